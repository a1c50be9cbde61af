//! In-process store: sharded maps, no global lock.
//!
//! Keys are spread over a fixed number of shards by hash; a decision locks
//! only the shards its keys fall in, in ascending order so two decisions can
//! never deadlock, and holds them for the check and the consume together —
//! that makes a multi-limit decision atomic like the Redis script.
//! Idle keys are swept from a shard when it has doubled since its last sweep,
//! so memory stays bounded by the keys active in the last two windows.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::{Mutex, MutexGuard, PoisonError};

use super::{Store, StoreError};
use crate::limit::sliding_window::{self, State};
use crate::limit::{Decision, LimitRequest};

const SHARDS: usize = 64;

struct Entry {
    state: State,
    window_ms: u64,
}

#[derive(Default)]
struct Shard {
    map: HashMap<String, Entry>,
    swept_at_len: usize,
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

    fn shard_of(&self, key: &str) -> usize {
        (self.hasher.hash_one(key) as usize) % SHARDS
    }

    /// Number of keys held; for tests and metrics.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| lock(s).map.len()).sum()
    }

    /// True when no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Decides synchronously; [`Store::decide`] wraps this.
    pub fn decide_now(&self, now_ms: u64, requests: &[LimitRequest]) -> Decision {
        let idx: Vec<usize> = requests.iter().map(|r| self.shard_of(&r.key)).collect();
        let mut order: Vec<usize> = idx.clone();
        order.sort_unstable();
        order.dedup();
        let mut guards: Vec<(usize, MutexGuard<'_, Shard>)> =
            order.iter().map(|&i| (i, lock(&self.shards[i]))).collect();
        let mut states = Vec::with_capacity(requests.len());
        let mut outcomes = Vec::with_capacity(requests.len());
        for (r, &si) in requests.iter().zip(&idx) {
            let g = guard(&mut guards, si);
            let window = now_ms / r.window_ms;
            let st = g
                .map
                .get(&r.key)
                .map_or_else(State::default, |e| e.state)
                .at(window);
            outcomes.push(sliding_window::check(
                st,
                now_ms,
                r.limit,
                r.window_ms,
                r.cost,
            ));
            states.push(st);
        }
        let allowed = outcomes.iter().all(|o| o.admits);
        if allowed {
            for ((r, &si), mut st) in requests.iter().zip(&idx).zip(states) {
                st.cur += r.cost;
                let g = guard(&mut guards, si);
                if st.cur == 0 && st.prev == 0 {
                    // Nothing to decay (cost 0 on an empty counter): absent
                    // is the same state, as the Redis script DELs it. Kept,
                    // an empty entry would pin its window for a caller whose
                    // clock is behind, unlike Redis.
                    g.map.remove(&r.key);
                    continue;
                }
                match g.map.get_mut(&r.key) {
                    Some(e) => {
                        e.state = st;
                        e.window_ms = r.window_ms;
                    }
                    None => {
                        g.map.insert(
                            r.key.clone(),
                            Entry {
                                state: st,
                                window_ms: r.window_ms,
                            },
                        );
                        if g.map.len() > 1024 && g.map.len() >= 2 * g.swept_at_len {
                            sweep(g, now_ms);
                        }
                    }
                }
            }
        }
        Decision { allowed, outcomes }
    }
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

/// Drops entries whose counters have fully decayed.
fn sweep(shard: &mut Shard, now_ms: u64) {
    shard
        .map
        .retain(|_, e| e.state.window + 1 >= now_ms / e.window_ms);
    shard.swept_at_len = shard.map.len().max(512);
}

impl Store for MemoryStore {
    async fn decide(&self, now_ms: u64, requests: &[LimitRequest]) -> Result<Decision, StoreError> {
        Ok(self.decide_now(now_ms, requests))
    }
}
