//! In-process store: sharded maps, no global lock.
//!
//! Keys are spread over a fixed number of shards by hash; a decision locks
//! only the shards its keys fall in, in ascending order so two decisions can
//! never deadlock, and holds them for the check and the consume together —
//! that makes a multi-limit decision atomic like the Redis script.
//! Idle keys are swept from a shard when it has doubled since its last sweep,
//! so memory stays bounded by the keys active in the last two windows.
//! Each key holds its algorithm's state; a sliding log (up to L timestamps)
//! is pruned and grown in place, never copied.
//!
//! A key is hashed once, with the process's keyed SipHash (keys come from
//! clients, so a guessable hash would let them pile every key into one
//! bucket): the hash picks the shard and then places the key in the
//! shard's [`HashTable`]. With a million keys a decision costs its cache
//! misses more than its arithmetic, so an entry is one 96-byte slot
//! holding the key's bytes (up to 48 of them; longer keys on the heap),
//! its window and its state, the sliding log boxed so that the slot is
//! sized for the counters: the lookup reads the slot and nothing else.

pub mod leases;

use std::hash::{BuildHasher, Hasher, RandomState};
use std::net::IpAddr;
use std::sync::{Mutex, MutexGuard, PoisonError};

use hashbrown::HashTable;
use smallvec::{SmallVec, smallvec};

use super::contract::{Store, StoreError};
use crate::limit::key::StoreKey;
use crate::limit::settle::Settlement;
use crate::limit::state::State;
use crate::limit::{Answer, LimitRequest, Standings, gcra, sliding_log, sliding_window};

const SHARDS: usize = 64;

/// A key's bytes, in the slot itself up to 48 bytes — a key for an IPv4
/// identity with short route and limit names — so a lookup that finds its
/// slot need not follow a pointer to compare the key, a cache miss of its
/// own with a million keys. Longer keys go to the heap.
type KeyBytes = SmallVec<[u8; 48]>;

struct Entry {
    key: KeyBytes,
    window_ms: u64,
    state: State,
}

#[derive(Default)]
struct Shard {
    table: HashTable<Entry>,
    swept_at_len: usize,
}

/// The most bytes [`key_bytes`] writes: an IPv6 address key's.
const PACKED: usize = 22;

/// What the store hashes and compares of a key: its text's bytes, or for
/// a [`StoreKey::Address`] a byte no text holds (`0xFF` is in no UTF-8),
/// the limit's number, the prefix length and the address: 10 bytes for
/// IPv4 and 22 for IPv6 (the lengths keep the two apart), where the text
/// `tg:{ip=10.0.0.1/32}:app:per_ip` is 30. `buf` holds them meanwhile.
#[inline]
fn key_bytes<'a>(key: &'a StoreKey, buf: &'a mut [u8; PACKED]) -> &'a [u8] {
    match key {
        StoreKey::Text(t) => t.as_bytes(),
        StoreKey::Address { limit, net } => {
            buf[0] = 0xFF;
            buf[1..5].copy_from_slice(&limit.to_le_bytes());
            buf[5] = net.prefix_len();
            match net.addr() {
                IpAddr::V4(a) => {
                    buf[6..10].copy_from_slice(&a.octets());
                    &buf[..10]
                }
                IpAddr::V6(a) => {
                    buf[6..22].copy_from_slice(&a.octets());
                    &buf[..22]
                }
            }
        }
    }
}

impl Shard {
    fn get(&self, hash: u64, key: &StoreKey) -> Option<&Entry> {
        let mut buf = [0; PACKED];
        let key = key_bytes(key, &mut buf);
        self.table.find(hash, |e| *e.key == *key)
    }

    fn get_mut(&mut self, hash: u64, key: &StoreKey) -> Option<&mut Entry> {
        let mut buf = [0; PACKED];
        let key = key_bytes(key, &mut buf);
        self.table.find_mut(hash, |e| *e.key == *key)
    }

    /// Removes `key`; whether it was held.
    fn remove(&mut self, hash: u64, key: &StoreKey) -> bool {
        let mut buf = [0; PACKED];
        let key = key_bytes(key, &mut buf);
        match self.table.find_entry(hash, |e| *e.key == *key) {
            Ok(e) => {
                e.remove();
                true
            }
            Err(_) => false,
        }
    }

    /// Adds a key known to be absent, sweeping when the shard has doubled.
    fn insert(
        &mut self,
        hasher: &RandomState,
        hash: u64,
        r: &LimitRequest,
        state: State,
        now_ms: u64,
    ) {
        let mut buf = [0; PACKED];
        let entry = Entry {
            key: KeyBytes::from_slice(key_bytes(&r.key, &mut buf)),
            window_ms: r.window_ms,
            state,
        };
        // Growing the table rehashes every key (rarely: it doubles).
        self.table
            .insert_unique(hash, entry, |e| key_hash(hasher, &e.key));
        let len = self.table.len();
        if len > 1024 && len >= 2 * self.swept_at_len {
            self.sweep(now_ms);
        }
    }

    /// Drops entries whose counters have fully decayed.
    fn sweep(&mut self, now_ms: u64) {
        self.table.retain(|e| !e.state.is_idle(now_ms, e.window_ms));
        self.swept_at_len = self.table.len().max(512);
    }
}

/// The key's bytes through the process's SipHash. `Hash for str` would also
/// write a terminating byte, which only matters when several fields are
/// hashed in a row; one key does not need it, and skipping it is a
/// measurable part of the decision.
fn key_hash(hasher: &RandomState, key: &[u8]) -> u64 {
    let mut h = hasher.build_hasher();
    h.write(key);
    h.finish()
}

/// The shard a hash falls in. hashbrown places an entry by the hash's low
/// bits and tags it with its top seven, so the shard comes from bits in
/// between: taken from either end, every key of a shard would share them
/// and the shard's keys would crowd into a few buckets or tags.
fn shard_of(hash: u64) -> usize {
    (hash >> 32) as usize % SHARDS
}

/// The in-process store.
pub struct MemoryStore {
    shards: Box<[Mutex<Shard>]>,
    hasher: RandomState,
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore").finish_non_exhaustive()
    }
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            hasher: RandomState::new(),
        }
    }

    fn hash(&self, key: &StoreKey) -> u64 {
        let mut buf = [0; PACKED];
        key_hash(&self.hasher, key_bytes(key, &mut buf))
    }

    /// Number of keys held; for tests and metrics.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| lock(s).table.len()).sum()
    }

    /// True when no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Forgets the counters of `keys` (an operator's reset); how many
    /// were held.
    pub fn remove(&self, keys: &[StoreKey]) -> u64 {
        let mut removed = 0;
        for key in keys {
            let hash = self.hash(key);
            if lock(&self.shards[shard_of(hash)]).remove(hash, key) {
                removed += 1;
            }
        }
        removed
    }

    /// Decides synchronously; [`Store::decide`] wraps this.
    pub fn decide_now(&self, now_ms: u64, requests: &[LimitRequest]) -> Answer {
        if let [r] = requests
            && !r.algorithm.one_entry_per_unit()
        {
            return self.decide_one(now_ms, r);
        }
        // A route has a few limits: the bookkeeping stays on the stack.
        let hashes: SmallVec<[u64; 4]> = requests.iter().map(|r| self.hash(&r.key)).collect();
        let mut guards = self.lock_shards(&hashes);
        let (mut outcomes, states) = check_each(&mut guards, now_ms, requests, &hashes);
        let allowed = outcomes.iter().all(|o| o.admits);
        if allowed {
            self.consume(&mut guards, now_ms, requests, &hashes, states, &outcomes);
        } else {
            show_standing(&mut guards, now_ms, requests, &hashes, &mut outcomes);
        }
        Answer { allowed, outcomes }
    }

    /// Locks the shards that `hashes` fall in, each once, in ascending
    /// order, so two decisions can never deadlock.
    fn lock_shards(&self, hashes: &[u64]) -> Guards<'_> {
        let mut order: SmallVec<[usize; 4]> = hashes.iter().map(|&h| shard_of(h)).collect();
        order.sort_unstable();
        order.dedup();
        order.iter().map(|&i| (i, lock(&self.shards[i]))).collect()
    }

    /// Stores what every limit of an admitted request consumed: the state
    /// [`check_each`] computed, or this request's units added to a sliding
    /// log already held.
    fn consume(
        &self,
        guards: &mut Guards<'_>,
        now_ms: u64,
        requests: &[LimitRequest],
        hashes: &[u64],
        states: SmallVec<[Option<State>; 4]>,
        outcomes: &Standings,
    ) {
        for (((r, &h), st), o) in requests.iter().zip(hashes).zip(states).zip(outcomes) {
            let g = guard(guards, shard_of(h));
            if o.reset_ms == 0 {
                // Nothing counts any more: absent is the same state, as
                // the Redis script deletes the key. Keeping an empty
                // state would also keep its window index, which a
                // request from a clock behind would then honour.
                g.remove(h, &r.key);
                continue;
            }
            let Some(st) = st else {
                // A sliding log already held: add this request's units.
                if let Some(Entry {
                    state: State::Log(log),
                    window_ms,
                    ..
                }) = g.get_mut(h, &r.key)
                {
                    sliding_log::add(log, now_ms, r.units());
                    *window_ms = r.window_ms;
                }
                continue;
            };
            match g.get_mut(h, &r.key) {
                Some(e) => {
                    e.state = st;
                    e.window_ms = r.window_ms;
                }
                None => g.insert(&self.hasher, h, r, st, now_ms),
            }
        }
    }
}

/// The shards of one decision, locked, each with its index.
type Guards<'a> = SmallVec<[(usize, MutexGuard<'a, Shard>); 4]>;

/// Each limit's outcome at the request's cost, and per limit the state to
/// store if all admit: `None` for a sliding log, which is pruned in place
/// (as the script's ZREMRANGEBYSCORE) and grown in place, never copied: it
/// holds up to L entries.
fn check_each(
    guards: &mut Guards<'_>,
    now_ms: u64,
    requests: &[LimitRequest],
    hashes: &[u64],
) -> (Standings, SmallVec<[Option<State>; 4]>) {
    let mut states: SmallVec<[Option<State>; 4]> = SmallVec::with_capacity(requests.len());
    let mut outcomes = Standings::with_capacity(requests.len());
    for (r, &h) in requests.iter().zip(hashes) {
        let g = guard(guards, shard_of(h));
        if r.algorithm.one_entry_per_unit() {
            if let Some(Entry {
                state: State::Log(log),
                ..
            }) = g.get_mut(h, &r.key)
            {
                sliding_log::prune(log, now_ms, r.window_ms);
                let o = sliding_log::check(log, now_ms, r.limit, r.window_ms, r.units());
                outcomes.push(o);
                states.push(None);
                continue;
            }
        }
        let st = State::for_request(g.get(h, &r.key).map(|e| &e.state), r, now_ms);
        let (outcome, after) = st.check(r, now_ms, r.units());
        outcomes.push(outcome);
        states.push(Some(after));
    }
    (outcomes, states)
}

/// A denied request consumes nothing, so every limit shows its state
/// without it. A limit that admitted answered with the request's cost
/// taken: it answers again at cost 0, from the state still held (nothing
/// was written).
fn show_standing(
    guards: &mut Guards<'_>,
    now_ms: u64,
    requests: &[LimitRequest],
    hashes: &[u64],
    outcomes: &mut Standings,
) {
    for ((r, &h), o) in requests.iter().zip(hashes).zip(outcomes.iter_mut()) {
        if o.admits {
            let g = guard(guards, shard_of(h));
            let standing = State::standing(g.get(h, &r.key).map(|e| &e.state), r, now_ms);
            o.remaining = standing.remaining;
            o.reset_ms = standing.reset_ms;
        }
    }
}

impl MemoryStore {
    /// The common case of one counter limit, decided as the general path
    /// does but with one lock, one lookup and no bookkeeping vectors: the
    /// general path's per-request vectors cost more than the decision
    /// itself.
    fn decide_one(&self, now_ms: u64, r: &LimitRequest) -> Answer {
        let mut buf = [0; PACKED];
        let key = key_bytes(&r.key, &mut buf);
        let hash = key_hash(&self.hasher, key);
        let mut g = lock(&self.shards[shard_of(hash)]);
        let shard = &mut *g;
        let outcome = match shard.table.find_entry(hash, |e| *e.key == *key) {
            Ok(mut held) => {
                let e = held.get_mut();
                if let Some(s) = e.state.sliding_window(r.algorithm) {
                    // The default algorithm, rolled and counted in place:
                    // the same numbers as below without building and
                    // matching a second state.
                    let (window, elapsed) = window_of(s.window, now_ms, r.window_ms);
                    let rolled = s.at(window);
                    let (l, w, c) = (r.limit, r.window_ms, r.units());
                    let admits = sliding_window::admits(rolled, elapsed, l, w, c);
                    if admits {
                        if rolled.prev == 0 && rolled.cur + c == 0 {
                            // Nothing counts any more (`reset_ms` is 0); see
                            // the general path.
                            held.remove();
                        } else {
                            *s = sliding_window::Counts {
                                cur: rolled.cur + c,
                                ..rolled
                            };
                            e.window_ms = w;
                        }
                    }
                    drop(g);
                    // The rest of the outcome is arithmetic on the snapshot,
                    // worked out (with its division) after the shard is
                    // released.
                    let o = sliding_window::check_elapsed(rolled, elapsed, l, w, c);
                    debug_assert_eq!(o.admits, admits);
                    return Answer {
                        allowed: o.admits,
                        outcomes: smallvec![o],
                    };
                }
                if let Some(tat) = e.state.gcra(r.algorithm) {
                    // GCRA's one arrival time, checked and written in
                    // place, as the general path below would.
                    let burst = r.algorithm.capacity(r.limit);
                    let checked = gcra::check(*tat, now_ms, r.limit, r.window_ms, burst, r.units());
                    let o = checked.outcome;
                    if o.admits {
                        if o.reset_ms == 0 {
                            held.remove();
                        } else {
                            *tat = checked.after;
                            e.window_ms = r.window_ms;
                        }
                    }
                    return Answer {
                        allowed: o.admits,
                        outcomes: smallvec![o],
                    };
                }
                let (o, after) =
                    State::for_request(Some(&e.state), r, now_ms).check(r, now_ms, r.units());
                if o.admits {
                    // Nothing counting any more is the same as no state
                    // (see the general path).
                    if o.reset_ms == 0 {
                        held.remove();
                    } else {
                        e.state = after;
                        e.window_ms = r.window_ms;
                    }
                }
                o
            }
            Err(_) => {
                let (o, after) = State::for_request(None, r, now_ms).check(r, now_ms, r.units());
                if o.admits && o.reset_ms != 0 {
                    shard.insert(&self.hasher, hash, r, after, now_ms);
                }
                o
            }
        };
        Answer {
            allowed: outcome.admits,
            outcomes: smallvec![outcome],
        }
    }
}

/// The index of `now`'s window and the time elapsed in it: `now / w` and
/// `now % w`, found by multiplying when `now` is in window `seen` (where the
/// key was last written) or the next one, as it is for nearly every busy
/// key; a 64-bit division is a long wait at the head of the decision.
#[inline]
fn window_of(seen: u64, now: u64, w: u64) -> (u64, u64) {
    if let Some(start) = seen.checked_mul(w)
        && let Some(elapsed) = now.checked_sub(start)
    {
        if elapsed < w {
            return (seen, elapsed);
        }
        if elapsed - w < w {
            return (seen + 1, elapsed - w);
        }
    }
    (now / w, now % w)
}

fn lock(m: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    // A panic while holding a shard cannot leave a half-written entry (every
    // write is one assignment), so a poisoned shard is still consistent.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn guard<'a, 'b>(guards: &'a mut [(usize, MutexGuard<'b, Shard>)], shard: usize) -> &'a mut Shard {
    let pos = guards
        .iter()
        .position(|(i, _)| *i == shard)
        .expect("every shard of the request was locked");
    &mut guards[pos].1
}

impl Store for MemoryStore {
    async fn decide(&self, now_ms: u64, requests: &[LimitRequest]) -> Result<Answer, StoreError> {
        Ok(self.decide_now(now_ms, requests))
    }

    async fn settle(&self, now_ms: u64, settlements: &[Settlement]) -> Result<(), StoreError> {
        self.settle_now(now_ms, settlements);
        Ok(())
    }
}

impl MemoryStore {
    /// Settles reservations synchronously ([`crate::limit::settle`] has
    /// the rules); [`Store::settle`] wraps this. One shard lock per key.
    pub fn settle_now(&self, now_ms: u64, settlements: &[Settlement]) {
        for s in settlements {
            let r = &s.request;
            let delta = s.bounded_delta();
            if delta == 0 {
                continue;
            }
            let hash = self.hash(&r.key);
            let mut g = lock(&self.shards[shard_of(hash)]);
            let held = g.get(hash, &r.key).map(|e| &e.state);
            let after = State::settled(held, s, now_ms, delta);
            let Some(after) = after else { continue };
            match g.get_mut(hash, &r.key) {
                Some(e) => {
                    e.state = after;
                    e.window_ms = r.window_ms;
                }
                None => g.insert(&self.hasher, hash, r, after, now_ms),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_of_divides() {
        for w in [1u64, 7, 1_000, 60_000] {
            for now in [0u64, 1, 6, 7, 999, 1_000, 59_999, 60_000, 1_800_000_000_123] {
                for seen in [
                    0,
                    now / w,
                    (now / w).saturating_sub(1),
                    now / w + 1,
                    u64::MAX,
                ] {
                    assert_eq!(
                        window_of(seen, now, w),
                        (now / w, now % w),
                        "seen={seen} now={now} w={w}"
                    );
                }
            }
        }
    }

    #[test]
    fn an_address_key_is_its_own_counter_and_resets() {
        let store = MemoryStore::new();
        let at = |limit, net: &str| StoreKey::Address {
            limit,
            net: net.parse().unwrap(),
        };
        let keys = [
            at(0, "192.0.2.7/32"),
            at(1, "192.0.2.7/32"),
            at(0, "192.0.2.8/32"),
            at(0, "192.0.2.7/31"),
            at(0, "2001:db8::/64"),
            // The text of `at(0, "192.0.2.7/32")` under some prefix and
            // suffix: another key, whatever it reads.
            StoreKey::Text(at(0, "192.0.2.7/32").text().into_owned()),
        ];
        let request = |key: &StoreKey| LimitRequest {
            key: key.clone(),
            limit: 1,
            window_ms: 60_000,
            cost: 1,
            ..LimitRequest::default()
        };
        for key in &keys {
            assert!(store.decide_now(1_000, &[request(key)]).allowed, "{key:?}");
        }
        for key in &keys {
            assert!(!store.decide_now(1_001, &[request(key)]).allowed, "{key:?}");
        }
        assert_eq!(store.len(), keys.len());
        assert_eq!(store.remove(&keys[..2]), 2);
        assert!(store.decide_now(1_002, &[request(&keys[0])]).allowed);
        assert!(!store.decide_now(1_002, &[request(&keys[2])]).allowed);
    }

    #[test]
    fn an_entry_is_a_cache_line_and_a_half() {
        // The module doc's figure; a million keys' worth of cache misses
        // depends on it.
        assert_eq!(std::mem::size_of::<Entry>(), 96);
    }
}
