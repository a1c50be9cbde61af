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
//! Three states, one atomic: shared (decisions in Redis; the only check on
//! the usual path is one load), behind (a backlog waits), pushing. A push
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

mod admin;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{info, warn};

use super::Undecided;
use super::resync::{BEHIND, Gate, Resync, SHARED, begin_push};
use super::slots::Concurrency;
use super::sync::{self, Intent, SyncTable};
use super::sync_task::{self, SyncLink, SyncTask};
use crate::clock::{Clock, SystemClock};
use crate::config::{ClockSource, OnError, StoreConfig};
use crate::limit::deny_cache::DenyCache;
use crate::limit::settle::Settlement;
use crate::limit::{Decision, LimitRequest, Outcomes};
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
    /// `sync` mode: what this gateway knows of the fleet's counts and owes
    /// Redis ([`sync`]).
    sync: Arc<SyncTable>,
    /// Whether `sync` mode's counts are fresh, and the way to ask for an
    /// exchange at once.
    link: Arc<SyncLink>,
    /// The task exchanging `sync` mode's counts, started by the first
    /// synced decision; aborted on drop.
    exchange: std::sync::OnceLock<JoinHandle<()>>,
    /// The clock the exchange reads (the gateway's).
    clock: Arc<dyn Clock>,
    /// Concurrency limits' slots.
    concurrency: Concurrency,
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
        if let Some(t) = self.exchange.get() {
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
        let concurrency = Concurrency::new(cfg, redis.clone(), Arc::clone(&breaker));
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
            sync: Arc::new(SyncTable::new()),
            link: Arc::new(SyncLink::default()),
            exchange: std::sync::OnceLock::new(),
            clock: Arc::new(SystemClock),
            concurrency,
        })
    }

    /// Reads time for `sync` mode's exchanges from `clock` (the clock the
    /// gateway decides on) instead of the system's.
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
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

    /// Whether the store answered (Redis connected, script loaded) within
    /// `timeout`; true at once without Redis. Serving waits on it.
    pub async fn wait_ready(&self, timeout: Duration) -> bool {
        let Some(r) = &self.redis else { return true };
        r.wait_ready(timeout).await
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

    /// Where concurrency limits' slots are kept.
    pub fn concurrency(&self) -> &Concurrency {
        &self.concurrency
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
    /// policy (a route's own `on_error`). `sync` holds each limit's `sync`
    /// interval in ms, 0 for a limit decided in Redis (see [`sync`]).
    pub async fn decide_with(
        &self,
        now_ms: u64,
        requests: &[LimitRequest],
        sync: &[u64],
        on_error: Option<OnError>,
    ) -> Result<Decision, Undecided> {
        let Some(redis) = &self.redis else {
            return Ok(self.decide_memory(now_ms, requests));
        };
        let synced = requests
            .iter()
            .zip(sync)
            .filter(|&(r, &every)| every > 0 && sync::syncable(r.algorithm))
            .count();
        if synced > 0 {
            return self
                .decide_synced(redis, now_ms, requests, sync, synced, on_error)
                .await;
        }
        match self.decide_in_redis(redis, now_ms, requests).await {
            Ok(d) => Ok(d),
            Err(e) => self.fail_over(&e, now_ms, requests, on_error),
        }
    }

    /// Decides `requests` in Redis (or from the deny cache).
    async fn decide_in_redis(
        &self,
        redis: &Arc<RedisStore>,
        now_ms: u64,
        requests: &[LimitRequest],
    ) -> Result<Decision, StoreError> {
        if let Some(d) = self
            .deny_cache
            .as_ref()
            .and_then(|c| c.get(now_ms, requests))
        {
            self.metrics.deny_cache_hits.inc();
            return Ok(d);
        }
        let (called, result) = self.ask_redis(redis, now_ms, requests).await;
        match result {
            Ok(d) => {
                if let Some(c) = &self.deny_cache {
                    c.insert(now_ms, requests, &d);
                }
                self.shared_again();
                Ok(d)
            }
            Err(e) => {
                // A call the open breaker skipped is not a store error.
                if called {
                    self.metrics.errors.inc();
                }
                Err(e)
            }
        }
    }

    /// Redis decides again (or `sync` mode does): says so once.
    fn shared_again(&self) {
        // A load first: the usual case writes nothing to the shared line.
        if self.degraded.load(Ordering::Relaxed) && self.degraded.swap(false, Ordering::Relaxed) {
            self.metrics.fallback.set(0);
            info!("redis answers again; limits are shared again");
        }
    }

    /// A request with `synced` limits in `sync` mode: decided in process
    /// against the fleet's totals ([`SyncTable`]) while the exchanges with
    /// Redis succeed; its other limits (if any) in Redis. While Redis
    /// cannot be used — the link down, the breaker open, the last exchange
    /// failed, or what the fallback admitted not pushed yet — `on_error`
    /// decides the whole request exactly as in exact mode, and its synced
    /// keys are queued so that the next exchange reads their totals before
    /// they are decided in process again.
    async fn decide_synced(
        &self,
        redis: &Arc<RedisStore>,
        now_ms: u64,
        requests: &[LimitRequest],
        sync: &[u64],
        synced: usize,
        on_error: Option<OnError>,
    ) -> Result<Decision, Undecided> {
        self.start_exchange(redis);
        self.cold_start(redis).await;
        if let Err(why) = self
            .sync_usable(redis, now_ms, requests, sync, synced)
            .await
        {
            // Whatever the fallback admits is not in the counts this
            // gateway holds: they are read again before it decides in sync
            // mode again.
            self.link.failed.store(true, Ordering::SeqCst);
            self.touch(now_ms, requests, sync, synced);
            let e = StoreError::Unavailable(why.into());
            return self.fail_over(&e, now_ms, requests, on_error);
        }
        let start = std::time::Instant::now();
        let decided = if synced == requests.len() {
            self.sync
                .decide(now_ms, requests, sync, Intent::Consume)
                .ok_or_else(garbage)
        } else {
            self.decide_mixed(redis, now_ms, requests, sync).await
        };
        self.metrics
            .sync_duration
            .observe(start.elapsed().as_secs_f64());
        match decided {
            Ok(d) => {
                self.shared_again();
                Ok(d)
            }
            Err(e) => self.fail_over(&e, now_ms, requests, on_error),
        }
    }

    /// Whether synced limits can be decided in process now: Redis is
    /// connected, the breaker closed, and the counts held are fresh — after
    /// a failure (an exchange that failed, or a decision the fallback
    /// made) an exchange is asked for at once and awaited, at most the
    /// store's timeout, as a decision waits for an outage's push in exact
    /// mode; and what the fallback admitted is pushed first.
    async fn sync_usable(
        &self,
        redis: &Arc<RedisStore>,
        now_ms: u64,
        requests: &[LimitRequest],
        sync: &[u64],
        synced: usize,
    ) -> Result<(), &'static str> {
        if !redis.is_connected() {
            return Err("not connected to Redis");
        }
        if !self.breaker.allows() {
            return Err("breaker open");
        }
        if self.link.failed.load(Ordering::SeqCst) {
            // Queued, so the exchange reads these keys.
            self.touch(now_ms, requests, sync, synced);
            let deadline = Instant::now() + self.resync.wait;
            if !self.link.refreshed(deadline).await {
                return Err(
                    "the counts held are not fresh: the exchange with Redis failed or is late",
                );
            }
        }
        if self.resync.mode.load(Ordering::SeqCst) != SHARED
            && self.catch_up(redis, now_ms).await != Gate::Redis
        {
            return Err("counts admitted in process are not in Redis yet");
        }
        Ok(())
    }

    /// Queues the synced keys of `requests` for the next exchange, which
    /// reads their totals, without deciding.
    fn touch(&self, now_ms: u64, requests: &[LimitRequest], sync: &[u64], synced: usize) {
        if synced == requests.len() {
            let _ = self.sync.decide(now_ms, requests, sync, Intent::Check);
            return;
        }
        let (synced, every): (Vec<LimitRequest>, Vec<u64>) = requests
            .iter()
            .zip(sync)
            .filter(|&(r, &every)| every > 0 && sync::syncable(r.algorithm))
            .map(|(r, &every)| (r.clone(), every))
            .unzip();
        let _ = self.sync.decide(now_ms, &synced, &every, Intent::Check);
    }

    /// Some limits synced, some decided in Redis: the synced ones are
    /// checked first, in process; only when they admit do the others go to
    /// Redis, and only when Redis admits too are the synced ones consumed.
    /// When the synced ones deny, Redis is asked at cost 0, which consumes
    /// nothing, for the other limits' headers.
    async fn decide_mixed(
        &self,
        redis: &Arc<RedisStore>,
        now_ms: u64,
        requests: &[LimitRequest],
        sync: &[u64],
    ) -> Result<Decision, StoreError> {
        let is_synced = |i: usize| sync[i] > 0 && sync::syncable(requests[i].algorithm);
        let (ours, theirs): (Vec<usize>, Vec<usize>) =
            (0..requests.len()).partition(|&i| is_synced(i));
        let pick = |idx: &[usize]| -> Vec<LimitRequest> {
            idx.iter().map(|&i| requests[i].clone()).collect()
        };
        let (synced, every): (Vec<LimitRequest>, Vec<u64>) =
            (pick(&ours), ours.iter().map(|&i| sync[i]).collect());
        let checked = self
            .sync
            .decide(now_ms, &synced, &every, Intent::Check)
            .ok_or_else(garbage)?;
        let mut exact = pick(&theirs);
        if !checked.allowed {
            for r in &mut exact {
                r.cost = 0;
            }
        }
        let asked = self.decide_in_redis(redis, now_ms, &exact).await?;
        let allowed = checked.allowed && asked.allowed;
        let synced_outcomes = if allowed {
            self.sync
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
            self.sync
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
    fn start_exchange(&self, redis: &Arc<RedisStore>) {
        self.exchange.get_or_init(|| {
            tokio::spawn(sync_task::run(SyncTask {
                table: Arc::clone(&self.sync),
                redis: Arc::clone(redis),
                breaker: Arc::clone(&self.breaker),
                link: Arc::clone(&self.link),
                resync: Arc::clone(&self.resync),
                instances: self.instances.clone(),
                metrics: self.metrics.clone(),
                clock: Arc::clone(&self.clock),
            }))
        });
    }

    /// Cold start: the first connection may be on its way. Waits for it at
    /// most the store's timeout, then `on_error` decides — never queues
    /// behind the connect. Once warm, one load and nothing else.
    async fn cold_start(&self, redis: &RedisStore) {
        if self.warming.load(Ordering::Relaxed) && !redis.is_connected() {
            redis.wait_connected(self.resync.wait).await;
        }
    }

    /// Asks Redis, unless the breaker is open or counts admitted in process
    /// during an outage have not reached it yet (they go first: docs/design.md#breaker-and-recovery).
    /// Whether Redis was called, and its answer.
    async fn ask_redis(
        &self,
        redis: &Arc<RedisStore>,
        now_ms: u64,
        requests: &[LimitRequest],
    ) -> (bool, Result<Decision, StoreError>) {
        self.cold_start(redis).await;
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
                // and counted as such (errors, breaker).
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
    ) -> Result<Decision, Undecided> {
        if !self.degraded.swap(true, Ordering::Relaxed) {
            self.metrics.fallback.set(1);
            warn!(error = %e, default_on_error = ?self.on_error, "redis cannot decide; deciding by on_error until it can");
        }
        match on_error.unwrap_or(self.on_error) {
            OnError::Allow => Err(Undecided::FailedOpen),
            OnError::Deny => Err(Undecided::Unavailable),
            OnError::Local => {
                let d = self.decide_locally(now_ms, requests);
                // Only an outage: a refusal or garbage would refuse the
                // push as well.
                if d.allowed && matches!(e, StoreError::Unavailable(_) | StoreError::Timeout) {
                    self.resync.record(now_ms, requests);
                }
                Ok(d)
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
                    begin_push(&self.resync, redis, &self.breaker, &self.metrics, now_ms);
                }
                _ => {}
            }
            if !self.resync.push_ended(deadline).await {
                return Gate::Behind;
            }
        }
    }

    /// Settles reservations at `now_ms` ([`super::settle`]) where
    /// the decisions are made: in Redis when it is configured (through the
    /// breaker; the store's timeout bounds the call), else in process.
    /// Counts what was settled and what was left standing; never panics,
    /// never waits past the store's timeout.
    ///
    /// # Errors
    /// Redis cannot settle them: the reservations stand.
    pub async fn settle(&self, now_ms: u64, settlements: &[Settlement]) -> Result<(), StoreError> {
        let n = settlements.len() as u64;
        let settled = match &self.redis {
            None => {
                self.memory.settle_now(now_ms, settlements);
                Ok(())
            }
            Some(r) if self.breaker.allows() => r.settle(now_ms, settlements).await,
            Some(_) => Err(StoreError::Unavailable("breaker open".into())),
        };
        match &settled {
            Ok(()) => self.metrics.settled.inc_by(n),
            Err(_) => self.metrics.settle_kept_store.inc_by(n),
        };
        settled
    }

    /// Counts reservations left standing because the response's value was
    /// missing or not a count.
    pub fn settle_kept_value(&self, n: u64) {
        self.metrics.settle_kept_value.inc_by(n);
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

/// The error of a synced key whose Redis counter holds something else.
fn garbage() -> StoreError {
    StoreError::Protocol("a synced key holds something other than its counter in Redis".into())
}
