//! The pool of Redis clients a store calls through, and what every call
//! needs besides: the script's SHA-1 once it is learned, the call timeout,
//! the clock the scripts read and the refusals standing ([`Health`]).
//!
//! [`Clients::start`] builds `pool_size` links and starts their
//! connection tasks without waiting for them (see the parent module on
//! availability). Each link holds one client at a time ([`Conn`]) with a
//! link watcher ([`watch_link`]) that follows fred's error and (re)connect
//! events, so a link counts as down from its first error until it is up
//! again; calls take the next connected link in turn. A link's client is
//! replaced whole ([`Clients::replace`]) when its server stops answering or
//! the sentinels name another master (`follow`): the old client's
//! connection task is stopped, so nothing more is sent to the server it was
//! connected to. Behind Sentinel the links start empty and are filled once
//! the sentinels have named the master. The commands sent through the pool
//! are in `commands`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use fred::bytes_utils::Str;
use fred::clients::Client;
use fred::error::Error as FredError;
use fred::interfaces::{ClientLike, EventInterface};
use fred::types::config::Server;
use fred::types::config::{
    Config as FredConfig, ConnectionConfig, ReconnectPolicy, ServerConfig, TcpConfig,
    UnresponsiveConfig,
};
use fred::types::{Builder, ConnectHandle};
use fred::util::redis_keyslot;
use tokio::sync::Notify;
use tokio::sync::broadcast::error::RecvError;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::warn;

use super::failovers::{FailoverReason, Failovers};
use super::fault::{self, Health, LinkError, Op, Probe};
use super::nodes::Nodes;
use super::topology;
use crate::config::{RedisConfig, RedisTopology};
use crate::store::contract::StoreError;

/// Longer call timeouts are clamped to this, so deadlines cannot overflow.
const MAX_TIMEOUT: Duration = Duration::from_secs(3_600);

/// The pool of clients and what every call through it needs.
pub(super) struct Clients {
    /// `pool_size` clients; calls take them in turn (see [`Self::client`]).
    links: Vec<Link>,
    /// Round-robin position in `links`.
    next: AtomicUsize,
    /// The decision script's SHA-1, once a `SCRIPT LOAD` answered it.
    pub(super) sha: OnceLock<Str>,
    /// A Redis Cluster: one request's keys may sit in several slots.
    pub(super) clustered: bool,
    /// In a Cluster, the slot map and each node's breaker.
    pub(super) nodes: Option<Nodes>,
    /// Refusals standing: wrong credentials, ACL, TLS.
    pub(super) health: Arc<Health>,
    /// What one call (a decision, a command, a push) may take at most.
    pub(super) timeout: Duration,
    /// `clock: redis`: the scripts read `TIME` instead of taking `now`.
    server_clock: AtomicBool,
    /// What a link's client is built from.
    build: Build,
    /// Behind Sentinel, where the links' clients connect: the master the
    /// sentinels named last (`None` until they have).
    pub(super) master: std::sync::Mutex<Option<Server>>,
    /// Failovers followed, by reason.
    pub(super) failovers: Arc<Failovers>,
    /// Woken when a link saw a sign that the master moved (no reply, a
    /// closed connection, `READONLY`): the sentinels are asked at once.
    pub(super) ask_sentinels: Arc<Notify>,
    /// When the clients started; [`Conn::stuck_since`] counts from it.
    epoch: Instant,
}

/// What every client of the pool is built from.
struct Build {
    /// fred's configuration: the servers of the configuration (behind
    /// Sentinel, replaced by the master the sentinels named).
    config: FredConfig,
    policy: ReconnectPolicy,
    connection: ConnectionConfig,
    came_up: Arc<Notify>,
    diagnosis: Arc<Option<Diagnosis>>,
}

/// One link of the pool: the client it calls through now.
struct Link {
    conn: ArcSwapOption<Conn>,
}

/// One client, its connection task and its link watcher.
pub(super) struct Conn {
    pub(super) client: Client,
    /// The server it was built for, for log lines (`host:port`), or the
    /// deployment's description.
    pub(super) server: String,
    /// The connection task ([`first_connection`]).
    task: ConnectHandle,
    /// The [`watch_link`] task.
    watcher: JoinHandle<()>,
    /// No connection error since the last (re)connect.
    up: Arc<AtomicBool>,
    /// Milliseconds after [`Clients::epoch`], plus one, at which the oldest
    /// call still unanswered was sent: a call that timed out with no reply
    /// on this client since. 0 while every call was answered.
    pub(super) stuck_since: AtomicU64,
    /// A reply said this server is a replica (`READONLY`).
    pub(super) replica: AtomicBool,
}

impl Conn {
    fn is_connected(&self) -> bool {
        self.up.load(Ordering::Acquire) && self.client.is_connected()
    }

    /// Stops the connection task and the watcher: fred's router ends, its
    /// socket is closed, and commands still queued fail.
    fn stop(&self) {
        self.task.abort();
        self.watcher.abort();
    }
}

/// A client beside the pool; dropping it stops its connection task.
pub(super) struct SideClient {
    pub(super) client: Client,
    task: ConnectHandle,
}

impl Drop for SideClient {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Clients {
    /// Starts the clients for `cfg` and returns at once, connected or not
    /// (see `RedisStore::connect`); `came_up` is woken whenever a link
    /// comes up. Must be called inside a Tokio runtime.
    ///
    /// # Errors
    /// [`StoreError::Unavailable`] when `cfg` is not usable.
    pub(super) fn start(cfg: &RedisConfig, came_up: &Arc<Notify>) -> Result<Clients, StoreError> {
        let mut config = topology::fred_config(cfg)?;
        // One attempt at once for the first connection: fred, when it runs
        // its reconnect policy for the first connection, sleeps one delay
        // of the policy before its first attempt (`reconnect.min` plus
        // jitter, 100 to 200 ms by default), which would make a Redis on
        // the same machine take that long to reach. `first_connection`
        // retries by the same policy while Redis is down; once connected,
        // fred's own reconnects follow the policy.
        config.fail_fast = true;
        let timeout = cfg.timeout.min(MAX_TIMEOUT);
        let connect_timeout = cfg.connect_timeout.min(MAX_TIMEOUT);
        let policy = reconnect_policy(cfg);
        let health = Arc::new(Health::new(cfg.describe()));
        let diagnosis = Arc::new(diagnosis(&config, connect_timeout));
        let sentinel = matches!(cfg.topology, RedisTopology::Sentinel { .. });
        let clustered = matches!(cfg.topology, RedisTopology::Cluster { .. });
        let clients = Clients {
            links: (0..cfg.pool_size.max(1))
                .map(|_| Link {
                    conn: ArcSwapOption::empty(),
                })
                .collect(),
            next: AtomicUsize::new(0),
            sha: OnceLock::new(),
            clustered,
            nodes: clustered.then(Nodes::default),
            health,
            timeout,
            server_clock: AtomicBool::new(false),
            build: Build {
                config,
                policy,
                connection: connection_config(timeout, connect_timeout, clustered),
                came_up: Arc::clone(came_up),
                diagnosis,
            },
            master: std::sync::Mutex::new(None),
            failovers: Arc::new(Failovers::default()),
            ask_sentinels: Arc::new(Notify::new()),
            epoch: Instant::now(),
        };
        // Behind Sentinel the links wait for the sentinels to name the
        // master (`follow`).
        if !sentinel {
            for link in &clients.links {
                link.conn.store(Some(clients.new_conn(None)?));
            }
        }
        Ok(clients)
    }

    /// A new client, connecting in the background: to `server` (the
    /// master the sentinels named, or a Cluster's current masters), or to
    /// the servers of the configuration.
    fn new_conn(&self, server: Option<ServerConfig>) -> Result<Arc<Conn>, StoreError> {
        let b = &self.build;
        let mut config = b.config.clone();
        let described = match server {
            Some(ServerConfig::Centralized { server }) => {
                let described = server.to_string();
                config.server = ServerConfig::Centralized { server };
                described
            }
            Some(other) => {
                config.server = other;
                self.health.redis().to_owned()
            }
            None => self.health.redis().to_owned(),
        };
        let connection = b.connection.clone();
        let client = Builder::from_config(config)
            .set_policy(b.policy.clone())
            .with_connection_config(|c| *c = connection)
            .build()
            .map_err(|e| StoreError::Unavailable(format!("Redis client: {}", e.details())))?;
        // Subscribe before connecting, so the first connect event is seen.
        let up = Arc::new(AtomicBool::new(false));
        let closed = Arc::new(AtomicBool::new(false));
        let watcher = watch_link(
            &client,
            Watched {
                link_up: Arc::clone(&up),
                closed,
                came_up: Arc::clone(&b.came_up),
                health: Arc::clone(&self.health),
                diagnosis: Arc::clone(&b.diagnosis),
                ask_sentinels: Arc::clone(&self.ask_sentinels),
                failovers: Arc::clone(&self.failovers),
                server: described.clone(),
            },
        );
        // Spawned, not awaited: the first connection is made in the
        // background.
        let task = tokio::spawn(first_connection(client.clone(), Some(b.policy.clone())));
        Ok(Arc::new(Conn {
            client,
            server: described,
            task,
            watcher,
            up,
            stuck_since: AtomicU64::new(0),
            replica: AtomicBool::new(false),
        }))
    }

    /// Replaces link `i`'s client by a new one connecting to `server` (or
    /// to the configuration's servers); the old client is stopped at once.
    pub(super) fn replace(&self, i: usize, server: Option<&Server>) {
        let Some(link) = self.links.get(i) else {
            return;
        };
        let server = server.map(|s| ServerConfig::Centralized { server: s.clone() });
        match self.new_conn(server) {
            // Dropping the last handle of the old one stops it; a call
            // holding it meanwhile fails (its router is gone).
            Ok(conn) => {
                if let Some(old) = link.conn.swap(Some(conn)) {
                    old.stop();
                }
            }
            Err(e) => warn!(error = %e, "could not build a new Redis client"),
        }
    }

    /// Cluster: replaces every link's client by a new one seeded with
    /// `seeds` (the current masters, the promoted ones first), once all of
    /// them are connected, within `connect_timeout`. Until that moment the
    /// old clients keep serving, so the slots that did not move are decided
    /// throughout; they are stopped one call timeout after it, when the
    /// calls that took them before the swap are over. Whether the links
    /// moved.
    pub(super) async fn rebuild(&self, seeds: &[Server]) -> bool {
        let ServerConfig::Clustered { policy, .. } = &self.build.config.server else {
            return false;
        };
        let within = self.build.connection.connection_timeout;
        let mut fresh = Vec::with_capacity(self.links.len());
        for _ in &self.links {
            let server = ServerConfig::Clustered {
                hosts: seeds.to_vec(),
                policy: policy.clone(),
            };
            match self.new_conn(Some(server)) {
                Ok(conn) => fresh.push(conn),
                Err(e) => {
                    warn!(error = %e, "could not build a new Redis client");
                    return false;
                }
            }
        }
        let deadline = Instant::now() + within;
        for conn in &fresh {
            loop {
                let came_up = self.build.came_up.notified();
                if conn.is_connected() {
                    break;
                }
                if tokio::time::timeout_at(deadline, came_up).await.is_err() {
                    // Dropping `fresh` stops the new clients.
                    return false;
                }
            }
        }
        // Calls that took an old client just before the swap finish on it
        // (each is bounded by the call timeout); then it is stopped.
        let old: Vec<Arc<Conn>> = self
            .links
            .iter()
            .zip(fresh)
            .filter_map(|(link, conn)| link.conn.swap(Some(conn)))
            .collect();
        let grace = self.timeout;
        tokio::spawn(async move {
            tokio::time::sleep(grace).await;
            for conn in old {
                conn.stop();
            }
        });
        true
    }

    /// A client beside the pool (one per sentinel), built like the
    /// pool's from `config` and connecting in the background; its
    /// connection task ends when it is dropped.
    pub(super) fn side_client(&self, config: FredConfig) -> Option<SideClient> {
        let connection = self.build.connection.clone();
        let client = Builder::from_config(config)
            .set_policy(self.build.policy.clone())
            .with_connection_config(|c| *c = connection)
            .build()
            .ok()?;
        let task = tokio::spawn(first_connection(
            client.clone(),
            Some(self.build.policy.clone()),
        ));
        Some(SideClient { client, task })
    }

    /// The links' clients now, by link index (`None`: not built yet).
    pub(super) fn conns(&self) -> Vec<Option<Arc<Conn>>> {
        self.links.iter().map(|l| l.conn.load_full()).collect()
    }

    /// Stops every client's connection task and link watcher.
    pub(super) fn stop(&self) {
        for link in &self.links {
            if let Some(conn) = link.conn.swap(None) {
                conn.stop();
            }
        }
    }

    /// Whether a connection to Redis is up right now.
    pub(super) fn is_connected(&self) -> bool {
        self.links
            .iter()
            .any(|l| l.conn.load().as_ref().is_some_and(|c| c.is_connected()))
    }

    /// The next connected client of the pool (the first one when none is).
    ///
    /// # Errors
    /// [`StoreError::Unavailable`] behind Sentinel before the sentinels
    /// named a master.
    pub(super) fn conn(&self) -> Result<Arc<Conn>, StoreError> {
        let n = self.links.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let mut first = None;
        for i in 0..n {
            let Some(conn) = self.links[(start + i) % n].conn.load_full() else {
                continue;
            };
            if conn.is_connected() {
                return Ok(conn);
            }
            first.get_or_insert(conn);
        }
        first.ok_or_else(|| StoreError::Unavailable("no Redis master known yet".into()))
    }

    /// Records what one call sent at `sent` through `conn` for `slot`
    /// returned: a reply (even an error reply) means the server answers; a
    /// timeout leaves the call unanswered, and the oldest such call is what
    /// the watchdog (`follow`) measures. `READONLY` says the server is a
    /// replica. In a Cluster the outcome also goes to the breaker of the
    /// node that owns `slot`.
    pub(super) fn observe<T>(
        &self,
        conn: &Conn,
        sent: Instant,
        slot: Option<u16>,
        result: &Result<T, StoreError>,
    ) {
        if let (Some(nodes), Some(slot)) = (&self.nodes, slot) {
            nodes.record(slot, result);
        }
        match result {
            Ok(_) | Err(StoreError::Protocol(_) | StoreError::Refused(_)) => {
                if conn.stuck_since.load(Ordering::Relaxed) != 0 {
                    conn.stuck_since.store(0, Ordering::Relaxed);
                }
                self.failovers.answered();
            }
            Err(StoreError::Timeout) => {
                let at = self.millis(sent) + 1;
                let _ =
                    conn.stuck_since
                        .compare_exchange(0, at, Ordering::Relaxed, Ordering::Relaxed);
            }
            Err(StoreError::Unavailable(words)) => {
                if words.starts_with("READONLY") && !conn.replica.swap(true, Ordering::Relaxed) {
                    warn!(redis = %conn.server, "redis node is a replica (READONLY): it takes no writes");
                    self.ask_sentinels.notify_one();
                }
            }
        }
    }

    /// [`Self::observe`], and the outcome of `op` told to the health record.
    pub(super) fn told<T>(
        &self,
        conn: &Conn,
        sent: Instant,
        op: Op,
        slot: Option<u16>,
        result: &Result<T, StoreError>,
    ) {
        self.observe(conn, sent, slot, result);
        self.health.observe(op, result);
    }

    /// In a Cluster, whether a call for `slot` may be sent (the breaker of
    /// the node that owns it is closed).
    ///
    /// # Errors
    /// [`StoreError::Unavailable`] naming the node.
    pub(super) fn check_node(&self, slot: Option<u16>) -> Result<(), StoreError> {
        match (&self.nodes, slot) {
            (Some(nodes), Some(slot)) => nodes.check(slot),
            _ => Ok(()),
        }
    }

    /// Milliseconds from [`Self::epoch`] to `at`.
    pub(super) fn millis(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.epoch).as_millis()).unwrap_or(u64::MAX)
    }

    /// Whether the scripts read Redis `TIME` (`clock: redis`).
    pub(super) fn server_clock(&self) -> bool {
        self.server_clock.load(Ordering::Relaxed)
    }

    /// `clock: redis`: from now on the scripts read Redis `TIME`.
    pub(super) fn use_server_clock(&self, on: bool) {
        self.server_clock.store(on, Ordering::Relaxed);
    }
}

/// The connection task of `client`: attempts the first connection at once
/// and, while it fails, again after each delay of `policy`; then runs
/// fred's connection task, which reconnects by the same policy.
///
/// Aborting this task aborts fred's (the handle is dropped with it).
async fn first_connection(
    client: Client,
    policy: Option<ReconnectPolicy>,
) -> Result<(), FredError> {
    /// fred's connection task, aborted when dropped.
    struct Running(ConnectHandle);
    impl Drop for Running {
        fn drop(&mut self) {
            self.0.abort();
        }
    }
    let mut policy = policy;
    loop {
        // With `fail_fast`, a failed first connection ends the task at once
        // (its error reaches the link watcher), leaving the client ready to
        // connect again.
        let mut running = Running(client.connect());
        let error = match (&mut running.0).await {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(e)) => e,
            Err(e) => FredError::new(fred::error::ErrorKind::Unknown, e.to_string()),
        };
        let Some(delay) = policy.as_mut().and_then(ReconnectPolicy::next_delay) else {
            return Err(error);
        };
        tokio::time::sleep(Duration::from_millis(delay)).await;
    }
}

/// Reconnect forever, backing off exponentially from `reconnect.min` to
/// `reconnect.max`, plus up to `reconnect.jitter` at random.
fn reconnect_policy(cfg: &RedisConfig) -> ReconnectPolicy {
    let ms = |d: Duration| u32::try_from(d.as_millis()).unwrap_or(u32::MAX);
    let mut policy = ReconnectPolicy::new_exponential(
        0, // retry forever
        ms(cfg.reconnect_min).max(1),
        ms(cfg.reconnect_max).max(1),
        2,
    );
    policy.set_jitter(ms(cfg.reconnect_jitter));
    policy
}

/// Each client's connection: commands sent at most once, and fred's own
/// unresponsive check (a write with no read for a few call timeouts). That
/// check cannot fire while writes keep coming, which is why `follow`'s
/// watchdog measures the oldest unanswered call instead. A Cluster client
/// goes without it: fred answers one node's silence by reconnecting to
/// every node, which would stop the slots that answer; the nodes' breakers
/// and `follow::follow_cluster` handle a silent node instead.
fn connection_config(
    timeout: Duration,
    connect_timeout: Duration,
    clustered: bool,
) -> ConnectionConfig {
    let unresponsive = (timeout * 4).max(Duration::from_secs(1));
    ConnectionConfig {
        connection_timeout: connect_timeout,
        internal_command_timeout: connect_timeout,
        max_command_attempts: 1,
        unresponsive: UnresponsiveConfig {
            max_timeout: (!clustered).then_some(unresponsive),
            interval: unresponsive / 4,
        },
        tcp: TcpConfig {
            nodelay: Some(true),
            ..TcpConfig::default()
        },
        ..ConnectionConfig::default()
    }
}

/// Where to probe a suspect connection failure, and whether a probe is
/// under way (one at a time per store).
struct Diagnosis {
    probe: Probe,
    running: AtomicBool,
}

/// Where to ask when a failure may be TLS on one side only (the
/// first server `config` names).
fn diagnosis(config: &FredConfig, connect_timeout: Duration) -> Option<Diagnosis> {
    config.server.hosts().first().map(|server| Diagnosis {
        probe: Probe {
            host: server.host.to_string(),
            port: server.port,
            tls: config.tls.is_some(),
            timeout: connect_timeout,
        },
        running: AtomicBool::new(false),
    })
}
/// What a link watcher keeps in step and tells.
struct Watched {
    link_up: Arc<AtomicBool>,
    closed: Arc<AtomicBool>,
    came_up: Arc<Notify>,
    health: Arc<Health>,
    diagnosis: Arc<Option<Diagnosis>>,
    ask_sentinels: Arc<Notify>,
    failovers: Arc<Failovers>,
    /// The server, for log lines.
    server: String,
}

/// Keeps `link_up` in step with fred's events: down on any connection error,
/// up on every (re)connect (fred sends one on the first connection too).
///
/// Both are broadcast from fred's router task in order, an error before the
/// reconnect that repairs it; preferring errors (`biased`) when both are
/// waiting keeps that order here. A reconnect that fails after its event
/// (replaying buffered commands) leaves fred's state not `Connected`, which
/// [`Clients::is_connected`] also requires.
///
/// Each error is also sorted ([`fault::classify`]): a refusal
/// (credentials, TLS) is raised in `health`, a failure that
/// may be TLS on one side only starts a [`fault::probe`] (unless one is
/// running), and a connection made clears what connecting had raised. A
/// connection that was up and closes is logged once, with the server's
/// address, and the sentinels are asked at once whether the master moved.
fn watch_link(client: &Client, w: Watched) -> JoinHandle<()> {
    let mut errors = client.error_rx();
    let mut connects = client.reconnect_rx();
    tokio::spawn(async move {
        loop {
            let up = tokio::select! {
                biased;
                e = errors.recv() => match e {
                    Ok((e, _)) => {
                        if w.link_up.load(Ordering::Acquire) && !w.closed.swap(true, Ordering::AcqRel) {
                            warn!(redis = %w.server, error = %e.details(), "redis connection closed; reconnecting");
                            w.failovers.hint(FailoverReason::Closed);
                            w.ask_sentinels.notify_one();
                        }
                        sort_link_error(&e, &w.health, &w.diagnosis);
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
            w.link_up.store(up, Ordering::Release);
            if up {
                w.closed.store(false, Ordering::Release);
                w.health.clear(Op::Connect);
                w.came_up.notify_waiters();
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

/// The slot a call for `key` goes to: its Cluster slot, or 0 on one
/// server, which takes any keys in one call.
pub(super) fn call_slot(clustered: bool, key: &str) -> u16 {
    if clustered {
        redis_keyslot(key.as_bytes())
    } else {
        0
    }
}

/// Indices of `keys` grouped by [`call_slot`], in ascending slot order.
pub(super) fn slot_groups<'a>(
    clustered: bool,
    keys: impl IntoIterator<Item = &'a str>,
) -> Vec<Vec<usize>> {
    let mut groups: BTreeMap<u16, Vec<usize>> = BTreeMap::new();
    for (i, key) in keys.into_iter().enumerate() {
        groups.entry(call_slot(clustered, key)).or_default().push(i);
    }
    groups.into_values().collect()
}
