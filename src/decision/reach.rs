//! How decisions reach Redis (docs/design.md#breaker-and-recovery): one
//! state, [`Reach`] — shared, down, behind, pushing — with every change of
//! it in [`Reachability`]; what `on_error: local` admitted during an outage
//! (the backlog), and the push that adds it to the Redis counters
//! ([`begin_push`]) before decisions go there again. The limiter's module
//! docs tell the whole story.

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

/// How decisions reach Redis: one state, held in one atomic, changed only
/// by the methods of [`Reachability`].
///
/// ```text
///  Shared ──a call fails──▶ Down ──`local` admits──▶ Behind ──push──▶ Pushing
///    ▲                       │ ▲                       ▲                 │
///    └──Redis answers────────┘ └──────push succeeds────┼─────────────────┤
///                                                      └──push fails─────┘
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(super) enum Reach {
    /// Decisions go to Redis; the usual path checks nothing but this.
    Shared = 0,
    /// The last call failed: `on_error` decided, nothing waits to be
    /// pushed, and decisions still try Redis first.
    Down = 1,
    /// Counts admitted in process wait to be added to Redis: decisions stay
    /// local until a push succeeds.
    Behind = 2,
    /// A push is under way; decisions wait for it.
    Pushing = 3,
}

impl Reach {
    fn from_u8(v: u8) -> Self {
        match v {
            0 => Self::Shared,
            1 => Self::Down,
            2 => Self::Behind,
            _ => Self::Pushing,
        }
    }
}

/// The backlog of an outage and the state of the way back to Redis.
#[derive(Debug)]
pub(super) struct Reachability {
    /// A [`Reach`].
    state: AtomicU8,
    pub(super) backlog: Backlog,
    /// Woken when a push ends.
    ended: Notify,
    /// After a push failed for an outage, none before this.
    not_before: Mutex<Option<Instant>>,
    /// How long a decision waits for a push: the store's timeout.
    pub(super) wait: Duration,
    /// The pause after a failed push: the breaker's probe interval.
    retry: Duration,
}

impl Reachability {
    /// Shared, with an empty backlog; a decision waits `wait` at most for a
    /// push, and a failed push is tried again after `retry`.
    pub(super) fn new(wait: Duration, retry: Duration) -> Self {
        Self {
            state: AtomicU8::new(Reach::Shared as u8),
            backlog: Backlog::new(),
            ended: Notify::new(),
            not_before: Mutex::new(None),
            wait,
            retry,
        }
    }

    pub(super) fn get(&self) -> Reach {
        Reach::from_u8(self.state.load(Ordering::SeqCst))
    }

    /// Whether decisions go to Redis without waiting for a push: shared,
    /// or down with nothing to push.
    pub(super) fn ahead(&self) -> bool {
        matches!(self.get(), Reach::Shared | Reach::Down)
    }

    /// Whether `on_error` decided since Redis last answered.
    pub(super) fn fallback_active(&self) -> bool {
        self.get() != Reach::Shared
    }

    fn swap_from(&self, from: Reach, to: Reach) -> bool {
        self.state
            .compare_exchange(from as u8, to as u8, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    }

    /// A call failed and `on_error` decides: whether this is the change
    /// from shared (to be told once).
    pub(super) fn failed(&self) -> bool {
        self.swap_from(Reach::Shared, Reach::Down)
    }

    /// Redis decided: whether this is the change back to shared.
    pub(super) fn answered(&self) -> bool {
        // A load first: the usual case writes nothing to the shared line.
        self.get() == Reach::Down && self.swap_from(Reach::Down, Reach::Shared)
    }

    /// Records an admission made in process during an outage.
    pub(super) fn record(&self, now_ms: u64, requests: &[LimitRequest]) {
        for r in requests {
            self.backlog.record(now_ms, r);
        }
        // After the records: a push ending now either sees them or finds
        // itself overruled here.
        let _ = self.swap_from(Reach::Down, Reach::Behind)
            || self.swap_from(Reach::Shared, Reach::Behind);
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
            if self.get() != Reach::Pushing {
                return true;
            }
            if tokio::time::timeout_at(deadline, ended).await.is_err() {
                return self.get() != Reach::Pushing;
            }
        }
    }

    /// A push failed for an outage: behind again, and no push before
    /// `retry`.
    fn push_failed(&self) {
        *self
            .not_before
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(Instant::now() + self.retry);
        self.state.store(Reach::Behind as u8, Ordering::SeqCst);
        self.ended.notify_waiters();
    }

    /// A push cleared the backlog (added, or refused and dropped): down until
    /// Redis answers a decision — or behind once more when decisions
    /// recorded during the push.
    fn push_cleared(&self) {
        self.state.store(Reach::Down as u8, Ordering::SeqCst);
        if !self.backlog.is_empty() {
            let _ = self.swap_from(Reach::Down, Reach::Behind);
        }
        self.ended.notify_waiters();
    }
}

/// Starts the push of the backlog, unless one is under way (or none is
/// due). The push runs in a task: a request that goes away must not leave
/// it half done.
pub(super) fn begin_push(
    reach: &Arc<Reachability>,
    redis: &Arc<RedisStore>,
    breaker: &Arc<Breaker>,
    metrics: &StoreMetrics,
    now_ms: u64,
) {
    if reach.may_try() && reach.swap_from(Reach::Behind, Reach::Pushing) {
        tokio::spawn(push(
            Arc::clone(reach),
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
    reach: Arc<Reachability>,
    redis: Arc<RedisStore>,
    breaker: Arc<Breaker>,
    metrics: StoreMetrics,
    now_ms: u64,
) {
    let entries = reach.backlog.take(now_ms);
    let keys = entries.len();
    let pushed = redis.push(now_ms, entries).await;
    metrics.backlog_pushed.inc_by(pushed.added as u64);
    match pushed.error {
        None => {
            if keys > 0 {
                info!(
                    keys = pushed.added,
                    skipped = pushed.skipped,
                    "added what was admitted in process during the outage to redis; decisions are back in redis"
                );
            }
            reach.push_cleared();
        }
        Some(e @ (StoreError::Unavailable(_) | StoreError::Timeout)) => {
            breaker.record(Err(&e));
            warn!(error = %e, keys = pushed.failed.len(), retry_in = ?reach.retry, "could not add what was admitted in process to redis yet; deciding in process meanwhile");
            reach.backlog.restore(pushed.failed);
            reach.push_failed();
        }
        Some(e @ (StoreError::Refused(_) | StoreError::Protocol(_))) => {
            warn!(error = %e, keys = pushed.failed.len(), "redis refused what was admitted in process during the outage; those counts are dropped");
            reach.push_cleared();
        }
    }
}
