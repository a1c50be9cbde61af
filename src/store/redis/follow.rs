//! Leaving a Redis server that is lost, for the one that replaces it.
//!
//! fred reconnects when a connection closes, but a server that stops
//! answering while its port stays open (a paused or swapping host, a
//! stalled disk, a path that drops packets) closes nothing, and fred's own
//! unresponsive check cannot fire while the gateway keeps writing (it
//! measures from the last write). A master that wakes after Sentinel
//! promoted its replica still says `master` until Sentinel demotes it, and
//! every write it takes meanwhile is lost. So two tasks run beside the
//! clients:
//!
//! - [`watchdog`] (one server, Sentinel): a link whose oldest unanswered
//!   call is older than the
//!   **bound** — four call timeouts, at least one second — is lost: its
//!   client is replaced by a new one, which connects again (behind
//!   Sentinel, to the master the sentinels name). Every call the gateway
//!   makes is bounded by the store's timeout, so a reply later than four of
//!   them is not a slow script of the gateway's own; a server blocked by
//!   someone else's script for more than a second is reconnected, which
//!   costs a connection and nothing else. Measured from the oldest call
//!   that timed out with no reply on the link since, so a server that
//!   answers anything is never declared lost.
//! - [`follow`] (Sentinel): the sentinels are asked for the master
//!   (`SENTINEL MASTER <service>`, every configured sentinel, four times a
//!   second, and at once when a link closes, stops answering or meets
//!   `READONLY`). The answer with the highest config epoch names the
//!   master; when it is not the one the links use, every link's client is
//!   replaced by one connected to the new master, and the old clients are
//!   stopped: nothing more is sent to the old master, whether it is dead,
//!   frozen or about to wake. Commands already written to a frozen
//!   master's socket may still run when it wakes; nothing is written after.
//!   When every sentinel that answers knows no master by the service name,
//!   the fault is raised ([`FaultKind::Sentinel`]).
//!
//! - [`follow_cluster`] (Cluster): every node is asked for `CLUSTER NODES`
//!   four times a second, over a connection of its own, each ask bounded
//!   by the call timeout (at least 200 ms). An answer closes that node's
//!   breaker (`nodes`). For every slot the master claim with the highest
//!   config epoch wins; when the winners differ from the slot map in force
//!   (a replica promoted after its master stopped answering, a manual
//!   `CLUSTER FAILOVER`), a new client is built, seeded with the new
//!   owners first — so the slot map it reads names them and it never waits
//!   on the frozen node — and once it is connected it takes every link's
//!   place and the old clients are stopped: nothing more is sent to the
//!   old owner. The old clients serve the slots that did not move until
//!   that moment. **Bound:** a promotion is seen within one poll (250 ms)
//!   plus one ask (the silent node's ask runs out at its bound), and the new
//!   client connects in a few round trips: decisions for the moved slots
//!   reach the new master about half a second after the promotion.
//!
//! Each move is logged once (`redis master moved from A to B`, `no reply
//! from A within X`) and counted in
//! [`Failovers`](super::failovers::Failovers) with its reason.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use fred::clients::Client;
use fred::error::ErrorKind;
use fred::interfaces::ClientLike;
use fred::types::config::Server;
use fred::types::config::{Config as FredConfig, Options, ServerConfig};
use fred::types::{ClusterHash, CustomCommand, Value};
use futures_util::future::join_all;
use tokio::time::Instant;
use tracing::{info, warn};

use super::clients::{Clients, SideClient};
use super::failovers::FailoverReason;
use super::fault::{Fault, FaultKind, Op};
use super::nodes::{Nodes, View, parse_nodes};

/// How often the sentinels are asked for the master when nothing else
/// asks sooner.
const POLL: Duration = Duration::from_millis(250);

/// How often the watchdog looks at the links.
const WATCH: Duration = Duration::from_millis(100);

/// The unresponsive bound: four call timeouts, at least one second.
pub(super) fn bound(timeout: Duration) -> Duration {
    (timeout * 4).max(Duration::from_secs(1))
}

/// Runs forever: every [`WATCH`], replaces the client of every link whose
/// oldest unanswered call is older than [`bound`], or whose server said
/// it is a replica. Behind Sentinel the sentinels are asked first (the
/// new client connects to the master they name).
pub(super) async fn watchdog(clients: Arc<Clients>, sentinel: bool) {
    // A Cluster client spans every node: one hung node must not take the
    // others' slots down with it, and calls to the others answer, so it is
    // left to fred's own redirections and reconnects.
    if clients.clustered {
        return;
    }
    let bound = bound(clients.timeout);
    let bound_ms = u64::try_from(bound.as_millis()).unwrap_or(u64::MAX);
    let mut tick = tokio::time::interval(WATCH);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let now = clients.millis(Instant::now());
        for (i, conn) in clients.conns().into_iter().enumerate() {
            let Some(conn) = conn else { continue };
            let since = conn.stuck_since.load(Ordering::Relaxed);
            let hung = since != 0 && now.saturating_sub(since - 1) > bound_ms;
            // Behind Sentinel a replica is left for the master the
            // sentinels name; a standalone URL naming a replica is the
            // operator's to fix (logged once by `Clients::observe`).
            let replica = sentinel && conn.replica.load(Ordering::Relaxed);
            if !(hung || replica) {
                continue;
            }
            if hung {
                warn!(redis = %conn.server, bound = ?bound, "no reply from redis within {bound:?}; leaving that connection and connecting again");
                clients.failovers.hint(FailoverReason::NoReply);
            }
            if sentinel {
                // The follower moves every link when the sentinels name
                // another master; until they do, this link reconnects to
                // the one they name now.
                clients.ask_sentinels.notify_one();
                let master = clients
                    .master
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .clone();
                clients.replace(i, master.as_ref());
            } else {
                clients.replace(i, None);
                if hung {
                    clients.failovers.add(FailoverReason::NoReply);
                }
            }
        }
    }
}

/// One sentinel's answer: the master's address and the config epoch it
/// was named in.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Named {
    server: Server,
    epoch: i64,
}

/// What asking one sentinel found.
#[derive(Debug)]
enum Answer {
    Master(Named),
    /// The sentinel monitors no master by that name.
    Unknown(String),
    /// No answer (down, timed out, refused).
    Silent,
}

/// Runs forever (Sentinel): asks `sentinels` for the master of `service`
/// every [`POLL`] and whenever a link asks, and moves every link to the
/// master the highest config epoch names.
pub(super) async fn follow(clients: Arc<Clients>, template: FredConfig, service: String) {
    let sentinels: Vec<SideClient> = sentinel_clients(&clients, &template);
    let mut last_epoch = i64::MIN;
    loop {
        let asked = Instant::now();
        let bound = clients.timeout.max(Duration::from_millis(200));
        let answers = join_all(sentinels.iter().map(|s| ask(&s.client, &service, bound))).await;
        let unknown = answers.iter().find_map(|a| match a {
            Answer::Unknown(words) => Some(words.clone()),
            _ => None,
        });
        let best = answers
            .into_iter()
            .filter_map(|a| match a {
                Answer::Master(n) => Some(n),
                _ => None,
            })
            .max_by_key(|n| n.epoch);
        match (best, unknown) {
            (Some(named), _) => {
                clients.health.clear(Op::Sentinel);
                if named.epoch >= last_epoch {
                    last_epoch = named.epoch;
                    move_to(&clients, named.server);
                }
            }
            (None, Some(words)) => clients.health.raise(
                Op::Sentinel,
                Fault {
                    kind: FaultKind::Sentinel,
                    words: format!("no sentinel knows the service name {service:?}: {words}"),
                },
            ),
            (None, None) => {}
        }
        // Woken by a link (closed, no reply, READONLY), or the next poll.
        let next = asked + POLL;
        let _ = tokio::time::timeout_at(next, clients.ask_sentinels.notified()).await;
    }
}

/// Moves every link to `master` unless they are there already.
fn move_to(clients: &Clients, master: Server) {
    let was = {
        let mut current = clients
            .master
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if current.as_ref() == Some(&master) {
            // Links left empty by a failed build are filled here.
            None
        } else {
            Some(current.replace(master.clone()))
        }
    };
    match was {
        None => {
            for (i, conn) in clients.conns().into_iter().enumerate() {
                if conn.is_none() {
                    clients.replace(i, Some(&master));
                }
            }
        }
        Some(was) => {
            for i in 0..clients.conns().len() {
                clients.replace(i, Some(&master));
            }
            match was {
                None => info!(master = %master, "redis master named by the sentinels"),
                Some(was) => {
                    let reason = clients
                        .failovers
                        .take_hint()
                        .unwrap_or(FailoverReason::Switch);
                    warn!(from = %was, to = %master, reason = reason.label(), "redis master moved from {was} to {master}; nothing more is sent to {was}");
                    clients.failovers.add(reason);
                }
            }
        }
    }
}

/// Runs forever (Cluster): asks every node it knows for `CLUSTER NODES`
/// every [`POLL`], closes the breaker of each node that answers, and moves
/// every link when the slot owners the answers name differ from the map in
/// force (module docs).
pub(super) async fn follow_cluster(clients: Arc<Clients>, template: FredConfig) {
    let Some(nodes) = clients.nodes.as_ref() else {
        return;
    };
    let mut asked: BTreeMap<String, SideClient> = BTreeMap::new();
    for server in template.server.hosts() {
        ask_also(&clients, &template, &mut asked, &server.to_string());
    }
    loop {
        let started = Instant::now();
        let bound = clients.timeout.max(Duration::from_millis(200));
        let answers = join_all(asked.iter().map(|(addr, side)| async move {
            (addr.clone(), ask_nodes(&side.client, bound).await)
        }))
        .await;
        let (mut seen, mut claims) = (Vec::new(), Vec::new());
        for (addr, text) in answers {
            let Some(text) = text else { continue };
            nodes.answered(&addr);
            let (addrs, claimed) = parse_nodes(&text);
            seen.extend(addrs);
            claims.extend(claimed);
        }
        for addr in seen {
            ask_also(&clients, &template, &mut asked, &addr);
        }
        if !claims.is_empty() {
            settle(&clients, nodes, &View::merge(&claims)).await;
        }
        tokio::time::sleep_until(started + POLL).await;
    }
}

/// Starts asking the node at `addr` (`host:port`) too, over a client of
/// its own built from `template`.
fn ask_also(
    clients: &Clients,
    template: &FredConfig,
    asked: &mut BTreeMap<String, SideClient>,
    addr: &str,
) {
    if asked.contains_key(addr) {
        return;
    }
    let Some(server) = server_at(addr) else {
        return;
    };
    let mut config = template.clone();
    config.server = ServerConfig::Centralized { server };
    config.database = None;
    if let Some(side) = clients.side_client(config) {
        asked.insert(addr.to_owned(), side);
    }
}

/// `host:port` as fred's [`Server`].
fn server_at(addr: &str) -> Option<Server> {
    let (host, port) = addr.rsplit_once(':')?;
    Some(Server::new(host, port.parse::<u16>().ok()?))
}

/// Puts `view` in force: at once when no map is (the pool's clients read
/// the same one), through new clients when slots moved (module docs).
async fn settle(clients: &Clients, nodes: &Nodes, view: &View) {
    let map = nodes.map();
    if map.runs.is_empty() {
        nodes.install(view);
        return;
    }
    let moves = view.moves(&map);
    if moves.is_empty() {
        return;
    }
    // The nodes that gained slots first: the slot map the new client
    // reads from its first seed then names them.
    let mut seeds: Vec<&str> = moves.iter().map(|(_, _, _, to)| to.as_str()).collect();
    seeds.extend(view.runs.iter().map(|(_, _, addr)| addr.as_str()));
    let mut servers: Vec<Server> = Vec::new();
    for server in seeds.into_iter().filter_map(server_at) {
        if !servers.contains(&server) {
            servers.push(server);
        }
    }
    if !clients.rebuild(&servers).await {
        warn!(to = ?servers, "redis cluster slots moved, but the new masters did not all connect; trying again");
        return;
    }
    nodes.install(view);
    let mut left: Vec<&str> = Vec::new();
    for (start, end, from, to) in &moves {
        let reason = if nodes.is_open(from) {
            FailoverReason::NoReply
        } else {
            FailoverReason::Switch
        };
        warn!(%from, %to, slots = %format!("{start}-{end}"), reason = reason.label(), "redis cluster slots {start}-{end} moved from {from} to {to}; nothing more is sent to {from}");
        if !left.contains(&from.as_str()) {
            left.push(from);
            clients.failovers.add(reason);
        }
    }
}

/// `CLUSTER NODES` on one node, bounded by `bound`; its text, or `None`
/// when it does not answer.
async fn ask_nodes(node: &Client, bound: Duration) -> Option<String> {
    if !node.is_connected() {
        let connected = tokio::time::timeout(bound, node.wait_for_connect()).await;
        if !matches!(connected, Ok(Ok(()))) {
            return None;
        }
    }
    let cmd = CustomCommand::new_static("CLUSTER", ClusterHash::Random, false);
    let options = Options {
        fail_fast: true,
        max_attempts: Some(1),
        timeout: Some(bound),
        ..Options::default()
    };
    let reply = node
        .with_options(&options)
        .custom::<Value, Value>(cmd, vec![Value::from("NODES")])
        .await;
    reply.ok()?.as_string()
}

/// One client per configured sentinel, connecting in the background with
/// the same credentials and TLS as the master's (no database).
fn sentinel_clients(clients: &Clients, template: &FredConfig) -> Vec<SideClient> {
    let ServerConfig::Sentinel { hosts, .. } = &template.server else {
        return Vec::new();
    };
    hosts
        .iter()
        .filter_map(|server| {
            let mut config = template.clone();
            config.server = ServerConfig::Centralized {
                server: server.clone(),
            };
            config.database = None;
            clients.side_client(config)
        })
        .collect()
}

/// `SENTINEL MASTER service` on one sentinel, bounded by `bound`.
async fn ask(sentinel: &Client, service: &str, bound: Duration) -> Answer {
    if !sentinel.is_connected() {
        // At start (or after a sentinel came back) its connection may be a
        // moment away: waiting for it here, not a poll later, names the
        // master as soon as one sentinel answers.
        let connected = tokio::time::timeout(bound, sentinel.wait_for_connect()).await;
        if !matches!(connected, Ok(Ok(()))) {
            return Answer::Silent;
        }
    }
    let cmd = CustomCommand::new_static("SENTINEL", ClusterHash::Random, false);
    let options = Options {
        fail_fast: true,
        max_attempts: Some(1),
        timeout: Some(bound),
        ..Options::default()
    };
    let reply = sentinel
        .with_options(&options)
        .custom::<Value, Value>(cmd, vec![Value::from("MASTER"), Value::from(service)])
        .await;
    match reply {
        Ok(v) => parse_master(v).map_or(Answer::Silent, Answer::Master),
        Err(e) if e.kind() == &ErrorKind::Unknown && e.details().contains("No such master") => {
            Answer::Unknown(e.details().to_owned())
        }
        Err(_) => Answer::Silent,
    }
}

/// The master's address and config epoch from `SENTINEL MASTER`'s reply:
/// a flat list (RESP2) or a map (RESP3) of field names and values.
fn parse_master(reply: Value) -> Option<Named> {
    let pairs: Vec<(String, String)> = match reply {
        Value::Array(items) => items
            .chunks(2)
            .filter_map(|kv| Some((kv.first()?.as_string()?, kv.get(1)?.as_string()?)))
            .collect(),
        Value::Map(map) => map
            .inner()
            .into_iter()
            .filter_map(|(k, v)| Some((k.as_str()?.to_string(), v.as_string()?)))
            .collect(),
        _ => return None,
    };
    let field = |name: &str| pairs.iter().find(|(k, _)| k == name).map(|(_, v)| v);
    let host = field("ip")?.clone();
    let port: u16 = field("port")?.parse().ok()?;
    let epoch: i64 = field("config-epoch")
        .and_then(|e| e.parse().ok())
        .unwrap_or(0);
    Some(Named {
        server: Server::new(host, port),
        epoch,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bound_sits_above_four_timeouts_and_a_second() {
        assert_eq!(bound(Duration::from_millis(25)), Duration::from_secs(1));
        assert_eq!(bound(Duration::from_millis(500)), Duration::from_secs(2));
    }

    #[test]
    fn reads_the_master_and_its_epoch() {
        let flat = |kv: &[(&str, &str)]| {
            Value::Array(
                kv.iter()
                    .flat_map(|(k, v)| [Value::from(*k), Value::from(*v)])
                    .collect(),
            )
        };
        let named = parse_master(flat(&[
            ("name", "mymaster"),
            ("ip", "127.0.0.1"),
            ("port", "6380"),
            ("flags", "master"),
            ("config-epoch", "3"),
        ]));
        assert_eq!(
            named,
            Some(Named {
                server: Server::new("127.0.0.1", 6380),
                epoch: 3
            })
        );
        assert_eq!(parse_master(flat(&[("ip", "127.0.0.1")])), None);
        assert_eq!(parse_master(Value::Null), None);
    }
}
