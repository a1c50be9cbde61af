//! Gateway instances announce themselves in Redis, so each knows how many
//! share the limits.
//!
//! `on_error: local` enforces limits in process while Redis is away; with
//! `n` gateways behind a load balancer each must then admit about `1/n` of
//! a limit, or the fleet admits `n` times too much. Every instance runs
//! [`run`]: once per [`INTERVAL`] it adds itself, scored by Redis `TIME`, to
//! one sorted set, drops members older than [`TTL`], and reads the count.
//! The last count read survives an outage — that is the "last known number
//! of live instances" the fallback divides by.
//!
//! Why a sorted set on the server's clock: one key (one slot, fine in a
//! Cluster), one small script per beat, gateways with skewed clocks agree,
//! and an instance that died is forgotten after `TTL` without anyone
//! cleaning up. The key expires with its last member.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use fred::types::Value;
use tracing::debug;

use super::RedisStore;
use crate::store::keys;

/// How often an instance announces itself.
pub const INTERVAL: Duration = Duration::from_secs(1);
/// An instance not heard from for this long is no longer counted.
pub const TTL: Duration = Duration::from_secs(3);

/// The script; its header comment names `KEYS` and `ARGV`.
pub const SCRIPT: &str = include_str!("heartbeat.lua");

/// The number of live gateway instances, as last read from Redis.
#[derive(Debug, Clone)]
pub struct Instances(Arc<AtomicU64>);

impl Default for Instances {
    fn default() -> Self {
        Self(Arc::new(AtomicU64::new(1)))
    }
}

impl Instances {
    /// The last known count; at least 1 (this instance).
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed).max(1)
    }

    fn set(&self, n: u64) {
        self.0.store(n.max(1), Ordering::Relaxed);
    }
}

/// A random id for this instance: process id and a random number, so two
/// processes (or two gateways in one test process) never share one.
pub fn instance_id() -> String {
    RedisStore::new_instance_id()
}

/// The sorted set's key: `<prefix>{instances}` (its own hash tag).
pub fn key(prefix: &str) -> String {
    keys::instances(prefix)
}

/// Beats forever, updating `instances`; spawn it and abort it to stop.
/// A failed beat keeps the last count.
pub async fn run(store: Arc<RedisStore>, key: String, id: String, instances: Instances) {
    let mut tick = tokio::time::interval(INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let ttl = i64::try_from(TTL.as_millis()).unwrap_or(i64::MAX);
    loop {
        tick.tick().await;
        let args = vec![Value::from(id.as_str()), Value::Integer(ttl)];
        match store.eval(SCRIPT, &[key.as_str()], args).await {
            Ok(Value::Integer(n)) => match u64::try_from(n) {
                Ok(n) => instances.set(n),
                Err(_) => debug!(reply = n, "heartbeat: negative instance count"),
            },
            Ok(other) => debug!(reply = ?other, "heartbeat: reply is not a count"),
            Err(e) => debug!(error = %e, "heartbeat failed; keeping the last instance count"),
        }
    }
}
