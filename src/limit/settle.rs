//! Costs known only after the request (docs/limits.md#costs-settled-by-the-response): a limit reserves a cost
//! when the request is decided and *settles* the difference once the real
//! amount is known — from a response header, a response trailer, the
//! bytes of the request or response body, or the usage a response body
//! reports.
//!
//! The reservation is the cost of the ordinary decision, so "admit only if
//! every limit admits" is unchanged. A [`Settlement`] then adds
//! `actual − reserved` to the counter the reservation went into: a refund
//! when negative, an extra charge when positive. This file holds the
//! vocabulary and the arithmetic the in-process store applies; the Redis
//! script `store/redis/settle.lua` mirrors it number for number.
//!
//! The rules, per algorithm and the state each keeps:
//!
//! - **Sliding and fixed windows, calendar months.** The reservation went
//!   into window `R` (the window of its instant). While `R` still counts
//!   (it is now's window, or for a sliding window the one before): if the
//!   key holds `R` as its current window, that count moves; if it has
//!   rolled on to `R + 1` (sliding window), the reserved units sit in its
//!   previous count, which moves. Otherwise the window has gone: a refund has
//!   nothing left to give back, and an extra charge goes into the current
//!   window (the caller pays when the answer arrived, not never).
//! - **Precision buckets** as windows, bucket for window: while the
//!   reservation's bucket still counts and is held, its count moves;
//!   otherwise a refund gives nothing back and an extra charge goes into
//!   now's bucket ([`super::buckets::settled`]).
//! - **GCRA.** The theoretical arrival time moves by `delta · w/L`; a refund
//!   never moves it before `now` (an idle bucket is already full).
//! - **Sliding log** is refused by the configuration: a log holds one
//!   member per unit at its instant, and taking some of them back is not
//!   worth a second layout.
//!
//! Counts never go below 0, and never above the limit `L` (a GCRA bucket
//! never below empty): an extra charge can use up the quota but not more,
//! which keeps every count inside the bounds the Redis script computes
//! exactly in (`3·L·w < 2^53`). So the counters hold exactly the sum of the
//! settled amounts as long as no window reaches its limit.

use std::sync::Arc;

use http::HeaderName;

use super::usage::UsageSpec;
use super::{Algorithm, LimitRequest, fixed_window, gcra, sliding_window};

/// Where a limit learns its final cost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A response header holding a non-negative integer
    /// (`cost: { reserve, from_header }`).
    Header(HeaderName),
    /// A response trailer holding a non-negative integer
    /// (`cost: { reserve, from_trailer }`).
    Trailer(HeaderName),
    /// Body bytes (`bytes: request | response | both`).
    Bytes(Bytes),
    /// The usage a JSON or event-stream response body reports
    /// (`cost: { reserve, from_body }`), read as the body passes.
    Body(BodyUsage),
}

/// `from_body`: what the response body's usage is, as written.
#[derive(Debug, Clone)]
pub struct BodyUsage {
    /// As written: `openai`, `anthropic`, or the `json:` sum with its `stream:`.
    pub written: Arc<str>,
    /// The fields read and how a stream's events add up.
    pub spec: Arc<UsageSpec>,
}

impl BodyUsage {
    /// The presets `from_body` takes by name.
    pub const PRESETS: [&'static str; 2] = ["openai", "anthropic"];
}

impl PartialEq for BodyUsage {
    /// One spelling is one reader: the spec is parsed from it.
    fn eq(&self, other: &Self) -> bool {
        self.written == other.written
    }
}

impl Eq for BodyUsage {}

/// Which body bytes a byte quota counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bytes {
    /// The request body as forwarded upstream.
    Request,
    /// The response body as passed to the client.
    Response,
    /// Both.
    Both,
}

impl Bytes {
    /// Every spelling `bytes:` accepts, with its value.
    pub const SPELLINGS: [(&'static str, Self); 3] = [
        ("request", Self::Request),
        ("response", Self::Response),
        ("both", Self::Both),
    ];

    /// Whether the request body counts.
    pub fn request(self) -> bool {
        matches!(self, Self::Request | Self::Both)
    }

    /// Whether the response body counts.
    pub fn response(self) -> bool {
        matches!(self, Self::Response | Self::Both)
    }
}

/// A reservation to settle: the limit as it was decided (its `cost` is
/// what was reserved), the instant it was decided at, and the amount the
/// request turned out to cost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settlement {
    /// The limit's request as decided; `cost` is the reservation.
    pub request: LimitRequest,
    /// The instant of the decision (ms), which names the window the
    /// reservation went into.
    pub reserved_at_ms: u64,
    /// What the request cost in the end.
    pub actual: u64,
}

impl Settlement {
    /// `actual − reserved`: negative is a refund, positive an extra charge.
    pub fn delta(&self) -> i128 {
        i128::from(self.actual) - i128::from(self.request.cost)
    }

    /// [`Self::delta`] within the bounds both stores compute exactly in:
    /// an extra charge of more than the limit (or burst) `M` fills the
    /// quota as `M` does, a refund of more than every count held empties it
    /// as that does (for GCRA, `3·M` units, the most a bucket within the
    /// configuration's bounds holds).
    pub fn bounded_delta(&self) -> i128 {
        let r = &self.request;
        let m = i128::from(match r.algorithm {
            Algorithm::Gcra { burst } => burst.max(r.limit),
            _ => r.limit,
        });
        let floor = match r.algorithm {
            Algorithm::Gcra { .. } => -3 * m,
            _ => -(1 << 52),
        };
        self.delta().clamp(floor, m)
    }

    /// The window index the reservation went into and the one `now_ms` is
    /// in, for a window algorithm (calendar months count months, precision
    /// buckets their buckets: [`Algorithm::window_index`]).
    pub fn windows(&self, now_ms: u64) -> (u64, u64) {
        let r = &self.request;
        (
            r.algorithm.window_index(self.reserved_at_ms, r.window_ms),
            r.algorithm.window_index(now_ms, r.window_ms),
        )
    }
}

/// `count + delta`, between 0 and `limit`.
fn moved(count: u64, delta: i128, limit: u64) -> u64 {
    // A count already above the limit (the limit was lowered) is its own
    // ceiling: a refund still takes from it, a charge adds nothing.
    let v = (i128::from(count) + delta).clamp(0, i128::from(limit.max(count)));
    u64::try_from(v).unwrap_or(0)
}

/// A sliding-window counter after settling `delta` for a reservation made
/// in window `reserved` (`None` in: the key is absent). `None` out: nothing
/// changes.
pub fn sliding(
    state: Option<sliding_window::Counts>,
    reserved: u64,
    now_idx: u64,
    limit: u64,
    delta: i128,
) -> Option<sliding_window::Counts> {
    // R counts while it is the current or the previous window.
    let counts = reserved + 1 >= now_idx;
    match state {
        Some(s) if counts && s.window == reserved => Some(sliding_window::Counts {
            cur: moved(s.cur, delta, limit),
            ..s
        }),
        Some(s) if counts && s.window == reserved + 1 => Some(sliding_window::Counts {
            prev: moved(s.prev, delta, limit),
            ..s
        }),
        _ if delta > 0 => {
            let s = state.unwrap_or_default().at(now_idx.max(reserved));
            Some(sliding_window::Counts {
                cur: moved(s.cur, delta, limit),
                ..s
            })
        }
        _ => None,
    }
}

/// A fixed-window count (calendar months too, by month index) after
/// settling `delta` for a reservation made in window `reserved`; as
/// [`sliding`], without a previous window.
pub fn fixed(
    state: Option<fixed_window::Count>,
    reserved: u64,
    now_idx: u64,
    limit: u64,
    delta: i128,
) -> Option<fixed_window::Count> {
    // R counts while it is the current window.
    match state {
        Some(s) if reserved >= now_idx && s.window == reserved => Some(fixed_window::Count {
            count: moved(s.count, delta, limit),
            ..s
        }),
        _ if delta > 0 => {
            let s = state.unwrap_or_default().at(now_idx.max(reserved));
            Some(fixed_window::Count {
                count: moved(s.count, delta, limit),
                ..s
            })
        }
        _ => None,
    }
}

/// A GCRA arrival time after settling `delta` at `now`: moved by
/// `delta · w/L` ms, kept in `[now, now + B·w/L]` when it moves (never
/// before `now`: an idle bucket is full; never past an empty bucket).
pub fn gcra(
    state: gcra::Tat,
    now: u64,
    limit: u64,
    window: u64,
    burst: u64,
    delta: i128,
) -> gcra::Tat {
    let (l, w) = (i128::from(limit.max(1)), i128::from(window.max(1)));
    // Everything in units of 1/L ms, as gcra.rs.
    let mut rem = i128::from(state.rem);
    let mut tat = i128::from(state.tat);
    if rem >= l {
        tat += 1;
        rem = 0;
    }
    let now_units = i128::from(now) * l;
    let held = tat * l + rem;
    let base = held.max(now_units);
    let cap = now_units + i128::from(burst) * w;
    let target = if delta > 0 {
        (base + delta * w).min(cap.max(base))
    } else {
        (held + delta * w).max(now_units)
    };
    if delta <= 0 && held <= now_units {
        // Already full: nothing to give back.
        return state;
    }
    gcra::Tat {
        tat: u64::try_from(target / l).unwrap_or(u64::MAX),
        rem: u64::try_from(target % l).unwrap_or(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sw(window: u64, prev: u64, cur: u64) -> sliding_window::Counts {
        sliding_window::Counts { window, prev, cur }
    }

    #[test]
    fn a_sliding_window_settles_where_the_reservation_went() {
        assert_eq!(
            sliding(Some(sw(5, 3, 10)), 5, 5, 100, -4),
            Some(sw(5, 3, 6))
        );
        assert_eq!(
            sliding(Some(sw(6, 10, 2)), 5, 6, 100, 7),
            Some(sw(6, 17, 2))
        );
        assert_eq!(sliding(Some(sw(5, 3, 2)), 5, 5, 100, -9), Some(sw(5, 3, 0)));
        // Gone: a refund gives nothing back, a charge lands now.
        assert_eq!(sliding(Some(sw(8, 1, 1)), 5, 8, 100, -3), None);
        assert_eq!(sliding(Some(sw(5, 0, 4)), 5, 7, 100, -3), None);
        assert_eq!(sliding(Some(sw(5, 0, 4)), 5, 7, 100, 3), Some(sw(7, 0, 3)));
        assert_eq!(sliding(None, 5, 9, 100, 3), Some(sw(9, 0, 3)));
        assert_eq!(sliding(Some(sw(7, 0, 4)), 5, 8, 100, 3), Some(sw(8, 4, 3)));
        // Never past the limit.
        assert_eq!(
            sliding(Some(sw(5, 0, 90)), 5, 5, 100, 30),
            Some(sw(5, 0, 100))
        );
    }

    #[test]
    fn a_fixed_window_settles_in_its_window_or_charges_the_current_one() {
        let f = |window, count| fixed_window::Count { window, count };
        assert_eq!(fixed(Some(f(2, 10)), 2, 2, 50, 5), Some(f(2, 15)));
        assert_eq!(fixed(Some(f(3, 10)), 2, 3, 50, -5), None);
        assert_eq!(fixed(Some(f(3, 10)), 2, 3, 50, 5), Some(f(3, 15)));
        assert_eq!(fixed(None, 2, 3, 50, 0), None);
    }

    #[test]
    fn gcra_moves_the_arrival_time() {
        let s = gcra::Tat { tat: 1_500, rem: 0 };
        // L = 10 per 1000 ms: one unit is 100 ms; the bucket is empty at 2000.
        assert_eq!(gcra(s, 1_000, 10, 1_000, 10, -3).tat, 1_200);
        assert_eq!(gcra(s, 1_000, 10, 1_000, 10, -30).tat, 1_000);
        assert_eq!(gcra(s, 1_000, 10, 1_000, 10, 2).tat, 1_700);
        assert_eq!(gcra(s, 1_000, 10, 1_000, 10, 50).tat, 2_000);
        let idle = gcra::Tat { tat: 500, rem: 0 };
        assert_eq!(gcra(idle, 1_000, 10, 1_000, 10, -3), idle);
        assert_eq!(gcra(idle, 1_000, 10, 1_000, 10, 3).tat, 1_300);
    }
}
