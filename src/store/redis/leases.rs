//! Concurrency slots in Redis: leases with an expiry, so that
//! the slots of a gateway that dies are freed without anyone cleaning up.
//!
//! Each concurrency limit and caller is one sorted set
//! ([`lease.lua`](SCRIPT)): a request in flight is a member, a lease id
//! unique to this gateway, scored by when its lease expires on the Redis
//! server's clock. Taking a slot drops the expired leases and adds one when
//! fewer than the cap remain, in one script call; giving it back removes
//! the member. While a request lives its lease is renewed: one task per
//! gateway ([`RedisLeases::renew`], driven by the decision layer) pushes
//! every live lease's expiry out every third of the lease time, in one
//! call per Cluster slot (one call in all on a single server), at most
//! [`RENEW_BATCH`] leases each. A gateway killed with slots held stops
//! renewing them, and they are dropped by the next request that finds them
//! expired: within one lease time.
//!
//! A slot is given back from a guard's `Drop`, which must not wait: the
//! removal is spawned on the runtime. If it cannot be sent (Redis away, no
//! runtime), the lease expires by itself. A taking call that fails may
//! still have reached Redis (a timeout after the script ran), so its lease
//! is removed the same way before the failure is answered.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use fred::types::Value;
use tracing::debug;

use super::RedisStore;
use super::clients::slot_groups;
use super::heartbeat;
use crate::store::contract::StoreError;

/// The script; its header comment names `KEYS` and `ARGV`.
pub const SCRIPT: &str = include_str!("lease.lua");

/// Leases renewed by one call, at most.
pub const RENEW_BATCH: usize = 256;

/// What taking a slot in Redis answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acquired {
    /// The lease `serial` holds a slot; this many are still free.
    Held {
        /// The lease, for [`RedisLeases::release`].
        serial: u64,
        /// Slots left after this one.
        free: u64,
    },
    /// Every slot is held (by live leases); none was taken.
    Full,
}

/// This gateway's leases in Redis.
pub struct RedisLeases {
    store: Arc<RedisStore>,
    lease_ms: i64,
    /// Makes lease ids unique across gateways and restarts.
    instance: String,
    next: AtomicU64,
    /// The leases held now, by serial: their keys, for renewal and release.
    live: Mutex<HashMap<u64, String>>,
}

impl std::fmt::Debug for RedisLeases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisLeases")
            .field("lease_ms", &self.lease_ms)
            .field("live", &self.live())
            .finish_non_exhaustive()
    }
}

impl RedisLeases {
    /// Leases of `lease` in `store`.
    pub fn new(store: Arc<RedisStore>, lease: Duration) -> Self {
        Self {
            store,
            lease_ms: i64::try_from(lease.as_millis()).unwrap_or(i64::MAX),
            instance: heartbeat::instance_id(),
            next: AtomicU64::new(0),
            live: Mutex::default(),
        }
    }

    fn id(&self, serial: u64) -> String {
        format!("{}:{serial}", self.instance)
    }

    fn live_map(&self) -> std::sync::MutexGuard<'_, HashMap<u64, String>> {
        self.live.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether Redis is connected now: a slot is not asked of a link known
    /// to be down.
    pub fn is_connected(&self) -> bool {
        self.store.is_connected()
    }

    /// Takes one of `cap` slots of `key`, bounded by the store's timeout.
    ///
    /// # Errors
    /// [`StoreError`] when Redis cannot answer; no lease is kept then.
    pub async fn acquire(self: &Arc<Self>, key: &str, cap: u64) -> Result<Acquired, StoreError> {
        let serial = self.next.fetch_add(1, Ordering::Relaxed);
        let id = self.id(serial);
        let args = vec![
            Value::from("acquire"),
            Value::Integer(self.lease_ms),
            Value::Integer(i64::try_from(cap).unwrap_or(i64::MAX)),
            Value::from(id.as_str()),
        ];
        let reply = self.store.eval(SCRIPT, &[key], args).await;
        let taken = reply.and_then(|r| match r {
            Value::Array(items) => match items.as_slice() {
                [Value::Integer(1), Value::Integer(held)] => Ok(Some(*held)),
                [Value::Integer(0), Value::Integer(_)] => Ok(None),
                _ => Err(StoreError::Protocol(format!("lease reply {items:?}"))),
            },
            other => Err(StoreError::Protocol(format!("lease reply {other:?}"))),
        });
        match taken {
            Ok(Some(held)) => {
                self.live_map().insert(serial, key.to_owned());
                let held = u64::try_from(held).unwrap_or(cap);
                Ok(Acquired::Held {
                    serial,
                    free: cap.saturating_sub(held),
                })
            }
            Ok(None) => Ok(Acquired::Full),
            Err(e) => {
                // The script may have run before the call was cut off.
                self.remove(key.to_owned(), id);
                Err(e)
            }
        }
    }

    /// Gives back the lease `serial`: forgotten at once (no longer
    /// renewed), removed from Redis by a task of its own.
    pub fn release(self: &Arc<Self>, serial: u64) {
        let key = self.live_map().remove(&serial);
        if let Some(key) = key {
            self.remove(key, self.id(serial));
        }
    }

    /// Removes lease `id` of `key` in a spawned task; without a runtime
    /// (a gateway shutting down) it is left to expire.
    fn remove(self: &Arc<Self>, key: String, id: String) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let this = Arc::clone(self);
        rt.spawn(async move {
            let args = vec![Value::from("release"), Value::Integer(0), Value::from(id)];
            if let Err(e) = this.store.eval(SCRIPT, &[key.as_str()], args).await {
                debug!(error = %e, "a concurrency slot was not given back; its lease will expire");
            }
        });
    }

    /// Renews every live lease: one call per Cluster slot (one in all on a
    /// single server), at most [`RENEW_BATCH`] leases each. Returns how
    /// many calls failed; a lease whose renewal fails expires unless the
    /// next round reaches it in time.
    pub async fn renew(&self) -> usize {
        let live: Vec<(String, String)> = self
            .live_map()
            .iter()
            .map(|(&serial, key)| (key.clone(), self.id(serial)))
            .collect();
        if live.is_empty() {
            return 0;
        }
        let groups = slot_groups(
            self.store.is_clustered(),
            live.iter().map(|(k, _)| k.as_str()),
        );
        let mut failed = 0;
        for group in groups {
            let group: Vec<&(String, String)> = group.iter().map(|&i| &live[i]).collect();
            for chunk in group.chunks(RENEW_BATCH) {
                let keys: Vec<&str> = chunk.iter().map(|(k, _)| k.as_str()).collect();
                let mut args = Vec::with_capacity(2 + chunk.len());
                args.push(Value::from("renew"));
                args.push(Value::Integer(self.lease_ms));
                args.extend(chunk.iter().map(|(_, id)| Value::from(id.as_str())));
                if let Err(e) = self.store.eval(SCRIPT, &keys, args).await {
                    debug!(error = %e, leases = chunk.len(), "renewing concurrency leases failed");
                    failed += 1;
                }
            }
        }
        failed
    }

    /// The leases of `key` not expired, every gateway's.
    ///
    /// # Errors
    /// [`StoreError`] when Redis cannot answer.
    pub async fn held(&self, key: &str) -> Result<u64, StoreError> {
        let args = vec![Value::from("count"), Value::Integer(0)];
        match self.store.eval(SCRIPT, &[key], args).await? {
            Value::Integer(n) => Ok(u64::try_from(n).unwrap_or(0)),
            other => Err(StoreError::Protocol(format!("lease count {other:?}"))),
        }
    }

    /// Leases this gateway holds now.
    pub fn live(&self) -> usize {
        self.live_map().len()
    }
}
