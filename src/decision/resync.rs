//! The way back to Redis after an outage (docs/design.md#breaker-and-recovery): what `on_error:
//! local` admitted meanwhile ([`Resync`]'s backlog), the state that keeps
//! decisions local until it has been added to the Redis counters, and the
//! push that adds it ([`begin_push`]). The limiter's module docs tell the
//! whole story.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tracing::{info, warn};

use crate::limit::LimitRequest;
use crate::metrics::StoreMetrics;
use crate::store::redis::backlog::Backlog;
use crate::store::{Breaker, RedisStore, StoreError};

/// Where one decision goes while counts may be behind Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Gate {
    /// To Redis: nothing waits to be pushed.
    Redis,
    /// Nowhere: the link is down (a failed call, as the store would answer).
    Down,
    /// In process: a push is due, under way or failed a moment ago.
    Behind,
}

/// Decisions go to Redis.
pub(super) const SHARED: u8 = 0;
/// Counts admitted in process wait to be added to Redis: decisions stay
/// local until a push succeeds.
pub(super) const BEHIND: u8 = 1;
/// A push is under way; decisions wait for it.
pub(super) const PUSHING: u8 = 2;

/// The backlog of an outage and the state of its way back to Redis.
#[derive(Debug)]
pub(super) struct Resync {
    /// [`SHARED`], [`BEHIND`] or [`PUSHING`].
    pub(super) mode: AtomicU8,
    pub(super) backlog: Backlog,
    /// Woken when a push ends.
    pub(super) ended: Notify,
    /// After a push failed for an outage, none before this.
    pub(super) not_before: Mutex<Option<Instant>>,
    /// How long a decision waits for a push: the store's timeout.
    pub(super) wait: Duration,
    /// The pause after a failed push: the breaker's probe interval.
    pub(super) retry: Duration,
}

impl Resync {
    /// Records an admission made in process during an outage.
    pub(super) fn record(&self, now_ms: u64, requests: &[LimitRequest]) {
        for r in requests {
            self.backlog.record(now_ms, r);
        }
        // After the records: a push ending now either sees them or finds
        // itself overruled here.
        let _ = self
            .mode
            .compare_exchange(SHARED, BEHIND, Ordering::SeqCst, Ordering::SeqCst);
    }

    pub(super) fn may_try(&self) -> bool {
        let not_before = self
            .not_before
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        not_before.is_none_or(|t| Instant::now() >= t)
    }

    /// Waits, until `deadline`, for the push under way to end; whether it
    /// did.
    pub(super) async fn push_ended(&self, deadline: Instant) -> bool {
        loop {
            // Created before the check, so a push ending in between still
            // wakes it (`Notify::notify_waiters`).
            let ended = self.ended.notified();
            if self.mode.load(Ordering::SeqCst) != PUSHING {
                return true;
            }
            if tokio::time::timeout_at(deadline, ended).await.is_err() {
                return self.mode.load(Ordering::SeqCst) != PUSHING;
            }
        }
    }
}

/// Starts the push of the backlog, unless one is under way (or none is
/// due). The push runs in a task: a request that goes away must not leave
/// it half done.
pub(super) fn begin_push(
    resync: &Arc<Resync>,
    redis: &Arc<RedisStore>,
    breaker: &Arc<Breaker>,
    metrics: &StoreMetrics,
    now_ms: u64,
) {
    if resync.may_try()
        && resync
            .mode
            .compare_exchange(BEHIND, PUSHING, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    {
        tokio::spawn(push(
            Arc::clone(resync),
            Arc::clone(redis),
            Arc::clone(breaker),
            metrics.clone(),
            now_ms,
        ));
    }
}

/// Adds the backlog to Redis at `now_ms`, then lets decisions go there (or
/// back to waiting, if the push failed for an outage).
pub(super) async fn push(
    resync: Arc<Resync>,
    redis: Arc<RedisStore>,
    breaker: Arc<Breaker>,
    metrics: StoreMetrics,
    now_ms: u64,
) {
    let entries = resync.backlog.take(now_ms);
    let keys = entries.len();
    let pushed = redis.push(now_ms, entries).await;
    metrics.backlog_pushed.inc_by(pushed.added as u64);
    let behind = match pushed.error {
        None => {
            if keys > 0 {
                info!(
                    keys = pushed.added,
                    skipped = pushed.skipped,
                    "added what was admitted in process during the outage to redis; decisions are back in redis"
                );
            }
            false
        }
        Some(e @ (StoreError::Unavailable(_) | StoreError::Timeout)) => {
            breaker.record(Err(&e));
            warn!(error = %e, keys = pushed.failed.len(), retry_in = ?resync.retry, "could not add what was admitted in process to redis yet; deciding in process meanwhile");
            resync.backlog.restore(pushed.failed);
            *resync
                .not_before
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = Some(Instant::now() + resync.retry);
            true
        }
        Some(e @ (StoreError::Refused(_) | StoreError::Protocol(_))) => {
            warn!(error = %e, keys = pushed.failed.len(), "redis refused what was admitted in process during the outage; those counts are dropped");
            false
        }
    };
    if behind {
        resync.mode.store(BEHIND, Ordering::SeqCst);
    } else {
        resync.mode.store(SHARED, Ordering::SeqCst);
        // Recorded during the push (a decision that gave up waiting):
        // another push first.
        if !resync.backlog.is_empty() {
            let _ =
                resync
                    .mode
                    .compare_exchange(SHARED, BEHIND, Ordering::SeqCst, Ordering::SeqCst);
        }
    }
    resync.ended.notify_waiters();
}
