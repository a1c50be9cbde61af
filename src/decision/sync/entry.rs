//! The counts `sync` mode keeps per key ([`Entry`]), the queue of keys
//! waiting for an exchange ([`Queue`]), and what a decision or an
//! exchange does to one key. [`super`] has the design.

use std::collections::VecDeque;

use super::Intent;
use crate::limit::{
    Algorithm, LimitRequest, Standing, Summed, calendar, fixed_window, sliding_window,
};
use crate::store::redis::sync::{Counter, Delta};

/// Counts of a window and the one before it (a fixed window uses `cur`
/// alone).
pub(super) type Counts = sliding_window::Counts;

/// How a synced limit counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Sliding,
    Fixed,
    Month,
}

impl Kind {
    /// The kind of `algorithm`, when it can be synced.
    pub(super) fn of(algorithm: Algorithm) -> Option<Kind> {
        algorithm.summed().map(|summed| match summed {
            Summed::Sliding => Kind::Sliding,
            Summed::Fixed => Kind::Fixed,
            Summed::Month => Kind::Month,
        })
    }

    /// The index of the window `now` falls in.
    pub(super) fn index(self, now: u64, window_ms: u64) -> u64 {
        match self {
            Kind::Month => calendar::month_index(now),
            Kind::Sliding | Kind::Fixed => now / window_ms,
        }
    }

    /// `c` as seen from window `i`: a sliding window rolls `cur` into
    /// `prev`, a fixed window starts again. Counts from a later window (a
    /// clock ahead) are kept, as the stores keep them.
    pub(super) fn roll(self, c: Counts, i: u64) -> Counts {
        match self {
            Kind::Sliding => c.at(i),
            Kind::Fixed | Kind::Month if c.window >= i => c,
            Kind::Fixed | Kind::Month => empty(i),
        }
    }

    /// `a + b`, both seen from the later of their windows.
    pub(super) fn merge(self, a: Counts, b: Counts) -> Counts {
        let i = a.window.max(b.window);
        let (a, b) = (self.roll(a, i), self.roll(b, i));
        Counts {
            window: i,
            prev: a.prev.saturating_add(b.prev),
            cur: a.cur.saturating_add(b.cur),
        }
    }

    /// The algorithm's answer for `r` at cost `cost` against `view`.
    pub(super) fn check(self, view: Counts, now: u64, r: &LimitRequest, cost: u64) -> Standing {
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
    pub(super) fn counter(self, now: u64, window_ms: u64) -> Counter {
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

pub(super) fn empty(window: u64) -> Counts {
    Counts {
        window,
        prev: 0,
        cur: 0,
    }
}

/// One key in sync mode.
#[derive(Debug)]
pub(super) struct Entry {
    pub(super) key: Box<str>,
    pub(super) kind: Kind,
    pub(super) window_ms: u64,
    /// How often it is exchanged, in ms.
    pub(super) interval_ms: u64,
    /// The fleet's totals at the last exchange.
    pub(super) fleet: Counts,
    /// Admitted here and sent in the exchange under way.
    pub(super) sent: Counts,
    /// Admitted here since.
    pub(super) unsent: Counts,
    /// Touched since its last exchange: in the shard's `waiting` list.
    pub(super) queued: bool,
    /// Also in the shard's `urgent` list: exchanged at the next tick.
    pub(super) urgent: bool,
    /// When it was queued (its record in `waiting`).
    pub(super) queued_at: u64,
    /// Longest a queued key that is not urgent waits, in ms.
    pub(super) max_wait_ms: u64,
    /// Its totals have been read from Redis at least once.
    pub(super) read: bool,
    /// In the exchange under way.
    pub(super) in_flight: bool,
    /// Redis holds something else at this key: decisions on it fail (as
    /// in exact mode) until an exchange reads counts again.
    pub(super) garbage: bool,
    /// When it was last taken for an exchange.
    pub(super) taken_at: u64,
}

impl Entry {
    pub(super) fn new(key: &str, kind: Kind, window_ms: u64, interval_ms: u64) -> Entry {
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
    pub(super) fn view(&self, i: u64) -> Counts {
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
    pub(super) fn is_idle(&self, now: u64) -> bool {
        if self.queued || self.in_flight {
            return false;
        }
        let v = self.view(self.kind.index(now, self.window_ms));
        v.prev == 0 && v.cur == 0
    }
}

/// How long a key far from its limit may wait for its exchange: a hundred
/// intervals, at most a quarter of its window, at least one interval.
pub(super) fn max_wait(interval_ms: u64, window_ms: u64) -> u64 {
    interval_ms
        .saturating_mul(MAX_WAIT_INTERVALS)
        .min(window_ms / 4)
        .max(interval_ms)
}

/// A queued key waits at most this many intervals (see [`max_wait`]).
pub(super) const MAX_WAIT_INTERVALS: u64 = 100;

/// The share of the room left that the instances may admit, together,
/// between two exchanges of a key that waits: a key becomes urgent once
/// this instance has admitted `1 / (ROOM_SHARE · N)` of the room its view
/// leaves.
pub(super) const ROOM_SHARE: u64 = 10;

/// Keys that waited their longest taken in one exchange at most (urgent
/// ones are not counted): when many come due at once — all first touched
/// in the same second — the work is spread over a few ticks instead of
/// holding the runtime for one large exchange.
pub(super) const MAX_WAITED_PER_EXCHANGE: usize = 1024;

/// Keys waiting for an exchange: `urgent` ones go at the next tick,
/// `waiting` ones (every queued key, in the order it was queued) when
/// they have waited their longest.
#[derive(Default)]
pub(super) struct Queue {
    pub(super) urgent: Vec<Box<str>>,
    pub(super) waiting: VecDeque<(u64, Box<str>)>,
}

impl Queue {
    /// Queues `e` (once) as touched at `now`.
    pub(super) fn touch(&mut self, e: &mut Entry, now: u64) {
        if !e.queued {
            e.queued = true;
            e.queued_at = now;
            self.waiting.push_back((now, e.key.clone()));
        }
    }

    /// Puts `e` (once) in the list for the next tick.
    pub(super) fn urge(&mut self, e: &mut Entry) {
        if !e.urgent {
            e.urgent = true;
            self.urgent.push(e.key.clone());
        }
    }
}

/// After a decision: an admitted request's cost is owed to Redis (for
/// [`Intent::Consume`]), a denied request shows `r`'s limit without it, and the key
/// is queued for an exchange — within its longest wait, if only to read
/// the fleet's totals; at the next tick when its totals were never read,
/// when it denies (the caller is at its limit), or when this instance has
/// used its share of the room left.
#[allow(clippy::too_many_arguments)]
pub(super) fn account(
    e: &mut Entry,
    queue: &mut Queue,
    view: Counts,
    r: &LimitRequest,
    o: &mut Standing,
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
            u.cur = u.cur.saturating_add(r.units());
            e.unsent = u;
        }
    } else if o.admits && r.units() > 0 {
        // Shown without the refused request.
        *o = e.kind.check(view, now, r, 0);
    }
    let u = e.kind.roll(e.unsent, i);
    let owed = u.prev.saturating_add(u.cur);
    let urgent = !e.read
        || denies
        || owed.saturating_mul(ROOM_SHARE).saturating_mul(instances) > o.remaining;
    queue.touch(e, now);
    if urgent {
        queue.urge(e);
    }
}

/// Takes `e` for an exchange at `now`: what it owes moves to `sent`.
pub(super) fn take_one(e: &mut Entry, now: u64) -> Delta {
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
