//! The decision phase: asks the configured store and applies the failure
//! policy when it cannot answer.
//!
//! With Redis configured every decision goes to Redis. When Redis fails or
//! times out, `on_error` decides: `allow` admits without a decision (no
//! `RateLimit` header is sent, since no count is known) and `local` decides
//! in an in-process store. The switch to and from the fallback is logged
//! once each way, not per request.
//!
//! In front of Redis sits the [deny cache](super::deny_cache): a request
//! Redis denied is denied again locally until its Retry-After, so a caller
//! hammering a closed limit costs no Redis call.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tracing::{info, warn};

use super::deny_cache::DenyCache;
use super::{Decision, LimitRequest};
use crate::config::{OnError, StoreConfig};
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
    /// Denials Redis answered, replayed locally until their Retry-After.
    deny_cache: Option<DenyCache>,
    on_error: OnError,
    degraded: AtomicBool,
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
        let deny_cache =
            (redis.is_some() && cfg.deny_cache > 0).then(|| DenyCache::new(cfg.deny_cache));
        Ok(Self {
            memory: MemoryStore::new(),
            redis,
            deny_cache,
            on_error: cfg.on_error,
            degraded: AtomicBool::new(false),
        })
    }

    /// The Redis store, when one is configured (for the API-key hash).
    pub fn redis(&self) -> Option<&RedisStore> {
        self.redis.as_ref()
    }

    /// Decides one request at `now_ms`.
    pub async fn decide(&self, now_ms: u64, requests: &[LimitRequest]) -> Verdict {
        let Some(redis) = &self.redis else {
            return Verdict::Decided(self.memory.decide_now(now_ms, requests));
        };
        if let Some(d) = self
            .deny_cache
            .as_ref()
            .and_then(|c| c.get(now_ms, requests))
        {
            return Verdict::Decided(d);
        }
        match redis.decide(now_ms, requests).await {
            Ok(d) => {
                if let Some(c) = &self.deny_cache {
                    c.insert(now_ms, requests, &d);
                }
                if self.degraded.swap(false, Ordering::Relaxed) {
                    info!("redis answers again; limits are shared again");
                }
                Verdict::Decided(d)
            }
            Err(e) => {
                if !self.degraded.swap(true, Ordering::Relaxed) {
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
                    OnError::Local => Verdict::Decided(self.memory.decide_now(now_ms, requests)),
                }
            }
        }
    }
}
