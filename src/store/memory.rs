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

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, RandomState};
use std::sync::{Mutex, MutexGuard, PoisonError};

use super::{Store, StoreError};
use crate::limit::{
    Algorithm, Decision, LimitOutcome, LimitRequest, calendar, fixed_window, gcra, sliding_log,
    sliding_window,
};

const SHARDS: usize = 64;

/// The state of one key, in the shape of its algorithm.
#[derive(Debug, Clone)]
enum State {
    Sliding(sliding_window::State),
    Fixed(fixed_window::State),
    /// A fixed window that is a calendar month; `window` is the month index.
    Month(fixed_window::State),
    Log(VecDeque<u64>),
    Gcra(gcra::State),
}

impl State {
    /// The state as `r`'s algorithm sees it at `now`: a key written by
    /// another algorithm (the limit's algorithm changed) starts empty.
    fn for_request(stored: Option<&State>, r: &LimitRequest, now: u64) -> State {
        let window = now / r.window_ms;
        match (r.algorithm, stored) {
            (Algorithm::SlidingWindow, Some(State::Sliding(s))) => State::Sliding(s.at(window)),
            (Algorithm::SlidingWindow, _) => {
                State::Sliding(sliding_window::State::default().at(window))
            }
            (Algorithm::FixedWindow, Some(State::Fixed(s))) => State::Fixed(s.at(window)),
            (Algorithm::FixedWindow, _) => State::Fixed(fixed_window::State::default().at(window)),
            (Algorithm::CalendarMonth, Some(State::Month(s))) => {
                State::Month(s.at(calendar::month_index(now)))
            }
            (Algorithm::CalendarMonth, _) => {
                State::Month(fixed_window::State::default().at(calendar::month_index(now)))
            }
            (Algorithm::SlidingLog, Some(State::Log(log))) => {
                let mut log = log.clone();
                sliding_log::prune(&mut log, now, r.window_ms);
                State::Log(log)
            }
            (Algorithm::SlidingLog, _) => State::Log(VecDeque::new()),
            (Algorithm::Gcra { .. }, Some(State::Gcra(s))) => State::Gcra(*s),
            (Algorithm::Gcra { .. }, _) => State::Gcra(gcra::State::default()),
        }
    }

    /// Decides `r` and returns the state to keep if the request is admitted.
    fn check(&self, r: &LimitRequest, now: u64) -> (LimitOutcome, State) {
        let (l, w, c) = (r.limit, r.window_ms, r.cost);
        match (self, r.algorithm) {
            (State::Sliding(s), _) => {
                let o = sliding_window::check(*s, now, l, w, c);
                let mut after = *s;
                if o.admits {
                    after.cur += c;
                }
                (o, State::Sliding(after))
            }
            (State::Month(s), _) => {
                // The end of now's month, also for state written by a clock
                // ahead (as the Redis script, which is told only now's month).
                let o = fixed_window::check_until(*s, now, l, calendar::month(now).1, c);
                let mut after = *s;
                if o.admits {
                    after.count += c;
                }
                (o, State::Month(after))
            }
            (State::Fixed(s), _) => {
                let o = fixed_window::check(*s, now, l, w, c);
                let mut after = *s;
                if o.admits {
                    after.count += c;
                }
                (o, State::Fixed(after))
            }
            (State::Log(log), _) => {
                let o = sliding_log::check(log, now, l, w, c);
                let mut after = log.clone();
                if o.admits {
                    sliding_log::add(&mut after, now, c);
                }
                (o, State::Log(after))
            }
            (State::Gcra(s), alg) => {
                let burst = match alg {
                    Algorithm::Gcra { burst } => burst,
                    _ => l,
                };
                let checked = gcra::check(*s, now, l, w, burst, c);
                (checked.outcome, State::Gcra(checked.after))
            }
        }
    }

    /// Whether the key holds nothing that still counts at `now`.
    fn is_idle(&self, now: u64, window_ms: u64) -> bool {
        match self {
            State::Sliding(s) => s.window + 1 < now / window_ms,
            State::Fixed(s) => s.window < now / window_ms,
            State::Month(s) => s.window < calendar::month_index(now),
            State::Log(log) => log.back().is_none_or(|&s| s + window_ms <= now),
            State::Gcra(s) => s.tat < now,
        }
    }
}

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
        if let [r] = requests
            && r.algorithm != Algorithm::SlidingLog
        {
            return self.decide_one(now_ms, r);
        }
        let idx: Vec<usize> = requests.iter().map(|r| self.shard_of(&r.key)).collect();
        let mut order: Vec<usize> = idx.clone();
        order.sort_unstable();
        order.dedup();
        let mut guards: Vec<(usize, MutexGuard<'_, Shard>)> =
            order.iter().map(|&i| (i, lock(&self.shards[i]))).collect();
        // Per request, the state to store if all admit; `None` for a sliding
        // log, which is pruned in place (as the script's ZREMRANGEBYSCORE)
        // and grown in place, never copied: it holds up to L entries.
        let mut states: Vec<Option<State>> = Vec::with_capacity(requests.len());
        let mut outcomes = Vec::with_capacity(requests.len());
        for (r, &si) in requests.iter().zip(&idx) {
            let g = guard(&mut guards, si);
            if r.algorithm == Algorithm::SlidingLog {
                if let Some(Entry {
                    state: State::Log(log),
                    ..
                }) = g.map.get_mut(&r.key)
                {
                    sliding_log::prune(log, now_ms, r.window_ms);
                    let o = sliding_log::check(log, now_ms, r.limit, r.window_ms, r.cost);
                    outcomes.push(o);
                    states.push(None);
                    continue;
                }
            }
            let st = State::for_request(g.map.get(&r.key).map(|e| &e.state), r, now_ms);
            let (outcome, after) = st.check(r, now_ms);
            outcomes.push(outcome);
            states.push(Some(after));
        }
        let allowed = outcomes.iter().all(|o| o.admits);
        if allowed {
            for (((r, &si), st), o) in requests.iter().zip(&idx).zip(states).zip(&outcomes) {
                let g = guard(&mut guards, si);
                if o.reset_ms == 0 {
                    // Nothing counts any more: absent is the same state, as
                    // the Redis script deletes the key. Keeping an empty
                    // state would also keep its window index, which a
                    // request from a clock behind would then honour.
                    g.map.remove(&r.key);
                    continue;
                }
                let Some(st) = st else {
                    // A sliding log already held: add this request's units.
                    if let Some(Entry {
                        state: State::Log(log),
                        window_ms,
                    }) = g.map.get_mut(&r.key)
                    {
                        sliding_log::add(log, now_ms, r.cost);
                        *window_ms = r.window_ms;
                    }
                    continue;
                };
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

impl MemoryStore {
    /// The common case of one counter limit, decided as the general path
    /// does but with one lock, one lookup and no bookkeeping vectors: the
    /// general path's per-request vectors and repeated hashing cost more
    /// than the decision itself.
    fn decide_one(&self, now_ms: u64, r: &LimitRequest) -> Decision {
        let mut g = lock(&self.shards[self.shard_of(&r.key)]);
        let shard = &mut *g;
        let mut remove = false;
        let outcome = match shard.map.get_mut(&r.key) {
            Some(e) => {
                let (o, after) = State::for_request(Some(&e.state), r, now_ms).check(r, now_ms);
                if o.admits {
                    // Nothing counting any more is the same as no state
                    // (see the general path).
                    if o.reset_ms == 0 {
                        remove = true;
                    } else {
                        e.state = after;
                        e.window_ms = r.window_ms;
                    }
                }
                o
            }
            None => {
                let (o, after) = State::for_request(None, r, now_ms).check(r, now_ms);
                if o.admits && o.reset_ms != 0 {
                    shard.map.insert(
                        r.key.clone(),
                        Entry {
                            state: after,
                            window_ms: r.window_ms,
                        },
                    );
                    if shard.map.len() > 1024 && shard.map.len() >= 2 * shard.swept_at_len {
                        sweep(shard, now_ms);
                    }
                }
                o
            }
        };
        if remove {
            shard.map.remove(&r.key);
        }
        Decision {
            allowed: outcome.admits,
            outcomes: vec![outcome],
        }
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
        .retain(|_, e| !e.state.is_idle(now_ms, e.window_ms));
    shard.swept_at_len = shard.map.len().max(512);
}

impl Store for MemoryStore {
    async fn decide(&self, now_ms: u64, requests: &[LimitRequest]) -> Result<Decision, StoreError> {
        Ok(self.decide_now(now_ms, requests))
    }
}
