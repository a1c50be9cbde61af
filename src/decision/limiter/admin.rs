//! What the admin API asks of the limiter: a caller's counters read
//! without counting, reset, and the deny cache forgotten. A child of the
//! limiter because it reaches its stores and deny cache directly: a read
//! goes to the store itself, never to the deny cache or the failure
//! policy, so an operator sees the store's numbers or an error, never a
//! fallback's guess.

use super::Limiter;
use crate::limit::{Answer, LimitRequest};
use crate::store::{Store, StoreError};

impl Limiter {
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
        match &self.redis {
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
    pub async fn reset(&self, prefix: &str, keys: &[String]) -> Result<u64, StoreError> {
        let local = self.memory.remove(keys);
        match &self.redis {
            Some(side) => side.store.reset_keys(prefix, keys).await,
            None => Ok(local),
        }
    }

    /// Forgets every denial the deny cache holds.
    pub fn forget_denials(&self) {
        if let Some(c) = self
            .redis
            .as_ref()
            .and_then(|side| side.deny_cache.as_ref())
        {
            c.clear();
        }
    }
}
