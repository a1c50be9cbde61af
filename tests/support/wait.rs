//! Waiting for state that sends no signal when it changes — a count in a
//! store, a metric, a settlement made by a task of the gateway's own — by
//! polling it against a deadline. The poll interval is not a guess at how
//! long something takes: the condition is what ends the wait, and the
//! deadline only bounds a failing test.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

/// Polls `ok` every few milliseconds until it holds.
///
/// # Panics
/// When it does not hold within `within`, naming `what`.
pub async fn until<F, Fut>(what: &str, within: Duration, ok: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    assert!(
        holds_within(within, ok).await,
        "{what}: not within {within:?}"
    );
}

/// As [`until`], for a caller whose failure message carries what the
/// polls saw: whether `ok` held within `within`.
pub async fn holds_within<F, Fut>(within: Duration, mut ok: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    while !ok().await {
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    true
}
