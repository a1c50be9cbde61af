//! What a store is: the [`Store`] trait every store implements and the
//! [`StoreError`] it answers when it cannot decide. Both stores and
//! everything around Redis build on this file; it builds on the limit
//! types alone.

use std::future::Future;

use crate::limit::settle::Settlement;
use crate::limit::{Answer, LimitRequest};

/// Why a store could not decide.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// The store is not connected.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The call did not finish within the configured timeout.
    #[error("store call timed out")]
    Timeout,
    /// The store answered something that is not a valid decision.
    #[error("store replied garbage: {0}")]
    Protocol(String),
    /// Redis refused the gateway's command, in its own words: an ACL
    /// permission is missing (`NOPERM`) or the connection is not
    /// authenticated (`NOAUTH`, `WRONGPASS`). A configuration fault, not an
    /// outage: it will not heal by waiting (see `redis::fault`).
    #[error("redis refused: {0}")]
    Refused(String),
}

/// A place that decides limits and keeps their counters.
pub trait Store: Send + Sync {
    /// Decides every limit of one request at `now_ms` (ms since the epoch).
    /// Admits only if all admit, and then consumes each request's cost from
    /// its limit; a denied request consumes nothing, and every outcome of a
    /// denial shows its limit without it.
    ///
    /// # Errors
    /// [`StoreError`] when the store cannot answer; nothing is consumed then
    /// as far as the caller can tell.
    fn decide(
        &self,
        now_ms: u64,
        requests: &[LimitRequest],
    ) -> impl Future<Output = Result<Answer, StoreError>> + Send;

    /// Settles reservations at `now_ms`: adds each
    /// settlement's `actual − reserved` to the counter its reservation went
    /// into, by the rules of [`crate::limit::settle`]. Atomic per key.
    ///
    /// # Errors
    /// [`StoreError`] when the store cannot answer; a reservation then
    /// stands as far as the caller can tell.
    fn settle(
        &self,
        now_ms: u64,
        settlements: &[Settlement],
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
}
