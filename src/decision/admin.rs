//! What the admin API asks of the stores, beside the
//! [`Limiter`](super::limiter::Limiter) that decides with them: a caller's
//! counters read without counting, reset, the deny cache forgotten, and
//! Redis for the overrides hash. It reaches the stores and the deny cache
//! directly: a read goes to the store itself, never to the deny cache or
//! the failure policy, so an operator sees the store's numbers or an
//! error, never a fallback's guess.

use super::redis_side::RedisSide;
use crate::limit::key::StoreKey;
use crate::limit::{Answer, LimitRequest};
use crate::store::{MemoryStore, RedisStore, Store, StoreError};

/// The stores as the admin API reaches them, read from a
/// [`Limiter`](super::limiter::Limiter) (`Limiter::admin`).
#[derive(Clone, Copy)]
pub struct LimiterAdmin<'a> {
    memory: &'a MemoryStore,
    redis: Option<&'a RedisSide>,
}

impl<'a> LimiterAdmin<'a> {
    /// The admin API's reach into `memory` and `redis` (when configured).
    pub(super) fn new(memory: &'a MemoryStore, redis: Option<&'a RedisSide>) -> Self {
        Self { memory, redis }
    }

    /// The Redis store, when one is configured.
    pub fn redis(&self) -> Option<&'a RedisStore> {
        self.redis.map(|r| &*r.store)
    }

    /// Reads `requests` (each only read, so nothing is consumed) at
    /// `now_ms` from the store that decides them: Redis when configured,
    /// else the in-process store.
    ///
    /// # Errors
    /// Redis cannot answer.
    pub async fn read<'r>(
        &self,
        now_ms: u64,
        requests: impl IntoIterator<Item = &'r LimitRequest>,
    ) -> Result<Answer, StoreError> {
        let read: Vec<LimitRequest> = requests.into_iter().map(LimitRequest::read_only).collect();
        match self.redis {
            Some(side) => side.store.decide(now_ms, &read).await,
            None => Ok(self.memory.decide_now(now_ms, &read)),
        }
    }

    /// Deletes the counters of `keys` in the in-process store and in
    /// Redis, whose generation is bumped so every gateway forgets its
    /// denials ([`Self::forget_denials`]); how many keys held counts.
    ///
    /// # Errors
    /// Redis cannot answer.
    pub async fn reset(&self, prefix: &str, keys: &[StoreKey]) -> Result<u64, StoreError> {
        let local = self.memory.remove(keys);
        match self.redis {
            Some(side) => {
                let texts: Vec<String> = keys.iter().map(ToString::to_string).collect();
                side.store.reset_keys(prefix, &texts).await
            }
            None => Ok(local),
        }
    }

    /// Forgets every denial the deny cache holds.
    pub fn forget_denials(&self) {
        if let Some(c) = self.redis.and_then(|side| side.deny_cache.as_ref()) {
            c.clear();
        }
    }
}
