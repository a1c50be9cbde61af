//! Where reserved costs are settled ([`Settler`]): the store side of
//! settling; what is settled and when is in [`super`].

use std::sync::Arc;

use crate::decision::redis_side::RedisSide;
use crate::limit::deny_cache::DenyCache;
use crate::limit::settle::Settlement;
use crate::metrics::StoreMetrics;
use crate::store::{Breaker, MemoryStore, RedisStore, Store, StoreError};

/// Settles reservations where the decisions are made: in Redis when it is
/// configured (through the breaker), else in the in-process store.
#[derive(Debug)]
pub struct Settler {
    memory: Arc<MemoryStore>,
    redis: Option<(Arc<RedisStore>, Arc<Breaker>)>,
    /// Redis's deny cache, told of every refund so that it never replays
    /// a denial the refund undid.
    deny_cache: Option<Arc<DenyCache>>,
    pub(in crate::decision) metrics: StoreMetrics,
}

impl Settler {
    pub(in crate::decision) fn new(
        memory: Arc<MemoryStore>,
        redis: Option<&RedisSide>,
        metrics: StoreMetrics,
    ) -> Self {
        Self {
            memory,
            redis: redis.map(|r| (Arc::clone(&r.store), Arc::clone(&r.breaker))),
            deny_cache: redis.and_then(|r| r.deny_cache.clone()),
            metrics,
        }
    }

    /// Settles `settlements` at `now_ms` ([`super::Reservations`]). Counts what
    /// was settled and what was left standing; never panics, never waits
    /// past the store's timeout.
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
            Some((redis, breaker)) if breaker.allows() => redis.settle(now_ms, settlements).await,
            Some(_) => Err(StoreError::Unavailable("breaker open".into())),
        };
        match &settled {
            Ok(()) => {
                self.metrics.settled.inc_by(n);
                for s in settlements {
                    if let Some(c) = &self.deny_cache
                        && s.delta() < 0
                    {
                        c.refunded(now_ms, &s.request.key.text());
                    }
                }
            }
            Err(_) => {
                self.metrics.settle_kept_store.inc_by(n);
            }
        }
        settled
    }

    /// Counts reservations left standing because the response's value was
    /// missing or not a count.
    pub fn kept_value(&self, n: u64) {
        self.metrics.settle_kept_value.inc_by(n);
    }

    /// Counts a reservation left standing for `reason` (a response body's
    /// usage missing or unreadable, the upstream's error, the client gone
    /// before any usage).
    pub fn kept(&self, reason: &'static str) {
        self.metrics.kept(reason);
    }
}
