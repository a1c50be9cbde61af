//! The decision of a request with limits in `sync` mode: which of its
//! limits are synced, and the decision — in process alone, or mixed with
//! limits decided in Redis — while the counts are fresh. The design and
//! its bound are in [`super::sync`].

use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::time::Instant;

use super::reach::Gate;
use super::redis_side::RedisSide;
use super::sync::{Intent, syncable};
use super::sync_task::{self, SyncTask};
use crate::limit::{Decision, LimitRequest, Outcomes};
use crate::store::StoreError;

/// How many of `requests` are synced: a `sync` interval and an algorithm
/// that can be synced.
pub(super) fn count(requests: &[LimitRequest], sync: &[u64]) -> usize {
    requests
        .iter()
        .zip(sync)
        .filter(|&(r, &every)| every > 0 && syncable(r.algorithm))
        .count()
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
        sync: &[u64],
        synced: usize,
    ) -> Result<Decision, StoreError> {
        self.start_exchange();
        self.cold_start().await;
        if let Err(why) = self.sync_usable(now_ms, requests, sync, synced).await {
            // Whatever the fallback admits is not in the counts this
            // gateway holds: they are read again before it decides in sync
            // mode again.
            self.synced.link.failed.store(true, Ordering::SeqCst);
            self.synced.touch(now_ms, requests, sync, synced);
            return Err(StoreError::Unavailable(why.into()));
        }
        let start = std::time::Instant::now();
        let decided = if synced == requests.len() {
            self.synced
                .table
                .decide(now_ms, requests, sync, Intent::Consume)
                .ok_or_else(garbage)
        } else {
            self.decide_mixed(now_ms, requests, sync).await
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
        sync: &[u64],
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
            self.synced.touch(now_ms, requests, sync, synced);
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
    /// When the synced ones deny, Redis is asked at cost 0, which consumes
    /// nothing, for the other limits' headers.
    async fn decide_mixed(
        &self,
        now_ms: u64,
        requests: &[LimitRequest],
        sync: &[u64],
    ) -> Result<Decision, StoreError> {
        let is_synced = |i: usize| sync[i] > 0 && syncable(requests[i].algorithm);
        let (ours, theirs): (Vec<usize>, Vec<usize>) =
            (0..requests.len()).partition(|&i| is_synced(i));
        let pick = |idx: &[usize]| -> Vec<LimitRequest> {
            idx.iter().map(|&i| requests[i].clone()).collect()
        };
        let (synced, every): (Vec<LimitRequest>, Vec<u64>) =
            (pick(&ours), ours.iter().map(|&i| sync[i]).collect());
        let checked = self
            .synced
            .table
            .decide(now_ms, &synced, &every, Intent::Check)
            .ok_or_else(garbage)?;
        let mut exact = pick(&theirs);
        if !checked.allowed {
            for r in &mut exact {
                r.cost = 0;
            }
        }
        let asked = self.decide_in_redis(now_ms, &exact).await?;
        let allowed = checked.allowed && asked.allowed;
        let synced_outcomes = if allowed {
            self.synced
                .table
                .decide(now_ms, &synced, &every, Intent::Consume)
                .ok_or_else(garbage)?;
            checked.outcomes
        } else if checked.allowed {
            // Redis denied: the synced limits without the request.
            let standing: Vec<LimitRequest> = synced
                .iter()
                .map(|r| LimitRequest {
                    cost: 0,
                    ..r.clone()
                })
                .collect();
            self.synced
                .table
                .decide(now_ms, &standing, &every, Intent::Check)
                .ok_or_else(garbage)?
                .outcomes
        } else {
            checked.outcomes
        };
        let mut outcomes = Outcomes::with_capacity(requests.len());
        let (mut a, mut b) = (synced_outcomes.into_iter(), asked.outcomes.into_iter());
        for i in 0..requests.len() {
            let next = if is_synced(i) { a.next() } else { b.next() };
            outcomes
                .push(next.ok_or_else(|| StoreError::Protocol("an outcome is missing".into()))?);
        }
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
