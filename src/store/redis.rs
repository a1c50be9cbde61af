//! Redis store: counters shared by every gateway instance.
//!
//! [`limits.lua`](SCRIPT) decides every limit of a request, whatever its
//! algorithm, in one script call, so checking all limits and consuming from
//! all of them is one atomic step on the server (DESIGN §4). On one server (standalone or behind Sentinel) concurrent
//! decisions share that call: `batch` sends everything waiting as one
//! `EVALSHA`, and the script decides each request of the batch in turn,
//! independently, exactly as a call of its own would. In a Cluster each
//! decision is still one `EVALSHA` (a batch of one). The script takes
//! `now` as an argument — the store never reads a clock — so the conformance
//! table drives it exactly like the in-process store; with `clock: redis`
//! ([`RedisStore::use_server_clock`]) it is passed the word `TIME` and reads
//! the server's clock instead.
//!
//! Where Redis is — one server (TLS, ACL user, database), a Cluster, or a
//! master behind Sentinel — is [`topology`]'s business; a request whose keys
//! span several Cluster slots is decided by `cluster` (reserve in slot
//! order, refund on a later deny). `pool_size` clients are kept, each with
//! its own link watcher, and decisions take the next connected one.
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
//! - A connection whose replies stop coming for a few timeouts is declared
//!   unresponsive and reconnected, so a hung server turns into fast
//!   `Unavailable` answers rather than one timeout per request.
//!
//! Two more halves of availability (issue 11) live beside the store:
//! [`fault`] tells a Redis that refuses this gateway (credentials, ACL,
//! TLS) from one that is away, for the log, the metrics and `/readyz`; and
//! [`backlog`] keeps what `on_error: local` admitted during an outage, which
//! [`RedisStore::push`] adds to the counters before decisions return here.
//!
//! The script's SHA-1 is learned once from the server's `SCRIPT LOAD` reply
//! (fred's own SHA-1 needs its `sha-1` feature) and kept; a `NOSCRIPT` reply
//! (server restarted or `SCRIPT FLUSH`) loads it again and retries once.

pub mod backlog;
mod batch;
mod cluster;
pub use cluster::REFUND;
mod commands;
pub mod fault;
pub mod topology;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use fred::bytes_utils::Str;
use fred::clients::Client;
use fred::error::{Error as FredError, ErrorKind};
use fred::interfaces::{ClientLike, EventInterface};
use fred::types::config::{
    ConnectionConfig, Options, ReconnectPolicy, TcpConfig, UnresponsiveConfig,
};
use fred::types::{Builder, ClusterHash, ConnectHandle, CustomCommand, Value};
use tokio::sync::Notify;
use tokio::sync::broadcast::error::RecvError;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use self::fault::{Fault, Health, LinkError, Op, Probe};
use super::{Store, StoreError};
use crate::config::{RedisConfig, RedisTopology};
use crate::limit::{Algorithm, Decision, LimitOutcome, LimitRequest, calendar};

/// The decision script; its header comment names `KEYS` and `ARGV`.
pub const SCRIPT: &str = concat!(
    include_str!("redis/arith.lua"),
    include_str!("redis/limits.lua")
);

/// `now` argument that makes the scripts read Redis `TIME` (`clock: redis`).
const SERVER_CLOCK: &str = "TIME";
/// Longer call timeouts are clamped to this, so deadlines cannot overflow.
const MAX_TIMEOUT: Duration = Duration::from_secs(3_600);

/// Arguments at or above 2^53 are refused: the script computes in doubles.
const MAX_ARG: u64 = 1 << 53;

/// The Redis-backed store. Cheap to share behind an `Arc`; dropping it stops
/// the connection tasks and the batching task.
pub struct RedisStore {
    /// The clients, shared with the batching task.
    clients: Arc<Clients>,
    timeout: Duration,
    /// `clock: redis`: the scripts read `TIME` instead of taking `now`.
    server_clock: AtomicBool,
    /// Woken whenever a link comes up, for [`RedisStore::wait_connected`].
    came_up: Arc<Notify>,
    /// Collects concurrent decisions into one call; `None` for a Cluster,
    /// whose requests are decided one call each (see `batch`).
    batcher: Option<batch::Batcher>,
}

/// The pool of clients and the script's SHA-1: what a script call needs.
struct Clients {
    /// `pool_size` clients; calls take them in turn (see [`Self::client`]).
    links: Vec<Link>,
    /// Round-robin position in `links`.
    next: AtomicUsize,
    sha: OnceLock<Str>,
    /// A Redis Cluster: one request's keys may sit in several slots.
    clustered: bool,
    /// Refusals standing (issue 11): wrong credentials, ACL, TLS.
    health: Arc<Health>,
}

/// One client of the pool and its link watcher.
struct Link {
    client: Client,
    /// fred's connection task.
    task: ConnectHandle,
    /// The [`watch_link`] task.
    watcher: JoinHandle<()>,
    /// No connection error since the last (re)connect.
    up: Arc<AtomicBool>,
}

impl Link {
    fn is_connected(&self) -> bool {
        self.up.load(Ordering::Acquire) && self.client.is_connected()
    }
}

/// One request's part of a script call: its keys and its shape, the
/// arguments it sends apart from its keys (see limits.lua's header).
struct Encoded {
    keys: Vec<Value>,
    shape: Vec<Value>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("connected", &self.is_connected())
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl Drop for RedisStore {
    fn drop(&mut self) {
        // The clients are private to this store, so nothing else can use the
        // connection tasks once the store is gone.
        for link in &self.clients.links {
            link.task.abort();
            link.watcher.abort();
        }
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
        let mut config = topology::fred_config(cfg)?;
        // Run the reconnect policy for the first connection too, instead of
        // giving up when Redis is down at startup.
        config.fail_fast = false;
        let timeout = cfg.timeout.min(MAX_TIMEOUT);
        let unresponsive = (timeout * 4).max(Duration::from_secs(1));
        let connect_timeout = cfg.connect_timeout.min(MAX_TIMEOUT);
        let ms = |d: Duration| u32::try_from(d.as_millis()).unwrap_or(u32::MAX);
        let mut policy = ReconnectPolicy::new_exponential(
            0, // retry forever
            ms(cfg.reconnect_min).max(1),
            ms(cfg.reconnect_max).max(1),
            2,
        );
        policy.set_jitter(ms(cfg.reconnect_jitter));
        let clustered = matches!(cfg.topology, RedisTopology::Cluster { .. });
        let mut links = Vec::with_capacity(cfg.pool_size.max(1));
        let came_up = Arc::new(Notify::new());
        let health = Arc::new(Health::new(cfg.describe()));
        // issue 11: where to ask when a failure may be TLS on one side only.
        let diagnosis = config.server.hosts().first().map(|server| Diagnosis {
            probe: Probe {
                host: server.host.to_string(),
                port: server.port,
                tls: config.tls.is_some(),
                timeout: connect_timeout,
            },
            running: AtomicBool::new(false),
        });
        let diagnosis = Arc::new(diagnosis);
        for _ in 0..cfg.pool_size.max(1) {
            let client = Builder::from_config(config.clone())
                .set_policy(policy.clone())
                .with_connection_config(|c| {
                    *c = ConnectionConfig {
                        connection_timeout: connect_timeout,
                        internal_command_timeout: connect_timeout,
                        max_command_attempts: 1,
                        unresponsive: UnresponsiveConfig {
                            max_timeout: Some(unresponsive),
                            interval: unresponsive / 4,
                        },
                        tcp: TcpConfig {
                            nodelay: Some(true),
                            ..TcpConfig::default()
                        },
                        ..ConnectionConfig::default()
                    };
                })
                .build()
                .map_err(|e| StoreError::Unavailable(format!("Redis client: {}", e.details())))?;
            // Subscribe before connecting, so the first connect event is seen.
            let up = Arc::new(AtomicBool::new(false));
            let watcher = watch_link(
                &client,
                Arc::clone(&up),
                Arc::clone(&came_up),
                Arc::clone(&health),
                Arc::clone(&diagnosis),
            );
            // `connect` spawns the connection task and does not wait for it.
            let task = client.connect();
            links.push(Link {
                client,
                task,
                watcher,
                up,
            });
        }
        let clients = Arc::new(Clients {
            links,
            next: AtomicUsize::new(0),
            sha: OnceLock::new(),
            clustered,
            health,
        });
        // issue 4: a Cluster keeps one call per request; a batch would have
        // to share one slot.
        let batcher = (!clustered).then(|| batch::Batcher::start(Arc::clone(&clients)));
        Ok(RedisStore {
            clients,
            timeout,
            server_clock: AtomicBool::new(false),
            came_up,
            batcher,
        })
    }

    /// Waits at most `timeout` for a connection to be up; whether one is.
    /// Woken by the link watchers, not by polling.
    pub async fn wait_connected(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            // Created before the check, so a link coming up in between
            // still wakes it (`Notify::notify_waiters`).
            let came_up = self.came_up.notified();
            if self.is_connected() {
                return true;
            }
            if tokio::time::timeout_at(deadline, came_up).await.is_err() {
                return self.is_connected();
            }
        }
    }

    /// Whether a connection to Redis is up right now.
    pub fn is_connected(&self) -> bool {
        self.clients.is_connected()
    }

    /// Why Redis refuses this gateway, while it does (issue 11): wrong
    /// credentials, a missing ACL permission, a TLS mismatch.
    pub fn fault(&self) -> Option<Fault> {
        self.clients.health.fault()
    }

    /// The refusals standing, for metrics.
    pub fn health(&self) -> &Health {
        &self.clients.health
    }

    /// The next connected client of the pool (the first one when none is).
    fn client(&self) -> &Client {
        self.clients.client()
    }

    /// `clock: redis`: from now on the scripts read Redis `TIME`.
    pub fn use_server_clock(&self, on: bool) {
        self.server_clock.store(on, Ordering::Relaxed);
    }

    /// Options for one command that must finish by `deadline`.
    fn options(deadline: Instant) -> Result<Options, StoreError> {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(StoreError::Timeout);
        }
        Ok(Options {
            fail_fast: true,
            max_attempts: Some(1),
            timeout: Some(left),
            ..Options::default()
        })
    }

    /// One request's keys and arguments for the script.
    fn encode(&self, now_ms: u64, requests: &[LimitRequest]) -> Result<Encoded, StoreError> {
        let mut shape = script_args(now_ms, requests)?;
        // issue 4 (clock: redis): the script reads TIME when `now` is "TIME".
        if self.server_clock.load(Ordering::Relaxed) {
            shape[1] = Value::from(SERVER_CLOCK);
        }
        let keys = requests
            .iter()
            .map(|r| Value::from(r.key.as_str()))
            .collect();
        Ok(Encoded { keys, shape })
    }

    /// Decides one request in a call of its own (a Cluster slot group).
    async fn decide_by(
        &self,
        deadline: Instant,
        now_ms: u64,
        requests: &[LimitRequest],
    ) -> Result<Decision, StoreError> {
        let encoded = self.encode(now_ms, requests)?;
        let slot = cluster::first_key_slot(requests);
        let reply = self
            .clients
            .call(deadline, slot, std::iter::once(&encoded))
            .await?;
        parse_replies(reply, std::iter::once(requests.len()))?
            .pop()
            .unwrap_or_else(|| Err(StoreError::Protocol("script reply is empty".into())))
    }
}

impl Clients {
    fn is_connected(&self) -> bool {
        self.links.iter().any(Link::is_connected)
    }

    /// The next connected client of the pool (the first one when none is).
    fn client(&self) -> &Client {
        let n = self.links.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        (0..n)
            .map(|i| &self.links[(start + i) % n])
            .find(|l| l.is_connected())
            .map_or(&self.links[start % n].client, |l| &l.client)
    }

    /// `SCRIPT LOAD`s the script and remembers the SHA-1 the server returns.
    async fn load_script(&self, deadline: Instant) -> Result<Str, StoreError> {
        // issue 4: in a Cluster the script is loaded on every primary.
        if self.clustered {
            return self.load_script_everywhere(deadline).await;
        }
        let cmd = CustomCommand::new_static("SCRIPT", ClusterHash::Random, false);
        let args = vec![Value::from("LOAD"), Value::from(SCRIPT)];
        let reply: Value = self
            .client()
            .with_options(&RedisStore::options(deadline)?)
            .custom(cmd, args)
            .await
            .map_err(store_error)?;
        let sha = match reply {
            Value::String(s) if s.len() == 40 => s,
            other => {
                return Err(StoreError::Protocol(format!(
                    "SCRIPT LOAD replied {other:?}, not a SHA-1"
                )));
            }
        };
        // Every load of the same script yields the same SHA-1, so a
        // concurrent first load storing it first is just as good.
        let _ = self.sha.set(sha.clone());
        Ok(sha)
    }

    /// One call of the script deciding `requests` (one or a batch), by
    /// `EVALSHA`; the script is loaded first when its SHA-1 is not known
    /// yet, and loaded again and the call retried once on `NOSCRIPT`.
    /// Fails fast while the link is down.
    async fn call<'a, I>(
        &self,
        deadline: Instant,
        slot: ClusterHash,
        requests: I,
    ) -> Result<Value, StoreError>
    where
        I: Iterator<Item = &'a Encoded> + Clone,
    {
        let result = self.call_once(deadline, slot, requests).await;
        self.health.observe(Op::Script, &result);
        result
    }

    /// [`Self::call`] before its outcome is told to the health record.
    async fn call_once<'a, I>(
        &self,
        deadline: Instant,
        slot: ClusterHash,
        requests: I,
    ) -> Result<Value, StoreError>
    where
        I: Iterator<Item = &'a Encoded> + Clone,
    {
        if !self.is_connected() {
            return Err(StoreError::Unavailable("not connected to Redis".into()));
        }
        let sha = match self.sha.get() {
            Some(sha) => sha.clone(),
            None => self.load_script(deadline).await?,
        };
        match self
            .evalsha(&sha, slot.clone(), requests.clone(), deadline)
            .await?
        {
            Some(reply) => Ok(reply),
            // Flushed or a new server: load and retry, once.
            None => {
                let sha = self.load_script(deadline).await?;
                self.evalsha(&sha, slot, requests, deadline)
                    .await?
                    .ok_or_else(|| StoreError::Protocol("NOSCRIPT right after SCRIPT LOAD".into()))
            }
        }
    }

    /// One `EVALSHA` of the script; `None` when the server does not know
    /// it (`NOSCRIPT`).
    async fn evalsha<'a, I>(
        &self,
        sha: &Str,
        slot: ClusterHash,
        requests: I,
        deadline: Instant,
    ) -> Result<Option<Value>, StoreError>
    where
        I: Iterator<Item = &'a Encoded> + Clone,
    {
        // issue 4: fred applies only `ClusterHash::Custom` to custom commands
        // (an `Offset` is ignored and the SHA-1 would be hashed), so the
        // caller computes the slot.
        let cmd = CustomCommand::new_static("EVALSHA", slot, false);
        let args = evalsha_args(sha, requests);
        let options = RedisStore::options(deadline)?;
        match self.client().with_options(&options).custom(cmd, args).await {
            Ok(reply) => Ok(Some(reply)),
            Err(e) if e.details().starts_with("NOSCRIPT") => Ok(None),
            Err(e) => Err(store_error(e)),
        }
    }
}

impl RedisStore {
    /// `HGET key field`, bounded by the store's timeout like a decision.
    /// Used for the dynamic API-key → plan hash.
    ///
    /// # Errors
    /// [`StoreError`] when Redis cannot answer, or answers something other
    /// than a string or nil.
    pub async fn hget(&self, key: &str, field: &str) -> Result<Option<String>, StoreError> {
        if !self.is_connected() {
            return Err(StoreError::Unavailable("not connected to Redis".into()));
        }
        let deadline = Instant::now() + self.timeout;
        // fred routes custom commands only by `ClusterHash::Custom`.
        let slot = ClusterHash::Custom(fred::util::redis_keyslot(key.as_bytes()));
        let cmd = CustomCommand::new_static("HGET", slot, false);
        let call = async {
            self.client()
                .with_options(&Self::options(deadline)?)
                .custom::<Value, Value>(cmd, vec![Value::from(key), Value::from(field)])
                .await
                .map_err(store_error)
        };
        let reply = tokio::time::timeout_at(deadline, call)
            .await
            .unwrap_or(Err(StoreError::Timeout));
        self.clients.health.observe(Op::Hget, &reply);
        match reply? {
            Value::Null => Ok(None),
            Value::String(s) => Ok(Some(s.to_string())),
            Value::Bytes(b) => String::from_utf8(b.to_vec())
                .map(Some)
                .map_err(|_| StoreError::Protocol("HGET replied bytes that are not UTF-8".into())),
            other => Err(StoreError::Protocol(format!(
                "HGET replied {other:?}, not a string"
            ))),
        }
    }
}

impl Store for RedisStore {
    async fn decide(&self, now_ms: u64, requests: &[LimitRequest]) -> Result<Decision, StoreError> {
        if requests.is_empty() {
            // Nothing to check; the in-process store answers the same.
            return Ok(Decision {
                allowed: true,
                outcomes: Default::default(),
            });
        }
        // fred bounds each command by what is left until the deadline; this
        // bounds the decision as a whole.
        let deadline = Instant::now() + self.timeout;
        if let Some(batcher) = &self.batcher {
            // Fail fast, before queueing, while the link is down.
            if !self.is_connected() {
                return Err(StoreError::Unavailable("not connected to Redis".into()));
            }
            let encoded = self.encode(now_ms, requests)?;
            return batcher.decide(deadline, encoded).await;
        }
        // The Cluster paths below hold fred's command futures (kilobytes);
        // boxed, so the batched path's future stays small and cheap to
        // move.
        // issue 4: keys in several Cluster slots, reserved slot by slot.
        if cluster::spans_slots(requests) {
            return Box::pin(self.decide_across_slots(deadline, now_ms, requests)).await;
        }
        Box::pin(tokio::time::timeout_at(
            deadline,
            self.decide_by(deadline, now_ms, requests),
        ))
        .await
        .unwrap_or(Err(StoreError::Timeout))
    }
}

/// Where to probe a suspect connection failure, and whether a probe is
/// under way (one at a time per store).
struct Diagnosis {
    probe: Probe,
    running: AtomicBool,
}

/// Keeps `link_up` in step with fred's events: down on any connection error,
/// up on every (re)connect (fred sends one on the first connection too).
///
/// Both are broadcast from fred's router task in order, an error before the
/// reconnect that repairs it; preferring errors (`biased`) when both are
/// waiting keeps that order here. A reconnect that fails after its event
/// (replaying buffered commands) leaves fred's state not `Connected`, which
/// [`RedisStore::is_connected`] also requires.
///
/// issue 11: each error is also sorted ([`fault::classify`]): a refusal
/// (credentials, TLS) is raised in `health`, a failure that may be TLS on
/// one side only starts a [`fault::probe`] (unless one is running), and a
/// connection made clears what connecting had raised.
fn watch_link(
    client: &Client,
    link_up: Arc<AtomicBool>,
    came_up: Arc<Notify>,
    health: Arc<Health>,
    diagnosis: Arc<Option<Diagnosis>>,
) -> JoinHandle<()> {
    let mut errors = client.error_rx();
    let mut connects = client.reconnect_rx();
    tokio::spawn(async move {
        loop {
            let up = tokio::select! {
                biased;
                e = errors.recv() => match e {
                    Ok((e, _)) => {
                        sort_link_error(&e, &health, &diagnosis);
                        false
                    }
                    Err(RecvError::Lagged(_)) => false,
                    Err(RecvError::Closed) => return,
                },
                c = connects.recv() => match c {
                    // Lagged: many reconnects went by; the latest pending
                    // error, if any, is read next and wins.
                    Ok(_) | Err(RecvError::Lagged(_)) => true,
                    Err(RecvError::Closed) => return,
                },
            };
            link_up.store(up, Ordering::Release);
            if up {
                health.clear(Op::Connect);
                came_up.notify_waiters();
            }
        }
    })
}

/// Raises a connection refusal, or probes a suspect failure in the
/// background (the watcher must keep reading events meanwhile).
fn sort_link_error(e: &FredError, health: &Arc<Health>, diagnosis: &Arc<Option<Diagnosis>>) {
    let Some(d) = diagnosis.as_ref() else {
        return;
    };
    match fault::classify(e, d.probe.tls) {
        LinkError::Fault(f) => health.raise(Op::Connect, f),
        LinkError::Outage => {}
        LinkError::Suspect => {
            if d.running.swap(true, Ordering::AcqRel) {
                return;
            }
            let (health, diagnosis) = (Arc::clone(health), Arc::clone(diagnosis));
            tokio::spawn(async move {
                if let Some(d) = diagnosis.as_ref() {
                    if let Some(f) = fault::probe(&d.probe).await {
                        health.raise(Op::Connect, f);
                    }
                    d.running.store(false, Ordering::Release);
                }
            });
        }
    }
}

/// One request's shape for the script: its number of limits, now, then
/// algorithm, limit, window, cost and burst per limit (for a calendar
/// month: the month's end and its index).
fn script_args(now_ms: u64, requests: &[LimitRequest]) -> Result<Vec<Value>, StoreError> {
    let mut argv = Vec::with_capacity(2 + 5 * requests.len());
    argv.push(Value::Integer(requests.len() as i64));
    argv.push(arg(now_ms, "now")?);
    for r in requests {
        // A calendar month is computed here, once, for both stores' sake:
        // the script is told the month index and when it ends.
        let (window, burst) = match r.algorithm {
            Algorithm::Gcra { burst } => (r.window_ms, burst),
            Algorithm::CalendarMonth => {
                let (index, end) = calendar::month(now_ms);
                (end, index)
            }
            _ => (r.window_ms, r.limit),
        };
        argv.push(arg(r.algorithm.code(), "algorithm")?);
        argv.push(arg(r.limit, "limit")?);
        argv.push(arg(window, "window")?);
        argv.push(arg(r.cost, "cost")?);
        argv.push(arg(burst, "burst")?);
    }
    Ok(argv)
}

/// `EVALSHA sha numkeys key... S shape... index...`: every request's keys,
/// each distinct shape once, then each request's shape index, in the same
/// order (limits.lua's header). Arguments are most of what a call costs
/// Redis per request, and a batch's requests mostly share a few shapes.
fn evalsha_args<'a>(sha: &Str, requests: impl Iterator<Item = &'a Encoded> + Clone) -> Vec<Value> {
    let mut shapes: Vec<&[Value]> = Vec::new();
    let mut indices = Vec::new();
    let mut keys = 0;
    for e in requests.clone() {
        keys += e.keys.len();
        let i = match shapes.iter().position(|s| *s == e.shape.as_slice()) {
            Some(i) => i,
            None => {
                shapes.push(&e.shape);
                shapes.len() - 1
            }
        };
        indices.push(Value::Integer(i as i64 + 1));
    }
    let shape_args: usize = shapes.iter().map(|s| s.len()).sum();
    let mut args = Vec::with_capacity(3 + keys + shape_args + indices.len());
    args.push(Value::String(sha.clone()));
    args.push(Value::Integer(keys as i64));
    for e in requests {
        args.extend(e.keys.iter().cloned());
    }
    args.push(Value::Integer(shapes.len() as i64));
    for s in shapes {
        args.extend(s.iter().cloned());
    }
    args.extend(indices);
    args
}

fn arg(v: u64, what: &str) -> Result<Value, StoreError> {
    if v < MAX_ARG {
        // Below 2^53, so it fits an i64.
        Ok(Value::Integer(v as i64))
    } else {
        Err(StoreError::Protocol(format!(
            "{what} {v} is not below 2^53, beyond what the script computes exactly"
        )))
    }
}

/// Classifies a fred error. No catch-all arm: a new error kind must be placed.
fn store_error(e: FredError) -> StoreError {
    let detail = e.details().to_owned();
    match e.kind() {
        ErrorKind::Timeout => StoreError::Timeout,
        // Canceled is what `fail_fast` answers while disconnected.
        ErrorKind::Canceled
        | ErrorKind::IO
        | ErrorKind::Backpressure
        | ErrorKind::Routing
        | ErrorKind::Config
        | ErrorKind::Url
        | ErrorKind::Cluster
        | ErrorKind::Tls
        | ErrorKind::Sentinel => StoreError::Unavailable(format!("{:?}: {detail}", e.kind())),
        // WRONGPASS, NOAUTH: the connection is not authenticated.
        ErrorKind::Auth => StoreError::Refused(detail),
        // issue 11: the ACL user lacks the command or the key pattern.
        ErrorKind::Unknown if detail.starts_with("NOPERM") => StoreError::Refused(detail),
        // Server error replies arrive as Unknown; the ones that mean "not
        // now" are outages, the rest (script errors) are garbage answers.
        ErrorKind::Unknown if is_transient_reply(&detail) => StoreError::Unavailable(detail),
        // issue 4: a Cluster redirect (MOVED/ASK, a stale slot map during a
        // failover or resharding) uses up the single attempt: an outage of
        // that slot, not garbage.
        ErrorKind::Unknown if detail.starts_with("Too many failed write attempts") => {
            StoreError::Unavailable(detail)
        }
        ErrorKind::Unknown
        | ErrorKind::InvalidCommand
        | ErrorKind::InvalidArgument
        | ErrorKind::Protocol
        | ErrorKind::Parse
        | ErrorKind::NotFound => StoreError::Protocol(detail),
    }
}

/// Redis error codes that say the server cannot serve right now.
fn is_transient_reply(detail: &str) -> bool {
    const CODES: [&str; 6] = [
        "LOADING",
        "BUSY",
        "MASTERDOWN",
        "READONLY",
        "OOM",
        "TRYAGAIN",
    ];
    let code = detail.split_whitespace().next().unwrap_or("");
    CODES.contains(&code)
}

/// Splits the script's reply into one result per request; `sizes` are the
/// requests' numbers of limits, in the order they were sent. A request the
/// script could not decide (garbage in one of its keys) is answered by its
/// error message and fails alone, as [`StoreError::Protocol`] like the error
/// reply of a call of its own.
///
/// # Errors
/// The reply as a whole is not one entry per request.
fn parse_replies(
    reply: Value,
    sizes: impl ExactSizeIterator<Item = usize>,
) -> Result<Vec<Result<Decision, StoreError>>, StoreError> {
    let Value::Array(items) = reply else {
        return Err(StoreError::Protocol("script reply is not an array".into()));
    };
    if items.len() != sizes.len() {
        return Err(StoreError::Protocol(format!(
            "script reply has {} entries for {} requests",
            items.len(),
            sizes.len()
        )));
    }
    Ok(items
        .into_iter()
        .zip(sizes)
        .map(|(item, n)| match item {
            Value::Array(_) => parse_reply(item, n),
            Value::String(msg) => Err(StoreError::Protocol(msg.to_string())),
            Value::Bytes(msg) => Err(StoreError::Protocol(
                String::from_utf8_lossy(&msg).into_owned(),
            )),
            other => Err(StoreError::Protocol(format!(
                "script reply holds {other:?}, not a decision"
            ))),
        })
        .collect())
}

/// Reads one request's flat reply: allowed, then per limit admits,
/// remaining, reset_ms and retry_after_ms (−1 for never).
fn parse_reply(reply: Value, n: usize) -> Result<Decision, StoreError> {
    let bad = |why: &str| StoreError::Protocol(format!("script reply {why}"));
    let Value::Array(items) = reply else {
        return Err(bad("is not an array"));
    };
    if items.len() != 1 + 4 * n {
        return Err(bad(&format!(
            "has {} items, expected {}",
            items.len(),
            1 + 4 * n
        )));
    }
    let ints = items
        .into_iter()
        .map(|v| match v {
            Value::Integer(i) => Ok(i),
            _ => Err(bad("holds a non-integer")),
        })
        .collect::<Result<Vec<i64>, _>>()?;
    let flag = |i: i64| match i {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err(bad("holds a flag that is not 0 or 1")),
    };
    let count = |i: i64| u64::try_from(i).map_err(|_| bad("holds a negative count"));
    let Some((&allowed, per_limit)) = ints.split_first() else {
        return Err(bad("is empty"));
    };
    let allowed = flag(allowed)?;
    let outcomes = per_limit
        .chunks_exact(4)
        .map(|o| {
            Ok(LimitOutcome {
                admits: flag(o[0])?,
                remaining: count(o[1])?,
                reset_ms: count(o[2])?,
                retry_after_ms: match o[3] {
                    -1 => None,
                    v => Some(count(v)?),
                },
            })
        })
        .collect::<Result<Vec<_>, StoreError>>()?;
    if allowed != outcomes.iter().all(|o| o.admits) {
        return Err(bad(
            "contradicts itself: allowed is not every limit admitting",
        ));
    }
    Ok(Decision {
        allowed,
        outcomes: outcomes.into(),
    })
}

#[cfg(test)]
mod tests;
