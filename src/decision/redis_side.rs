//! What the [`Limiter`](super::limiter::Limiter) holds of Redis, and the way a decision goes there:
//! the deny cache first, then the breaker and the way back after an
//! outage ([`Reachability`]), then the store. The limiter's module docs
//! tell the whole story.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{info, warn};

use super::reach::{Gate, Reach, Reachability, begin_push};
use super::sync_task::Synced;
use crate::config::{ClockSource, RedisConfig, StoreConfig};
use crate::limit::deny_cache::DenyCache;
use crate::limit::{Decision, LimitRequest};
use crate::metrics::StoreMetrics;
use crate::store::heartbeat::{self, Instances};
use crate::store::{Breaker, RedisStore, Store, StoreError};

/// Redis, when the store is configured with it, and all that reaching it
/// takes.
pub(super) struct RedisSide {
    pub(super) store: Arc<RedisStore>,
    /// Denials Redis answered, replayed locally until their Retry-After.
    pub(super) deny_cache: Option<DenyCache>,
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
    pub(super) synced: Synced,
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
        let breaker = Arc::new(Breaker::new(cfg.breaker));
        let instances = Instances::default();
        let warming = Arc::new(AtomicBool::new(true));
        let store = Arc::new(RedisStore::connect(r).await?);
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
                heartbeat::instance_id(),
                instances.clone(),
            )),
        ];
        Ok(Self {
            deny_cache: (cfg.deny_cache > 0).then(|| DenyCache::new(cfg.deny_cache)),
            reach: Arc::new(Reachability::new(r.timeout, cfg.breaker.probe_interval)),
            synced: Synced::default(),
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
}

impl RedisSide {
    /// Decides `requests` in Redis (or from the deny cache).
    pub(super) async fn decide_in_redis(
        &self,
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

    /// Redis decides again (or `sync` mode does): says so once.
    pub(super) fn shared_again(&self) {
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
    ) -> (bool, Result<Decision, StoreError>) {
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
}
