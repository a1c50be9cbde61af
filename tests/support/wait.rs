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

/// Polls `seen` every few milliseconds until it returns `Ok`, and returns
/// that value: for a wait whose end is itself the thing wanted (a reply, a
/// decision, a count).
///
/// # Panics
/// When `seen` has not returned `Ok` within `within`, naming `what` and
/// the last `Err` it returned (what the polls saw).
pub async fn value<T, E, F, Fut>(what: &str, within: Duration, mut seen: F) -> T
where
    E: std::fmt::Display,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let deadline = Instant::now() + within;
    loop {
        match seen().await {
            Ok(v) => return v,
            Err(e) if Instant::now() >= deadline => {
                panic!("{what}: not within {within:?}; last seen: {e}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(5)).await,
        }
    }
}

/// As [`until`], for a caller that measures the wait: how long `ok` took
/// to hold.
pub async fn took<F, Fut>(what: &str, within: Duration, ok: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let started = Instant::now();
    until(what, within, ok).await;
    started.elapsed()
}
