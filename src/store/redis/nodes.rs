//! Redis Cluster: which node owns which slots, and whether each node
//! answers.
//!
//! One fred client spans every node of a Cluster, so what the other
//! topologies decide for the whole store is decided here per node:
//!
//! - **Per-node breaking.** Every call sent for a slot tells the node that
//!   owns it ([`Nodes::record`]). After `store.breaker.failures`
//!   consecutive failures or timeouts that node's breaker opens: calls for
//!   its slots fail at once ([`Nodes::check`]) and `on_error` decides them,
//!   while every other node's slots keep going to Redis. The node's next
//!   answer to `CLUSTER NODES` (asked four times a second by
//!   `follow::follow_cluster`) closes it again. Each change is logged once
//!   with the node's address and exported as
//!   `tollgate_store_node_breaker_open{node}`. In a Cluster the store-wide
//!   breaker is not used: one node's faults must not stop the others.
//! - **The slot map.** [`View`] reads the nodes' `CLUSTER NODES` answers:
//!   for each slot the master claim with the highest config epoch wins, as
//!   a Cluster itself settles it (a frozen master that wakes still claims
//!   its slots until it hears of its replica's higher epoch). The map in
//!   force ([`Nodes::install`]) is the one the pool's clients were built
//!   for; `follow::follow_cluster` builds new clients when the winning
//!   owners change.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use arc_swap::ArcSwap;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use tracing::{info, warn};

use crate::store::contract::StoreError;

/// Hash slots of a Redis Cluster.
const SLOTS: usize = 16_384;

/// `tollgate_store_node_breaker_open`, by `node` (`host:port`).
pub type NodeGauges = Family<Vec<(String, String)>, Gauge<i64, AtomicI64>>;

/// One node of the Cluster and its breaker.
#[derive(Debug)]
pub(super) struct Node {
    /// `host:port`, as the Cluster announces it.
    pub(super) addr: String,
    consecutive: AtomicU32,
    open: AtomicBool,
}

/// A run of slots and the master that owns it.
#[derive(Debug, Clone)]
pub(super) struct Owned {
    pub(super) start: u16,
    pub(super) end: u16,
    pub(super) node: Arc<Node>,
}

/// The slot map in force: runs of slots in ascending order.
#[derive(Debug, Default)]
pub(super) struct SlotMap {
    pub(super) runs: Vec<Owned>,
}

impl SlotMap {
    /// The node that owns `slot`, if the map knows one.
    fn owner(&self, slot: u16) -> Option<&Arc<Node>> {
        let i = self.runs.partition_point(|r| r.start <= slot);
        let run = self.runs.get(i.checked_sub(1)?)?;
        (slot <= run.end).then_some(&run.node)
    }
}

/// The nodes of a Cluster: the slot map in force and a breaker per node.
#[derive(Debug)]
pub(super) struct Nodes {
    map: ArcSwap<SlotMap>,
    /// Every node seen, by address; a node keeps its breaker across maps.
    known: Mutex<BTreeMap<String, Arc<Node>>>,
    /// Consecutive failures that open a node's breaker.
    failures: AtomicU32,
    gauges: OnceLock<NodeGauges>,
}

impl Default for Nodes {
    fn default() -> Self {
        Self {
            map: ArcSwap::from_pointee(SlotMap::default()),
            known: Mutex::default(),
            failures: AtomicU32::new(3),
            gauges: OnceLock::new(),
        }
    }
}

impl Nodes {
    /// Consecutive failures that open a node's breaker
    /// (`store.breaker.failures`).
    pub(super) fn set_failures(&self, failures: u32) {
        self.failures.store(failures.max(1), Ordering::Relaxed);
    }

    /// Mirrors every node's breaker in `gauges` from now on.
    pub(super) fn export(&self, gauges: NodeGauges) {
        let _ = self.gauges.set(gauges);
        let known = self.known.lock().unwrap_or_else(PoisonError::into_inner);
        for node in known.values() {
            self.show(node);
        }
    }

    fn show(&self, node: &Node) {
        if let Some(g) = self.gauges.get() {
            let open = node.open.load(Ordering::Relaxed);
            g.get_or_create(&vec![("node".to_owned(), node.addr.clone())])
                .set(i64::from(open));
        }
    }

    /// The node at `addr`, made known (with a closed breaker) if new.
    pub(super) fn node(&self, addr: &str) -> Arc<Node> {
        let mut known = self.known.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = known.get(addr) {
            return Arc::clone(n);
        }
        let node = Arc::new(Node {
            addr: addr.to_owned(),
            consecutive: AtomicU32::new(0),
            open: AtomicBool::new(false),
        });
        known.insert(addr.to_owned(), Arc::clone(&node));
        drop(known);
        self.show(&node);
        node
    }

    /// The slot map in force.
    pub(super) fn map(&self) -> Arc<SlotMap> {
        self.map.load_full()
    }

    /// Puts `view` in force: the pool's clients route by it now.
    pub(super) fn install(&self, view: &View) {
        let runs = view
            .runs
            .iter()
            .map(|(start, end, addr)| Owned {
                start: *start,
                end: *end,
                node: self.node(addr),
            })
            .collect();
        self.map.store(Arc::new(SlotMap { runs }));
    }

    /// Whether a call for `slot` may be sent: not while the breaker of the
    /// node that owns it is open.
    ///
    /// # Errors
    /// [`StoreError::Unavailable`] naming the node.
    pub(super) fn check(&self, slot: u16) -> Result<(), StoreError> {
        match self.map.load().owner(slot) {
            Some(node) if node.open.load(Ordering::Acquire) => Err(StoreError::Unavailable(
                format!("redis node {} is not answering", node.addr),
            )),
            _ => Ok(()),
        }
    }

    /// Records the outcome of one call sent for `slot` on the breaker of
    /// the node that owns it. A reply of any kind (even an error) proves
    /// the node answers; only outages count.
    pub(super) fn record<T>(&self, slot: u16, result: &Result<T, StoreError>) {
        let map = self.map.load();
        let Some(node) = map.owner(slot) else {
            return;
        };
        match result {
            Ok(_) | Err(StoreError::Protocol(_) | StoreError::Refused(_)) => {
                node.consecutive.store(0, Ordering::Relaxed);
            }
            Err(e @ (StoreError::Unavailable(_) | StoreError::Timeout)) => {
                let n = node.consecutive.fetch_add(1, Ordering::Relaxed) + 1;
                if n >= self.failures.load(Ordering::Relaxed)
                    && !node.open.swap(true, Ordering::AcqRel)
                {
                    self.show(node);
                    warn!(node = %node.addr, error = %e, failures = n, "redis node breaker open: its slots are decided by on_error until it answers or its replica takes over");
                }
            }
        }
    }

    /// `addr` answered: its breaker closes.
    pub(super) fn answered(&self, addr: &str) {
        let node = self.node(addr);
        node.consecutive.store(0, Ordering::Relaxed);
        if node.open.swap(false, Ordering::AcqRel) {
            self.show(&node);
            info!(node = %node.addr, "redis node breaker closed: the node answers again");
        }
    }

    /// Whether the breaker of a node that owns slots is open.
    pub(super) fn any_open(&self) -> bool {
        self.map
            .load()
            .runs
            .iter()
            .any(|r| r.node.open.load(Ordering::Relaxed))
    }

    /// Whether the breaker of the node at `addr` is open.
    pub(super) fn is_open(&self, addr: &str) -> bool {
        self.node(addr).open.load(Ordering::Acquire)
    }
}

/// One master's claim read from `CLUSTER NODES`: its address, config
/// epoch and slots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Claim {
    pub(super) addr: String,
    epoch: u64,
    slots: Vec<(u16, u16)>,
}

/// One `CLUSTER NODES` answer: every node's address (masters and
/// replicas, to ask next time) and the masters' claims.
pub(super) fn parse_nodes(text: &str) -> (Vec<String>, Vec<Claim>) {
    let mut addrs = Vec::new();
    let mut claims = Vec::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (Some(addr), Some(flags), Some(epoch)) = (fields.get(1), fields.get(2), fields.get(6))
        else {
            continue;
        };
        // `ip:port@cport[,hostname]`; an empty ip is a node without an
        // address (`noaddr`).
        let addr = addr.split(['@', ',']).next().unwrap_or("");
        if addr.starts_with(':') || addr.is_empty() || flags.contains("noaddr") {
            continue;
        }
        addrs.push(addr.to_owned());
        if !flags.split(',').any(|f| f == "master") {
            continue;
        }
        let slots: Vec<(u16, u16)> = fields
            .iter()
            .skip(8)
            .filter(|s| !s.starts_with('['))
            .filter_map(|s| match s.split_once('-') {
                Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
                None => s.parse().ok().map(|a| (a, a)),
            })
            .filter(|&(a, b)| a <= b && usize::from(b) < SLOTS)
            .collect();
        if let (false, Ok(epoch)) = (slots.is_empty(), epoch.parse()) {
            claims.push(Claim {
                addr: addr.to_owned(),
                epoch,
                slots,
            });
        }
    }
    (addrs, claims)
}

/// The slot map the nodes' answers make: runs of slots and their owner's
/// address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct View {
    pub(super) runs: Vec<(u16, u16, String)>,
}

impl View {
    /// For each slot, the claim with the highest config epoch.
    pub(super) fn merge(claims: &[Claim]) -> View {
        let mut owner: Vec<Option<(u64, usize)>> = vec![None; SLOTS];
        for (i, c) in claims.iter().enumerate() {
            for &(a, b) in &c.slots {
                for slot in &mut owner[usize::from(a)..=usize::from(b)] {
                    if slot.is_none_or(|(e, _)| c.epoch > e) {
                        *slot = Some((c.epoch, i));
                    }
                }
            }
        }
        let mut runs: Vec<(u16, u16, String)> = Vec::new();
        for (slot, o) in owner.iter().enumerate() {
            let Some((_, i)) = o else { continue };
            let Ok(slot) = u16::try_from(slot) else { break };
            let addr = &claims[*i].addr;
            match runs.last_mut() {
                Some((_, end, a)) if *end + 1 == slot && a == addr => *end = slot,
                _ => runs.push((slot, slot, addr.clone())),
            }
        }
        View { runs }
    }

    /// What `self` moves compared with the map in force: each run whose
    /// owner differs, with the old owner's address.
    pub(super) fn moves(&self, map: &SlotMap) -> Vec<(u16, u16, String, String)> {
        self.runs
            .iter()
            .filter_map(|(a, b, addr)| {
                let was = map.owner(*a)?;
                (was.addr != *addr).then(|| (*a, *b, was.addr.clone(), addr.clone()))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NODES: &str = "\
07c3 127.0.0.1:30004@31004 slave e7d1 0 1426238317239 4 connected
67ed 127.0.0.1:30002@31002 master - 0 1426238316232 2 connected 5461-10922
e7d1 127.0.0.1:30001@31001 myself,master - 0 0 1 connected 0-5460 [5461->-67ed]
6ec2 127.0.0.1:30005@31005 master,fail? - 0 1426238316232 5 connected 10923-16383
29a2 :0@0 master,noaddr - 0 1426238318243 3 disconnected
";

    #[test]
    fn reads_every_address_and_the_masters_claims() {
        let (addrs, claims) = parse_nodes(NODES);
        assert_eq!(
            addrs,
            [
                "127.0.0.1:30004",
                "127.0.0.1:30002",
                "127.0.0.1:30001",
                "127.0.0.1:30005"
            ]
        );
        assert_eq!(claims.len(), 3);
        assert_eq!(claims[1].slots, [(0, 5460)]);
        assert_eq!(claims[2].epoch, 5);
    }

    #[test]
    fn the_highest_epoch_owns_a_slot() {
        let (_, mut claims) = parse_nodes(NODES);
        // A replica promoted in epoch 7 takes 10923-16383; the old master
        // (epoch 5), still claiming them, loses.
        claims.push(Claim {
            addr: "127.0.0.1:30006".into(),
            epoch: 7,
            slots: vec![(10_923, 16_383)],
        });
        let view = View::merge(&claims);
        assert_eq!(
            view.runs,
            [
                (0, 5460, "127.0.0.1:30001".to_owned()),
                (5461, 10_922, "127.0.0.1:30002".to_owned()),
                (10_923, 16_383, "127.0.0.1:30006".to_owned()),
            ]
        );
        let nodes = Nodes::default();
        nodes.install(&View::merge(&parse_nodes(NODES).1));
        let moves = view.moves(&nodes.map());
        assert_eq!(
            moves,
            [(
                10_923,
                16_383,
                "127.0.0.1:30005".to_owned(),
                "127.0.0.1:30006".to_owned()
            )]
        );
    }

    #[test]
    fn a_node_breaker_opens_after_consecutive_outages_and_closes_on_an_answer() {
        let nodes = Nodes::default();
        nodes.install(&View::merge(&parse_nodes(NODES).1));
        let down: Result<(), StoreError> = Err(StoreError::Timeout);
        for _ in 0..3 {
            assert!(nodes.check(12_000).is_ok());
            nodes.record(12_000, &down);
        }
        assert!(nodes.check(12_000).is_err(), "its slots fail at once");
        assert!(nodes.check(100).is_ok(), "another node's slots go on");
        nodes.record(100, &down);
        nodes.record(100, &Ok(()));
        nodes.record(100, &down);
        nodes.record(100, &down);
        assert!(nodes.check(100).is_ok(), "a success resets the count");
        nodes.answered("127.0.0.1:30005");
        assert!(nodes.check(12_000).is_ok());
    }
}
