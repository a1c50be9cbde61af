//! What the in-process fallback admitted while Redis could not decide,
//! kept to be added to the Redis counters when it can again (docs/design.md#breaker-and-recovery).
//!
//! Under `on_error: local` an outage does not stop counting: each gateway
//! decides in process. Without this, those counts stay in process, and
//! when Redis returns (with its old counts, or empty after a restart) the
//! window that spans the outage is granted again: 10 admitted locally for
//! a limit of 10, then 10 more from Redis. So every admission the fallback
//! makes during an outage is also recorded here, per Redis key, in the
//! shape its algorithm counts in, and the limiter hands the lot to
//! [`RedisStore::push`](super::RedisStore::push) (see `push`) before decisions
//! go back to Redis.
//!
//! What "add" means per algorithm (push.lua does it on the server):
//! - **sliding window**: the units admitted in the current and the previous
//!   window, added to the key's counts of those windows;
//! - **fixed window** and **calendar month**: the units admitted in the
//!   current window, added to its count;
//! - **sliding log**: one member per unit, at the time it was admitted;
//! - **precision buckets**: the units admitted per bucket, added to the
//!   key's counts of those buckets;
//! - **GCRA**: the TAT is advanced as if the local admissions had come
//!   after everything Redis counted. Each admission maps a TAT `x` to
//!   `max(x, t) + c·T`, and any run of them composes to
//!   `x ↦ max(x + C, D)`: `C` their total cost times `T`, `D` the TAT they
//!   reach alone. Both are kept, and the push sets the key's TAT to
//!   `max(TAT + C, D)` — exactly what Redis would hold had it decided them,
//!   when Redis was away for everyone. When other gateways kept deciding
//!   in Redis meanwhile, their admissions are taken as all earlier than
//!   this gateway's, which errs by at most the outage's interleaving. The
//!   result is capped at two bursts of debt (2·B·T ahead of now).
//!
//! Counts of a window that has ended (or a debt already repaid) count for
//! nothing any more and are not sent.
//!
//! **Bound.** At most [`MAX_ITEMS`] items are kept: one per key, plus one
//! per distinct millisecond a sliding log admitted in. A key takes about
//! 150 bytes (100,000 sliding-window keys of 21 bytes raised the resident
//! size by 14.6 MB), a log run 16 more, so about 15 MB at most. When full,
//! the records whose windows
//! have ended are dropped first (at most once a second); an admission
//! that still finds no room is not recorded — counted in
//! `tollgate_store_backlog_dropped_total` and logged once per outage —
//! and its identity may be granted its window again when Redis returns.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};

use prometheus_client::metrics::counter::Counter;
use tracing::warn;

use crate::limit::{Algorithm, LimitRequest, buckets, fixed_window, gcra, sliding_window};

/// Items kept at most: keys, plus one per sliding-log run.
pub const MAX_ITEMS: usize = 100_000;

/// A GCRA record's total cost stays below this (2^52), within what the
/// script computes exactly; far beyond the cap on the pushed debt anyway.
const MAX_GCRA_COST: u64 = 1 << 52;

const SHARDS: usize = 16;

pub use crate::limit::state::Admitted;

/// One key's record: the limit it was counted under and what was admitted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// How the limit counts.
    pub algorithm: Algorithm,
    /// Its full limit (not the fallback's share of it).
    pub limit: u64,
    /// Its window in ms.
    pub window_ms: u64,
    /// What the fallback admitted.
    pub delta: Admitted,
}

impl Entry {
    fn new(r: &LimitRequest) -> Entry {
        let delta = Admitted::empty(r.algorithm);
        Entry {
            algorithm: r.algorithm,
            limit: r.limit,
            window_ms: r.window_ms.max(1),
            delta,
        }
    }

    /// Whether `r` counts the way this entry was counted.
    fn matches(&self, r: &LimitRequest) -> bool {
        self.algorithm == r.algorithm && self.limit == r.limit && self.window_ms == r.window_ms
    }

    /// Items this entry takes from the budget.
    fn items(&self) -> usize {
        match &self.delta {
            Admitted::Log(runs) => 1 + runs.len(),
            _ => 1,
        }
    }

    /// The window index now falls in, for the fixed kinds.
    fn index(&self, now: u64) -> u64 {
        self.algorithm.window_index(now, self.window_ms)
    }

    /// Adds `cost` units admitted at `now`.
    fn add(&mut self, now: u64, cost: u64) {
        let (w, l) = (self.window_ms, self.limit.max(1));
        let idx = self.index(now);
        match &mut self.delta {
            Admitted::Sliding(s) => {
                *s = s.at(idx);
                s.cur = s.cur.saturating_add(cost);
            }
            Admitted::Fixed(s) => {
                *s = s.at(idx);
                s.count = s.count.saturating_add(cost);
            }
            Admitted::Log(runs) => {
                prune(runs, now, w);
                let at = runs.partition_point(|&(ms, _)| ms < now);
                match runs.get_mut(at) {
                    Some((ms, units)) if *ms == now => *units = units.saturating_add(cost),
                    _ => runs.insert(at, (now, cost)),
                }
            }
            Admitted::Buckets {
                precision_ms,
                counts,
            } => {
                buckets::prune(counts, now, w, *precision_ms);
                buckets::add(counts, now / (*precision_ms).max(1), cost);
            }
            Admitted::Gcra { tat, cost: total } => {
                let units = u128::from(cost) * u128::from(w);
                *tat = advance(*tat, now, l, units);
                *total = u64::try_from(u128::from(*total) + units)
                    .unwrap_or(u64::MAX)
                    .min(MAX_GCRA_COST);
            }
        }
    }

    /// Whether anything in it still counts at `now`.
    pub fn counts_at(&self, now: u64) -> bool {
        let idx = self.index(now);
        match &self.delta {
            Admitted::Sliding(s) => {
                let s = s.at(idx);
                s.prev > 0 || s.cur > 0
            }
            Admitted::Fixed(s) => s.at(idx).count > 0,
            Admitted::Log(runs) => runs
                .last()
                .is_some_and(|&(ms, _)| ms + self.window_ms > now),
            Admitted::Buckets {
                precision_ms,
                counts,
            } => !buckets::is_idle(counts, now, self.window_ms, *precision_ms),
            // Redis's own TAT may carry the cost further, but never more
            // than a burst beyond the TAT the local admissions reached.
            Admitted::Gcra { tat, .. } => {
                let burst = self.algorithm.capacity(self.limit);
                let l = u128::from(self.limit.max(1));
                u128::from(tat.tat) * l
                    + u128::from(tat.rem)
                    + u128::from(burst) * u128::from(self.window_ms)
                    > u128::from(now) * l
            }
        }
    }

    /// Folds `earlier` (the same key, counted the same way, admitted
    /// before this one's admissions) into this one.
    fn merge(&mut self, earlier: Entry) {
        let l = u128::from(self.limit.max(1));
        match (&mut self.delta, earlier.delta) {
            (Admitted::Sliding(a), Admitted::Sliding(b)) => {
                let i = a.window.max(b.window);
                let (x, y) = (a.at(i), b.at(i));
                *a = sliding_window::Counts {
                    window: i,
                    prev: x.prev.saturating_add(y.prev),
                    cur: x.cur.saturating_add(y.cur),
                };
            }
            (Admitted::Fixed(a), Admitted::Fixed(b)) => {
                let i = a.window.max(b.window);
                let (x, y) = (a.at(i), b.at(i));
                *a = fixed_window::Count {
                    window: i,
                    count: x.count.saturating_add(y.count),
                };
            }
            (Admitted::Log(a), Admitted::Log(b)) => {
                for (ms, units) in b {
                    let at = a.partition_point(|&(m, _)| m < ms);
                    match a.get_mut(at) {
                        Some((m, u)) if *m == ms => *u = u.saturating_add(units),
                        _ => a.insert(at, (ms, units)),
                    }
                }
            }
            (Admitted::Buckets { counts: a, .. }, Admitted::Buckets { counts: b, .. }) => {
                for (bucket, units) in b {
                    buckets::add(a, bucket, units);
                }
            }
            // This step after the earlier one: x ↦ max(max(x + c1, d1) + c2, d2).
            (Admitted::Gcra { tat, cost }, Admitted::Gcra { tat: d1, cost: c1 }) => {
                let at = |s: gcra::Tat| u128::from(s.tat) * l + u128::from(s.rem);
                let later = at(d1) + u128::from(*cost);
                if later > at(*tat) {
                    *tat = gcra::Tat {
                        tat: u64::try_from(later / l).unwrap_or(u64::MAX),
                        rem: (later % l) as u64,
                    };
                }
                *cost = cost.saturating_add(c1).min(MAX_GCRA_COST);
            }
            // Entries of one key are merged only when they match.
            (_, _) => {}
        }
    }

    /// The push arguments after the window (see push.lua's header):
    /// window, n, then n numbers; `None` when nothing counts at `now`.
    pub fn push_args(&self, now: u64) -> Option<(u64, Vec<u64>)> {
        if !self.counts_at(now) {
            return None;
        }
        let w = self.window_ms;
        Some(match &self.delta {
            Admitted::Sliding(s) => {
                let s = s.at(now / w);
                (w, vec![s.prev, s.cur])
            }
            Admitted::Fixed(s) => match self.algorithm.month(now) {
                Some((index, end)) => (end, vec![index, s.at(index).count]),
                None => (w, vec![s.at(now / w).count]),
            },
            Admitted::Log(runs) => {
                let mut runs = runs.clone();
                prune(&mut runs, now, w);
                (w, runs.into_iter().flat_map(|(ms, u)| [ms, u]).collect())
            }
            Admitted::Buckets {
                precision_ms,
                counts,
            } => {
                let mut counts = counts.clone();
                buckets::prune(&mut counts, now, w, *precision_ms);
                let pairs = counts.into_iter().flat_map(|(b, n)| [b, n]);
                (w, std::iter::once(*precision_ms).chain(pairs).collect())
            }
            Admitted::Gcra { tat, cost } => {
                let burst = self.algorithm.capacity(self.limit);
                (w, vec![self.limit.max(1), burst, tat.tat, tat.rem, *cost])
            }
        })
    }
}

/// Drops runs that no longer count at `now` (admitted at or before
/// `now − w`), as `sliding_log::prune` does.
fn prune(runs: &mut Vec<(u64, u64)>, now: u64, w: u64) {
    if let Some(horizon) = now.checked_sub(w) {
        let gone = runs.partition_point(|&(ms, _)| ms <= horizon);
        runs.drain(..gone);
    }
}

/// `s` advanced from `max(s, now)` by `units` of `1/l` ms (gcra.rs's
/// arithmetic: one unit of cost is `w` such units).
fn advance(s: gcra::Tat, now: u64, l: u64, units: u128) -> gcra::Tat {
    let (base_ms, base_rem) = if s.tat > now || (s.tat == now && s.rem > 0) {
        (s.tat, s.rem)
    } else {
        (now, 0)
    };
    let l = u128::from(l);
    let total = u128::from(base_rem) + units;
    gcra::Tat {
        tat: base_ms.saturating_add(u64::try_from(total / l).unwrap_or(u64::MAX)),
        rem: (total % l) as u64,
    }
}

#[derive(Debug, Default)]
struct Shard {
    map: HashMap<String, Entry>,
}

/// The records of one outage (or several, until a push succeeds).
#[derive(Debug)]
pub struct Backlog {
    shards: Box<[Mutex<Shard>]>,
    hasher: RandomState,
    /// Items held, at most `capacity`.
    items: AtomicUsize,
    capacity: usize,
    /// Whether the drop warning was logged since the last push.
    warned: AtomicBool,
    /// `now / 1000 + 1` of the last sweep for room (0: never).
    swept_at: AtomicU64,
    /// `tollgate_store_backlog_dropped_total`, once known.
    dropped: OnceLock<Counter>,
}

impl Default for Backlog {
    fn default() -> Self {
        Self::with_capacity(MAX_ITEMS)
    }
}

impl Backlog {
    /// An empty backlog of [`MAX_ITEMS`].
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty backlog of `capacity` items.
    pub fn with_capacity(capacity: usize) -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            hasher: RandomState::new(),
            items: AtomicUsize::new(0),
            capacity,
            warned: AtomicBool::new(false),
            swept_at: AtomicU64::new(0),
            dropped: OnceLock::new(),
        }
    }

    /// Counts admissions that found no room in `counter` from now on.
    pub fn export(&self, counter: Counter) {
        let _ = self.dropped.set(counter);
    }

    fn shard(&self, key: &str) -> MutexGuard<'_, Shard> {
        // Keys come from clients: the process's keyed SipHash, as the
        // in-process store uses.
        let i = self.hasher.hash_one(key) as usize % SHARDS;
        self.shards[i]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether nothing waits to be pushed.
    pub fn is_empty(&self) -> bool {
        self.items.load(Ordering::SeqCst) == 0
    }

    /// Takes `n` items from the budget, if there is room.
    fn reserve(&self, n: usize) -> bool {
        if n == 0 {
            return true;
        }
        let before = self.items.fetch_add(n, Ordering::SeqCst);
        if before + n <= self.capacity {
            return true;
        }
        self.items.fetch_sub(n, Ordering::SeqCst);
        false
    }

    fn release(&self, n: usize) {
        if n > 0 {
            self.items.fetch_sub(n, Ordering::SeqCst);
        }
    }

    /// Records that `r` (its full limit) admitted `r.units()` at `now`
    /// in process. Nothing for a read or a cost of 0.
    pub fn record(&self, now: u64, r: &LimitRequest) {
        if r.units() == 0 {
            return;
        }
        if self.record_in(&mut self.shard(&r.key.text()), now, r) {
            return;
        }
        // Full: make room from windows that ended (one caller, at most once
        // a second), and try once more.
        let second = now / 1000 + 1;
        let last = self.swept_at.load(Ordering::Relaxed);
        if last != second
            && self
                .swept_at
                .compare_exchange(last, second, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            self.sweep(now);
            if self.record_in(&mut self.shard(&r.key.text()), now, r) {
                return;
            }
        }
        if let Some(c) = self.dropped.get() {
            c.inc();
        }
        if !self.warned.swap(true, Ordering::Relaxed) {
            warn!(
                capacity = self.capacity,
                "the outage backlog is full: further admissions made in process are not added to Redis when it returns"
            );
        }
    }

    /// Drops the records that count for nothing at `now`, shard by shard.
    fn sweep(&self, now: u64) {
        for shard in self.shards.iter() {
            let mut shard = shard.lock().unwrap_or_else(PoisonError::into_inner);
            let mut freed = 0;
            shard.map.retain(|_, e| {
                let keep = e.counts_at(now);
                if !keep {
                    freed += e.items();
                }
                keep
            });
            self.release(freed);
        }
    }

    /// [`Self::record`] under the shard's lock; false when out of room.
    fn record_in(&self, shard: &mut Shard, now: u64, r: &LimitRequest) -> bool {
        match shard.map.get_mut(&*r.key.text()) {
            Some(e) if e.matches(r) => {
                // Only a sliding log grows, by one run at most (and its
                // pruning may free some): reserve that one, give back the
                // rest.
                if let Admitted::Log(_) = e.delta {
                    let before = e.items();
                    if !self.reserve(1) {
                        return false;
                    }
                    e.add(now, r.units());
                    self.release(before + 1 - e.items());
                } else {
                    e.add(now, r.units());
                }
                true
            }
            Some(e) => {
                // The limit changed (a reload): what it counted before is
                // not this limit's any more.
                let mut fresh = Entry::new(r);
                fresh.add(now, r.units());
                let (before, after) = (e.items(), fresh.items());
                if after > before && !self.reserve(after - before) {
                    return false;
                }
                self.release(before.saturating_sub(after));
                *e = fresh;
                true
            }
            None => {
                let mut fresh = Entry::new(r);
                fresh.add(now, r.units());
                if !self.reserve(fresh.items()) {
                    return false;
                }
                shard.map.insert(r.key.text().into_owned(), fresh);
                true
            }
        }
    }

    /// Takes every record out; those that still count at `now`, to push.
    pub fn take(&self, now: u64) -> Vec<(String, Entry)> {
        let mut out = Vec::new();
        for shard in self.shards.iter() {
            let mut shard = shard.lock().unwrap_or_else(PoisonError::into_inner);
            let map = std::mem::take(&mut shard.map);
            drop(shard);
            let items: usize = map.values().map(Entry::items).sum();
            self.release(items);
            out.extend(map.into_iter().filter(|(_, e)| e.counts_at(now)));
        }
        self.warned.store(false, Ordering::Relaxed);
        out
    }

    /// Puts back records a push could not deliver, folded into whatever
    /// was recorded since. Records that find no room are dropped.
    pub fn restore(&self, entries: Vec<(String, Entry)>) {
        for (key, entry) in entries {
            let mut shard = self.shard(&key);
            match shard.map.get_mut(&key) {
                Some(e)
                    if e.algorithm == entry.algorithm
                        && e.limit == entry.limit
                        && e.window_ms == entry.window_ms =>
                {
                    let before = e.items();
                    let mut merged = e.clone();
                    merged.merge(entry);
                    if self.reserve(merged.items().saturating_sub(before)) {
                        *e = merged;
                    }
                }
                // Counted differently since: the newer record wins.
                Some(_) => {}
                None => {
                    if self.reserve(entry.items()) {
                        shard.map.insert(key, entry);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
