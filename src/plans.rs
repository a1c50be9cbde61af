//! Plans per API key (docs/limits.md#plans-and-api-keys): which pricing tier a caller is on.
//!
//! A key's plan comes from the static `api_keys.keys` map, then — when
//! `api_keys.redis_hash` is on — from the Redis hash `<prefix>keys`
//! (`HGET <prefix>keys <key>` → plan name), so operators add or re-plan a
//! key with one `HSET` and no restart. Redis answers, including "no such
//! key", are kept in process for `api_keys.cache` (by the gateway's clock)
//! in a bounded LRU, so a busy key costs one `HGET` per cache period, not
//! one per request. When Redis cannot answer, the key is treated as unknown
//! for that request and nothing is cached, so the next request asks again.
//!
//! With `plans_from: claim:NAME` or `header:NAME` the request names its
//! plan itself ([`PlanResolver::plan_named`]): the verified claim, or the
//! header a trusted proxy set; a name the configuration does not define
//! counts as unknown.
//!
//! A key that is unknown everywhere (or a request without a key) gets the
//! `unknown` plan, or — with `unknown: reject` — a 401 on routes whose
//! limits come from plans. A Redis hash naming a plan this configuration
//! does not define is treated the same as an unknown key, and logged.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use hashlink::LruCache;
use tracing::warn;

use crate::config::{ApiKeyConfig, Plan, UnknownKey};
use crate::decision::limiter::Limiter;

/// Keys whose Redis answer is remembered at most.
const CACHE_ENTRIES: usize = 100_000;

/// What a caller is allowed under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlanChoice {
    /// This plan.
    Plan(Arc<str>),
    /// No plan: answer 401.
    Reject,
}

/// Resolves API keys to plans.
pub struct PlanResolver {
    keys: HashMap<String, Arc<str>>,
    plans: Vec<Arc<str>>,
    unknown: UnknownKey,
    redis_hash: Option<String>,
    ttl_ms: u64,
    /// Sharded so concurrent lookups of different keys do not queue.
    cache: Box<[Mutex<Cache>]>,
    hasher: RandomState,
    /// Redis lookups that failed.
    failures: AtomicU64,
}

const SHARDS: usize = 16;

/// Key → (plan, or none found; expiry in ms by the gateway's clock).
type Cache = LruCache<String, (Option<Arc<str>>, u64)>;

impl std::fmt::Debug for PlanResolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlanResolver")
            .field("static_keys", &self.keys.len())
            .field("redis_hash", &self.redis_hash)
            .finish_non_exhaustive()
    }
}

impl PlanResolver {
    /// A resolver for `cfg`, whose Redis hash (if any) is `<prefix>keys`.
    pub fn new(cfg: &ApiKeyConfig, plans: &[Plan], prefix: &str) -> Self {
        Self {
            keys: cfg.keys.clone(),
            plans: plans.iter().map(|p| p.name.clone()).collect(),
            unknown: cfg.unknown.clone(),
            redis_hash: cfg
                .redis_hash
                .then(|| crate::store::keys::api_key_hash(prefix)),
            ttl_ms: u64::try_from(cfg.cache.as_millis()).unwrap_or(u64::MAX),
            cache: (0..SHARDS)
                .map(|_| Mutex::new(LruCache::new(CACHE_ENTRIES / SHARDS)))
                .collect(),
            hasher: RandomState::new(),
            failures: AtomicU64::new(0),
        }
    }

    fn shard(&self, key: &str) -> std::sync::MutexGuard<'_, Cache> {
        // One insert or lookup per lock: a poisoned shard is consistent.
        self.cache[(self.hasher.hash_one(key) as usize) % SHARDS]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn unknown(&self) -> PlanChoice {
        match &self.unknown {
            UnknownKey::Plan(p) => PlanChoice::Plan(p.clone()),
            UnknownKey::Reject => PlanChoice::Reject,
        }
    }

    /// The plan a request names itself (`plans_from: claim:NAME` or
    /// `header:NAME`): that plan when this configuration defines it, else
    /// the plan of unknown callers (`api_keys.unknown`), as for an unknown
    /// API key.
    pub fn plan_named(&self, name: Option<&[u8]>) -> PlanChoice {
        let plan = name.and_then(|n| self.plans.iter().find(|p| p.as_bytes() == n));
        match plan {
            Some(p) => PlanChoice::Plan(p.clone()),
            None => self.unknown(),
        }
    }

    /// The plan of a caller presenting `api_key` (or none) at `now_ms`.
    pub async fn plan_of(
        &self,
        api_key: Option<&[u8]>,
        store: &Limiter,
        now_ms: u64,
    ) -> PlanChoice {
        let Some(key) = api_key.and_then(|k| std::str::from_utf8(k).ok()) else {
            return self.unknown();
        };
        if let Some(plan) = self.keys.get(key) {
            return PlanChoice::Plan(plan.clone());
        }
        let Some(hash) = &self.redis_hash else {
            return self.unknown();
        };
        let cached = {
            let mut cache = self.shard(key);
            match cache.get(key) {
                Some((plan, expires)) if now_ms < *expires => Some(plan.clone()),
                _ => None,
            }
        };
        let plan = match cached {
            Some(plan) => plan,
            None => match store.plan_store().lookup(hash, key).await {
                Ok(found) => {
                    let plan = found.and_then(|name| {
                        let known = self.plans.iter().find(|p| ***p == *name).cloned();
                        if known.is_none() {
                            warn!(plan = %name, "the API-key hash names a plan this configuration does not define; treating the key as unknown");
                        }
                        known
                    });
                    self.shard(key).insert(
                        key.to_owned(),
                        (plan.clone(), now_ms.saturating_add(self.ttl_ms)),
                    );
                    plan
                }
                Err(e) => {
                    // Logged at the 1st, 2nd, 4th, 8th … failure, so an
                    // outage does not flood the log.
                    let n = self.failures.fetch_add(1, Ordering::Relaxed) + 1;
                    if n.is_power_of_two() {
                        warn!(error = %e, failures_total = n, "API-key lookup in Redis failed; treating the key as unknown");
                    }
                    None
                }
            },
        };
        plan.map_or_else(|| self.unknown(), PlanChoice::Plan)
    }
}
