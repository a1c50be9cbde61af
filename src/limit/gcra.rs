//! GCRA, the generic cell rate algorithm: a token bucket kept as one
//! theoretical arrival time (TAT) per key, as redis-cell and
//! go-redis/redis_rate do.
//!
//! The bucket holds `B` units (`burst`, default `L`) and refills at `L`
//! units per window `w`, so one unit is worth `T = w/L` ms. A request of
//! cost `c` at `now` is admitted iff `max(TAT, now) + c·T − now ≤ B·T`;
//! then `TAT = max(TAT, now) + c·T`.
//!
//! `T` is rarely a whole number of milliseconds (3 per 10 s is 3333.3 ms),
//! and rounding it would change the rate. So the TAT is kept exactly as
//! `tat + rem/L` ms with `0 ≤ rem < L`, and every comparison is made in
//! units of `1/L` ms, where `T` is exactly `w`: all integers, which the Lua
//! script beside the Redis store can reproduce with doubles (the largest
//! quantity is `(B + c)·w`, below 2^53 by the configuration's bound).

use super::Standing;

/// The theoretical arrival time of one key: `tat + rem/L` ms.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tat {
    /// Whole milliseconds of the TAT.
    pub tat: u64,
    /// Fraction of a millisecond, in units of `1/L` ms.
    pub rem: u64,
}

/// The state after a request is admitted, and the outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Checked {
    /// The answer for this limit.
    pub outcome: Standing,
    /// The TAT to store if the whole request is admitted.
    pub after: Tat,
}

/// Decides one limit at `now` (ms).
///
/// A limit or window of 0 counts as 1 (the configuration refuses both).
/// A `rem` of `L` or more (the limit was lowered since it was written) is
/// rounded up to the next millisecond: the new limit errs towards denying.
pub fn check(state: Tat, now: u64, limit: u64, window: u64, burst: u64, cost: u64) -> Checked {
    // The configuration refuses a limit or window of 0; were one to reach
    // here, it counts as 1 rather than dividing by zero.
    let (l, w, b, c) = (
        u128::from(limit.max(1)),
        u128::from(window.max(1)),
        u128::from(burst),
        u128::from(cost),
    );
    let mut s = state;
    if u128::from(s.rem) >= l {
        s = Tat {
            tat: s.tat.saturating_add(1),
            rem: 0,
        };
    }
    // max(TAT, now)
    let (base_ms, base_rem) = if s.tat > now || (s.tat == now && s.rem > 0) {
        (s.tat, s.rem)
    } else {
        (now, 0)
    };
    // (max(TAT, now) − now) · L
    let diff = u128::from(base_ms - now) * l + u128::from(base_rem);
    let cap = b * w;
    let admits = c <= b && diff + c * w <= cap;
    let diff_after = if admits { diff + c * w } else { diff };
    let remaining = div_rem(cap.saturating_sub(diff_after), w).0;
    let retry = if admits {
        Some(0)
    } else if c > b {
        None
    } else {
        Some(div_ceil(diff + c * w - cap, l))
    };
    let after = if admits {
        let (whole, rem) = div_rem(u128::from(base_rem) + c * w, l);
        Tat {
            tat: base_ms.saturating_add(u64::try_from(whole).unwrap_or(u64::MAX)),
            rem: rem as u64,
        }
    } else {
        s
    };
    Checked {
        outcome: Standing {
            admits,
            remaining: u64::try_from(remaining).unwrap_or(u64::MAX),
            reset_ms: u64::try_from(div_ceil(diff_after, l)).unwrap_or(u64::MAX),
            retry_after_ms: retry.map(|r| u64::try_from(r).unwrap_or(u64::MAX)),
        },
        after,
    }
}

/// `a / b` and `a % b` (`b` > 0), in one 64-bit division when both fit,
/// as they do for every limit whose `(B + c)·w` is below 2^53: a 128-bit
/// division is a call into the compiler's runtime, two of them for the
/// quotient and the remainder.
#[inline]
fn div_rem(a: u128, b: u128) -> (u128, u128) {
    match (u64::try_from(a), u64::try_from(b)) {
        (Ok(a), Ok(b)) => (u128::from(a / b), u128::from(a % b)),
        _ => div_rem_wide(a, b),
    }
}

/// [`div_rem`] past 64 bits: out of line, so that the check's code every
/// request runs is not spread around the two calls into the runtime.
#[cold]
#[inline(never)]
fn div_rem_wide(a: u128, b: u128) -> (u128, u128) {
    (a / b, a % b)
}

/// `a / b` rounded up (`b` > 0), as [`div_rem`] divides.
#[inline]
fn div_ceil(a: u128, b: u128) -> u128 {
    let (q, r) = div_rem(a, b);
    q + u128::from(r != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn divisions_in_64_bits_agree_with_128() {
        let big = u128::from(u64::MAX);
        for a in [0, 1, 7, 9_999, 10_000, big - 1, big, big + 1, big * 3 + 2] {
            for b in [1, 3, 10_000, big, big + 5] {
                assert_eq!(div_rem(a, b), (a / b, a % b), "{a} / {b}");
                assert_eq!(div_ceil(a, b), a.div_ceil(b), "{a} / {b}");
            }
        }
    }

    #[test]
    fn a_full_bucket_takes_a_burst_then_refills_at_the_rate() {
        // 3 per 10 s, burst 3: T = 3333.3 ms.
        let mut s = Tat::default();
        let now = 1_000_000;
        for left in [2, 1, 0] {
            let r = check(s, now, 3, 10_000, 3, 1);
            assert!(r.outcome.admits);
            assert_eq!(r.outcome.remaining, left);
            s = r.after;
        }
        let r = check(s, now, 3, 10_000, 3, 1);
        assert!(!r.outcome.admits);
        // One unit back after ceil(3333.3) ms.
        assert_eq!(r.outcome.retry_after_ms, Some(3334));
        assert_eq!(r.outcome.reset_ms, 10_000);
        assert!(!check(s, now + 3333, 3, 10_000, 3, 1).outcome.admits);
        assert!(check(s, now + 3334, 3, 10_000, 3, 1).outcome.admits);
    }

    #[test]
    fn retry_after_is_exact() {
        for (l, w, b) in [
            (3u64, 10_000u64, 3u64),
            (7, 1_000, 2),
            (1, 60_000, 5),
            (100, 1_000, 10),
        ] {
            for c in 1..=b {
                let mut s = Tat::default();
                let mut now = 5_000_000;
                for _ in 0..20 {
                    let r = check(s, now, l, w, b, c);
                    if r.outcome.admits {
                        s = r.after;
                        now += 7;
                        continue;
                    }
                    let d = r.outcome.retry_after_ms.unwrap();
                    assert!(
                        check(s, now + d, l, w, b, c).outcome.admits,
                        "l={l} b={b} c={c}"
                    );
                    assert!(!check(s, now + d - 1, l, w, b, c).outcome.admits);
                    now += d;
                }
            }
        }
    }

    #[test]
    fn cost_above_burst_never_admits() {
        let r = check(Tat::default(), 0, 10, 1000, 4, 5);
        assert!(!r.outcome.admits);
        assert_eq!(r.outcome.retry_after_ms, None);
    }
}
