//! The decision phase: asks the configured store and applies the failure
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
//! issue 11: what `local` admits while Redis cannot decide (an outage: the
//! link down, a timeout, the breaker open) is also recorded in a
//! [`Backlog`], and decisions stay local until it has been added to the
//! Redis counters. The first decision that finds Redis usable again starts
//! that push in a task of its own; decisions arriving meanwhile wait for it
//! (at most the store's timeout, then they decide locally and are recorded
//! for the next push), and go to Redis once it is done. So the window that
//! spans an outage is not granted once in process and once more in Redis.
//! Three states, one atomic: shared (decisions in Redis; the only check on
//! the usual path is one load), behind (a backlog waits), pushing. A push
//! that fails for an outage puts its records back, counts for the breaker
//! and is tried again after a probe interval; a push Redis refuses
//! (garbage, `NOPERM`) is dropped with a warning, since waiting would not
//! help. While the link is down a decision in the behind state is counted
//! as the failed call it would have been (errors, breaker), as before.

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{info, warn};

use crate::config::{ClockSource, OnError, StoreConfig};
use crate::limit::deny_cache::DenyCache;
use crate::limit::{Decision, LimitRequest};
use crate::metrics::StoreMetrics;
use crate::store::heartbeat::{self, Instances};
use crate::store::redis::backlog::Backlog;
use crate::store::redis::fault::Fault;
use crate::store::{Breaker, BreakerState, MemoryStore, RedisStore, Store, StoreError};

/// Decides requests against the configured store.
pub struct Limiter {
    memory: MemoryStore,
    redis: Option<Arc<RedisStore>>,
    /// Denials Redis answered, replayed locally until their Retry-After.
    deny_cache: Option<DenyCache>,
    on_error: OnError,
    degraded: AtomicBool,
    breaker: Arc<Breaker>,
    instances: Instances,
    /// The breaker's probe and the heartbeat; aborted on drop.
    tasks: Vec<JoinHandle<()>>,
    metrics: StoreMetrics,
    /// What the fallback admitted during an outage, and whether decisions
    /// wait for it to reach Redis (module docs).
    resync: Arc<Resync>,
    /// A cold start: set until the first Redis connection is up or had its
    /// `connect_timeout` to come up. Meanwhile a decision waits for it at
    /// most the store's `timeout` before `on_error` decides, and the
    /// instance is not ready.
    warming: Arc<AtomicBool>,
}

/// Where one decision goes while counts may be behind Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Gate {
    /// To Redis: nothing waits to be pushed.
    Redis,
    /// Nowhere: the link is down (a failed call, as the store would answer).
    Down,
    /// In process: a push is due, under way or failed a moment ago.
    Behind,
}

/// Decisions go to Redis.
const SHARED: u8 = 0;
/// Counts admitted in process wait to be added to Redis: decisions stay
/// local until a push succeeds.
const BEHIND: u8 = 1;
/// A push is under way; decisions wait for it.
const PUSHING: u8 = 2;

/// The backlog of an outage and the state of its way back to Redis.
#[derive(Debug)]
struct Resync {
    /// [`SHARED`], [`BEHIND`] or [`PUSHING`].
    mode: AtomicU8,
    backlog: Backlog,
    /// Woken when a push ends.
    ended: Notify,
    /// After a push failed for an outage, none before this.
    not_before: Mutex<Option<Instant>>,
    /// How long a decision waits for a push: the store's timeout.
    wait: Duration,
    /// The pause after a failed push: the breaker's probe interval.
    retry: Duration,
}

impl Resync {
    /// Records an admission made in process during an outage.
    fn record(&self, now_ms: u64, requests: &[LimitRequest]) {
        for r in requests {
            self.backlog.record(now_ms, r);
        }
        // After the records: a push ending now either sees them or finds
        // itself overruled here.
        let _ = self
            .mode
            .compare_exchange(SHARED, BEHIND, Ordering::SeqCst, Ordering::SeqCst);
    }

    fn may_try(&self) -> bool {
        let not_before = self
            .not_before
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        not_before.is_none_or(|t| Instant::now() >= t)
    }

    /// Waits, until `deadline`, for the push under way to end; whether it
    /// did.
    async fn push_ended(&self, deadline: Instant) -> bool {
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

impl std::fmt::Debug for Limiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Limiter")
            .field("redis", &self.redis.is_some())
            .field("on_error", &self.on_error)
            .field("breaker", &self.breaker.state())
            .finish_non_exhaustive()
    }
}

impl Drop for Limiter {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Ends the cold start (`warming`) when the first Redis connection is up
/// or had `connect_timeout` to come up, and says which: the first
/// connection at INFO, its absence as a warning (naming why when Redis
/// refuses this gateway), then the connection when it comes.
async fn announce_connection(
    store: Arc<RedisStore>,
    redis: String,
    connect_timeout: Duration,
    warming: Arc<AtomicBool>,
) {
    let up = store.wait_connected(connect_timeout).await;
    warming.store(false, Ordering::Relaxed);
    if !up {
        match store.fault() {
            // Already logged at ERROR when it was found.
            Some(fault) => {
                warn!(%redis, %fault, "redis refuses this gateway at startup; serving by on_error until it accepts it");
            }
            None => {
                warn!(%redis, "redis not reachable at startup; serving by on_error until it is");
            }
        }
        while !store.wait_connected(Duration::from_secs(3600)).await {}
    }
    info!(%redis, "redis connected");
}

/// How a decision was reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The store decided (Redis, or in process by `on_error: local`).
    Decided(Decision),
    /// The store failed and `on_error: allow` admitted the request.
    FailedOpen,
    /// The store failed and `on_error: deny` refuses the request (503).
    Unavailable,
}

impl Limiter {
    /// A limiter over `cfg`'s store. Never waits for Redis: when it is down
    /// at startup the gateway serves by the failure policy until it is up.
    ///
    /// # Errors
    /// The Redis configuration cannot be used at all (a malformed URL).
    pub async fn new(cfg: &StoreConfig) -> Result<Self, StoreError> {
        let breaker = Arc::new(Breaker::new(cfg.breaker));
        let instances = Instances::default();
        let mut tasks = Vec::new();
        let warming = Arc::new(AtomicBool::new(cfg.redis.is_some()));
        let redis = match &cfg.redis {
            Some(r) => {
                let store = Arc::new(RedisStore::connect(r).await?);
                store.use_server_clock(cfg.clock == ClockSource::Redis);
                // Serving starts at once; the first connection comes up
                // meanwhile (see `ask_redis`).
                tasks.push(tokio::spawn(announce_connection(
                    Arc::clone(&store),
                    r.describe(),
                    r.connect_timeout,
                    Arc::clone(&warming),
                )));
                tasks.push(tokio::spawn(Arc::clone(&breaker).probe(Arc::clone(&store))));
                tasks.push(tokio::spawn(heartbeat::run(
                    Arc::clone(&store),
                    heartbeat::key(&cfg.prefix),
                    heartbeat::instance_id(),
                    instances.clone(),
                )));
                Some(store)
            }
            None => None,
        };
        let deny_cache =
            (redis.is_some() && cfg.deny_cache > 0).then(|| DenyCache::new(cfg.deny_cache));
        let resync = Arc::new(Resync {
            mode: AtomicU8::new(SHARED),
            backlog: Backlog::new(),
            ended: Notify::new(),
            not_before: Mutex::new(None),
            wait: cfg.redis.as_ref().map_or(Duration::ZERO, |r| r.timeout),
            retry: cfg.breaker.probe_interval,
        });
        Ok(Self {
            memory: MemoryStore::new(),
            redis,
            deny_cache,
            on_error: cfg.on_error,
            degraded: AtomicBool::new(false),
            breaker,
            instances,
            tasks,
            metrics: StoreMetrics::default(),
            resync,
            warming,
        })
    }

    /// Waits at most `timeout` for Redis to be connected; whether it is
    /// (true at once without Redis). For callers that must not start
    /// before the store can share counts, such as tests.
    pub async fn wait_connected(&self, timeout: Duration) -> bool {
        match &self.redis {
            Some(r) => r.wait_connected(timeout).await,
            None => true,
        }
    }

    /// Records store latency, errors and the fallback state in `metrics`.
    pub fn with_metrics(mut self, metrics: StoreMetrics) -> Self {
        self.breaker.export(metrics.breaker_open.clone());
        if let Some(r) = &self.redis {
            r.health().export(metrics.faults.clone());
        }
        self.resync.backlog.export(metrics.backlog_dropped.clone());
        self.metrics = metrics;
        self
    }

    /// Whether decisions can be made: no Redis is configured, Redis is
    /// connected, or the `on_error` fallback answers while it is not
    /// (`deny` answers 503, so it does not count) — but at a cold start
    /// only once the first connection had its `connect_timeout` to come
    /// up: an instance is not put in service deciding in process when
    /// Redis is a moment away. Never while Redis refuses this gateway ([`Self::redis_fault`]): a wrong password or
    /// missing permission does not heal by itself, and a rollout that
    /// brought it should stop at this instance rather than serve every
    /// request by `on_error` unnoticed.
    pub fn is_ready(&self) -> bool {
        match &self.redis {
            None => true,
            Some(r) => {
                r.fault().is_none()
                    && (r.is_connected()
                        || (matches!(self.on_error, OnError::Allow | OnError::Local)
                            && !self.warming.load(Ordering::Relaxed)))
            }
        }
    }

    /// Why Redis refuses this gateway, while it does: wrong or missing
    /// credentials, a missing ACL permission, a TLS mismatch.
    pub fn redis_fault(&self) -> Option<Fault> {
        self.redis.as_ref().and_then(|r| r.fault())
    }

    /// Whether Redis is configured and currently answering.
    pub fn redis_connected(&self) -> Option<bool> {
        self.redis.as_ref().map(|r| r.is_connected())
    }

    /// Whether the last Redis call failed, so `on_error` is deciding.
    pub fn fallback_active(&self) -> bool {
        self.degraded.load(Ordering::Relaxed)
    }

    /// Decides in process, timing the call.
    fn decide_memory(&self, now_ms: u64, requests: &[LimitRequest]) -> Decision {
        let start = std::time::Instant::now();
        let d = self.memory.decide_now(now_ms, requests);
        self.metrics
            .memory_duration
            .observe(start.elapsed().as_secs_f64());
        d
    }

    /// Whether decisions go to Redis (for metrics).
    pub fn breaker_state(&self) -> BreakerState {
        self.breaker.state()
    }

    /// The last known number of live gateway instances sharing Redis.
    pub fn live_instances(&self) -> u64 {
        self.instances.get()
    }

    /// The Redis store, when one is configured (for the API-key hash).
    pub fn redis(&self) -> Option<&RedisStore> {
        self.redis.as_deref()
    }

    /// Reads `field` of the store's hash `hash` (the dynamic API keys).
    /// Only Redis keeps hashes: without it the answer is "not there".
    ///
    /// # Errors
    /// [`StoreError`] when Redis cannot answer.
    pub async fn lookup(&self, hash: &str, field: &str) -> Result<Option<String>, StoreError> {
        match &self.redis {
            Some(redis) => redis.hget(hash, field).await,
            None => Ok(None),
        }
    }

    /// Decides one request at `now_ms`; `on_error` overrides the store's
    /// policy (a route's own `on_error`).
    pub async fn decide_with(
        &self,
        now_ms: u64,
        requests: &[LimitRequest],
        on_error: Option<OnError>,
    ) -> Verdict {
        let Some(redis) = &self.redis else {
            return Verdict::Decided(self.decide_memory(now_ms, requests));
        };
        if let Some(d) = self
            .deny_cache
            .as_ref()
            .and_then(|c| c.get(now_ms, requests))
        {
            self.metrics.deny_cache_hits.inc();
            return Verdict::Decided(d);
        }
        let (called, result) = self.ask_redis(redis, now_ms, requests).await;
        match result {
            Ok(d) => {
                if let Some(c) = &self.deny_cache {
                    c.insert(now_ms, requests, &d);
                }
                if self.degraded.swap(false, Ordering::Relaxed) {
                    self.metrics.fallback.set(0);
                    info!("redis answers again; limits are shared again");
                }
                Verdict::Decided(d)
            }
            Err(e) => {
                // A call the open breaker skipped is not a store error.
                if called {
                    self.metrics.errors.inc();
                }
                self.fail_over(&e, now_ms, requests, on_error)
            }
        }
    }

    /// Asks Redis, unless the breaker is open or counts admitted in process
    /// during an outage have not reached it yet (issue 11: they go first).
    /// Whether Redis was called, and its answer.
    async fn ask_redis(
        &self,
        redis: &Arc<RedisStore>,
        now_ms: u64,
        requests: &[LimitRequest],
    ) -> (bool, Result<Decision, StoreError>) {
        // Cold start: the first connection may be on its way. Wait for it
        // at most the store's timeout, then let `on_error` decide — never
        // queue behind the connect.
        if !redis.is_connected() && self.warming.load(Ordering::Relaxed) {
            redis.wait_connected(self.resync.wait).await;
        }
        let gate = if self.resync.mode.load(Ordering::SeqCst) == SHARED {
            Gate::Redis
        } else {
            self.catch_up(redis, now_ms).await
        };
        let called = self.breaker.allows() && gate != Gate::Behind;
        let result = if called {
            let start = std::time::Instant::now();
            let r = match gate {
                Gate::Redis => redis.decide(now_ms, requests).await,
                // What the store answers at once while its link is down,
                // and counted as such (errors, breaker), as before.
                Gate::Down | Gate::Behind => {
                    Err(StoreError::Unavailable("not connected to Redis".into()))
                }
            };
            self.metrics
                .redis_duration
                .observe(start.elapsed().as_secs_f64());
            self.breaker.record(r.as_ref().map(drop));
            r
        } else if gate == Gate::Behind && self.breaker.allows() {
            Err(StoreError::Unavailable(
                "counts admitted in process are not in Redis yet".into(),
            ))
        } else {
            Err(StoreError::Unavailable("breaker open".into()))
        };
        (called, result)
    }

    /// Redis could not decide: the failure policy does, `on_error` (a
    /// route's own) before the store's.
    fn fail_over(
        &self,
        e: &StoreError,
        now_ms: u64,
        requests: &[LimitRequest],
        on_error: Option<OnError>,
    ) -> Verdict {
        if !self.degraded.swap(true, Ordering::Relaxed) {
            self.metrics.fallback.set(1);
            warn!(error = %e, default_on_error = ?self.on_error, "redis cannot decide; deciding by on_error until it can");
        }
        match on_error.unwrap_or(self.on_error) {
            OnError::Allow => Verdict::FailedOpen,
            OnError::Deny => Verdict::Unavailable,
            OnError::Local => {
                let d = self.decide_locally(now_ms, requests);
                // Only an outage: a refusal or garbage would refuse the
                // push as well.
                if d.allowed && matches!(e, StoreError::Unavailable(_) | StoreError::Timeout) {
                    self.resync.record(now_ms, requests);
                }
                Verdict::Decided(d)
            }
        }
    }

    /// Behind: starts the push when Redis looks usable (unless one failed
    /// a moment ago) and waits for it, at most the store's timeout. Where
    /// this decision goes.
    async fn catch_up(&self, redis: &Arc<RedisStore>, now_ms: u64) -> Gate {
        let deadline = Instant::now() + self.resync.wait;
        loop {
            match self.resync.mode.load(Ordering::SeqCst) {
                SHARED => return Gate::Redis,
                BEHIND => {
                    if !redis.is_connected() {
                        return Gate::Down;
                    }
                    if !(self.breaker.allows() && self.resync.may_try()) {
                        return Gate::Behind;
                    }
                    if self
                        .resync
                        .mode
                        .compare_exchange(BEHIND, PUSHING, Ordering::SeqCst, Ordering::SeqCst)
                        .is_ok()
                    {
                        // A task: a request that goes away must not leave
                        // the push half done.
                        tokio::spawn(push(
                            Arc::clone(&self.resync),
                            Arc::clone(redis),
                            Arc::clone(&self.breaker),
                            self.metrics.clone(),
                            now_ms,
                        ));
                    }
                }
                _ => {}
            }
            if !self.resync.push_ended(deadline).await {
                return Gate::Behind;
            }
        }
    }

    /// Whether counts admitted in process during an outage wait to be added
    /// to Redis (decisions stay local until they are).
    pub fn behind_redis(&self) -> bool {
        self.resync.mode.load(Ordering::SeqCst) != SHARED
    }

    /// `on_error: local`: each limit divided by the live instances (at
    /// least 1 left), so the fleet as a whole stays near the limit.
    fn decide_locally(&self, now_ms: u64, requests: &[LimitRequest]) -> Decision {
        let n = self.instances.get();
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

/// Adds the backlog to Redis at `now_ms`, then lets decisions go there (or
/// back to waiting, if the push failed for an outage).
async fn push(
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
