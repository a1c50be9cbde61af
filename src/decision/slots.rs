//! Where a gateway keeps its concurrency slots (docs/limits.md#concurrency-limits), and the guard
//! that gives them back: in process ([`MemoryLeases`]) without Redis or for
//! `on_error: local`, as leases in Redis ([`RedisLeases`]) with it, renewed
//! by one task per gateway every third of `store.redis.lease`. Lease
//! calls share the rate limits' breaker: they count towards opening it,
//! and while it is open the failure policy decides without calling Redis. What a
//! request does with its slots is [`concurrency`](super::concurrency)'s
//! business; this file knows nothing of requests, so the limiter can own it.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use smallvec::SmallVec;
use tokio::task::JoinHandle;
use tracing::debug;

use crate::config::{OnError, StoreConfig};
use crate::store::memory::leases::{MemoryLeases, Taken};
use crate::store::redis::leases::{Acquired, RedisLeases};
use crate::store::{Breaker, RedisStore, StoreError};

/// Where a gateway keeps its concurrency slots.
#[derive(Debug)]
pub struct Concurrency {
    /// Slots in process: without Redis, and for `on_error: local`.
    memory: Arc<MemoryLeases>,
    redis: Option<Arc<RedisLeases>>,
    /// The limiter's breaker: while it is open no lease call goes to Redis,
    /// and every lease call's failure counts towards opening it.
    breaker: Arc<Breaker>,
    on_error: OnError,
    renew_every: Duration,
    /// The renewal task, started with the first lease; aborted on drop.
    renewal: OnceLock<JoinHandle<()>>,
}

impl Drop for Concurrency {
    fn drop(&mut self) {
        if let Some(t) = self.renewal.get() {
            t.abort();
        }
    }
}

impl Concurrency {
    /// Slots for `cfg`'s store, in `redis` when it is configured.
    pub fn new(cfg: &StoreConfig, redis: Option<Arc<RedisStore>>, breaker: Arc<Breaker>) -> Self {
        let lease = cfg
            .redis
            .as_ref()
            .map_or(Duration::from_secs(10), |r| r.lease);
        Self {
            memory: Arc::new(MemoryLeases::new()),
            redis: redis.map(|r| Arc::new(RedisLeases::new(r, lease))),
            breaker,
            on_error: cfg.on_error,
            renew_every: lease / 3,
            renewal: OnceLock::new(),
        }
    }

    /// Slots of `key` held now: in Redis (every gateway's) when it is
    /// configured, else in process.
    ///
    /// # Errors
    /// Redis cannot answer.
    pub async fn held(&self, key: &str) -> Result<u64, StoreError> {
        match &self.redis {
            Some(r) => r.held(key).await,
            None => Ok(self.memory.held(key)),
        }
    }

    /// Slots held in process, all keys (the fallback's, or all of them
    /// without Redis) and leases this gateway holds in Redis.
    pub fn held_here(&self) -> (usize, usize) {
        (
            self.memory.keys(),
            self.redis.as_ref().map_or(0, |r| r.live()),
        )
    }

    fn start_renewal(&self, leases: &Arc<RedisLeases>) {
        self.renewal.get_or_init(|| {
            let leases = Arc::clone(leases);
            let every = self.renew_every;
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(every);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tick.tick().await;
                    leases.renew().await;
                }
            })
        });
    }

    /// Takes one of `cap` slots of `key`.
    pub(super) async fn take(
        &self,
        key: &str,
        cap: u64,
        on_error: Option<OnError>,
        instances: u64,
    ) -> Take {
        let Some(redis) = &self.redis else {
            return self.take_here(key, cap);
        };
        let failed = if !self.breaker.allows() {
            "breaker open".to_owned()
        } else if redis.is_connected() {
            let acquired = redis.acquire(key, cap).await;
            self.breaker.record(acquired.as_ref().map(drop));
            match acquired {
                Ok(Acquired::Held { serial, free }) => {
                    self.start_renewal(redis);
                    return Take::Held(
                        Slot::Redis {
                            leases: Arc::clone(redis),
                            serial,
                        },
                        free,
                    );
                }
                Ok(Acquired::Full) => return Take::Full,
                Err(e) => e.to_string(),
            }
        } else {
            "not connected to Redis".to_owned()
        };
        debug!(error = %failed, "a concurrency slot could not be taken in Redis; deciding by on_error");
        match on_error.unwrap_or(self.on_error) {
            OnError::Allow => Take::FailedOpen,
            OnError::Deny => Take::Unavailable,
            OnError::Local => self.take_here(key, (cap / instances.max(1)).max(1)),
        }
    }

    fn take_here(&self, key: &str, cap: u64) -> Take {
        match self.memory.acquire(key, cap) {
            Taken::Held { free } => Take::Held(
                Slot::Memory {
                    leases: Arc::clone(&self.memory),
                    key: key.to_owned(),
                },
                free,
            ),
            Taken::Full => Take::Full,
        }
    }
}

/// What taking one slot answered.
pub(super) enum Take {
    Held(Slot, u64),
    Full,
    /// The store failed and `on_error: allow` goes on without a slot.
    FailedOpen,
    /// The store failed and `on_error: deny` refuses.
    Unavailable,
}

/// One slot held.
pub(super) enum Slot {
    Memory {
        leases: Arc<MemoryLeases>,
        key: String,
    },
    Redis {
        leases: Arc<RedisLeases>,
        serial: u64,
    },
}

impl Drop for Slot {
    fn drop(&mut self) {
        match self {
            Self::Memory { leases, key } => leases.release(key),
            Self::Redis { leases, serial } => leases.release(*serial),
        }
    }
}

/// The concurrency slots one request holds; dropping it gives them back.
#[derive(Default)]
pub struct Slots(SmallVec<[Slot; 1]>);

impl std::fmt::Debug for Slots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Slots").field(&self.0.len()).finish()
    }
}

impl Slots {
    pub(super) fn push(&mut self, slot: Slot) {
        self.0.push(slot);
    }

    /// Whether no slot is held.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}
