//! How the store is doing, beside the [`Limiter`](super::limiter::Limiter)
//! that decides with it: whether decisions can be made (readiness, and
//! the waits for it at startup), Redis's link and why it refuses this
//! gateway, whether the failure policy is deciding, the breaker, the
//! live instances, and an outage's backlog. `/healthz`, `/readyz`,
//! serving's start and the metrics read it; nothing here decides.

use std::time::Duration;

use super::redis_side::RedisSide;
use crate::config::OnError;
use crate::store::BreakerState;
use crate::store::redis::fault::Fault;

/// The store's health and readiness, read from a
/// [`Limiter`](super::limiter::Limiter) (`Limiter::health`).
#[derive(Clone, Copy)]
pub struct StoreHealth<'a> {
    redis: Option<&'a RedisSide>,
    on_error: OnError,
}

impl<'a> StoreHealth<'a> {
    /// The health of a limiter holding `redis` (when configured) whose
    /// store's failure policy is `on_error`.
    pub(super) fn new(redis: Option<&'a RedisSide>, on_error: OnError) -> Self {
        Self { redis, on_error }
    }

    /// Waits at most `timeout` for Redis to be connected; whether it is
    /// (true at once without Redis). For callers that must not start
    /// before the store can share counts, such as tests.
    pub async fn wait_connected(&self, timeout: Duration) -> bool {
        match self.redis {
            Some(r) => r.store.wait_connected(timeout).await,
            None => true,
        }
    }

    /// Whether the store answered (Redis connected, script loaded) within
    /// `timeout`; true at once without Redis. Serving waits on it.
    pub async fn wait_ready(&self, timeout: Duration) -> bool {
        let Some(r) = self.redis else { return true };
        r.store.wait_ready(timeout).await
    }

    /// Whether decisions can be made: no Redis is configured, Redis is
    /// connected, or the `on_error` fallback answers while it is not
    /// (`deny` answers 503, so it does not count) — but at a cold start
    /// only once the first connection had its `connect_timeout` to come
    /// up: an instance is not put in service deciding in process when
    /// Redis is a moment away. Never while Redis refuses this gateway
    /// ([`Self::redis_fault`]): a wrong password or missing permission
    /// does not heal by itself, and a rollout that brought it should stop
    /// at this instance rather than serve every request by `on_error`
    /// unnoticed.
    pub fn is_ready(&self) -> bool {
        match self.redis {
            None => true,
            Some(r) => {
                r.store.fault().is_none()
                    && (r.store.is_connected()
                        || (matches!(self.on_error, OnError::Allow | OnError::Local)
                            && !r.warming()))
            }
        }
    }

    /// Why Redis refuses this gateway, while it does: wrong or missing
    /// credentials, a missing ACL permission, a TLS mismatch.
    pub fn redis_fault(&self) -> Option<Fault> {
        self.redis.and_then(|r| r.store.fault())
    }

    /// Whether Redis is configured and currently answering.
    pub fn redis_connected(&self) -> Option<bool> {
        self.redis.map(|r| r.store.is_connected())
    }

    /// Whether a Redis call failed since Redis last decided, so `on_error`
    /// is deciding.
    pub fn fallback_active(&self) -> bool {
        self.redis.is_some_and(|r| r.reach.fallback_active())
    }

    /// Whether decisions go to Redis (for metrics).
    pub fn breaker_state(&self) -> BreakerState {
        self.redis
            .map_or(BreakerState::Closed, |r| r.breaker.state())
    }

    /// The last known number of live gateway instances sharing Redis.
    pub fn live_instances(&self) -> u64 {
        self.redis.map_or(1, |r| r.instances.get())
    }

    /// Whether counts admitted in process during an outage wait to be added
    /// to Redis (decisions stay local until they are).
    pub fn behind_redis(&self) -> bool {
        self.redis.is_some_and(|r| !r.reach.ahead())
    }
}
