//! The fixed-window counter (docs/design.md#what-a-limit-promises): one count per window, as an
//! `INCRBY` + `PEXPIRE` limiter keeps it.
//!
//! Window index `i = floor(t/w)`. A request of cost `c` is admitted iff
//! `count + c ≤ L`; the count starts again at 0 in window `i+1`. Exact
//! inside a window and the cheapest algorithm, but a caller who spends `L`
//! at the end of one window and `L` again at the start of the next gets
//! `2·L` through in a few milliseconds — the boundary burst the sliding
//! algorithms exist to remove.

use super::Standing;

/// The count of one key and the window it belongs to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Count {
    /// Index of the window `count` belongs to.
    pub window: u64,
    /// Units admitted in that window.
    pub count: u64,
}

impl Count {
    /// The state seen from window `i`. As in the sliding window, a state
    /// written in a later window by a gateway whose clock is ahead is kept.
    pub fn at(self, i: u64) -> Count {
        if self.window >= i {
            self
        } else {
            Count {
                window: i,
                count: 0,
            }
        }
    }
}

/// Decides one limit at `now` (ms) against `state` (rolled with
/// [`Count::at`]). The caller adds `cost` to `count` when the whole request
/// is admitted.
pub fn check(state: Count, now: u64, limit: u64, window: u64, cost: u64) -> Standing {
    // The window this count belongs to ends here (later than now's window
    // only for state from a clock ahead).
    check_until(
        state,
        now,
        limit,
        (state.window + 1).saturating_mul(window),
        cost,
    )
}

/// [`check`] for a window that ends at `end` (ms): calendar months, whose
/// length varies.
pub fn check_until(state: Count, now: u64, limit: u64, end: u64, cost: u64) -> Standing {
    let admits = cost <= limit && state.count.saturating_add(cost) <= limit;
    let after = if admits {
        state.count + cost
    } else {
        state.count
    };
    let to_end = end.saturating_sub(now);
    Standing {
        admits,
        remaining: limit.saturating_sub(after),
        reset_ms: if after > 0 { to_end } else { 0 },
        retry_after_ms: if admits {
            Some(0)
        } else if cost > limit {
            None
        } else {
            // The next window starts empty and cost ≤ L fits.
            Some(to_end)
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_is_the_next_window() {
        let w = 1000;
        for l in 1..=4u64 {
            for c in 1..=l {
                for count in 0..=l {
                    for e in [0u64, 1, 500, 999] {
                        let now = 10 * w + e;
                        let s = Count { window: 10, count };
                        let o = check(s, now, l, w, c);
                        if o.admits {
                            continue;
                        }
                        let d = o.retry_after_ms.unwrap();
                        let t = now + d;
                        assert!(check(s.at(t / w), t, l, w, c).admits);
                        let t = t - 1;
                        assert!(!check(s.at(t / w), t, l, w, c).admits);
                    }
                }
            }
        }
    }

    #[test]
    fn boundary_burst() {
        // L at the end of window 0, L again at the start of window 1.
        let s = Count {
            window: 0,
            count: 5,
        };
        assert!(!check(s, 999, 5, 1000, 1).admits);
        assert!(check(s.at(1), 1000, 5, 1000, 5).admits);
    }
}
