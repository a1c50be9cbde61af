//! The pool of Redis clients a store calls through, and what every call
//! needs besides: the script's SHA-1 once it is learned, the call timeout,
//! the clock the scripts read and the refusals standing ([`Health`]).
//!
//! [`Clients::start`] builds `pool_size` clients and starts their
//! connection tasks without waiting for them (see the parent module on
//! availability). Each client has a link watcher ([`watch_link`]) that
//! follows fred's error and (re)connect events, so a link counts as down
//! from its first error until it is up again; calls take the next
//! connected client in turn. The commands sent through the pool are in
//! `commands`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use fred::bytes_utils::Str;
use fred::clients::Client;
use fred::error::Error as FredError;
use fred::interfaces::{ClientLike, EventInterface};
use fred::types::config::{
    Config as FredConfig, ConnectionConfig, ReconnectPolicy, TcpConfig, UnresponsiveConfig,
};
use fred::types::{Builder, ConnectHandle};
use fred::util::redis_keyslot;
use tokio::sync::Notify;
use tokio::sync::broadcast::error::RecvError;
use tokio::task::JoinHandle;

use super::fault::{self, Health, LinkError, Op, Probe};
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
    /// Refusals standing: wrong credentials, ACL, TLS.
    pub(super) health: Arc<Health>,
    /// What one call (a decision, a command, a push) may take at most.
    pub(super) timeout: Duration,
    /// `clock: redis`: the scripts read `TIME` instead of taking `now`.
    server_clock: AtomicBool,
}

/// One client of the pool and its link watcher.
struct Link {
    client: Client,
    /// The connection task ([`first_connection`]).
    task: ConnectHandle,
    /// The [`watch_link`] task.
    watcher: JoinHandle<()>,
    /// No connection error since the last (re)connect.
    up: Arc<AtomicBool>,
}

impl Link {
    /// Starts `client`'s connection task and its watcher, which wakes
    /// `came_up` whenever the link comes up.
    fn start(
        client: Client,
        came_up: &Arc<Notify>,
        health: &Arc<Health>,
        diagnosis: &Arc<Option<Diagnosis>>,
    ) -> Link {
        // Subscribe before connecting, so the first connect event is seen.
        let up = Arc::new(AtomicBool::new(false));
        let policy = client.client_reconnect_policy();
        let watcher = watch_link(
            &client,
            Arc::clone(&up),
            Arc::clone(came_up),
            Arc::clone(health),
            Arc::clone(diagnosis),
        );
        // Spawned, not awaited: the first connection is made in the
        // background.
        let task = tokio::spawn(first_connection(client.clone(), policy));
        Link {
            client,
            task,
            watcher,
            up,
        }
    }

    fn is_connected(&self) -> bool {
        self.up.load(Ordering::Acquire) && self.client.is_connected()
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
        let mut links = Vec::with_capacity(cfg.pool_size.max(1));
        for _ in 0..cfg.pool_size.max(1) {
            let client = Builder::from_config(config.clone())
                .set_policy(policy.clone())
                .with_connection_config(|c| *c = connection_config(timeout, connect_timeout))
                .build()
                .map_err(|e| StoreError::Unavailable(format!("Redis client: {}", e.details())))?;
            links.push(Link::start(client, came_up, &health, &diagnosis));
        }
        Ok(Clients {
            links,
            next: AtomicUsize::new(0),
            sha: OnceLock::new(),
            clustered: matches!(cfg.topology, RedisTopology::Cluster { .. }),
            health,
            timeout,
            server_clock: AtomicBool::new(false),
        })
    }

    /// Stops every client's connection task and link watcher.
    pub(super) fn stop(&self) {
        for link in &self.links {
            link.task.abort();
            link.watcher.abort();
        }
    }

    /// Whether a connection to Redis is up right now.
    pub(super) fn is_connected(&self) -> bool {
        self.links.iter().any(Link::is_connected)
    }

    /// The next connected client of the pool (the first one when none is).
    pub(super) fn client(&self) -> &Client {
        let n = self.links.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        (0..n)
            .map(|i| &self.links[(start + i) % n])
            .find(|l| l.is_connected())
            .map_or(&self.links[start % n].client, |l| &l.client)
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

/// Each client's connection: commands sent at most once, and a connection
/// whose replies stop coming for a few call timeouts declared unresponsive.
fn connection_config(timeout: Duration, connect_timeout: Duration) -> ConnectionConfig {
    let unresponsive = (timeout * 4).max(Duration::from_secs(1));
    ConnectionConfig {
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
