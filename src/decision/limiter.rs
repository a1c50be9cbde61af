//! The limiter: asks the configured store and applies the failure
//! policy when it cannot answer.
//!
//! With Redis configured every decision goes to Redis, through a
//! [`Breaker`] that stops calling it after repeated failures and lets a
//! background probe find it again. When Redis fails, times out, answers
//! garbage, or the breaker is open, `on_error` decides — the store's, or the
//! route's override: `allow` admits without a decision (no `RateLimit`
//! header is sent, since no count is known), `deny` answers 503, and `local`
//! decides in an in-process store with each limit divided by the last known
//! number of live gateway instances ([`heartbeat`]). The switch to and from
//! the fallback is logged once each way, not per request.
//!
//! In front of Redis sits the [deny cache](crate::limit::deny_cache): a request
//! Redis denied is denied again locally until its Retry-After, so a caller
//! hammering a closed limit costs no Redis call.
//!
//! What `local` admits while Redis cannot decide (an outage: the
//! link down, a timeout, the breaker open) is also recorded in a
//! [`Backlog`], and decisions stay local until it has been added to the
//! Redis counters. The first decision that finds Redis usable again starts
//! that push in a task of its own; decisions arriving meanwhile wait for it
//! (at most the store's timeout, then they decide locally and are recorded
//! for the next push), and go to Redis once it is done. So the window that
//! spans an outage is not granted once in process and once more in Redis.
//! Four states, one atomic ([`Reach`](super::reach::Reach)): shared
//! (decisions in Redis; the only check on the usual path is one load),
//! down (a call failed, nothing waits), behind (a backlog waits), pushing.
//! A push
//! that fails for an outage puts its records back, counts for the breaker
//! and is tried again after a probe interval; a push Redis refuses
//! (garbage, `NOPERM`) is dropped with a warning, since waiting would not
//! help. While the link is down a decision in the behind state is counted
//! as the failed call it would have been (errors, breaker).
//!
//! `sync` mode (docs/design.md#sync-mode): limits with a `sync` interval
//! are decided in process by [`SyncTable`] against the fleet's totals, and
//! a task started by the first such decision exchanges their counts with
//! Redis every interval ([`sync`] has the design and its bound). The
//! failure policy is the one above: while Redis is down, the breaker open,
//! an exchange has failed or a fallback decision was made, the counts are
//! stale and `on_error` decides; a decision that finds them so asks the
//! task for an exchange at once (after the outage's push) and waits for it
//! at most the store's timeout, as it waits for the push in exact mode.

//!
//! The parts: [`Limiter`] decides; [`RedisSide`] is what it holds of Redis
//! (the store, breaker, deny cache, reachability, `sync` mode's table and
//! task); how the store is doing ([`StoreHealth`]: readiness, Redis's
//! link, the failure policy at work) and what the admin API asks of the
//! stores ([`LimiterAdmin`]) are read through it, and settling
//! reservations ([`Settler`]), concurrency slots ([`Concurrency`]) and the
//! API-key plan lookups ([`PlanStore`]) are types of their own beside it.

use std::sync::Arc;

use tracing::warn;

use super::Unanswered;
use super::admin::LimiterAdmin;
use super::health::StoreHealth;
use super::redis_side::RedisSide;
use super::settle::store::Settler;
use super::slots::Concurrency;
use crate::clock::Clock;
use crate::config::{OnError, StoreConfig};
use crate::limit::{Answer, LimitRequest};
use crate::metrics::StoreMetrics;
use crate::store::{Breaker, MemoryStore, RedisStore, StoreError};

/// Decides requests against the configured store.
pub struct Limiter {
    memory: Arc<MemoryStore>,
    /// Redis, when configured, and all that reaching it takes.
    pub(super) redis: Option<RedisSide>,
    on_error: OnError,
    pub(super) metrics: StoreMetrics,
    /// Whether in-process decisions are timed into `metrics`: once they
    /// are exported ([`Self::with_metrics`]). Metrics nobody reads (an
    /// application's layer) cost no clock reads.
    timed: bool,
    /// Concurrency limits' slots.
    concurrency: Concurrency,
    /// Where reserved costs are settled.
    settler: Settler,
    /// The API-key hash behind `api_keys.redis_hash`.
    plan_store: PlanStore,
}

impl std::fmt::Debug for Limiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Limiter")
            .field("redis", &self.redis.is_some())
            .field("on_error", &self.on_error)
            .field("breaker", &self.health().breaker_state())
            .finish_non_exhaustive()
    }
}

/// Reads the plan names of dynamic API keys from the store's hash. Only
/// Redis keeps hashes: without it every answer is "not there".
#[derive(Debug, Clone, Default)]
pub struct PlanStore {
    redis: Option<Arc<RedisStore>>,
}

impl PlanStore {
    /// Reads `field` of the store's hash `hash`.
    ///
    /// # Errors
    /// [`StoreError`] when Redis cannot answer.
    pub async fn lookup(&self, hash: &str, field: &str) -> Result<Option<String>, StoreError> {
        match &self.redis {
            Some(redis) => redis.hget(hash, field).await,
            None => Ok(None),
        }
    }
}

impl Limiter {
    /// A limiter over `cfg`'s store. Never waits for Redis: when it is down
    /// at startup the gateway serves by the failure policy until it is up.
    ///
    /// # Errors
    /// The Redis configuration cannot be used at all (a malformed URL).
    pub async fn new(cfg: &StoreConfig) -> Result<Self, StoreError> {
        // Before the first request, which would otherwise wait for it.
        crate::clock::SystemClock::calibrate();
        let redis = match &cfg.redis {
            Some(r) => Some(RedisSide::start(cfg, r).await?),
            None => None,
        };
        let store = redis.as_ref().map(|r| Arc::clone(&r.store));
        let breaker = redis.as_ref().map_or_else(
            || Arc::new(Breaker::new(cfg.breaker)),
            |r| Arc::clone(&r.breaker),
        );
        let memory = Arc::new(MemoryStore::new());
        let metrics = StoreMetrics::default();
        Ok(Self {
            settler: Settler::new(Arc::clone(&memory), redis.as_ref(), metrics.clone()),
            concurrency: Concurrency::new(cfg, store.clone(), breaker),
            plan_store: PlanStore { redis: store },
            memory,
            redis,
            on_error: cfg.on_error,
            metrics,
            timed: false,
        })
    }

    /// Reads time for `sync` mode's exchanges from `clock` (the clock the
    /// gateway decides on) instead of the system's.
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        if let Some(r) = &mut self.redis {
            r.synced.clock = clock;
        }
        self
    }

    /// Records store latency, errors and the fallback state in `metrics`.
    pub fn with_metrics(mut self, metrics: StoreMetrics) -> Self {
        if let Some(r) = &mut self.redis {
            r.metrics = metrics.clone();
            r.breaker.export(metrics.breaker_open.clone());
            r.store.health().export(metrics.faults.clone());
            r.store.failovers().export(metrics.failovers.clone());
            r.store
                .export_node_breakers(metrics.node_breaker_open.clone());
            r.reach.backlog.export(metrics.backlog_dropped.clone());
        }
        self.settler.metrics = metrics.clone();
        self.metrics = metrics;
        self.timed = true;
        self
    }

    /// Where concurrency limits' slots are kept.
    pub fn concurrency(&self) -> &Concurrency {
        &self.concurrency
    }

    /// Where reserved costs are settled.
    pub fn settler(&self) -> &Settler {
        &self.settler
    }

    /// Where the plans of dynamic API keys are read.
    pub fn plan_store(&self) -> &PlanStore {
        &self.plan_store
    }

    /// Decides in process, timing the call when the metrics are exported.
    #[inline]
    fn decide_memory(&self, now_ms: u64, requests: &[LimitRequest]) -> Answer {
        if !self.timed {
            return self.memory.decide_now(now_ms, requests);
        }
        self.decide_memory_timed(now_ms, requests)
    }

    /// [`decide_memory`](Self::decide_memory) timed.
    fn decide_memory_timed(&self, now_ms: u64, requests: &[LimitRequest]) -> Answer {
        let start = std::time::Instant::now();
        let d = self.memory.decide_now(now_ms, requests);
        self.metrics
            .memory_duration
            .observe(start.elapsed().as_secs_f64());
        d
    }

    /// How the store is doing: readiness, Redis's link, the failure
    /// policy at work.
    pub fn health(&self) -> StoreHealth<'_> {
        StoreHealth::new(self.redis.as_ref(), self.on_error)
    }

    /// What the admin API asks of the stores: counters read and reset,
    /// denials forgotten, Redis for the overrides.
    pub fn admin(&self) -> LimiterAdmin<'_> {
        LimiterAdmin::new(&self.memory, self.redis.as_ref())
    }

    /// Whether every decision is made in process ([`decide_now`](Self::decide_now)
    /// answers): no Redis is configured.
    pub fn in_process(&self) -> bool {
        self.redis.is_none()
    }

    /// [`decide_with`](Self::decide_with) when the store answers at once:
    /// in process, without Redis; `None` with Redis configured.
    pub fn decide_now(&self, now_ms: u64, requests: &[LimitRequest]) -> Option<Answer> {
        self.redis
            .is_none()
            .then(|| self.decide_memory(now_ms, requests))
    }

    /// Decides one request's `requests` at `now_ms`, together: admitted
    /// only when each admits. `on_error` overrides the store's policy (a
    /// route's own `on_error`). Limits in `sync` mode ([`super::sync`])
    /// are decided in process, the others in the store.
    pub async fn decide_with(
        &self,
        now_ms: u64,
        requests: &[LimitRequest],
        on_error: Option<OnError>,
    ) -> Result<Answer, Unanswered> {
        let Some(redis) = &self.redis else {
            return Ok(self.decide_memory(now_ms, requests));
        };
        let synced = super::sync::count(requests);
        // Boxed: a Redis call's future is kilobytes, and it would
        // otherwise sit (and be copied) in every request's future, in
        // process too; next to a round trip the allocation is nothing.
        let decided = if synced > 0 {
            Box::pin(redis.decide_synced(now_ms, requests, synced)).await
        } else {
            Box::pin(redis.decide_in_redis(now_ms, requests)).await
        };
        decided.or_else(|e| self.fail_over(redis, &e, now_ms, requests, on_error))
    }

    /// Redis could not decide: the failure policy does, `on_error` (a
    /// route's own) before the store's.
    fn fail_over(
        &self,
        redis: &RedisSide,
        e: &StoreError,
        now_ms: u64,
        requests: &[LimitRequest],
        on_error: Option<OnError>,
    ) -> Result<Answer, Unanswered> {
        if redis.reach.failed() {
            self.metrics.fallback.set(1);
            warn!(error = %e, default_on_error = ?self.on_error, "redis cannot decide; deciding by on_error until it can");
        }
        match on_error.unwrap_or(self.on_error) {
            OnError::Allow => Err(Unanswered::FailedOpen),
            OnError::Deny => Err(Unanswered::Unavailable),
            OnError::Local => {
                let d = self.decide_locally(redis, now_ms, requests);
                // Only an outage: a refusal or garbage would refuse the
                // push as well.
                if d.allowed && matches!(e, StoreError::Unavailable(_) | StoreError::Timeout) {
                    redis.reach.record(now_ms, requests);
                }
                Ok(d)
            }
        }
    }

    /// `on_error: local`: each limit divided by the live instances (at
    /// least 1 left), so the fleet as a whole stays near the limit.
    fn decide_locally(&self, redis: &RedisSide, now_ms: u64, requests: &[LimitRequest]) -> Answer {
        let n = redis.instances.get();
        if n <= 1 {
            return self.decide_memory(now_ms, requests);
        }
        let shares: Vec<LimitRequest> = requests
            .iter()
            .map(|r| LimitRequest {
                limit: (r.limit / n).max(1),
                ..r.clone()
            })
            .collect();
        self.decide_memory(now_ms, &shares)
    }
}
