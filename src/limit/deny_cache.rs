//! The deny cache (docs/design.md#the-deny-cache): a request Redis denied until `T` is denied
//! again locally until `T`, without a Redis call.
//!
//! Why this is safe — it never denies a request Redis would admit: every
//! algorithm's Retry-After is the first instant at which the denying limit
//! would admit the same request *if nothing else is admitted*, and other
//! admissions only push that instant later. So until `T` Redis would deny
//! the same request again. "The same request" is checked in full: an entry
//! is used only when every limit's key, algorithm, limit, window, cost and
//! burst are identical to the ones Redis decided — a cost change, a plan
//! change or a reloaded limit is a different request and goes to Redis.
//! `T` is the earliest instant at which any denying limit could turn, so the
//! replayed outcomes of the denying limits stay exact (shifted by the time
//! elapsed); the outcomes of limits that admitted are replayed as they were
//! (each limit without the refused request at the denial: a snapshot of its
//! remaining quota, never used to decide). The one case
//! the cache cannot see is state removed behind the gateway's back (an
//! operator deleting keys in Redis): such a caller waits out its Retry-After.
//!
//! Memory is bounded: a fixed number of entries in LRU order, spread over
//! shards so no global lock is taken.

use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};

use hashlink::LruCache;

use super::{Answer, LimitRequest};

const SHARDS: usize = 16;

/// A never-admissible request (cost above a limit) is remembered this long.
const NEVER_MS: u64 = 60_000;

struct Entry {
    requests: Vec<LimitRequest>,
    decision: Answer,
    at_ms: u64,
    until_ms: u64,
}

/// Denied requests, remembered until their earliest Retry-After.
pub struct DenyCache {
    shards: Box<[Mutex<LruCache<u64, Entry>>]>,
    hasher: RandomState,
    /// Per counter key (by hash), the last instant a settlement gave units
    /// back to it: an entry denied before then may deny what Redis would
    /// now admit, so it is dropped when next looked up.
    refunds: Mutex<LruCache<u64, u64>>,
    /// Whether `refunds` was ever written: until a settlement refunds, a
    /// cached denial is served without taking its lock.
    any_refund: AtomicBool,
    /// How many keys `refunds` holds before it starts over (clearing every
    /// entry with it, so none outlives the refund that should drop it).
    refunds_capacity: usize,
}

impl std::fmt::Debug for DenyCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DenyCache").finish_non_exhaustive()
    }
}

impl DenyCache {
    /// A cache holding at most `capacity` denied requests (at least one per
    /// shard).
    pub fn new(capacity: usize) -> Self {
        let per_shard = capacity.div_ceil(SHARDS).max(1);
        Self {
            shards: (0..SHARDS)
                .map(|_| Mutex::new(LruCache::new(per_shard)))
                .collect(),
            hasher: RandomState::new(),
            refunds: Mutex::new(LruCache::new_unbounded()),
            any_refund: AtomicBool::new(false),
            refunds_capacity: capacity.max(SHARDS),
        }
    }

    fn key_hash(&self, key: &str) -> u64 {
        self.hasher.hash_one(key)
    }

    /// Notes that a settlement gave units back to counter `key` at
    /// `now_ms`: a denial of a request counting on `key` answered before
    /// then is not replayed. Refunds are the usual settlement of a cost
    /// read from the response (a reservation is an upper bound), so this
    /// is one lock and one insert; the entries it stales are dropped when
    /// looked up.
    pub fn refunded(&self, now_ms: u64, key: &str) {
        let hash = self.key_hash(key);
        let mut refunds = self.refunds.lock().unwrap_or_else(PoisonError::into_inner);
        if refunds.len() >= self.refunds_capacity && !refunds.contains_key(&hash) {
            // Full: forgetting a refund could let a stale denial stand, so
            // every denial goes with the record.
            refunds.clear();
            drop(refunds);
            self.clear();
            refunds = self.refunds.lock().unwrap_or_else(PoisonError::into_inner);
        }
        refunds.insert(hash, now_ms);
        self.any_refund.store(true, Ordering::Release);
    }

    /// Whether a settlement gave units back to one of `requests`' keys at
    /// or after `at_ms`.
    fn refunded_since(&self, at_ms: u64, requests: &[LimitRequest]) -> bool {
        if !self.any_refund.load(Ordering::Acquire) {
            return false;
        }
        let mut refunds = self.refunds.lock().unwrap_or_else(PoisonError::into_inner);
        if refunds.is_empty() {
            return false;
        }
        requests.iter().any(|r| {
            refunds
                .get(&self.key_hash(&r.key.text()))
                .is_some_and(|&t| t >= at_ms)
        })
    }

    fn hash(&self, requests: &[LimitRequest]) -> u64 {
        self.hasher.hash_one(requests)
    }

    fn shard(&self, hash: u64) -> std::sync::MutexGuard<'_, LruCache<u64, Entry>> {
        // Every update is a single insert or remove: a poisoned shard is
        // still consistent.
        self.shards[(hash as usize) % SHARDS]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The decision to answer locally, if `requests` was denied until after
    /// `now_ms`.
    pub fn get(&self, now_ms: u64, requests: &[LimitRequest]) -> Option<Answer> {
        let hash = self.hash(requests);
        let mut shard = self.shard(hash);
        let entry = shard.get(&hash)?;
        if entry.requests != requests {
            return None;
        }
        if now_ms < entry.at_ms
            || now_ms >= entry.until_ms
            || self.refunded_since(entry.at_ms, &entry.requests)
        {
            shard.remove(&hash);
            return None;
        }
        let elapsed = now_ms - entry.at_ms;
        let mut decision = entry.decision.clone();
        for o in &mut decision.outcomes {
            o.reset_ms = o.reset_ms.saturating_sub(elapsed);
            if !o.admits {
                o.retry_after_ms = o.retry_after_ms.map(|r| r - elapsed);
            }
        }
        Some(decision)
    }

    /// Remembers a denial Redis answered at `now_ms`.
    pub fn insert(&self, now_ms: u64, requests: &[LimitRequest], decision: &Answer) {
        if decision.allowed {
            return;
        }
        let wait = decision
            .outcomes
            .iter()
            .filter(|o| !o.admits)
            .map(|o| o.retry_after_ms.unwrap_or(NEVER_MS))
            .min()
            .unwrap_or(0);
        if wait == 0 {
            return;
        }
        let hash = self.hash(requests);
        self.shard(hash).insert(
            hash,
            Entry {
                requests: requests.to_vec(),
                decision: decision.clone(),
                at_ms: now_ms,
                until_ms: now_ms.saturating_add(wait),
            },
        );
    }

    /// Forgets every denial, for when an operator resets counters or
    /// changes a caller's numbers: the denials held were answered on the
    /// counts and numbers being replaced.
    pub fn clear(&self) {
        for s in self.shards.iter() {
            s.lock().unwrap_or_else(PoisonError::into_inner).clear();
        }
    }

    /// Entries held; for tests.
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(PoisonError::into_inner).len())
            .sum()
    }

    /// True when nothing is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::{Algorithm, Standing};

    fn req(key: &str, cost: u64) -> Vec<LimitRequest> {
        vec![LimitRequest {
            key: key.into(),
            limit: 5,
            window_ms: 10_000,
            cost,
            algorithm: Algorithm::SlidingWindow,
            mode: Default::default(),
        }]
    }

    fn denied(retry: Option<u64>) -> Answer {
        Answer {
            allowed: false,
            outcomes: smallvec::smallvec![Standing {
                admits: false,
                remaining: 0,
                reset_ms: 15_000,
                retry_after_ms: retry,
            }],
        }
    }

    #[test]
    fn answers_until_retry_after_then_forgets() {
        let c = DenyCache::new(100);
        c.insert(1_000, &req("a", 1), &denied(Some(4_000)));
        let d = c.get(3_000, &req("a", 1)).unwrap();
        assert_eq!(d.outcomes[0].retry_after_ms, Some(2_000));
        assert_eq!(d.outcomes[0].reset_ms, 13_000);
        assert!(c.get(4_999, &req("a", 1)).is_some());
        assert!(c.get(5_000, &req("a", 1)).is_none());
        assert!(c.is_empty());
    }

    #[test]
    fn another_cost_or_limit_is_another_request() {
        let c = DenyCache::new(100);
        c.insert(0, &req("a", 2), &denied(Some(4_000)));
        assert!(c.get(1, &req("a", 1)).is_none());
        let mut other = req("a", 2);
        other[0].limit = 6;
        assert!(c.get(1, &other).is_none());
        assert!(c.get(1, &req("a", 2)).is_some());
    }

    #[test]
    fn bounded() {
        let c = DenyCache::new(32);
        for i in 0..10_000 {
            c.insert(0, &req(&format!("k{i}"), 1), &denied(Some(1_000)));
        }
        assert!(c.len() <= 32, "{}", c.len());
    }
}
