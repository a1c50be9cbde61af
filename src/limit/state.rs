//! The state one key keeps in the in-process store, in the shape of its
//! limit's algorithm, and what a decision and a settlement do to it. The
//! store holds one per key and locks around these calls; the arithmetic is
//! each algorithm's module's. [`Admitted`] is the Redis store's record of
//! what its in-process fallback admitted during an outage, in the shape
//! the outage push adds to the key.

use std::collections::VecDeque;

use super::settle::{self, Settlement};
use super::{
    Algorithm, LimitRequest, Standing, buckets, calendar, fixed_window, gcra, sliding_log,
    sliding_window,
};

/// The state of one key, in the shape of its algorithm.
#[derive(Debug, Clone)]
pub enum State {
    /// A sliding-window counter.
    Sliding(sliding_window::Counts),
    /// A fixed window's count.
    Fixed(fixed_window::Count),
    /// A fixed window that is a calendar month; `window` is the month index.
    Month(fixed_window::Count),
    /// A sliding log, one instant per unit. Boxed: it is the only variant
    /// larger than three words, and every slot is as large as the largest
    /// variant.
    #[allow(clippy::box_collection)]
    Log(Box<VecDeque<u64>>),
    /// A GCRA arrival time.
    Gcra(gcra::Tat),
    /// Precision buckets of `precision_ms`, boxed as the log is.
    Buckets {
        /// The buckets' length.
        precision_ms: u64,
        /// Their counts.
        #[allow(clippy::box_collection)]
        counts: Box<buckets::BucketCounts>,
    },
}

impl State {
    /// The state as `r`'s algorithm sees it at `now`: a key written by
    /// another algorithm (the limit's algorithm changed) starts empty.
    #[inline]
    pub fn for_request(stored: Option<&State>, r: &LimitRequest, now: u64) -> State {
        let window = now / r.window_ms;
        match (r.algorithm, stored) {
            (Algorithm::SlidingWindow, Some(State::Sliding(s))) => State::Sliding(s.at(window)),
            (Algorithm::SlidingWindow, _) => {
                State::Sliding(sliding_window::Counts::default().at(window))
            }
            (Algorithm::FixedWindow, Some(State::Fixed(s))) => State::Fixed(s.at(window)),
            (Algorithm::FixedWindow, _) => State::Fixed(fixed_window::Count::default().at(window)),
            (Algorithm::CalendarMonth, Some(State::Month(s))) => {
                State::Month(s.at(calendar::month_index(now)))
            }
            (Algorithm::CalendarMonth, _) => {
                State::Month(fixed_window::Count::default().at(calendar::month_index(now)))
            }
            (Algorithm::SlidingLog, Some(State::Log(log))) => {
                let mut log = log.clone();
                sliding_log::prune(&mut log, now, r.window_ms);
                State::Log(log)
            }
            (Algorithm::SlidingLog, _) => State::Log(Box::default()),
            (Algorithm::Gcra { .. }, Some(State::Gcra(s))) => State::Gcra(*s),
            (Algorithm::Gcra { .. }, _) => State::Gcra(gcra::Tat::default()),
            (
                Algorithm::SlidingBuckets { precision_ms },
                Some(State::Buckets {
                    precision_ms: held,
                    counts,
                }),
            ) if *held == precision_ms => {
                let mut counts = counts.clone();
                buckets::prune(&mut counts, now, r.window_ms, precision_ms);
                State::Buckets {
                    precision_ms,
                    counts,
                }
            }
            (Algorithm::SlidingBuckets { precision_ms }, _) => State::Buckets {
                precision_ms,
                counts: Box::default(),
            },
        }
    }

    /// The counts of a default sliding-window limit held in place, for the
    /// store's fast path that rolls and counts them without building a
    /// second state; `None` for any other algorithm or shape.
    #[inline(always)]
    pub fn sliding_window(&mut self, algorithm: Algorithm) -> Option<&mut sliding_window::Counts> {
        match (algorithm, self) {
            (Algorithm::SlidingWindow, State::Sliding(s)) => Some(s),
            _ => None,
        }
    }

    /// The theoretical arrival time of a GCRA limit, for the in-process
    /// store's fast path that checks and writes it in place; `None` for any
    /// other algorithm or shape.
    #[inline(always)]
    pub fn gcra(&mut self, algorithm: Algorithm) -> Option<&mut gcra::Tat> {
        match (algorithm, self) {
            (Algorithm::Gcra { .. }, State::Gcra(t)) => Some(t),
            _ => None,
        }
    }

    /// Decides `r` at `cost` and returns the state to keep if the request
    /// is admitted.
    #[inline]
    pub fn check(&self, r: &LimitRequest, now: u64, cost: u64) -> (Standing, State) {
        let (l, w, c) = (r.limit, r.window_ms, cost);
        match self {
            State::Sliding(s) => {
                let o = sliding_window::check(*s, now, l, w, c);
                let mut after = *s;
                if o.admits {
                    after.cur += c;
                }
                (o, State::Sliding(after))
            }
            State::Month(s) => {
                // The end of now's month, also for state written by a clock
                // ahead (as the Redis script, which is told only now's month).
                let o = fixed_window::check_until(*s, now, l, calendar::month(now).1, c);
                let mut after = *s;
                if o.admits {
                    after.count += c;
                }
                (o, State::Month(after))
            }
            State::Fixed(s) => {
                let o = fixed_window::check(*s, now, l, w, c);
                let mut after = *s;
                if o.admits {
                    after.count += c;
                }
                (o, State::Fixed(after))
            }
            State::Log(log) => {
                let o = sliding_log::check(log, now, l, w, c);
                let mut after = log.clone();
                if o.admits {
                    sliding_log::add(&mut after, now, c);
                }
                (o, State::Log(after))
            }
            State::Gcra(s) => {
                let burst = r.algorithm.capacity(l);
                let checked = gcra::check(*s, now, l, w, burst, c);
                (checked.outcome, State::Gcra(checked.after))
            }
            State::Buckets {
                precision_ms,
                counts,
            } => {
                let p = *precision_ms;
                let o = buckets::check(counts, now, l, (w, p), c);
                let mut after = counts.clone();
                if o.admits {
                    buckets::add(&mut after, now / p.max(1), c);
                }
                let after = State::Buckets {
                    precision_ms: p,
                    counts: after,
                };
                (o, after)
            }
        }
    }

    /// What `r`'s limit shows at `now` without the request: its answer to a
    /// request of cost 0, which takes nothing. A held sliding log is already
    /// pruned to `now` (a decision prunes it in place).
    #[inline]
    pub fn standing(stored: Option<&State>, r: &LimitRequest, now: u64) -> Standing {
        let (l, w) = (r.limit, r.window_ms);
        match (r.algorithm, stored) {
            (Algorithm::SlidingLog, Some(State::Log(log))) => sliding_log::check(log, now, l, w, 0),
            // None held: an empty log, without the box of a new state.
            (Algorithm::SlidingLog, _) => sliding_log::check(&VecDeque::new(), now, l, w, 0),
            (
                Algorithm::SlidingWindow
                | Algorithm::FixedWindow
                | Algorithm::CalendarMonth
                | Algorithm::Gcra { .. }
                | Algorithm::SlidingBuckets { .. },
                _,
            ) => Self::for_request(stored, r, now).check(r, now, 0).0,
        }
    }

    /// Whether the key holds nothing that still counts at `now`.
    #[inline]
    pub fn is_idle(&self, now: u64, window_ms: u64) -> bool {
        match self {
            State::Sliding(s) => s.window + 1 < now / window_ms,
            State::Fixed(s) => s.window < now / window_ms,
            State::Month(s) => s.window < calendar::month_index(now),
            State::Log(log) => log.back().is_none_or(|&s| s + window_ms <= now),
            State::Gcra(s) => s.tat < now,
            State::Buckets {
                precision_ms,
                counts,
            } => buckets::is_idle(counts, now, window_ms, *precision_ms),
        }
    }

    /// The state to keep after settling `s` (its [`Settlement::bounded_delta`]
    /// is `delta`, not 0) at `now_ms` against `held`; `None` when nothing
    /// changes ([`settle`] has the rules).
    pub fn settled(
        held: Option<&State>,
        s: &Settlement,
        now_ms: u64,
        delta: i128,
    ) -> Option<State> {
        let r = &s.request;
        let (reserved, now_idx) = s.windows(now_ms);
        match r.algorithm {
            Algorithm::SlidingWindow => {
                let st = match held {
                    Some(State::Sliding(st)) => Some(*st),
                    _ => None,
                };
                settle::sliding(st, reserved, now_idx, r.limit, delta).map(State::Sliding)
            }
            Algorithm::FixedWindow | Algorithm::CalendarMonth => {
                let st = match held {
                    Some(State::Fixed(st) | State::Month(st)) => Some(*st),
                    _ => None,
                };
                let after = settle::fixed(st, reserved, now_idx, r.limit, delta);
                match r.algorithm.month(now_ms) {
                    None => after.map(State::Fixed),
                    Some(_) => after.map(State::Month),
                }
            }
            Algorithm::Gcra { burst } => {
                let st = match held {
                    Some(State::Gcra(st)) => *st,
                    _ => gcra::Tat::default(),
                };
                let after = settle::gcra(st, now_ms, r.limit, r.window_ms, burst, delta);
                (after != st).then_some(State::Gcra(after))
            }
            Algorithm::SlidingBuckets { precision_ms } => {
                let counts = match held {
                    Some(State::Buckets {
                        precision_ms: p,
                        counts,
                    }) if *p == precision_ms => Vec::clone(counts),
                    _ => Vec::new(),
                };
                let windows = (reserved, now_ms);
                let numbers = (r.limit, r.window_ms, precision_ms);
                buckets::settled(counts, windows, numbers, delta).map(|counts| State::Buckets {
                    precision_ms,
                    counts: Box::new(counts),
                })
            }
            // Refused by the configuration (see limit::settle).
            Algorithm::SlidingLog => None,
        }
    }
}

/// What one key's fallback admitted, in its algorithm's shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admitted {
    /// Units admitted per window (`window` is the later one).
    Sliding(sliding_window::Counts),
    /// Units admitted in one fixed window or calendar month (`window` is
    /// the window's or month's index).
    Fixed(fixed_window::Count),
    /// `(ms, units)` runs, sorted by time, one per millisecond.
    Log(Vec<(u64, u64)>),
    /// Units admitted per precision bucket, as [`buckets::BucketCounts`].
    Buckets {
        /// The buckets' length.
        precision_ms: u64,
        /// Units per bucket.
        counts: buckets::BucketCounts,
    },
    /// The local admissions as one GCRA step `x ↦ max(x + cost, tat)`.
    Gcra {
        /// The TAT they reach alone (`D`).
        tat: gcra::Tat,
        /// Their total cost in `1/L` ms (`C`: each unit is `w`), at most
        /// 2^52 (the backlog caps it).
        cost: u64,
    },
}

impl Admitted {
    /// Nothing admitted yet, in `algorithm`'s shape.
    pub fn empty(algorithm: Algorithm) -> Admitted {
        match algorithm {
            Algorithm::SlidingWindow => Admitted::Sliding(sliding_window::Counts::default()),
            Algorithm::FixedWindow | Algorithm::CalendarMonth => {
                Admitted::Fixed(fixed_window::Count::default())
            }
            Algorithm::SlidingLog => Admitted::Log(Vec::new()),
            Algorithm::SlidingBuckets { precision_ms } => Admitted::Buckets {
                precision_ms,
                counts: Vec::new(),
            },
            Algorithm::Gcra { .. } => Admitted::Gcra {
                tat: gcra::Tat::default(),
                cost: 0,
            },
        }
    }
}
