//! The decision of a request with limits in `sync` mode: which of its
//! limits are synced, and the decision — in process alone, or mixed with
//! limits decided in Redis — while the counts are fresh. The design and
//! its bound are in [`super::sync`].

use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::time::Instant;

use super::reach::Gate;
use super::redis_side::RedisSide;
use super::sync::Intent;
use super::sync_task::{self, SyncTask};
use crate::limit::{Decision, LimitKind, LimitRequest, Outcomes};
use crate::store::StoreError;

/// How many of `requests` are synced (in `sync` mode).
pub(super) fn count(requests: &[LimitRequest]) -> usize {
    requests.iter().filter(|r| is_synced(r)).count()
}

fn is_synced(r: &LimitRequest) -> bool {
    matches!(r.mode.kind, LimitKind::Synced(_))
}

impl RedisSide {
    /// A request with `synced` limits in `sync` mode: decided in process
    /// against the fleet's totals ([`SyncTable`]) while the exchanges with
    /// Redis succeed; its other limits (if any) in Redis. While Redis
    /// cannot be used — the link down, the breaker open, the last exchange
    /// failed, or what the fallback admitted not pushed yet — `on_error`
    /// decides the whole request exactly as in exact mode, and its synced
    /// keys are queued so that the next exchange reads their totals before
    /// they are decided in process again.
    pub(super) async fn decide_synced(
        &self,
        now_ms: u64,
        requests: &[LimitRequest],
        synced: usize,
    ) -> Result<Decision, StoreError> {
        self.start_exchange();
        self.cold_start().await;
        if let Err(why) = self.sync_usable(now_ms, requests, synced).await {
            // Whatever the fallback admits is not in the counts this
            // gateway holds: they are read again before it decides in sync
            // mode again.
            self.synced.link.failed.store(true, Ordering::SeqCst);
            self.synced.touch(now_ms, requests, synced);
            return Err(StoreError::Unavailable(why.into()));
        }
        let start = std::time::Instant::now();
        let decided = if synced == requests.len() {
            self.synced
                .table
                .decide(now_ms, requests, Intent::Consume)
                .ok_or_else(garbage)
        } else {
            self.decide_mixed(now_ms, requests).await
        };
        self.metrics
            .sync_duration
            .observe(start.elapsed().as_secs_f64());
        if decided.is_ok() {
            self.shared_again();
        }
        decided
    }

    /// Whether synced limits can be decided in process now: Redis is
    /// connected, the breaker closed, and the counts held are fresh — after
    /// a failure (an exchange that failed, or a decision the fallback
    /// made) an exchange is asked for at once and awaited, at most the
    /// store's timeout, as a decision waits for an outage's push in exact
    /// mode; and what the fallback admitted is pushed first.
    async fn sync_usable(
        &self,
        now_ms: u64,
        requests: &[LimitRequest],
        synced: usize,
    ) -> Result<(), &'static str> {
        if !self.store.is_connected() {
            return Err("not connected to Redis");
        }
        if !self.breaker.allows() {
            return Err("breaker open");
        }
        if self.synced.link.failed.load(Ordering::SeqCst) {
            // Queued, so the exchange reads these keys.
            self.synced.touch(now_ms, requests, synced);
            let deadline = Instant::now() + self.reach.wait;
            if !self.synced.link.refreshed(deadline).await {
                return Err(
                    "the counts held are not fresh: the exchange with Redis failed or is late",
                );
            }
        }
        if !self.reach.ahead() && self.catch_up(now_ms).await != Gate::Redis {
            return Err("counts admitted in process are not in Redis yet");
        }
        Ok(())
    }

    /// Some limits synced, some decided in Redis: the synced ones are
    /// checked first, in process; only when they admit do the others go to
    /// Redis, and only when Redis admits too are the synced ones consumed.
    /// When the synced ones deny, the others are only read in Redis, for
    /// their headers; when Redis denies, the synced ones are read again
    /// without the request.
    async fn decide_mixed(
        &self,
        now_ms: u64,
        requests: &[LimitRequest],
    ) -> Result<Decision, StoreError> {
        let (synced, exact): (Vec<LimitRequest>, Vec<LimitRequest>) =
            requests.iter().cloned().partition(is_synced);
        let table = &self.synced.table;
        let checked = table
            .decide(now_ms, &synced, Intent::Check)
            .ok_or_else(garbage)?;
        let asked = if checked.allowed {
            self.decide_in_redis(now_ms, &exact).await?
        } else {
            let read: Vec<LimitRequest> = exact.iter().map(LimitRequest::read_only).collect();
            self.decide_in_redis(now_ms, &read).await?
        };
        let allowed = checked.allowed && asked.allowed;
        let synced_outcomes = if allowed {
            table
                .decide(now_ms, &synced, Intent::Consume)
                .ok_or_else(garbage)?;
            checked.outcomes
        } else if checked.allowed {
            let standing: Vec<LimitRequest> = synced.iter().map(LimitRequest::read_only).collect();
            table
                .decide(now_ms, &standing, Intent::Check)
                .ok_or_else(garbage)?
                .outcomes
        } else {
            checked.outcomes
        };
        // Back to the requests' order.
        let (mut ours, mut theirs) = (synced_outcomes.into_iter(), asked.outcomes.into_iter());
        let outcomes = requests
            .iter()
            .map(|r| {
                if is_synced(r) {
                    ours.next()
                } else {
                    theirs.next()
                }
            })
            .collect::<Option<Outcomes>>()
            .ok_or_else(|| StoreError::Protocol("an outcome is missing".into()))?;
        Ok(Decision { allowed, outcomes })
    }

    /// Starts `sync` mode's exchange task, once.
    fn start_exchange(&self) {
        self.synced.exchange.get_or_init(|| {
            tokio::spawn(sync_task::run(SyncTask {
                table: Arc::clone(&self.synced.table),
                redis: Arc::clone(&self.store),
                breaker: Arc::clone(&self.breaker),
                link: Arc::clone(&self.synced.link),
                reach: Arc::clone(&self.reach),
                instances: self.instances.clone(),
                metrics: self.metrics.clone(),
                clock: Arc::clone(&self.synced.clock),
            }))
        });
    }
}

/// The error of a synced key whose Redis counter holds something else.
fn garbage() -> StoreError {
    StoreError::Protocol("a synced key holds something other than its counter in Redis".into())
}
