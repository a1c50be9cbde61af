//! The sliding-window counter (docs/design.md#what-a-limit-promises), as pure integer arithmetic.
//!
//! Window index `i = floor(t/w)`, elapsed `e = t mod w`, counts `cur`
//! (window `i`) and `prev` (window `i−1`). The estimate is
//! `E = prev·(w−e)/w + cur`; a request of cost `c` is admitted iff
//! `E + c ≤ L`. Everything is kept multiplied by `w` so no float is involved
//! and the Lua script beside the Redis store can compute the same numbers.
//! The estimate assumes requests in the previous window were spread evenly
//! (Cloudflare's write-up); it can over- or under-count a bursty previous
//! window, never by more than `prev`.
//!
//! Products are computed in `u64` when they fit and in `u128` otherwise
//! (which takes numbers no accepted configuration produces); the Lua
//! script uses doubles, which
//! are exact while `(prev + cur + c) · w < 2^53`, at most `3 · L · w`. The
//! configuration refuses limits with `3 · L · w ≥ 2^53` (a limit of one
//! million per 30-day window is fine) and the script answers an error rather
//! than a wrong number if it ever sees one.

use std::ops::{Add, Div, Mul, Sub};

use super::Standing;

/// Counter state of one key: the window index it was last written in and the
/// counts of that window and the one before.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Index of the window `cur` belongs to.
    pub window: u64,
    /// Count of window `window − 1`.
    pub prev: u64,
    /// Count of window `window`.
    pub cur: u64,
}

impl Counts {
    /// The counts as seen from window `i`: older state rolls forward.
    ///
    /// State written in a *later* window — by a gateway whose clock is
    /// ahead of this one's — is kept as it is rather than reset, so clock
    /// skew between instances never wipes counts; the estimate then uses
    /// this gateway's position in its own window, which errs by at most the
    /// skew.
    #[inline]
    pub fn at(self, i: u64) -> Counts {
        if self.window >= i {
            self
        } else if self.window + 1 == i {
            Counts {
                window: i,
                prev: self.cur,
                cur: 0,
            }
        } else {
            Counts {
                window: i,
                prev: 0,
                cur: 0,
            }
        }
    }
}

/// Decides one limit at time `now` (ms) against `state` (already rolled to
/// the current window with [`Counts::at`]). Does not modify the state; the
/// caller adds `cost` to `cur` when the whole request is admitted.
#[inline(always)]
pub fn check(state: Counts, now: u64, limit: u64, window: u64, cost: u64) -> Standing {
    check_elapsed(state, now % window, limit, window, cost)
}

/// [`check`] for a caller that knows the time `elapsed` since the start of
/// now's window (`now mod window`) without dividing for it.
#[inline(always)]
pub fn check_elapsed(state: Counts, elapsed: u64, limit: u64, window: u64, cost: u64) -> Standing {
    // No product or sum below exceeds (L + prev + cur + c + 2)·w. When that
    // fits in 64 bits — always for a configured limit, 3·L·w < 2^53 — the
    // arithmetic runs on u64 and gives the same numbers as on u128, whose
    // division is a library call several times slower.
    if fits(state, limit, window, cost) {
        check_in::<u64>(state, elapsed, limit, window, cost)
    } else {
        check_wide(state, elapsed, limit, window, cost)
    }
}

/// Whether [`check_elapsed`] admits, without the rest of the outcome (its
/// `remaining` costs a division): for a store that decides under a lock
/// and works out the outcome after releasing it.
#[inline(always)]
pub fn admits(state: Counts, elapsed: u64, limit: u64, window: u64, cost: u64) -> bool {
    if fits(state, limit, window, cost) {
        let (prev, cur) = (state.prev, state.cur);
        admits_in(cost, limit, prev * (window - elapsed), cur, window)
    } else {
        let (prev, cur) = (u128::from(state.prev), u128::from(state.cur));
        let w = u128::from(window);
        let decayed = prev * (w - u128::from(elapsed));
        admits_in(cost.into(), limit.into(), decayed, cur, w)
    }
}

/// `E + c ≤ L`, times `w`: `E·w = prev·(w−e) + cur·w = decayed + cur·w`.
#[inline(always)]
fn admits_in<N: Int>(c: N, l: N, decayed: N, cur: N, w: N) -> bool {
    c <= l && decayed + (cur + c) * w <= l * w
}

/// [`check`] in `u128`, kept out of line so that the common path stays
/// small enough to inline into the store (which then divides `now` by the
/// window once for the window index and the elapsed time together).
#[cold]
#[inline(never)]
fn check_wide(state: Counts, elapsed: u64, limit: u64, window: u64, cost: u64) -> Standing {
    check_in::<u128>(state, elapsed, limit, window, cost)
}

/// Whether (L + prev + cur + c + 2)·w, which bounds every number [`check`]
/// computes, fits in `u64`.
#[inline(always)]
fn fits(state: Counts, limit: u64, window: u64, cost: u64) -> bool {
    [state.prev, state.cur, cost, 2]
        .into_iter()
        .try_fold(limit, u64::checked_add)
        .and_then(|bound| bound.checked_mul(window))
        .is_some()
}

/// The unsigned integers [`check`] computes in.
trait Int:
    Copy
    + Ord
    + From<u64>
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
{
    fn div_ceil(self, d: Self) -> Self;
    /// The low 64 bits.
    fn low_u64(self) -> u64;
}

impl Int for u64 {
    fn div_ceil(self, d: Self) -> Self {
        u64::div_ceil(self, d)
    }
    fn low_u64(self) -> u64 {
        self
    }
}

impl Int for u128 {
    fn div_ceil(self, d: Self) -> Self {
        u128::div_ceil(self, d)
    }
    fn low_u64(self) -> u64 {
        self as u64
    }
}

#[inline]
fn check_in<N: Int>(state: Counts, elapsed: u64, limit: u64, window: u64, cost: u64) -> Standing {
    let (l, w, c) = (N::from(limit), N::from(window), N::from(cost));
    let e = N::from(elapsed);
    let prev = N::from(state.prev);
    let cur = N::from(state.cur);
    let zero = N::from(0);
    // E·w = prev·(w−e) + cur·w
    let decayed = prev * (w - e);
    let admits = admits_in(c, l, decayed, cur, w);
    let cur_after = if admits { cur + c } else { cur };
    let used = decayed + cur_after * w;
    let remaining = if l * w > used {
        (l * w - used) / w
    } else {
        zero
    };
    let reset_ms = if cur_after > zero {
        N::from(2) * w - e
    } else if prev > zero {
        w - e
    } else {
        zero
    };
    let retry_after_ms = if admits {
        Some(zero)
    } else if c > l {
        None
    } else if cur + c <= l {
        // Inside the current window: smallest Δ with
        // prev·(w−e−Δ) + (cur+c)·w ≤ L·w.
        let need = decayed + (cur + c) * w - l * w;
        Some(need.div_ceil(prev))
    } else {
        // Past the boundary, `cur` becomes `prev`: smallest e' with
        // cur·(w−e') ≤ (L−c)·w.
        let e2 = (w * (cur - (l - c))).div_ceil(cur);
        Some((w - e) + e2)
    };
    Standing {
        admits,
        remaining: remaining.low_u64(),
        reset_ms: reset_ms.low_u64(),
        retry_after_ms: retry_after_ms.map(N::low_u64),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Brute force: the first ms at which the request would be admitted.
    fn brute(state: Counts, now: u64, l: u64, w: u64, c: u64) -> Option<u64> {
        for d in 0..=3 * w {
            let t = now + d;
            let s = state.at(t / w);
            if check(s, t, l, w, c).admits {
                return Some(d);
            }
        }
        None
    }

    #[test]
    fn retry_after_is_the_first_admitting_instant() {
        let w = 1000;
        for l in [1u64, 3, 5, 10] {
            for c in 1..=l {
                for prev in 0..=l {
                    for cur in 0..=l {
                        for e in [0u64, 1, 250, 999] {
                            let now = 10 * w + e;
                            let s = Counts {
                                window: 10,
                                prev,
                                cur,
                            };
                            let o = check(s, now, l, w, c);
                            if !o.admits {
                                assert_eq!(
                                    o.retry_after_ms,
                                    brute(s, now, l, w, c),
                                    "l={l} c={c} prev={prev} cur={cur} e={e}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn u64_arithmetic_matches_u128_and_admits_matches_check() {
        let w_s = [1u64, 7, 1_000, 60_000, 2_678_400_000];
        let l_s = [1u64, 3, 10, 1_000, 1_000_000, 1_000_000_000_000];
        for w in w_s {
            for l in l_s {
                let counts = [0, 1, l / 3, l / 2, l - 1, l, l + 1];
                for c in [0, 1, 3, l, l + 1] {
                    for prev in counts {
                        for cur in counts {
                            for e in [0, 1, w / 3, w / 2, w - 1] {
                                let now = 5 * w + e;
                                let s = Counts {
                                    window: 5,
                                    prev,
                                    cur,
                                };
                                let o = check(s, now, l, w, c);
                                let why = format!("l={l} w={w} c={c} prev={prev} cur={cur} e={e}");
                                assert_eq!(o, check_in::<u128>(s, now % w, l, w, c), "{why}");
                                assert_eq!(o.admits, admits(s, now % w, l, w, c), "{why}");
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn state_from_a_clock_ahead_is_kept() {
        let s = Counts {
            window: 11,
            prev: 2,
            cur: 3,
        };
        assert_eq!(s.at(10), s);
        assert_eq!(
            s.at(12),
            Counts {
                window: 12,
                prev: 3,
                cur: 0
            }
        );
        assert_eq!(
            s.at(13),
            Counts {
                window: 13,
                prev: 0,
                cur: 0
            }
        );
    }

    #[test]
    fn cost_above_limit_never_admits() {
        let o = check(Counts::default(), 0, 5, 1000, 6);
        assert!(!o.admits);
        assert_eq!(o.retry_after_ms, None);
    }

    #[test]
    fn remaining_and_reset() {
        let s = Counts {
            window: 0,
            prev: 0,
            cur: 0,
        };
        let o = check(s, 0, 5, 10_000, 1);
        assert!(o.admits);
        assert_eq!(o.remaining, 4);
        assert_eq!(o.reset_ms, 20_000);
        // Half-way through the next window, half of prev still counts.
        let s = Counts {
            window: 0,
            prev: 0,
            cur: 4,
        }
        .at(1);
        let o = check(s, 15_000, 5, 10_000, 1);
        assert!(o.admits);
        assert_eq!(o.remaining, 2); // 5 − (4·0.5 + 1) = 2
    }
}
