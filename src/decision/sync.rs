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

use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use hashbrown::HashTable;
use smallvec::SmallVec;
use tokio::sync::Notify;

use crate::limit::{Algorithm, Answer, LimitKind, LimitRequest, Standings};
use crate::store::redis::sync::{Delta, SyncAnswer};

mod entry;
pub(super) mod task;

#[cfg(test)]
use entry::ROOM_SHARE;
use entry::{Counts, Entry, Kind, MAX_WAITED_PER_EXCHANGE, Queue, account, max_wait, take_one};

const SHARDS: usize = 64;

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

/// Which queued keys an exchange takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Due {
    /// The urgent keys whose interval has passed, and those that waited
    /// their longest.
    Ready,
    /// Every queued key: the counts held are stale.
    All,
}

/// Whether `algorithm` can be decided in sync mode.
pub fn syncable(algorithm: Algorithm) -> bool {
    Kind::of(algorithm).is_some()
}

/// How many of `requests` are synced (in `sync` mode).
pub(super) fn count(requests: &[LimitRequest]) -> usize {
    requests.iter().filter(|r| is_synced(r)).count()
}

/// Whether `r` is decided in process in `sync` mode.
pub(super) fn is_synced(r: &LimitRequest) -> bool {
    matches!(r.mode.kind, LimitKind::Synced(_))
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

    /// Decides `requests` (each in `sync` mode, with its interval) at
    /// `now` against what this gateway knows of the fleet: admitted only
    /// if every limit admits, and then — for [`Intent::Consume`] — each
    /// cost is added to what this gateway owes Redis. A denied request consumes
    /// nothing and shows every limit without it, as the stores do.
    /// `None` when a key holds garbage in Redis (see [`Self::apply`]):
    /// the failure policy decides, as for the decision script's error.
    pub fn decide(&self, now: u64, requests: &[LimitRequest], intent: Intent) -> Option<Answer> {
        let instances = self.instances.load(Ordering::Relaxed);
        if let [r] = requests {
            // One limit, the common case: one lock, one lookup.
            let h = self.hash(&r.key.text());
            let mut shard = lock(&self.shards[shard_of(h)]);
            let Shard {
                table,
                queue,
                swept_at_len,
            } = &mut *shard;
            let e = self.entry(table, swept_at_len, h, r, r.sync_ms(), now)?;
            let view = e.view(e.kind.index(now, r.window_ms));
            let mut o = e.kind.check(view, now, r, r.units());
            let allowed = o.admits;
            account(e, queue, view, r, &mut o, allowed, intent, now, instances);
            let mut outcomes = Standings::new();
            outcomes.push(o);
            return Some(Answer { allowed, outcomes });
        }
        let hashes: SmallVec<[u64; 4]> =
            requests.iter().map(|r| self.hash(&r.key.text())).collect();
        let mut guards = self.lock_shards(&hashes);
        let mut views: SmallVec<[Counts; 4]> = SmallVec::new();
        let mut outcomes = Standings::with_capacity(requests.len());
        for (r, &h) in requests.iter().zip(&hashes) {
            let Shard {
                table,
                swept_at_len,
                ..
            } = guard(&mut guards, shard_of(h));
            let e = self.entry(table, swept_at_len, h, r, r.sync_ms(), now)?;
            let view = e.view(e.kind.index(now, r.window_ms));
            outcomes.push(e.kind.check(view, now, r, r.units()));
            views.push(view);
        }
        let allowed = outcomes.iter().all(|o| o.admits);
        for (((r, &h), o), view) in requests.iter().zip(&hashes).zip(&mut outcomes).zip(&views) {
            let Shard { table, queue, .. } = guard(&mut guards, shard_of(h));
            if let Some(e) = table.find_mut(h, |e| *e.key == *r.key.text()) {
                account(e, queue, *view, r, o, allowed, intent, now, instances);
            }
        }
        Some(Answer { allowed, outcomes })
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
        if table.find(h, |e| *e.key == *r.key.text()).is_none() {
            let len = table.len();
            if len > 1024 && len >= 2 * *swept_at_len {
                table.retain(|e| !e.is_idle(now));
                *swept_at_len = table.len().max(512);
            }
            let hasher = &self.hasher;
            table.insert_unique(
                h,
                Entry::new(&r.key.text(), kind, r.window_ms, interval),
                |e| hasher.hash_one(e.key.as_bytes()),
            );
            if self.tick_ms.fetch_min(interval, Ordering::Relaxed) > interval {
                self.tick_changed.notify_waiters();
            }
        }
        let e = table.find_mut(h, |e| *e.key == *r.key.text())?;
        if e.window_ms != r.window_ms || e.kind != kind {
            // The limit changed on reload: what was counted under the old
            // window is not this limit's any more (nor Redis's view of it).
            *e = Entry::new(&r.key.text(), kind, r.window_ms, interval);
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
    /// longest; every queued key for [`Due::All`] — with what each owes Redis.
    /// Their admissions move from `unsent` to `sent` until [`Self::apply`].
    pub fn take(&self, now: u64, due: Due) -> Vec<Delta> {
        let all = due == Due::All;
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
    pub fn apply(&self, deltas: Vec<Delta>, answers: Vec<SyncAnswer>) {
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
                    queue.touch(e, now);
                    queue.urge(e);
                }
                Err(_) => {
                    e.unsent = e.kind.merge(sent, e.unsent);
                    queue.touch(e, now);
                    queue.urge(e);
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

#[cfg(test)]
mod tests;
