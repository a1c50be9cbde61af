//! What the [`Limiter`](super::limiter::Limiter) holds of Redis, and the way a decision goes there:
//! the deny cache first, then the breaker and the way back after an
//! outage ([`Reachability`]), then the store; limits in `sync` mode are
//! decided against [`SyncMode`]'s counts instead. The limiter's module docs
//! tell the whole story.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{info, warn};

use super::reach::{Gate, Reach, Reachability, begin_push};
use super::sync::task::{self, SyncMode, SyncTask};
use super::sync::{Intent, is_synced};
use crate::config::{ClockSource, RedisConfig, StoreConfig};
use crate::limit::deny_cache::DenyCache;
use crate::limit::{Answer, LimitRequest, Standings};
use crate::metrics::StoreMetrics;
use crate::store::heartbeat::{self, Instances};
use crate::store::{Breaker, RedisStore, Store, StoreError};

/// Redis, when the store is configured with it, and all that reaching it
/// takes.
pub(super) struct RedisSide {
    pub(super) store: Arc<RedisStore>,
    /// Denials Redis answered, replayed locally until their Retry-After.
    pub(super) deny_cache: Option<Arc<DenyCache>>,
    pub(super) breaker: Arc<Breaker>,
    /// The live gateway instances sharing Redis, as the heartbeat counts
    /// them.
    pub(super) instances: Instances,
    /// Shared, down, behind or pushing, and the outage's backlog.
    pub(super) reach: Arc<Reachability>,
    /// A cold start: set until the first Redis connection is up or had its
    /// `connect_timeout` to come up. Meanwhile a decision waits for it at
    /// most the store's `timeout` before `on_error` decides, and the
    /// instance is not ready.
    warming: Arc<AtomicBool>,
    /// `sync` mode's counts and their exchange task.
    pub(super) synced: SyncMode,
    pub(super) metrics: StoreMetrics,
    /// The breaker's probe and the heartbeat; aborted on drop.
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for RedisSide {
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
    let up = store.wait_connected_or_refused(connect_timeout).await;
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

impl RedisSide {
    /// Connects (without waiting for the connection) and starts the
    /// breaker's probe, the heartbeat and the announcement of the first
    /// connection.
    pub(super) async fn start(cfg: &StoreConfig, r: &RedisConfig) -> Result<Self, StoreError> {
        let instances = Instances::default();
        let warming = Arc::new(AtomicBool::new(true));
        let store = Arc::new(RedisStore::connect(r).await?);
        // A Cluster breaks per node, in the store.
        let breaker = Arc::new(if store.is_clustered() {
            store.break_per_node(cfg.breaker.failures);
            Breaker::per_node(cfg.breaker)
        } else {
            Breaker::new(cfg.breaker)
        });
        store.use_server_clock(cfg.clock == ClockSource::Redis);
        // Serving starts at once; the first connection comes up meanwhile
        // (see `cold_start`).
        let tasks = vec![
            tokio::spawn(announce_connection(
                Arc::clone(&store),
                r.describe(),
                r.connect_timeout,
                Arc::clone(&warming),
            )),
            tokio::spawn(Arc::clone(&breaker).probe(Arc::clone(&store))),
            tokio::spawn(heartbeat::run(
                Arc::clone(&store),
                heartbeat::key(&cfg.prefix),
                store.instance_id().to_owned(),
                instances.clone(),
            )),
        ];
        Ok(Self {
            deny_cache: (cfg.deny_cache > 0).then(|| Arc::new(DenyCache::new(cfg.deny_cache))),
            reach: Arc::new(Reachability::new(r.timeout, cfg.breaker.probe_interval)),
            synced: SyncMode::default(),
            metrics: StoreMetrics::default(),
            store,
            breaker,
            instances,
            warming,
            tasks,
        })
    }

    /// Whether the cold start is still waiting for the first connection.
    pub(super) fn warming(&self) -> bool {
        self.warming.load(Ordering::Relaxed)
    }

    /// Cold start: the first connection may be on its way. Waits for it at
    /// most the store's timeout, then `on_error` decides — never queues
    /// behind the connect, and not at all while Redis refuses this gateway.
    /// Once warm, one load and nothing else.
    pub(super) async fn cold_start(&self) {
        if self.warming() && !self.store.is_connected() {
            self.store.wait_connected_or_refused(self.reach.wait).await;
        }
    }

    /// Decides `requests` in Redis (or from the deny cache).
    pub(super) async fn decide_in_redis(
        &self,
        now_ms: u64,
        requests: &[LimitRequest],
    ) -> Result<Answer, StoreError> {
        if let Some(d) = self
            .deny_cache
            .as_ref()
            .and_then(|c| c.get(now_ms, requests))
        {
            self.metrics.deny_cache_hits.inc();
            return Ok(d);
        }
        let (called, result) = self.ask_redis(now_ms, requests).await;
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

    /// Redis decides again (or `sync` mode does): says so once. In a
    /// Cluster, not while a node's breaker is open: its slots are still
    /// decided by `on_error`, and the state would flip with every request.
    pub(super) fn shared_again(&self) {
        if self.reach.fallback_active() && self.store.a_node_is_down() {
            return;
        }
        if self.reach.answered() {
            self.metrics.fallback.set(0);
            info!("redis answers again; limits are shared again");
        }
    }

    /// Asks Redis, unless the breaker is open or counts admitted in process
    /// during an outage have not reached it yet (they go first:
    /// docs/design.md#breaker-and-recovery). Whether Redis was called, and
    /// its answer.
    async fn ask_redis(
        &self,
        now_ms: u64,
        requests: &[LimitRequest],
    ) -> (bool, Result<Answer, StoreError>) {
        self.cold_start().await;
        let gate = if self.reach.ahead() {
            Gate::Redis
        } else {
            self.catch_up(now_ms).await
        };
        let called = self.breaker.allows() && gate != Gate::Behind;
        let result = if called {
            let start = std::time::Instant::now();
            let r = match gate {
                Gate::Redis => self.store.decide(now_ms, requests).await,
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

    /// Behind: starts the push when Redis looks usable (unless one failed
    /// a moment ago) and waits for it, at most the store's timeout. Where
    /// this decision goes.
    pub(super) async fn catch_up(&self, now_ms: u64) -> Gate {
        let deadline = Instant::now() + self.reach.wait;
        loop {
            match self.reach.get() {
                Reach::Shared | Reach::Down => return Gate::Redis,
                Reach::Behind => {
                    if !self.store.is_connected() {
                        return Gate::Down;
                    }
                    if !(self.breaker.allows() && self.reach.may_try()) {
                        return Gate::Behind;
                    }
                    begin_push(
                        &self.reach,
                        &self.store,
                        &self.breaker,
                        &self.metrics,
                        now_ms,
                    );
                }
                Reach::Pushing => {}
            }
            if !self.reach.push_ended(deadline).await {
                return Gate::Behind;
            }
        }
    }

    /// A request with `synced` limits in `sync` mode: decided in process
    /// against the fleet's totals ([`SyncTable`](super::sync::SyncTable))
    /// while the exchanges with Redis succeed; its other limits (if any) in Redis. While Redis
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
    ) -> Result<Answer, StoreError> {
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
    ) -> Result<Answer, StoreError> {
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
            .collect::<Option<Standings>>()
            .ok_or_else(|| StoreError::Protocol("an outcome is missing".into()))?;
        Ok(Answer { allowed, outcomes })
    }

    /// Starts `sync` mode's exchange task, once.
    fn start_exchange(&self) {
        self.synced.exchange.get_or_init(|| {
            tokio::spawn(task::run(SyncTask {
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
