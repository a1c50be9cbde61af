//! The decision phase: asks the configured store and applies the failure
//! policy when it cannot answer.
//!
//! With Redis configured every decision goes to Redis. When Redis fails or
//! times out, `on_error` decides: `allow` admits without a decision (no
//! `RateLimit` header is sent, since no count is known) and `local` decides
//! in an in-process store. The switch to and from the fallback is logged
//! once each way, not per request.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tracing::{info, warn};

use super::{Decision, LimitRequest};
use crate::config::{OnError, StoreConfig};
use crate::metrics::StoreMetrics;
use crate::store::{MemoryStore, RedisStore, Store, StoreError};

/// How long startup waits for the first Redis connection.
const STARTUP_WAIT: Duration = Duration::from_secs(1);

/// A Redis URL without its password, for logs.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => format!("{}***{}", &url[..s + 3], &url[at..]),
        _ => url.to_owned(),
    }
}

/// Decides requests against the configured store.
pub struct Limiter {
    memory: MemoryStore,
    redis: Option<RedisStore>,
    on_error: OnError,
    degraded: AtomicBool,
    metrics: StoreMetrics,
}

impl std::fmt::Debug for Limiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Limiter")
            .field("redis", &self.redis.is_some())
            .field("on_error", &self.on_error)
            .finish_non_exhaustive()
    }
}

/// How a decision was reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The store decided.
    Decided(Decision),
    /// The store failed and `on_error: allow` admitted the request.
    FailedOpen,
}

impl Limiter {
    /// A limiter over `cfg`'s store. Never waits for Redis: when it is down
    /// at startup the gateway serves by the failure policy until it is up.
    ///
    /// # Errors
    /// The Redis configuration cannot be used at all (a malformed URL).
    pub async fn new(cfg: &StoreConfig) -> Result<Self, StoreError> {
        let redis = match &cfg.redis {
            Some(r) => {
                let store = RedisStore::connect(r).await?;
                // Give the first connection a moment so the first requests
                // are not decided locally for nothing; never wait longer.
                let deadline = tokio::time::Instant::now() + STARTUP_WAIT;
                while !store.is_connected() && tokio::time::Instant::now() < deadline {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                if !store.is_connected() {
                    warn!(url = %redact(&r.url), "redis not reachable at startup; serving by on_error until it is");
                }
                Some(store)
            }
            None => None,
        };
        Ok(Self {
            memory: MemoryStore::new(),
            redis,
            on_error: cfg.on_error,
            degraded: AtomicBool::new(false),
            metrics: StoreMetrics::default(),
        })
    }

    /// Records store latency, errors and the fallback state in `metrics`.
    pub fn with_metrics(mut self, metrics: StoreMetrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// Whether decisions can be made: no Redis is configured, Redis is
    /// connected, or the `on_error` fallback answers while it is not.
    pub fn is_ready(&self) -> bool {
        match &self.redis {
            None => true,
            Some(r) => r.is_connected() || matches!(self.on_error, OnError::Allow | OnError::Local),
        }
    }

    /// Whether Redis is configured and currently answering.
    pub fn redis_connected(&self) -> Option<bool> {
        self.redis.as_ref().map(RedisStore::is_connected)
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

    /// Decides one request at `now_ms`.
    pub async fn decide(&self, now_ms: u64, requests: &[LimitRequest]) -> Verdict {
        let Some(redis) = &self.redis else {
            return Verdict::Decided(self.decide_memory(now_ms, requests));
        };
        let start = std::time::Instant::now();
        let result = redis.decide(now_ms, requests).await;
        self.metrics
            .redis_duration
            .observe(start.elapsed().as_secs_f64());
        match result {
            Ok(d) => {
                if self.degraded.swap(false, Ordering::Relaxed) {
                    self.metrics.fallback.set(0);
                    info!("redis answers again; limits are shared again");
                }
                Verdict::Decided(d)
            }
            Err(e) => {
                self.metrics.errors.inc();
                if !self.degraded.swap(true, Ordering::Relaxed) {
                    self.metrics.fallback.set(1);
                    match self.on_error {
                        OnError::Allow => {
                            warn!(error = %e, "redis unavailable; admitting requests unchecked (on_error: allow)")
                        }
                        OnError::Local => {
                            warn!(error = %e, "redis unavailable; deciding in process (on_error: local)")
                        }
                    }
                }
                match self.on_error {
                    OnError::Allow => Verdict::FailedOpen,
                    OnError::Local => Verdict::Decided(self.decide_memory(now_ms, requests)),
                }
            }
        }
    }
}
