//! `sync` mode: a limit decided in process against the last known fleet
//! total, with Redis off the request path.
//!
//! A limit with `sync: 100ms` (or under `store.redis.sync`) keeps, per
//! key, three sets of counts in this table: `fleet`, the totals Redis
//! answered at the last exchange (everyone's admissions, this gateway's
//! included); `sent`, what this gateway admitted and has sent in the
//! exchange under way; and `unsent`, what it admitted since. A decision is
//! the algorithm's own arithmetic (`crate::limit`) on their sum, so a
//! gateway sees its own admissions at once and everyone else's within one
//! exchange. Every interval a background task of the [`Limiter`] takes
//! the keys touched since ([`SyncTable::take`]), sends their deltas in one
//! call per Cluster slot ([`RedisStore::sync`], `sync.lua`: `INCRBY`-like
//! additions to the same keys, in the same layout and with the same
//! expiries as exact mode) and keeps the totals it answers
//! ([`SyncTable::apply`]). A key only denied is sent with nothing to add:
//! the call then reads its totals, so a gateway learns when the fleet's
//! count decays.
//!
//! Which keys go when: a key is urgent — sent at the next tick — when its
//! totals were never read, when it denied, or once this instance has
//! admitted `1/(10·N)` of the room its view leaves (`N` live instances);
//! any other touched key waits, up to 100 intervals (a quarter of its
//! window at most). So Redis works for the callers near their limits, and
//! for the rest once per key every 100 intervals, however busy they are.
//!
//! Only counters can be synced: a sliding or fixed window (calendar months
//! too) is a sum that gateways can add to apart. A sliding log or GCRA
//! state is not; the loader refuses `sync` on them.
//!
//! **The bound.** A gateway misses at most what the others admitted since
//! their last exchange before its own last one, and since: up to two
//! intervals and a round trip of their traffic, or one request more when
//! their last exchange of the key is older than an interval. A waiting
//! key adds what the instances admit unseen while it waits, a tenth of
//! the room left in all. So in any window a caller whose requests reach
//! N instances at a rate of `r` each gets at most
//! `L + L/10 + (N − 1) · (r · (2·interval + RTT) + 1)` admitted — about
//! `rate × interval × instances` — and never fewer than `L` (a view only
//! ever misses counts). One instance alone is exact. `docs/redis.md` has
//! a worked example and measured figures.
//!
//! `RateLimit` headers come from the same sum: `remaining` is
//! `L − (fleet + sent + unsent)`, never negative, approximate by the
//! bound.
//!
//! The table is sharded like the in-process store; a decision locks the
//! shards of its keys in ascending order and checks and consumes together,
//! so the limits of one request stay atomic with each other. Keys whose
//! counts stopped counting are swept when a shard has doubled.
//!
//! [`Limiter`]: super::limiter::Limiter
//! [`RedisStore::sync`]: crate::store::RedisStore::sync

use std::collections::VecDeque;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use hashbrown::HashTable;
use smallvec::SmallVec;
use tokio::sync::Notify;

use crate::limit::{
    Algorithm, Decision, LimitOutcome, LimitRequest, Outcomes, calendar, fixed_window,
    sliding_window,
};
use crate::store::redis::sync::{Counter, Delta, Synced};

const SHARDS: usize = 64;

/// Counts of a window and the one before it (a fixed window uses `cur`
/// alone).
type Counts = sliding_window::Counts;

/// How a synced limit counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Sliding,
    Fixed,
    Month,
}

impl Kind {
    /// The kind of `algorithm`, when it can be synced.
    fn of(algorithm: Algorithm) -> Option<Kind> {
        match algorithm {
            Algorithm::SlidingWindow => Some(Kind::Sliding),
            Algorithm::FixedWindow => Some(Kind::Fixed),
            Algorithm::CalendarMonth => Some(Kind::Month),
            Algorithm::SlidingLog | Algorithm::Gcra { .. } => None,
        }
    }

    /// The index of the window `now` falls in.
    fn index(self, now: u64, window_ms: u64) -> u64 {
        match self {
            Kind::Month => calendar::month_index(now),
            Kind::Sliding | Kind::Fixed => now / window_ms,
        }
    }

    /// `c` as seen from window `i`: a sliding window rolls `cur` into
    /// `prev`, a fixed window starts again. Counts from a later window (a
    /// clock ahead) are kept, as the stores keep them.
    fn roll(self, c: Counts, i: u64) -> Counts {
        match self {
            Kind::Sliding => c.at(i),
            Kind::Fixed | Kind::Month if c.window >= i => c,
            Kind::Fixed | Kind::Month => empty(i),
        }
    }

    /// `a + b`, both seen from the later of their windows.
    fn merge(self, a: Counts, b: Counts) -> Counts {
        let i = a.window.max(b.window);
        let (a, b) = (self.roll(a, i), self.roll(b, i));
        Counts {
            window: i,
            prev: a.prev.saturating_add(b.prev),
            cur: a.cur.saturating_add(b.cur),
        }
    }

    /// The algorithm's answer for `r` at cost `cost` against `view`.
    fn check(self, view: Counts, now: u64, r: &LimitRequest, cost: u64) -> LimitOutcome {
        let fixed = fixed_window::Count {
            window: view.window,
            count: view.cur,
        };
        match self {
            Kind::Sliding => sliding_window::check(view, now, r.limit, r.window_ms, cost),
            Kind::Fixed => fixed_window::check(fixed, now, r.limit, r.window_ms, cost),
            Kind::Month => {
                fixed_window::check_until(fixed, now, r.limit, calendar::month(now).1, cost)
            }
        }
    }

    /// How Redis is told to count a key of window `window_ms` at `now`.
    fn counter(self, now: u64, window_ms: u64) -> Counter {
        match self {
            Kind::Sliding => Counter::Sliding { window_ms },
            Kind::Fixed => {
                let index = now / window_ms;
                Counter::Fixed {
                    window_ms,
                    index,
                    end_ms: index.saturating_add(1).saturating_mul(window_ms),
                }
            }
            Kind::Month => {
                let (index, end_ms) = calendar::month(now);
                Counter::Fixed {
                    window_ms,
                    index,
                    end_ms,
                }
            }
        }
    }
}

fn empty(window: u64) -> Counts {
    Counts {
        window,
        prev: 0,
        cur: 0,
    }
}

/// One key in sync mode.
#[derive(Debug)]
struct Entry {
    key: Box<str>,
    kind: Kind,
    window_ms: u64,
    /// How often it is exchanged, in ms.
    interval_ms: u64,
    /// The fleet's totals at the last exchange.
    fleet: Counts,
    /// Admitted here and sent in the exchange under way.
    sent: Counts,
    /// Admitted here since.
    unsent: Counts,
    /// Touched since its last exchange: in the shard's `waiting` list.
    queued: bool,
    /// Also in the shard's `urgent` list: exchanged at the next tick.
    urgent: bool,
    /// When it was queued (its record in `waiting`).
    queued_at: u64,
    /// Longest a queued key that is not urgent waits, in ms.
    max_wait_ms: u64,
    /// Its totals have been read from Redis at least once.
    read: bool,
    /// In the exchange under way.
    in_flight: bool,
    /// Redis holds something else at this key: decisions on it fail (as
    /// in exact mode) until an exchange reads counts again.
    garbage: bool,
    /// When it was last taken for an exchange.
    taken_at: u64,
}

impl Entry {
    fn new(key: &str, kind: Kind, window_ms: u64, interval_ms: u64) -> Entry {
        Entry {
            key: key.into(),
            kind,
            window_ms,
            interval_ms,
            fleet: Counts::default(),
            sent: Counts::default(),
            unsent: Counts::default(),
            queued: false,
            urgent: false,
            queued_at: 0,
            max_wait_ms: max_wait(interval_ms, window_ms),
            read: false,
            in_flight: false,
            garbage: false,
            taken_at: 0,
        }
    }

    /// What this gateway believes the key holds in window `i`.
    fn view(&self, i: u64) -> Counts {
        let k = self.kind;
        let (f, s, u) = (
            k.roll(self.fleet, i),
            k.roll(self.sent, i),
            k.roll(self.unsent, i),
        );
        Counts {
            // Counts from a clock ahead keep their window (`roll`); the
            // sum is read from this gateway's position in its own window,
            // which errs by the skew, as the stores do.
            window: f.window.max(i),
            prev: f.prev.saturating_add(s.prev).saturating_add(u.prev),
            cur: f.cur.saturating_add(s.cur).saturating_add(u.cur),
        }
    }

    /// Whether nothing in it counts at `now` and nothing waits.
    fn is_idle(&self, now: u64) -> bool {
        if self.queued || self.in_flight {
            return false;
        }
        let v = self.view(self.kind.index(now, self.window_ms));
        v.prev == 0 && v.cur == 0
    }
}

/// How long a key far from its limit may wait for its exchange: a hundred
/// intervals, at most a quarter of its window, at least one interval.
fn max_wait(interval_ms: u64, window_ms: u64) -> u64 {
    interval_ms
        .saturating_mul(MAX_WAIT_INTERVALS)
        .min(window_ms / 4)
        .max(interval_ms)
}

/// A queued key waits at most this many intervals (see [`max_wait`]).
const MAX_WAIT_INTERVALS: u64 = 100;

/// The share of the room left that the instances may admit, together,
/// between two exchanges of a key that waits: a key becomes urgent once
/// this instance has admitted `1 / (ROOM_SHARE · N)` of the room its view
/// leaves.
const ROOM_SHARE: u64 = 10;

/// Keys that waited their longest taken in one exchange at most (urgent
/// ones are not counted): when many come due at once — all first touched
/// in the same second — the work is spread over a few ticks instead of
/// holding the runtime for one large exchange.
const MAX_WAITED_PER_EXCHANGE: usize = 1024;

/// Keys waiting for an exchange: `urgent` ones go at the next tick,
/// `waiting` ones (every queued key, in the order it was queued) when
/// they have waited their longest.
#[derive(Default)]
struct Queue {
    urgent: Vec<Box<str>>,
    waiting: VecDeque<(u64, Box<str>)>,
}

impl Queue {
    /// Queues `e` (once) as touched at `now`; `urgent` also puts it in the
    /// list for the next tick.
    fn touch(&mut self, e: &mut Entry, now: u64, urgent: bool) {
        if !e.queued {
            e.queued = true;
            e.queued_at = now;
            self.waiting.push_back((now, e.key.clone()));
        }
        if urgent && !e.urgent {
            e.urgent = true;
            self.urgent.push(e.key.clone());
        }
    }
}

#[derive(Default)]
struct Shard {
    table: HashTable<Entry>,
    queue: Queue,
    swept_at_len: usize,
}

/// The counts of every key in sync mode, with what each owes Redis.
pub struct SyncTable {
    shards: Box<[Mutex<Shard>]>,
    hasher: RandomState,
    /// The shortest interval of any key seen (ms): how often the exchange
    /// task wakes. `u64::MAX` until a key is synced.
    tick_ms: AtomicU64,
    /// Wakes the exchange task when `tick_ms` shrinks.
    tick_changed: Notify,
    /// The live instances last counted (at least 1), for the share of the
    /// room a waiting key may use.
    instances: AtomicU64,
    /// The shard each exchange starts at, turning.
    rotation: std::sync::atomic::AtomicUsize,
}

impl std::fmt::Debug for SyncTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SyncTable")
            .field("tick_ms", &self.tick_ms.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Default for SyncTable {
    fn default() -> Self {
        Self::new()
    }
}

/// The shards of one decision, locked, each with its index.
type Guards<'a> = SmallVec<[(usize, MutexGuard<'a, Shard>); 4]>;

fn lock(m: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn shard_of(hash: u64) -> usize {
    // Bits hashbrown uses for neither the bucket nor the tag (as the
    // in-process store picks its shards).
    (hash >> 32) as usize % SHARDS
}

fn guard<'g, 'a>(guards: &'g mut Guards<'a>, shard: usize) -> &'g mut Shard {
    let at = guards
        .iter()
        .position(|(i, _)| *i == shard)
        .unwrap_or_default();
    &mut guards[at].1
}

/// Whether `algorithm` can be decided in sync mode.
pub fn syncable(algorithm: Algorithm) -> bool {
    Kind::of(algorithm).is_some()
}

impl SyncTable {
    /// An empty table.
    pub fn new() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            hasher: RandomState::new(),
            tick_ms: AtomicU64::new(u64::MAX),
            tick_changed: Notify::new(),
            instances: AtomicU64::new(1),
            rotation: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// The live instances sharing the keys (from the heartbeat).
    pub fn set_instances(&self, n: u64) {
        self.instances.store(n.max(1), Ordering::Relaxed);
    }

    fn hash(&self, key: &str) -> u64 {
        self.hasher.hash_one(key.as_bytes())
    }

    /// Keys held; for tests and metrics.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| lock(s).table.len()).sum()
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How often the exchange runs: the shortest interval of any key,
    /// `None` before the first.
    pub fn tick(&self) -> Option<Duration> {
        match self.tick_ms.load(Ordering::Relaxed) {
            u64::MAX => None,
            ms => Some(Duration::from_millis(ms.max(1))),
        }
    }

    /// Waits until [`Self::tick`] shrinks (or a first key arrives).
    pub async fn tick_changed(&self) {
        self.tick_changed.notified().await;
    }

    /// Decides `requests` (each with its interval in `intervals`, ms) at
    /// `now` against what this gateway knows of the fleet: admitted only
    /// if every limit admits, and then — for [`Intent::Consume`] — each
    /// cost is added to what this gateway owes Redis. A denied request consumes
    /// nothing and shows every limit without it, as the stores do.
    /// `None` when a key holds garbage in Redis (see [`Self::apply`]):
    /// the failure policy decides, as for the decision script's error.
    pub fn decide(
        &self,
        now: u64,
        requests: &[LimitRequest],
        intervals: &[u64],
        intent: Intent,
    ) -> Option<Decision> {
        let instances = self.instances.load(Ordering::Relaxed);
        if let ([r], [interval]) = (requests, intervals) {
            // One limit, the common case: one lock, one lookup.
            let h = self.hash(&r.key);
            let mut shard = lock(&self.shards[shard_of(h)]);
            let Shard {
                table,
                queue,
                swept_at_len,
            } = &mut *shard;
            let e = self.entry(table, swept_at_len, h, r, *interval, now)?;
            let view = e.view(e.kind.index(now, r.window_ms));
            let mut o = e.kind.check(view, now, r, r.cost);
            let allowed = o.admits;
            account(e, queue, view, r, &mut o, allowed, intent, now, instances);
            let mut outcomes = Outcomes::new();
            outcomes.push(o);
            return Some(Decision { allowed, outcomes });
        }
        let hashes: SmallVec<[u64; 4]> = requests.iter().map(|r| self.hash(&r.key)).collect();
        let mut guards = self.lock_shards(&hashes);
        let mut views: SmallVec<[Counts; 4]> = SmallVec::new();
        let mut outcomes = Outcomes::with_capacity(requests.len());
        for ((r, &h), &interval) in requests.iter().zip(&hashes).zip(intervals) {
            let Shard {
                table,
                swept_at_len,
                ..
            } = guard(&mut guards, shard_of(h));
            let e = self.entry(table, swept_at_len, h, r, interval, now)?;
            let view = e.view(e.kind.index(now, r.window_ms));
            outcomes.push(e.kind.check(view, now, r, r.cost));
            views.push(view);
        }
        let allowed = outcomes.iter().all(|o| o.admits);
        for (((r, &h), o), view) in requests.iter().zip(&hashes).zip(&mut outcomes).zip(&views) {
            let Shard { table, queue, .. } = guard(&mut guards, shard_of(h));
            if let Some(e) = table.find_mut(h, |e| *e.key == *r.key) {
                account(e, queue, *view, r, o, allowed, intent, now, instances);
            }
        }
        Some(Decision { allowed, outcomes })
    }

    /// The entry of `r` in `shard`, made when absent; `None` when its key
    /// holds garbage in Redis.
    fn entry<'s>(
        &self,
        table: &'s mut HashTable<Entry>,
        swept_at_len: &mut usize,
        h: u64,
        r: &LimitRequest,
        interval: u64,
        now: u64,
    ) -> Option<&'s mut Entry> {
        let kind = Kind::of(r.algorithm)?;
        let interval = interval.max(1);
        if table.find(h, |e| *e.key == *r.key).is_none() {
            let len = table.len();
            if len > 1024 && len >= 2 * *swept_at_len {
                table.retain(|e| !e.is_idle(now));
                *swept_at_len = table.len().max(512);
            }
            let hasher = &self.hasher;
            table.insert_unique(h, Entry::new(&r.key, kind, r.window_ms, interval), |e| {
                hasher.hash_one(e.key.as_bytes())
            });
            if self.tick_ms.fetch_min(interval, Ordering::Relaxed) > interval {
                self.tick_changed.notify_waiters();
            }
        }
        let e = table.find_mut(h, |e| *e.key == *r.key)?;
        if e.window_ms != r.window_ms || e.kind != kind {
            // The limit changed on reload: what was counted under the old
            // window is not this limit's any more (nor Redis's view of it).
            *e = Entry::new(&r.key, kind, r.window_ms, interval);
        } else if e.interval_ms != interval {
            e.interval_ms = interval;
            e.max_wait_ms = max_wait(interval, e.window_ms);
            if self.tick_ms.fetch_min(interval, Ordering::Relaxed) > interval {
                self.tick_changed.notify_waiters();
            }
        }
        (!e.garbage).then_some(e)
    }

    /// Locks the shards `hashes` fall in, each once, in ascending order.
    fn lock_shards(&self, hashes: &[u64]) -> Guards<'_> {
        let mut order: SmallVec<[usize; 4]> = hashes.iter().map(|&h| shard_of(h)).collect();
        order.sort_unstable();
        order.dedup();
        order.iter().map(|&i| (i, lock(&self.shards[i]))).collect()
    }

    /// Takes the keys due for an exchange at `now` — the urgent ones whose
    /// interval has passed since their last exchange (less half a tick, so
    /// a key is not left a whole tick late), and those that waited their
    /// longest; every queued key when `all` — with what each owes Redis.
    /// Their admissions move from `unsent` to `sent` until [`Self::apply`].
    pub fn take(&self, now: u64, all: bool) -> Vec<Delta> {
        let half_tick = self.tick_ms.load(Ordering::Relaxed).min(u64::MAX / 2) / 2;
        let mut out = Vec::new();
        let mut waited = 0;
        // Each exchange starts at another shard, so a budget used up early
        // does not leave the same shards behind every time.
        let first = self.rotation.fetch_add(1, Ordering::Relaxed);
        for n in 0..SHARDS {
            let mut shard = lock(&self.shards[(first + n) % SHARDS]);
            let Shard { table, queue, .. } = &mut *shard;
            let mut later = Vec::new();
            for key in std::mem::take(&mut queue.urgent) {
                let h = self.hasher.hash_one(key.as_bytes());
                let Some(e) = table.find_mut(h, |e| e.key == key) else {
                    continue;
                };
                if !e.urgent {
                    continue;
                }
                let due = all
                    || now.saturating_add(half_tick) >= e.taken_at.saturating_add(e.interval_ms);
                if e.in_flight || !due {
                    later.push(key);
                    continue;
                }
                out.push(take_one(e, now));
            }
            queue.urgent = later;
            while let Some((at, key)) = queue.waiting.pop_front() {
                let h = self.hasher.hash_one(key.as_bytes());
                let Some(e) = table.find_mut(h, |e| e.key == key) else {
                    continue;
                };
                if !e.queued || e.queued_at != at {
                    // Taken since (as urgent) and maybe queued again: this
                    // record is stale.
                    continue;
                }
                if !all
                    && (now < at.saturating_add(e.max_wait_ms) || waited >= MAX_WAITED_PER_EXCHANGE)
                {
                    // Queued in order: the rest waited less.
                    queue.waiting.push_front((at, key));
                    break;
                }
                waited += 1;
                if e.in_flight {
                    // Taken again once its exchange is answered.
                    e.urgent = true;
                    queue.urgent.push(key);
                    continue;
                }
                out.push(take_one(e, now));
            }
        }
        out
    }

    /// Takes in what Redis answered for `deltas` (from [`Self::take`]):
    /// totals become the fleet's counts; a key holding garbage fails its
    /// decisions until it reads again; a key whose call failed keeps its
    /// admissions to send at the next exchange (they are not lost in an
    /// outage; see the limiter).
    pub fn apply(&self, deltas: Vec<Delta>, answers: Vec<Synced>) {
        for (d, answer) in deltas.into_iter().zip(answers) {
            let h = self.hash(&d.key);
            let mut shard = lock(&self.shards[shard_of(h)]);
            let Shard { table, queue, .. } = &mut *shard;
            let Some(e) = table.find_mut(h, |e| *e.key == *d.key) else {
                continue;
            };
            e.in_flight = false;
            let now = e.taken_at;
            let sent = std::mem::take(&mut e.sent);
            match answer {
                Ok(Some(t)) => {
                    e.fleet = Counts {
                        window: t.window,
                        prev: t.prev,
                        cur: t.cur,
                    };
                    e.garbage = false;
                    e.read = true;
                }
                Ok(None) => {
                    // Not added: decisions on the key fail until it is
                    // read again, each interval.
                    e.garbage = true;
                    queue.touch(e, now, true);
                }
                Err(_) => {
                    e.unsent = e.kind.merge(sent, e.unsent);
                    queue.touch(e, now, true);
                }
            }
        }
    }
}

/// What a synced decision does with an admitted request's costs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Intent {
    /// Takes them: owed to Redis from now on.
    Consume,
    /// Only checks the limits (and queues the keys for the next exchange).
    Check,
}

/// After a decision: an admitted request's cost is owed to Redis (for
/// [`Intent::Consume`]), a denied request shows `r`'s limit without it, and the key
/// is queued for an exchange — within its longest wait, if only to read
/// the fleet's totals; at the next tick when its totals were never read,
/// when it denies (the caller is at its limit), or when this instance has
/// used its share of the room left.
#[allow(clippy::too_many_arguments)]
fn account(
    e: &mut Entry,
    queue: &mut Queue,
    view: Counts,
    r: &LimitRequest,
    o: &mut LimitOutcome,
    allowed: bool,
    intent: Intent,
    now: u64,
    instances: u64,
) {
    let i = e.kind.index(now, r.window_ms);
    let denies = !o.admits;
    if allowed {
        if intent == Intent::Consume {
            let mut u = e.kind.roll(e.unsent, i);
            u.cur = u.cur.saturating_add(r.cost);
            e.unsent = u;
        }
    } else if o.admits && r.cost > 0 {
        // Shown without the refused request.
        *o = e.kind.check(view, now, r, 0);
    }
    let u = e.kind.roll(e.unsent, i);
    let owed = u.prev.saturating_add(u.cur);
    let urgent = !e.read
        || denies
        || owed.saturating_mul(ROOM_SHARE).saturating_mul(instances) > o.remaining;
    queue.touch(e, now, urgent);
}

/// Takes `e` for an exchange at `now`: what it owes moves to `sent`.
fn take_one(e: &mut Entry, now: u64) -> Delta {
    let i = e.kind.index(now, e.window_ms);
    let sent = e.kind.roll(e.unsent, i);
    e.sent = sent;
    e.unsent = empty(i);
    e.queued = false;
    e.urgent = false;
    e.in_flight = true;
    e.taken_at = now;
    Delta {
        key: e.key.to_string(),
        counter: e.kind.counter(now, e.window_ms),
        prev: if e.kind == Kind::Sliding {
            sent.prev
        } else {
            0
        },
        cur: sent.cur,
    }
}

#[cfg(test)]
mod tests;
