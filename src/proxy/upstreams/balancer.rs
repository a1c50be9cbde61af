//! A pool's live targets and how one is picked for each try.
//!
//! A [`Balancer`] holds the pool's endpoints — every address its targets
//! stand for (an address as written, or each address a name resolves to)
//! — and their state: requests in flight, consecutive failures, passive
//! ejection and the verdict of active checks. The endpoint list is swapped
//! whole when names resolve to new addresses; the state of an address that
//! stays is kept ([`EndpointState`] is shared), and so is it across a
//! configuration reload.
//!
//! Picking:
//!
//! - The candidates are the usable endpoints — not ejected, not failing
//!   their active checks — unless fewer than half of them are usable: then
//!   every endpoint is (Envoy's panic threshold), so a bad check or a bad
//!   deploy never funnels the whole load onto one survivor. Endpoints a
//!   request has tried already are left out of its next try while others
//!   remain.
//! - `round_robin` is nginx's smooth weighted round robin over them.
//! - `least_request` is the power of two choices: the first candidate is
//!   the smooth round robin's next, the second a random one, and the one
//!   with fewer requests in flight per unit of weight wins (the first on a
//!   tie). Under no load it is exactly weighted round robin; under load
//!   the less busy of two wins, as in Envoy.
//! - `hash` places each endpoint at 160 points per unit of weight on a
//!   ring of 64-bit hashes and takes the first candidate clockwise from the
//!   caller's key: a caller stays on its endpoint while that one is usable,
//!   and an endpoint leaving moves only its own callers. A caller without
//!   the key is balanced by least request.
//!
//! Randomness is a xorshift generator seeded from the pool's name, so a run
//! is repeatable.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use smallvec::SmallVec;
use tokio::sync::Notify;

use super::budget::RetryBudget;
use crate::config::{Balance, PoolTarget, TargetScheme, UpstreamPool};
use crate::metrics::targets::{PoolHealth, TargetFamilies, TargetMetrics, TryEnd};
use crate::proxy::keepalive::{ConnSettings, KeepAlive};

mod ring;

pub use ring::hash64;
use ring::{nth_set_bit, ring_pick};

/// Ring points per unit of weight for `balance: hash`.
const POINTS_PER_WEIGHT: usize = 160;

/// The longest an ejection lasts, in multiples of `eject.for`.
const MAX_EJECTION_FACTOR: u32 = 10;

/// Milliseconds since the first call, on the monotonic clock; ejection
/// deadlines are kept in it so they survive a reload.
fn now_ms() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    let epoch = *EPOCH.get_or_init(Instant::now);
    u64::try_from(epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// What one endpoint has been through; shared by every endpoint list (and
/// every configuration) the address belongs to.
#[derive(Debug)]
pub struct EndpointState {
    /// Keep-alive connections, for `http://` targets.
    pub conns: Option<KeepAlive>,
    in_flight: AtomicU32,
    /// Consecutive failed tries.
    failures: AtomicU32,
    /// When the current ejection ends (`now_ms`); 0 when not ejected.
    ejected_until: AtomicU64,
    /// Ejections since the factor was last reset (doubles each one).
    ejection_streak: AtomicU32,
    /// How long the last ejection lasted and when it ended, to tell a
    /// repeat (a failure sooner than that after its end) from a new one.
    last_ejection_ms: AtomicU64,
    last_end_ms: AtomicU64,
    /// Ejections in total, for `/admin/upstreams`.
    ejections: AtomicU64,
    /// The verdict of active checks (true without them).
    healthy: AtomicBool,
    /// Consecutive failed and passed active checks.
    check_fails: AtomicU32,
    check_passes: AtomicU32,
}

impl EndpointState {
    fn new(conns: Option<KeepAlive>) -> Self {
        Self {
            conns,
            in_flight: AtomicU32::new(0),
            failures: AtomicU32::new(0),
            ejected_until: AtomicU64::new(0),
            ejection_streak: AtomicU32::new(0),
            last_ejection_ms: AtomicU64::new(0),
            last_end_ms: AtomicU64::new(0),
            ejections: AtomicU64::new(0),
            healthy: AtomicBool::new(true),
            check_fails: AtomicU32::new(0),
            check_passes: AtomicU32::new(0),
        }
    }

    /// Requests now in flight to this endpoint.
    pub fn in_flight(&self) -> u32 {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Whether active checks pass (always, without them).
    pub fn healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }

    /// Ejections so far.
    pub fn ejections(&self) -> u64 {
        self.ejections.load(Ordering::Relaxed)
    }

    /// Whether an ejection is running at `now` (read lazily: the clock is
    /// read only when an ejection was started). An ejection that has run
    /// its time is ended here.
    fn ejected(&self, now: &mut Option<u64>) -> bool {
        let until = self.ejected_until.load(Ordering::Relaxed);
        if until == 0 {
            return false;
        }
        let t = *now.get_or_insert_with(now_ms);
        if t < until {
            return true;
        }
        // Ended; whoever sees it first clears it.
        let _ = self
            .ejected_until
            .compare_exchange(until, 0, Ordering::Relaxed, Ordering::Relaxed);
        false
    }

    /// Whether the endpoint takes requests (not ejected, checks passing).
    fn usable(&self, now: &mut Option<u64>) -> bool {
        self.healthy() && !self.ejected(now)
    }

    /// Whether an ejection is running now.
    pub fn is_ejected(&self) -> bool {
        self.ejected(&mut None)
    }

    /// Ends a running ejection before its time, if one runs. Its length
    /// and end stay as the doubling's history: failing again soon doubles.
    fn end_ejection(&self) -> bool {
        use Ordering::Relaxed;
        let (until, t) = (self.ejected_until.load(Relaxed), now_ms());
        let running = until != 0 && t < until;
        if !running
            || self
                .ejected_until
                .compare_exchange(until, 0, Relaxed, Relaxed)
                != Ok(until)
        {
            return false;
        }
        self.last_end_ms.store(t, Relaxed);
        self.failures.store(0, Relaxed);
        true
    }
}

/// One address of a target.
#[derive(Debug, Clone)]
pub struct Endpoint {
    /// Index of its target in the pool's `targets`.
    pub target: usize,
    /// The address; `None` for an `https://` target, whose client resolves
    /// its name itself.
    pub addr: Option<SocketAddr>,
    /// Its share of requests.
    pub weight: u32,
    /// What it has been through.
    pub state: Arc<EndpointState>,
}

/// One generation of a pool's endpoints: the list, the round robin's
/// state over it and, for `hash`, the ring.
#[derive(Debug)]
pub struct Endpoints {
    /// The endpoints, targets in file order, addresses sorted.
    pub list: Vec<Endpoint>,
    /// Smooth weighted round robin: each endpoint's current weight.
    current: Mutex<Vec<i64>>,
    /// Every endpoint has the same weight: the round robin is a rotation,
    /// one atomic add instead of the lock.
    equal: bool,
    /// The rotation's count.
    next: AtomicUsize,
    /// `(point, index)` sorted by point; empty unless `balance: hash`.
    ring: Vec<(u64, usize)>,
}

impl Endpoints {
    fn new(list: Vec<Endpoint>, balance: Balance) -> Self {
        let mut ring = Vec::new();
        if balance == Balance::Hash {
            for (i, e) in list.iter().enumerate() {
                let name = e
                    .addr
                    .map_or_else(|| format!("#{}", e.target), |a| a.to_string());
                for p in 0..POINTS_PER_WEIGHT * e.weight as usize {
                    ring.push((hash64(format!("{name}-{p}").as_bytes()), i));
                }
            }
            ring.sort_unstable();
        }
        Self {
            current: Mutex::new(vec![0; list.len()]),
            equal: list.windows(2).all(|w| w[0].weight == w[1].weight),
            next: AtomicUsize::new(0),
            list,
            ring,
        }
    }
}

/// Identity of an endpoint across endpoint lists and configurations: the
/// target as written and the address.
type EndpointKey = (Arc<str>, Option<SocketAddr>);

/// The endpoints a request has tried, by their state's address.
pub type Tried = SmallVec<[usize; 4]>;

fn tried_key(e: &Endpoint) -> usize {
    Arc::as_ptr(&e.state) as usize
}

/// A pool's targets at run time: endpoints, balancing, ejection, retry
/// budget.
pub struct Balancer {
    /// The pool as configured.
    pub config: Arc<UpstreamPool>,
    endpoints: ArcSwap<Endpoints>,
    /// The endpoints of a pool whose targets are all addresses, which
    /// never change: read by a pick without the swap's load.
    fixed: Option<Arc<Endpoints>>,
    /// Every state the balancer has made or was handed, by key, so an
    /// address that leaves and comes back keeps its history.
    states: Mutex<Vec<(EndpointKey, Arc<EndpointState>)>>,
    rng: AtomicU64,
    budget: RetryBudget,
    /// Wakes the resolver task (a connect failure asks for a fresh look).
    pub(super) resolve_now: Notify,
    conn_settings: ConnSettings,
    /// Each target's series, by target index (empty without metrics).
    metrics: Vec<TargetMetrics>,
}

impl std::fmt::Debug for Balancer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Balancer")
            .field("pool", &self.config.name)
            .field("endpoints", &self.endpoints.load().list.len())
            .finish_non_exhaustive()
    }
}

impl Balancer {
    /// A balancer for `config`. Targets written as addresses are endpoints
    /// at once; names join once resolved ([`Self::set_addresses`]).
    /// `previous` is the balancer of the same pool in the configuration
    /// being replaced: its endpoints' states, and the addresses its names
    /// resolved to, carry over.
    pub fn new(
        config: Arc<UpstreamPool>,
        previous: Option<&Self>,
        conn_settings: ConnSettings,
        metrics: Option<&TargetFamilies>,
    ) -> Self {
        let metrics = metrics.map_or_else(Vec::new, |m| {
            config
                .targets
                .iter()
                .map(|t| m.target(&config.name, &t.url))
                .collect()
        });
        let states = previous.map_or_else(Vec::new, |p| {
            p.states
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone()
        });
        let seed = hash64(config.name.as_bytes()) | 1;
        let mut balancer = Self {
            endpoints: ArcSwap::from_pointee(Endpoints::new(Vec::new(), config.balance)),
            fixed: None,
            states: Mutex::new(states),
            rng: AtomicU64::new(seed),
            // Linkerd's numbers: retries at most 20 % of requests over
            // 10 s, with a floor of 10 retries a second.
            budget: RetryBudget::new(Duration::from_secs(10), 10, 0.2),
            resolve_now: Notify::new(),
            conn_settings,
            metrics,
            config,
        };
        let mut addresses: Vec<Vec<Option<SocketAddr>>> = Vec::new();
        for t in &balancer.config.targets {
            let known = match (t.scheme, t.host.parse::<std::net::IpAddr>()) {
                // Spoken to through hyper's client, which resolves the name.
                (TargetScheme::Https | TargetScheme::H2c, _) => vec![None],
                (TargetScheme::Http, Ok(ip)) => vec![Some(SocketAddr::new(ip, t.port))],
                // A name: what it resolved to in the configuration being
                // replaced, until it is resolved again.
                (TargetScheme::Http, Err(_)) => previous
                    .map(|p| {
                        p.endpoints
                            .load()
                            .list
                            .iter()
                            .filter(|e| p.config.targets[e.target].url == t.url)
                            .map(|e| e.addr)
                            .collect()
                    })
                    .unwrap_or_default(),
            };
            addresses.push(known);
        }
        balancer.rebuild(&addresses);
        if !balancer.has_names() {
            balancer.fixed = Some(balancer.endpoints.load_full());
        }
        balancer
    }

    /// The pool's name.
    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// The endpoints now.
    pub fn endpoints(&self) -> Arc<Endpoints> {
        self.endpoints.load_full()
    }

    /// Whether the pool has no endpoint (its names not resolved yet).
    pub fn is_empty(&self) -> bool {
        self.endpoints.load().list.is_empty()
    }

    /// Whether some target is a name that needs resolving.
    pub fn has_names(&self) -> bool {
        self.config
            .targets
            .iter()
            .any(|t| t.scheme == TargetScheme::Http && t.host.parse::<std::net::IpAddr>().is_err())
    }

    /// Sets the addresses target `target` (a name) resolves to; the other
    /// targets keep theirs. A pool without names keeps its endpoints.
    pub fn set_addresses(&self, target: usize, mut addrs: Vec<SocketAddr>) {
        if self.fixed.is_some() {
            return;
        }
        addrs.sort_unstable();
        addrs.dedup();
        let current = self.endpoints.load();
        let mut addresses: Vec<Vec<Option<SocketAddr>>> =
            vec![Vec::new(); self.config.targets.len()];
        for e in &current.list {
            addresses[e.target].push(e.addr);
        }
        let new: Vec<Option<SocketAddr>> = addrs.into_iter().map(Some).collect();
        if addresses[target] == new {
            return;
        }
        addresses[target] = new;
        self.rebuild(&addresses);
    }

    fn rebuild(&self, addresses: &[Vec<Option<SocketAddr>>]) {
        let mut states = self.states.lock().unwrap_or_else(PoisonError::into_inner);
        let mut list = Vec::new();
        for (i, addrs) in addresses.iter().enumerate() {
            let t = &self.config.targets[i];
            for &addr in addrs {
                let key = (t.url.clone(), addr);
                let state = match states.iter().find(|(k, _)| *k == key) {
                    Some((_, s)) => s.clone(),
                    None => {
                        let s = Arc::new(EndpointState::new(self.conns(t, addr)));
                        states.push((key, s.clone()));
                        s
                    }
                };
                list.push(Endpoint {
                    target: i,
                    addr,
                    weight: t.weight,
                    state,
                });
            }
        }
        // States no endpoint uses and no one else holds are forgotten.
        states.retain(|(_, s)| {
            Arc::strong_count(s) > 1 || list.iter().any(|e| Arc::ptr_eq(&e.state, s))
        });
        self.endpoints
            .store(Arc::new(Endpoints::new(list, self.config.balance)));
    }

    fn conns(&self, t: &PoolTarget, addr: Option<SocketAddr>) -> Option<KeepAlive> {
        match (t.scheme, addr) {
            (TargetScheme::Http, Some(addr)) => Some(KeepAlive::to_addr(
                t.authority.clone(),
                addr,
                self.conn_settings,
            )),
            _ => None,
        }
    }

    /// The endpoint for the next try of a request, leaving out those in
    /// `tried` while others remain; `key` is the caller's hash for
    /// `balance: hash`. `None` when the pool has no endpoint.
    pub fn pick(&self, key: Option<u64>, tried: &Tried) -> Option<Endpoint> {
        let loaded;
        let eps: &Endpoints = match &self.fixed {
            Some(fixed) => fixed,
            None => {
                loaded = self.endpoints.load();
                &loaded
            }
        };
        let list = &eps.list;
        if list.is_empty() {
            return None;
        }
        if list.len() == 1 {
            return (!tried.contains(&tried_key(&list[0]))).then(|| list[0].clone());
        }
        let mut now = None;
        // Usable ones, as a bit set over the first 128 endpoints, and how
        // many (counted here: a popcount of 128 bits is some 40
        // instructions without the CPU's own).
        let n = list.len().min(128);
        let mut usable: u128 = 0;
        let mut count = 0usize;
        let mut bit: u128 = 1;
        for e in &list[..n] {
            if e.state.usable(&mut now) {
                usable |= bit;
                count += 1;
            }
            bit <<= 1;
        }
        // Every endpoint, as a bit set: asked for only past the panic
        // threshold or on a try after the first.
        let all = || -> u128 { if n == 128 { u128::MAX } else { (1 << n) - 1 } };
        // Panic threshold: fewer than half usable → all of them.
        let (mut candidates, mut count) = if count * 2 < n {
            (all(), n)
        } else {
            (usable, count)
        };
        // A first try (the common case) has nothing to leave out.
        if !tried.is_empty() {
            let mut untried_all = all();
            for (i, e) in list.iter().enumerate().take(128) {
                if tried.contains(&tried_key(e)) {
                    untried_all &= !(1 << i);
                }
            }
            if untried_all == 0 {
                return None;
            }
            // Candidates not tried yet, else any endpoint not tried yet.
            candidates = match candidates & untried_all {
                0 => untried_all,
                c => c,
            };
            count = candidates.count_ones() as usize;
        }
        let i = match (self.config.balance, key) {
            (Balance::RoundRobin, _) => self.round_robin(eps, candidates, count),
            (Balance::Hash, Some(k)) => ring_pick(&eps.ring, k, candidates),
            (Balance::LeastRequest | Balance::Hash, _) => {
                self.least_request(eps, candidates, count)
            }
        };
        Some(list[i].clone())
    }

    /// nginx's smooth weighted round robin over `candidates` (`count` of
    /// them): each gains its weight, the largest is chosen and loses the
    /// total.
    #[inline]
    fn round_robin(&self, eps: &Endpoints, candidates: u128, count: usize) -> usize {
        if eps.equal {
            // Equal weights: the smooth round robin visits the candidates
            // in turn, which a rotation does without the lock.
            let turn = eps.next.fetch_add(1, Ordering::Relaxed);
            if count > 0 {
                let nth = u32::try_from(turn % count).unwrap_or(0);
                return nth_set_bit(candidates, nth);
            }
        }
        smooth(eps, candidates)
    }

    /// Power of two choices: the round robin's next against a random
    /// candidate; fewer in flight per unit of weight wins. `count` is the
    /// number of candidates.
    fn least_request(&self, eps: &Endpoints, candidates: u128, count: usize) -> usize {
        let first = self.round_robin(eps, candidates, count);
        // The round robin picks one of the candidates.
        let rest = count.saturating_sub(1) as u64;
        // With nothing in flight on the round robin's pick no other has
        // fewer: the pick stands without drawing a second (the common
        // case under light load, and what keeps the weights exact there).
        if rest == 0 || eps.list[first].state.in_flight() == 0 {
            return first;
        }
        let others = candidates & !(1 << first);
        let nth = u32::try_from(self.random() % rest).unwrap_or(0);
        let second = nth_set_bit(others, nth);
        let (a, b) = (&eps.list[first], &eps.list[second]);
        // In flight per unit of weight, compared without dividing; with
        // nothing in flight the round robin's pick stands, so the weights
        // hold exactly under light load.
        let load = |e: &Endpoint, other: &Endpoint| {
            u64::from(e.state.in_flight()) * u64::from(other.weight)
        };
        if load(b, a) < load(a, b) {
            second
        } else {
            first
        }
    }

    fn random(&self) -> u64 {
        // xorshift64; a lost update between threads only repeats a number.
        let mut x = self.rng.load(Ordering::Relaxed);
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.rng.store(x, Ordering::Relaxed);
        x
    }

    /// Counts one try on `e` in its target's series.
    pub fn tried(&self, e: &Endpoint, outcome: TryEnd, took: Option<Duration>) {
        if let Some(m) = self.metrics.get(e.target) {
            m.tried(outcome, took);
        }
    }

    /// Endpoints that take requests now.
    pub fn usable(&self) -> usize {
        let mut now = None;
        self.endpoints
            .load()
            .list
            .iter()
            .filter(|e| e.state.usable(&mut now))
            .count()
    }

    /// Counts the request in the retry budget.
    pub fn deposit(&self) {
        self.budget.deposit();
    }

    /// Takes a retry from the budget; false when it is spent.
    pub fn withdraw(&self) -> bool {
        self.budget.withdraw()
    }

    /// A try on `e` succeeded (its answer was not 502, 503 or 504).
    pub fn succeeded(&self, e: &Endpoint) {
        if e.state.failures.load(Ordering::Relaxed) != 0 {
            e.state.failures.store(0, Ordering::Relaxed);
        }
    }

    /// A try on `e` failed: it could not connect, was reset, timed out, or
    /// answered 502, 503 or 504. Returns whether this ejected it.
    pub fn failed(&self, e: &Endpoint) -> bool {
        let eject = self.config.eject;
        let n = e.state.failures.fetch_add(1, Ordering::Relaxed) + 1;
        if n < eject.after {
            return false;
        }
        let mut now = None;
        if e.state.ejected(&mut now) {
            return false;
        }
        let eps = self.endpoints.load();
        let total = eps.list.len() as u64;
        let ejected = eps
            .list
            .iter()
            .filter(|o| o.state.ejected(&mut now))
            .count() as u64;
        // At least one may always be ejected (as Envoy does); beyond that,
        // `max_percent` of the pool.
        if ejected > 0 && (ejected + 1) * 100 > u64::from(eject.max_percent) * total {
            return false;
        }
        let t = *now.get_or_insert_with(now_ms);
        let s = &e.state;
        // A target that stayed in as long as its last ejection lasted
        // starts over at `for`; one that fails again sooner doubles it.
        let last = s.last_ejection_ms.load(Ordering::Relaxed);
        let back_since = s.last_end_ms.load(Ordering::Relaxed);
        let streak = if t.saturating_sub(back_since) < last {
            s.ejection_streak.load(Ordering::Relaxed)
        } else {
            0
        };
        let factor = 1u32
            .checked_shl(streak)
            .unwrap_or(MAX_EJECTION_FACTOR)
            .min(MAX_EJECTION_FACTOR);
        let ms = u64::try_from(eject.duration.as_millis()).unwrap_or(u64::MAX) * u64::from(factor);
        s.ejection_streak.store(streak + 1, Ordering::Relaxed);
        s.last_ejection_ms.store(ms, Ordering::Relaxed);
        let until = t.saturating_add(ms).max(1);
        s.last_end_ms.store(until, Ordering::Relaxed);
        s.ejected_until.store(until, Ordering::Relaxed);
        s.failures.store(0, Ordering::Relaxed);
        // Passes that end the ejection are counted from here.
        s.check_passes.store(0, Ordering::Relaxed);
        s.ejections.fetch_add(1, Ordering::Relaxed);
        if let Some(m) = self.metrics.get(e.target) {
            m.ejected();
        }
        tracing::warn!(
            pool = %self.config.name,
            target = %self.config.targets[e.target].url,
            addr = ?e.addr,
            for_ms = ms,
            "target ejected after consecutive failures"
        );
        true
    }

    /// The verdict of one active check of `e`; returns whether its health
    /// changed. `healthy_after` passes also end a running ejection, unless
    /// `eject.ended_by_checks` is false.
    pub fn checked(&self, e: &Endpoint, passed: bool) -> Option<bool> {
        let health = self.config.health.as_ref()?;
        let s = &e.state;
        if passed {
            s.check_fails.store(0, Ordering::Relaxed);
            let n = s.check_passes.fetch_add(1, Ordering::Relaxed) + 1;
            let ends = n >= health.healthy_after && self.config.eject.ended_by_checks;
            if ends && s.end_ejection() {
                if let Some(m) = self.metrics.get(e.target) {
                    m.ejection_ended();
                }
                let target = &self.config.targets[e.target].url;
                tracing::info!(pool = %self.config.name, %target, addr = ?e.addr, "target passes its health checks; ejection ended");
            }
            if !s.healthy() && n >= health.healthy_after {
                s.healthy.store(true, Ordering::Relaxed);
                return Some(true);
            }
        } else {
            s.check_passes.store(0, Ordering::Relaxed);
            let n = s.check_fails.fetch_add(1, Ordering::Relaxed) + 1;
            if s.healthy() && n >= health.unhealthy_after {
                s.healthy.store(false, Ordering::Relaxed);
                return Some(false);
            }
        }
        None
    }
}

/// The smooth weighted round robin over `candidates`, under its lock:
/// each gains its weight, the largest is chosen and loses the total. Not
/// inlined: an equal-weights pool rotates instead.
#[inline(never)]
fn smooth(eps: &Endpoints, candidates: u128) -> usize {
    let mut current = eps.current.lock().unwrap_or_else(PoisonError::into_inner);
    let mut total = 0i64;
    let mut best: Option<usize> = None;
    for (i, e) in eps.list.iter().enumerate().take(128) {
        if candidates & (1 << i) == 0 {
            continue;
        }
        let w = i64::from(e.weight);
        current[i] += w;
        total += w;
        if best.is_none_or(|b| current[i] > current[b]) {
            best = Some(i);
        }
    }
    let best = best.unwrap_or(0);
    current[best] -= total;
    best
}

impl PoolHealth for Balancer {
    fn pool(&self) -> &str {
        &self.config.name
    }

    fn usable(&self) -> usize {
        Balancer::usable(self)
    }
}

/// A request in flight to an endpoint: counted from the try until the
/// response body ends (or the try fails).
#[derive(Debug)]
pub struct InFlight(Arc<EndpointState>);

impl InFlight {
    /// Counts a request on `e`.
    pub fn start(e: &Endpoint) -> Self {
        e.state.in_flight.fetch_add(1, Ordering::Relaxed);
        Self(e.state.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Records `tried` as having tried `e`.
pub fn mark_tried(tried: &mut Tried, e: &Endpoint) {
    tried.push(tried_key(e));
}

#[cfg(test)]
mod tests;
