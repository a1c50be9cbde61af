//! Redis store: counters shared by every gateway instance.
//!
//! [`limits.lua`](SCRIPT) decides every limit of a request, whatever its
//! algorithm, in one script call, so checking all limits and consuming from
//! all of them is one atomic step on the server
//! (docs/design.md#several-limits-on-one-request). On one server
//! (standalone or behind Sentinel) concurrent decisions share that call:
//! `batch` sends everything waiting as one `EVALSHA`, and the script
//! decides each request of the batch in turn, independently, exactly as a
//! call of its own would. In a Cluster each decision is still one
//! `EVALSHA` (a batch of one). The script takes
//! `now` as an argument — the store never reads a clock — so the conformance
//! table drives it exactly like the in-process store; with `clock: redis`
//! ([`RedisStore::use_server_clock`]) it is passed the word `TIME` and reads
//! the server's clock instead.
//!
//! Where Redis is — one server (TLS, ACL user, database), a Cluster, or a
//! master behind Sentinel — is [`topology`]'s business; a request whose keys
//! span several Cluster slots is decided by `cluster` (reserve in slot
//! order, refund on a later deny). `pool_size` clients are kept
//! (`clients`), each with its own link watcher, and decisions take the next
//! connected one.
//!
//! Availability is the other half of the design. The gateway must start and
//! keep serving when Redis is down, and a decision must never wait for a
//! reconnect:
//! - [`RedisStore::connect`] only starts the clients' connection tasks and
//!   returns; each reconnects forever with an exponential backoff from
//!   `reconnect.min` (100 ms) to `reconnect.max` (one second), plus up to
//!   `reconnect.jitter` (100 ms) at random so a fleet does not reconnect in
//!   step.
//! - While the link is down a decision is answered at once with
//!   [`StoreError::Unavailable`] instead of being queued until a reconnect.
//!   fred's client state alone is not enough: after a connection drops it
//!   still reads `Connected` while the router sleeps its first backoff, and
//!   commands sent then wait in its queue. So the store also watches fred's
//!   error and (re)connect events (`watch_link`) and counts the link down
//!   from the first error until the next connection. Commands also carry
//!   fred's per-command `fail_fast` for the instant in between.
//! - Every command is sent at most once (`max_attempts = 1`): an `EVALSHA`
//!   cut off by a dropped connection may already have consumed quota, so
//!   replaying it could count a request twice.
//! - The whole decision, script reload and waiting for its batch included,
//!   is bounded by [`RedisConfig::timeout`]; fred drops a command whose
//!   timeout passed before it was written.
//! - A connection whose oldest unanswered call is older than a few
//!   timeouts is left for a new one, and behind Sentinel the connections
//!   follow the master the sentinels name ([`follow`]), so a hung server
//!   turns into fast `Unavailable` answers rather than one timeout per
//!   request, and a failover is followed whether the old master died,
//!   froze or woke up. In a Cluster each node has a breaker of its own
//!   and the slot map is read from every node ([`nodes`]), so a silent
//!   master stops only its slots, and its promoted replica is followed.
//!
//! Two more halves of availability live beside the store:
//! [`fault`] tells a Redis that refuses this gateway (credentials, ACL,
//! TLS) from one that is away, for the log, the metrics and `/readyz`; and
//! [`backlog`] keeps what `on_error: local` admitted during an outage, which
//! [`RedisStore::push`] adds to the counters (`push`) before decisions
//! return here. Beside the store, on its public calls, run the
//! [`breaker`] that stops calling a failing Redis and probes it, and the
//! [`heartbeat`] that counts the live gateway instances.
//!
//! The script's SHA-1 is learned once from the server's `SCRIPT LOAD` reply
//! (fred's own SHA-1 needs its `sha-1` feature) and kept; a `NOSCRIPT` reply
//! (server restarted or `SCRIPT FLUSH`) loads it again and retries once.
//!
//! The files: this one holds [`RedisStore`] and what it answers; `clients`
//! the pool and its link watchers; [`follow`] the watchdog and the
//! Sentinel and Cluster followers that replace the pool's clients;
//! [`nodes`] a Cluster's slot map and per-node breakers; `commands` every command sent;
//! `script` the decision script's arguments and replies; `batch` and
//! `cluster` the two ways a decision travels; `push` the way back of an
//! outage's backlog; `sync` the exchange of `sync` mode's counts. This file imports them, and they import none of it;
//! only the breaker and the heartbeat, which run on the store's public
//! calls, name [`RedisStore`] (and nothing here names them).

pub mod admin;
pub mod backlog;
mod batch;
pub mod breaker;
mod clients;
mod cluster;
mod commands;
pub mod console;
pub mod failovers;
pub mod fault;
pub mod follow;
pub mod heartbeat;
pub mod leases;
pub mod nodes;
mod push;
mod script;
pub mod settle;
pub mod shares;
pub mod sync;
pub mod topology;

pub use cluster::REFUND;
pub use push::{PUSH, Pushed};
pub use script::SCRIPT;
pub use sync::SYNC;

use std::sync::Arc;
use std::time::Duration;

use fred::types::Value;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::config::{RedisConfig, RedisTopology};
use crate::limit::settle::Settlement;
use crate::limit::{Answer, LimitRequest};
use crate::store::contract::{Store, StoreError};
use backlog::Entry;
use clients::Clients;
use fault::{Fault, Health};
use script::Encoded;

/// The Redis-backed store. Cheap to share behind an `Arc`; dropping it stops
/// the connection tasks and the batching task.
pub struct RedisStore {
    /// The clients, shared with the batching task.
    clients: Arc<Clients>,
    /// Woken whenever a link comes up, for [`RedisStore::wait_connected`].
    came_up: Arc<Notify>,
    /// Collects concurrent decisions into one call; `None` for a Cluster,
    /// whose requests are decided one call each (see `batch`).
    batcher: Option<batch::Batcher>,
    /// The watchdog and, behind Sentinel, the follower (`follow`).
    followers: Vec<tokio::task::JoinHandle<()>>,
    /// This gateway's member of the live instances (`heartbeat`), which
    /// also names what it publishes for the console (`console`).
    instance: String,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("connected", &self.is_connected())
            .field("timeout", &self.clients.timeout)
            .finish_non_exhaustive()
    }
}

impl Drop for RedisStore {
    fn drop(&mut self) {
        // The clients are private to this store, so nothing else can use the
        // connection tasks once the store is gone.
        for task in &self.followers {
            task.abort();
        }
        self.clients.stop();
        // The batcher's own Drop stops its task.
    }
}

impl RedisStore {
    /// Starts clients for `cfg` (standalone, Cluster or Sentinel; see
    /// [`topology`]) and returns at once, connected or not: connections are
    /// made, and remade after failures, in the background. Until one is up,
    /// [`Store::decide`] answers [`StoreError::Unavailable`].
    ///
    /// Must be called inside a Tokio runtime.
    ///
    /// # Errors
    /// [`StoreError::Unavailable`] when `cfg` is not usable (a malformed
    /// URL, an unreadable CA file). Never because the server is down or
    /// unreachable.
    pub async fn connect(cfg: &RedisConfig) -> Result<RedisStore, StoreError> {
        let came_up = Arc::new(Notify::new());
        let clients = Arc::new(Clients::start(cfg, &came_up)?);
        // A Cluster keeps one call per request; a batch would have
        // to share one slot.
        let batcher = (!clients.clustered).then(|| batch::Batcher::start(Arc::clone(&clients)));
        let sentinel = match &cfg.topology {
            RedisTopology::Sentinel { service_name, .. } => Some(service_name.clone()),
            RedisTopology::Standalone | RedisTopology::Cluster { .. } => None,
        };
        let mut followers = vec![tokio::spawn(follow::watchdog(
            Arc::clone(&clients),
            sentinel.is_some(),
        ))];
        if clients.clustered {
            followers.push(tokio::spawn(follow::follow_cluster(
                Arc::clone(&clients),
                topology::fred_config(cfg)?,
            )));
        }
        if let Some(service) = sentinel {
            let template = topology::fred_config(cfg)?;
            followers.push(tokio::spawn(follow::follow(
                Arc::clone(&clients),
                template,
                service,
            )));
        }
        Ok(RedisStore {
            clients,
            came_up,
            batcher,
            followers,
            instance: Self::new_instance_id(),
        })
    }

    /// A random id for an instance: process id and a random number, so
    /// two processes (or two gateways in one test process) never share one.
    pub fn new_instance_id() -> String {
        use std::hash::{BuildHasher, RandomState};
        let random = RandomState::new().hash_one(std::time::SystemTime::now());
        format!("{}-{random:016x}", std::process::id())
    }

    /// This gateway's id among the live instances (`heartbeat`).
    pub fn instance_id(&self) -> &str {
        &self.instance
    }

    /// Waits at most `timeout` for a connection to be up; whether one is.
    /// Woken by the link watchers, not by polling.
    pub async fn wait_connected(&self, timeout: Duration) -> bool {
        self.wait_link(timeout, false).await
    }

    /// [`Self::wait_connected`] that ends at once, unless connected, while
    /// Redis refuses this gateway ([`Self::fault`]): waiting cannot mend a
    /// wrong password, a TLS mismatch or an unknown Sentinel service name.
    pub async fn wait_connected_or_refused(&self, timeout: Duration) -> bool {
        self.wait_link(timeout, true).await
    }

    async fn wait_link(&self, timeout: Duration, refused_ends: bool) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            // Created before the check, so a link coming up in between
            // still wakes it (`Notify::notify_waiters`).
            let came_up = self.came_up.notified();
            let refused = self.clients.health.raised_now.notified();
            if self.is_connected() {
                return true;
            }
            if refused_ends && self.fault().is_some() {
                return false;
            }
            let woken = async {
                tokio::select! {
                    () = came_up => {}
                    () = refused => {}
                }
            };
            if tokio::time::timeout_at(deadline, woken).await.is_err() {
                return self.is_connected();
            }
        }
    }

    /// Waits at most `timeout` for the store to have answered: a
    /// connection up and the decision script loaded; whether it has. Ends
    /// at once while Redis refuses this gateway.
    pub async fn wait_ready(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if !self.wait_connected_or_refused(left).await {
                return false;
            }
            if self.clients.load_script(deadline).await.is_ok() {
                return true;
            }
            // Refused (NOPERM): waiting cannot mend it.
            if self.fault().is_some() {
                return false;
            }
            // Connected but the load failed (the link dropped meanwhile, or
            // Redis refuses the script): try again shortly, until the
            // deadline.
            let retry = (Instant::now() + Duration::from_millis(50)).min(deadline);
            tokio::time::sleep_until(retry).await;
            if Instant::now() >= deadline {
                return false;
            }
        }
    }

    /// Whether a connection to Redis is up right now.
    pub fn is_connected(&self) -> bool {
        self.clients.is_connected()
    }

    /// Why Redis refuses this gateway, while it does: wrong
    /// credentials, a missing ACL permission, a TLS mismatch.
    pub fn fault(&self) -> Option<Fault> {
        self.clients.health.fault()
    }

    /// The refusals standing, for metrics.
    pub fn health(&self) -> &Health {
        &self.clients.health
    }

    /// The failovers followed, for metrics.
    pub fn failovers(&self) -> &failovers::Failovers {
        &self.clients.failovers
    }

    /// In a Cluster, each node's breaker opens after `failures`
    /// consecutive failures or timeouts of calls for its slots (`nodes`).
    pub fn break_per_node(&self, failures: u32) {
        if let Some(nodes) = &self.clients.nodes {
            nodes.set_failures(failures);
        }
    }

    /// In a Cluster, mirrors each node's breaker in `gauges` (1 open).
    pub fn export_node_breakers(&self, gauges: nodes::NodeGauges) {
        if let Some(nodes) = &self.clients.nodes {
            nodes.export(gauges);
        }
    }

    /// In a Cluster, whether the breaker of a node that owns slots is open.
    pub fn a_node_is_down(&self) -> bool {
        self.clients.nodes.as_ref().is_some_and(|n| n.any_open())
    }

    /// Whether the store talks to a Cluster (a call's keys must then share
    /// a slot).
    pub fn is_clustered(&self) -> bool {
        self.clients.clustered
    }

    /// `clock: redis`: from now on the scripts read Redis `TIME`.
    pub fn use_server_clock(&self, on: bool) {
        self.clients.use_server_clock(on);
    }

    /// One `PING`, bounded by `timeout`.
    ///
    /// # Errors
    /// Not connected, timed out, or anything but `PONG` came back.
    pub async fn ping(&self, timeout: Duration) -> Result<(), StoreError> {
        self.clients.ping(timeout).await
    }

    /// `EVAL script` over `keys` (all in one slot) and `args`, bounded by
    /// the store's timeout.
    ///
    /// # Errors
    /// As [`Store::decide`]: unavailable, timed out, or an error reply from
    /// the script.
    pub async fn eval(
        &self,
        script: &'static str,
        keys: &[&str],
        args: Vec<Value>,
    ) -> Result<Value, StoreError> {
        self.clients.eval(script, keys, args).await
    }

    /// [`Self::eval`] for a call no decision depends on: its refusal
    /// (a missing ACL permission) is returned, not recorded as a fault of
    /// the gateway, so it never makes `/readyz` fail.
    ///
    /// # Errors
    /// As [`Self::eval`].
    pub async fn eval_aside(
        &self,
        script: &'static str,
        keys: &[&str],
        args: Vec<Value>,
    ) -> Result<Value, StoreError> {
        self.clients.eval_aside(script, keys, args).await
    }

    /// `HGET key field`, bounded by the store's timeout like a decision.
    /// Used for the dynamic API-key → plan hash.
    ///
    /// # Errors
    /// [`StoreError`] when Redis cannot answer, or answers something other
    /// than a string or nil.
    pub async fn hget(&self, key: &str, field: &str) -> Result<Option<String>, StoreError> {
        self.clients.hget(key, field).await
    }

    /// Adds `entries` (taken from a [`Backlog`](backlog::Backlog)) to the
    /// Redis counters at `now_ms` with push.lua: one `EVAL` per Cluster
    /// slot (on one server, per batch of keys), at most 256 keys each, a
    /// few calls at a time, each bounded by the store's timeout.
    ///
    /// A call that fails returns its records in [`Pushed::failed`]. One
    /// cut off after Redis ran it would then be added twice when pushed
    /// again: those identities are denied early in that window, never
    /// admitted more.
    pub async fn push(&self, now_ms: u64, entries: Vec<(String, Entry)>) -> Pushed {
        push::send(&self.clients, now_ms, entries).await
    }

    /// `sync` mode: adds `deltas` (what this gateway admitted in process)
    /// to the counters at `now_ms` with sync.lua and answers each key's
    /// totals, in order: one `EVAL` per Cluster slot (on one server, per
    /// batch of keys), each bounded by the store's timeout.
    pub async fn sync(&self, now_ms: u64, deltas: &[sync::Delta]) -> Vec<sync::SyncAnswer> {
        sync::send(&self.clients, now_ms, deltas).await
    }
}

impl Store for RedisStore {
    async fn decide(&self, now_ms: u64, requests: &[LimitRequest]) -> Result<Answer, StoreError> {
        if requests.is_empty() {
            // Nothing to check; the in-process store answers the same.
            return Ok(Answer {
                allowed: true,
                outcomes: Default::default(),
            });
        }
        // fred bounds each command by what is left until the deadline; this
        // bounds the decision as a whole.
        let deadline = Instant::now() + self.clients.timeout;
        if let Some(batcher) = &self.batcher {
            // Fail fast, before queueing, while the link is down.
            if !self.is_connected() {
                return Err(StoreError::Unavailable("not connected to Redis".into()));
            }
            let encoded = Encoded::new(now_ms, requests, self.clients.server_clock())?;
            return batcher.decide(deadline, encoded).await;
        }
        // The Cluster paths hold fred's command futures (kilobytes); boxed,
        // so the batched path's future stays small and cheap to move.
        Box::pin(cluster::decide(&self.clients, deadline, now_ms, requests)).await
    }

    async fn settle(&self, now_ms: u64, settlements: &[Settlement]) -> Result<(), StoreError> {
        settle::send(&self.clients, now_ms, settlements).await
    }
}
