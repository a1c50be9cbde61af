//! Limiter conformance: one table of scenarios, run unchanged against every
//! store (docs/design.md#what-a-limit-promises: both stores hold to one table).
//!
//! Time is injected: a scenario's steps carry their instant, relative to
//! [`T0`], and go to [`Store::decide`] as `now_ms`, so Redis scripts and the
//! in-process store see the same clock. Expected numbers are written out by
//! hand from the formulas in `src/limit/sliding_window.rs` (the comments show
//! the arithmetic) rather than computed, so the table checks the arithmetic
//! too, not only that the stores agree.
//!
//! Redis-only behaviour follows the table: expiry, garbage keys, Redis going
//! away and coming back, script reloads. A property test closes the file:
//! random traces must get identical decisions from both stores.

#[path = "support/mod.rs"]
mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use proptest::prelude::*;
use redis::AsyncCommands;
use support::redis::{RedisServer, command_calls};
use tollgate::config::RedisConfig;
use tollgate::limit::{Algorithm, Answer, LimitRequest, Standing, Standings, calendar};
use tollgate::store::{MemoryStore, RedisStore, Store, StoreError};

/// A realistic epoch instant that every window in the table divides
/// (a whole number of hours), so step times read as offsets into window 0.
const T0: u64 = 1_699_999_200_000;

/// Bound on one Redis call in these tests.
const TIMEOUT: Duration = Duration::from_millis(300);

// --- the table --------------------------------------------------------------

/// The wait before the limits that denied `a` admit its request.
fn retry_after_ms(a: &Answer) -> Option<u64> {
    tollgate::limit::longest_wait(a.outcomes.iter().filter(|o| !o.admits))
}

/// One limit's expected answer: admits, remaining, reset_ms, retry_after_ms.
type Expect = (bool, u64, u64, Option<u64>);

/// The limit admits, leaving `remaining`, fully reset in `reset` ms.
const fn ok(remaining: u64, reset: u64) -> Expect {
    (true, remaining, reset, Some(0))
}

/// The limit denies; it admits again in `retry` ms (`None`: never).
const fn no(remaining: u64, reset: u64, retry: Option<u64>) -> Expect {
    (false, remaining, reset, retry)
}

struct Step {
    /// Offset from [`T0`] in ms.
    at: u64,
    /// Cost of the request, the same for each of its limits.
    cost: u64,
    /// One expectation per limit; the request is allowed iff all admit.
    expect: &'static [Expect],
}

const fn step(at: u64, cost: u64, expect: &'static [Expect]) -> Step {
    Step { at, cost, expect }
}

struct Scenario {
    name: &'static str,
    /// The algorithm of every limit; a gcra burst of 0 stands for "the
    /// limit" (the configuration's default).
    alg: Algorithm,
    /// (limit, window_ms) per limit of every request.
    limits: &'static [(u64, u64)],
    steps: &'static [Step],
}

const SW: Algorithm = Algorithm::SlidingWindow;
const FW: Algorithm = Algorithm::FixedWindow;
const LOG: Algorithm = Algorithm::SlidingLog;
/// GCRA with burst = limit.
const GCRA: Algorithm = Algorithm::Gcra { burst: 0 };
/// `window: month`.
const MONTH: Algorithm = Algorithm::CalendarMonth;
/// `algorithm: sliding_window` with `precision: 10s`.
const BUCKETS: Algorithm = Algorithm::SlidingBuckets {
    precision_ms: 10_000,
};

/// Every algorithm's scenarios.
const TABLES: &[&[Scenario]] = &[
    SLIDING_WINDOW,
    FIXED_WINDOW,
    SLIDING_LOG,
    GCRA_TABLE,
    CALENDAR_MONTH,
    PRECISION_BUCKETS,
];

// Precision buckets (src/limit/buckets.rs): bucket b holds [b·p, (b+1)·p)
// and counts until (b+1)·p + w. Admit iff total + c ≤ L; remaining
// L − total; reset: the newest bucket's leaving; retry: the leaving of the
// oldest bucket after which total − left + c ≤ L.
const PRECISION_BUCKETS: &[Scenario] = &[
    Scenario {
        name: "3 per minute in 10 s buckets: a bucket leaves when all of it is older than the window",
        alg: BUCKETS,
        limits: &[(3, 60_000)],
        steps: &[
            // Bucket 0 counts until 70 s.
            step(0, 1, &[ok(2, 70_000)]),
            step(5_000, 1, &[ok(1, 65_000)]),
            // Bucket 1 counts until 80 s.
            step(15_000, 1, &[ok(0, 65_000)]),
            // Full: bucket 0's leaving frees 2.
            step(20_000, 1, &[no(0, 60_000, Some(50_000))]),
            // The unit of 0 s is a window old, but bucket 0 holds one of
            // 5 s: it still counts, one ms more.
            step(69_999, 1, &[no(0, 10_001, Some(1))]),
            // Bucket 0 has gone: room for 2; bucket 7 counts until 140 s.
            step(70_000, 2, &[ok(0, 70_000)]),
        ],
    },
    Scenario {
        name: "cost zero probes without consuming, a cost above the limit never",
        alg: BUCKETS,
        limits: &[(2, 20_000)],
        steps: &[
            step(0, 0, &[ok(2, 0)]),
            step(0, 3, &[no(2, 0, None)]),
            step(0, 2, &[ok(0, 30_000)]),
            step(12_000, 0, &[ok(0, 18_000)]),
            step(12_000, 1, &[no(0, 18_000, Some(18_000))]),
        ],
    },
    Scenario {
        name: "two limits in buckets, one denies: the other is not consumed",
        alg: Algorithm::SlidingBuckets {
            precision_ms: 5_000,
        },
        limits: &[(1, 10_000), (5, 60_000)],
        steps: &[
            step(0, 1, &[ok(0, 15_000), ok(4, 65_000)]),
            step(1_000, 1, &[no(0, 14_000, Some(14_000)), ok(4, 64_000)]),
            // Had the second been consumed, 2 would show counted.
            step(15_000, 1, &[ok(0, 15_000), ok(3, 65_000)]),
        ],
    },
];

// A calendar month: T0 is 2023-11-14T22:00:00Z; November ends at
// 2023-12-01T00:00:00Z, 1,389,600,000 ms later; December has 31 days.
const CALENDAR_MONTH: &[Scenario] = &[
    Scenario {
        name: "monthly quota: resets on the first of the month, UTC",
        alg: MONTH,
        limits: &[(3, 2_592_000_000)],
        steps: &[
            step(0, 2, &[ok(1, 1_389_600_000)]),
            step(1_000, 2, &[no(1, 1_389_599_000, Some(1_389_599_000))]),
            step(1_389_599_999, 1, &[ok(0, 1)]),
            step(1_389_600_000, 3, &[ok(0, 2_678_400_000)]),
            step(1_389_600_000, 4, &[no(0, 2_678_400_000, None)]),
        ],
    },
    Scenario {
        name: "two monthly limits, one denies: the other is not consumed",
        alg: MONTH,
        limits: &[(2, 2_592_000_000), (10, 2_592_000_000)],
        steps: &[
            step(0, 2, &[ok(0, 1_389_600_000), ok(8, 1_389_600_000)]),
            step(
                5,
                1,
                &[
                    no(0, 1_389_599_995, Some(1_389_599_995)),
                    ok(8, 1_389_599_995),
                ],
            ),
            step(
                1_389_600_000,
                1,
                &[ok(1, 2_678_400_000), ok(9, 2_678_400_000)],
            ),
        ],
    },
    Scenario {
        name: "a denial by the other limit shows 3 of 100 counted, whatever its cost",
        alg: MONTH,
        limits: &[(100, 2_592_000_000), (3, 2_592_000_000)],
        steps: &[
            step(0, 1, &[ok(99, 1_389_600_000), ok(2, 1_389_600_000)]),
            step(1, 1, &[ok(98, 1_389_599_999), ok(1, 1_389_599_999)]),
            step(2, 1, &[ok(97, 1_389_599_998), ok(0, 1_389_599_998)]),
            step(
                3,
                1,
                &[
                    ok(97, 1_389_599_997),
                    no(0, 1_389_599_997, Some(1_389_599_997)),
                ],
            ),
            step(
                3,
                3,
                &[
                    ok(97, 1_389_599_997),
                    no(0, 1_389_599_997, Some(1_389_599_997)),
                ],
            ),
            step(3, 10, &[ok(97, 1_389_599_997), no(0, 1_389_599_997, None)]),
        ],
    },
];

// In the comments: w window, e elapsed in window, E the estimate; all
// quantities times w as in the code (E·w = prev·(w−e) + cur·w).
const SLIDING_WINDOW: &[Scenario] = &[
    Scenario {
        name: "fill, deny, readmit after the previous window decays",
        alg: SW,
        limits: &[(3, 10_000)],
        steps: &[
            step(0, 1, &[ok(2, 20_000)]),
            step(1_000, 1, &[ok(1, 19_000)]),
            step(2_000, 1, &[ok(0, 18_000)]),
            // cur 3 + 1 > 3: wait past the boundary, then until
            // 3·(w−e') ≤ 2·w, e' = ceil(w/3) = 3334: 7000 + 3334.
            step(3_000, 1, &[no(0, 17_000, Some(10_334))]),
            // One ms early: 3·6667 + 1·w = 30001 > 30000. Nothing to reset
            // but prev's tail: w − e = 6667.
            step(13_333, 1, &[no(0, 6_667, Some(1))]),
            // 3·6666 + 1·w = 29998 ≤ 30000; remaining floor(2/w) = 0.
            step(13_334, 1, &[ok(0, 16_666)]),
            // Window 2, e = 5000: prev 1 → 5000 + 1·w; remaining 1.
            step(25_000, 1, &[ok(1, 15_000)]),
            // Window 4: both counts are more than a window old.
            step(45_000, 1, &[ok(2, 15_000)]),
        ],
    },
    Scenario {
        name: "exact boundary and prev weighting",
        alg: SW,
        limits: &[(2, 10_000)],
        steps: &[
            step(0, 2, &[ok(0, 20_000)]),
            // Last ms of window 0: 1 + ceil(w·(2−1)/2) = 5001.
            step(9_999, 1, &[no(0, 10_001, Some(5_001))]),
            // First ms of window 1: prev 2 weighs fully, 2·w + w > 2·w;
            // ceil((3w − 2w)/2) = 5000 — the same instant as above.
            step(10_000, 1, &[no(0, 10_000, Some(5_000))]),
            step(15_000, 1, &[ok(0, 15_000)]),
            // Window 2, e = 0: prev 1 weighs fully: w + w ≤ 2w.
            step(20_000, 1, &[ok(0, 20_000)]),
            // Window 4: written in window 2, fully decayed.
            step(40_000, 1, &[ok(1, 20_000)]),
        ],
    },
    Scenario {
        name: "roll-over weights prev by the unelapsed fraction",
        alg: SW,
        limits: &[(10, 10_000)],
        steps: &[
            step(9_999, 8, &[ok(2, 10_001)]),
            // e = 0: 8·w + 1·w = 9w; remaining 1.
            step(10_000, 1, &[ok(1, 20_000)]),
            // e = 2500: 8·7500 + 2·w = 80000; remaining 2.
            step(12_500, 1, &[ok(2, 17_500)]),
            // e = 7500: 8·2500 + 7·w = 90000; remaining 1.
            step(17_500, 5, &[ok(1, 12_500)]),
            // Window 2, e = 0: prev 7: 7w + 4w > 10w; remaining 3;
            // ceil((7w + 4w − 10w)/7) = ceil(10000/7) = 1429.
            step(20_000, 4, &[no(3, 10_000, Some(1_429))]),
            // One ms early: 7·8572 + 4w = 100004 > 100000; remaining
            // floor((100000 − 60004)/w) = 3.
            step(21_428, 4, &[no(3, 8_572, Some(1))]),
            // 7·8571 + 4w = 99997; remaining floor(3/w) = 0.
            step(21_429, 4, &[ok(0, 18_571)]),
        ],
    },
    Scenario {
        name: "cost above one",
        alg: SW,
        limits: &[(10, 60_000)],
        steps: &[
            step(0, 4, &[ok(6, 120_000)]),
            step(30_000, 5, &[ok(1, 90_000)]),
            // cur 9 + 2 > 10: 20000 + ceil(w·(9−8)/9) = 20000 + 6667.
            step(40_000, 2, &[no(1, 80_000, Some(26_667))]),
            // A cheaper request still fits.
            step(40_000, 1, &[ok(0, 80_000)]),
            // Window 1, e = 6667: prev 10: 10·53333 + 2w = 653330 > 600000;
            // remaining floor(66670/w) = 1; ceil(53330/10) = 5333.
            step(66_667, 2, &[no(1, 53_333, Some(5_333))]),
            // e = 12000: 10·48000 + 2w = 600000 exactly.
            step(72_000, 2, &[ok(0, 108_000)]),
        ],
    },
    Scenario {
        name: "cost above the limit is never admitted and consumes nothing",
        alg: SW,
        limits: &[(5, 10_000)],
        steps: &[
            step(0, 6, &[no(5, 0, None)]),
            step(0, 5, &[ok(0, 20_000)]),
            step(1_000, 6, &[no(0, 19_000, None)]),
        ],
    },
    Scenario {
        name: "two limits, one denies: the other is not consumed",
        alg: SW,
        limits: &[(2, 10_000), (10, 60_000)],
        steps: &[
            step(0, 1, &[ok(1, 20_000), ok(9, 120_000)]),
            step(1_000, 1, &[ok(0, 19_000), ok(8, 119_000)]),
            // The first denies (8000 + ceil(w/2)); the second would admit,
            // but nothing is consumed and it shows its 2 counted: 8 left.
            step(2_000, 1, &[no(0, 18_000, Some(13_000)), ok(8, 118_000)]),
            // 2·5000 + w = 2w. The second still holds 2, not 3: 7 left.
            step(15_000, 1, &[ok(0, 15_000), ok(7, 105_000)]),
        ],
    },
    Scenario {
        name: "cost zero probes without consuming",
        alg: SW,
        limits: &[(1, 10_000)],
        steps: &[
            // Nothing stored and nothing added: nothing to reset.
            step(0, 0, &[ok(1, 0)]),
            step(0, 1, &[ok(0, 20_000)]),
            step(5_000, 0, &[ok(0, 15_000)]),
            // cur 1 + 1 > 1: past the boundary prev 1 still weighs until
            // the window after: 5000 + w.
            step(5_000, 1, &[no(0, 15_000, Some(15_000))]),
        ],
    },
    Scenario {
        name: "a denial by the other limit shows 3 of 100 counted, whatever its cost",
        alg: SW,
        limits: &[(100, 60_000), (3, 10_000)],
        steps: &[
            step(0, 1, &[ok(99, 120_000), ok(2, 20_000)]),
            step(1, 1, &[ok(98, 119_999), ok(1, 19_999)]),
            step(2, 1, &[ok(97, 119_998), ok(0, 19_998)]),
            // The second denies: past the boundary, then until
            // 3·(w − e') ≤ (3 − c)·w. The first shows its 3: 97 left.
            // c = 1: 9997 + ceil(w/3).
            step(3, 1, &[ok(97, 119_997), no(0, 19_997, Some(13_331))]),
            // c = 3: 9997 + w.
            step(3, 3, &[ok(97, 119_997), no(0, 19_997, Some(19_997))]),
            // c = 10 > 3: never.
            step(3, 10, &[ok(97, 119_997), no(0, 19_997, None)]),
        ],
    },
];

// Fixed window: count per window index; reset and retry are the window's end.
const FIXED_WINDOW: &[Scenario] = &[
    Scenario {
        name: "fill, deny until the window ends",
        alg: FW,
        limits: &[(3, 10_000)],
        steps: &[
            step(0, 1, &[ok(2, 10_000)]),
            step(1_000, 1, &[ok(1, 9_000)]),
            step(2_000, 1, &[ok(0, 8_000)]),
            step(3_000, 1, &[no(0, 7_000, Some(7_000))]),
            step(9_999, 1, &[no(0, 1, Some(1))]),
            step(10_000, 1, &[ok(2, 10_000)]),
        ],
    },
    Scenario {
        name: "the boundary burst: 2·L in three milliseconds",
        alg: FW,
        limits: &[(3, 10_000)],
        steps: &[
            step(9_998, 2, &[ok(1, 2)]),
            step(9_999, 1, &[ok(0, 1)]),
            step(10_000, 3, &[ok(0, 10_000)]),
            step(10_001, 1, &[no(0, 9_999, Some(9_999))]),
        ],
    },
    Scenario {
        name: "cost above one, and above the limit",
        alg: FW,
        limits: &[(10, 60_000)],
        steps: &[
            step(0, 4, &[ok(6, 60_000)]),
            step(30_000, 5, &[ok(1, 30_000)]),
            step(40_000, 2, &[no(1, 20_000, Some(20_000))]),
            step(40_000, 1, &[ok(0, 20_000)]),
            step(40_000, 11, &[no(0, 20_000, None)]),
            step(60_000, 10, &[ok(0, 60_000)]),
        ],
    },
    Scenario {
        name: "two limits, one denies: the other is not consumed",
        alg: FW,
        limits: &[(2, 10_000), (10, 60_000)],
        steps: &[
            step(0, 1, &[ok(1, 10_000), ok(9, 60_000)]),
            step(1_000, 1, &[ok(0, 9_000), ok(8, 59_000)]),
            step(2_000, 1, &[no(0, 8_000, Some(8_000)), ok(8, 58_000)]),
            // The second holds 2, not 3: 7 left after this one.
            step(10_000, 1, &[ok(1, 10_000), ok(7, 50_000)]),
        ],
    },
    Scenario {
        name: "cost zero probes without consuming",
        alg: FW,
        limits: &[(1, 10_000)],
        steps: &[
            step(0, 0, &[ok(1, 0)]),
            step(0, 1, &[ok(0, 10_000)]),
            step(5_000, 0, &[ok(0, 5_000)]),
            step(5_000, 1, &[no(0, 5_000, Some(5_000))]),
        ],
    },
    Scenario {
        name: "a denial by the other limit shows 3 of 100 counted, whatever its cost",
        alg: FW,
        limits: &[(100, 60_000), (3, 10_000)],
        steps: &[
            step(0, 1, &[ok(99, 60_000), ok(2, 10_000)]),
            step(1, 1, &[ok(98, 59_999), ok(1, 9_999)]),
            step(2, 1, &[ok(97, 59_998), ok(0, 9_998)]),
            step(3, 1, &[ok(97, 59_997), no(0, 9_997, Some(9_997))]),
            step(3, 3, &[ok(97, 59_997), no(0, 9_997, Some(9_997))]),
            step(3, 10, &[ok(97, 59_997), no(0, 9_997, None)]),
        ],
    },
];

// Sliding log: a unit admitted at s counts at t iff s > t − w. Reset is the
// newest unit's s + w − now; a denied request waits for the k-th oldest
// unit, k = used − (L − c), to leave: s_k + w − now.
const SLIDING_LOG: &[Scenario] = &[
    Scenario {
        name: "fill, deny, readmit as units leave",
        alg: LOG,
        limits: &[(3, 10_000)],
        steps: &[
            step(0, 1, &[ok(2, 10_000)]),
            step(1_000, 1, &[ok(1, 10_000)]),
            step(2_000, 1, &[ok(0, 10_000)]),
            // k = 1, s_1 = 0: 10000 − 3000; reset 2000 + w − 3000.
            step(3_000, 1, &[no(0, 9_000, Some(7_000))]),
            step(9_999, 1, &[no(0, 2_001, Some(1))]),
            // The unit at 0 left at 10000 exactly.
            step(10_000, 1, &[ok(0, 10_000)]),
            // Log 1000, 2000, 10000; c = 2: k = 2, s_2 = 2000.
            step(10_500, 2, &[no(0, 9_500, Some(1_500))]),
            step(12_000, 2, &[ok(0, 10_000)]),
        ],
    },
    Scenario {
        name: "no boundary burst: L per any window",
        alg: LOG,
        limits: &[(3, 10_000)],
        steps: &[
            step(9_998, 2, &[ok(1, 10_000)]),
            step(9_999, 1, &[ok(0, 10_000)]),
            // k = 3, s_3 = 9999.
            step(10_000, 3, &[no(0, 9_999, Some(9_999))]),
            // k = 1, s_1 = 9998.
            step(10_001, 1, &[no(0, 9_998, Some(9_997))]),
            step(19_998, 1, &[ok(1, 10_000)]),
        ],
    },
    Scenario {
        name: "same millisecond, units of several requests",
        alg: LOG,
        limits: &[(3, 10_000)],
        steps: &[
            step(0, 1, &[ok(2, 10_000)]),
            step(0, 2, &[ok(0, 10_000)]),
            step(0, 1, &[no(0, 10_000, Some(10_000))]),
            step(10_000, 3, &[ok(0, 10_000)]),
        ],
    },
    Scenario {
        name: "cost above one, and above the limit",
        alg: LOG,
        limits: &[(10, 60_000)],
        steps: &[
            step(0, 4, &[ok(6, 60_000)]),
            step(30_000, 5, &[ok(1, 60_000)]),
            // used 9, c = 2: k = 1, s_1 = 0.
            step(40_000, 2, &[no(1, 50_000, Some(20_000))]),
            step(40_000, 1, &[ok(0, 60_000)]),
            step(40_000, 11, &[no(0, 60_000, None)]),
            // The four units at 0 leave: 6 + 4.
            step(60_000, 4, &[ok(0, 60_000)]),
        ],
    },
    Scenario {
        name: "two limits, one denies: the other is not consumed",
        alg: LOG,
        limits: &[(2, 10_000), (10, 60_000)],
        steps: &[
            step(0, 1, &[ok(1, 10_000), ok(9, 60_000)]),
            step(1_000, 1, &[ok(0, 10_000), ok(8, 60_000)]),
            // The second shows its two units, the newest at 1000.
            step(2_000, 1, &[no(0, 9_000, Some(8_000)), ok(8, 59_000)]),
            step(10_000, 1, &[ok(0, 10_000), ok(7, 60_000)]),
        ],
    },
    Scenario {
        name: "cost zero probes without consuming",
        alg: LOG,
        limits: &[(1, 10_000)],
        steps: &[
            step(0, 0, &[ok(1, 0)]),
            step(0, 1, &[ok(0, 10_000)]),
            step(5_000, 0, &[ok(0, 5_000)]),
            step(5_000, 1, &[no(0, 5_000, Some(5_000))]),
        ],
    },
    Scenario {
        name: "a denial by the other limit shows 3 of 100 counted, whatever its cost",
        alg: LOG,
        limits: &[(100, 60_000), (3, 10_000)],
        steps: &[
            step(0, 1, &[ok(99, 60_000), ok(2, 10_000)]),
            step(1, 1, &[ok(98, 60_000), ok(1, 10_000)]),
            step(2, 1, &[ok(97, 60_000), ok(0, 10_000)]),
            // The first shows its 3 units, the newest at 2: 2 + w − 3.
            // The second: k = c units must leave, s_1 = 0 and s_3 = 2.
            step(3, 1, &[ok(97, 59_999), no(0, 9_999, Some(9_997))]),
            step(3, 3, &[ok(97, 59_999), no(0, 9_999, Some(9_999))]),
            step(3, 10, &[ok(97, 59_999), no(0, 9_999, None)]),
        ],
    },
];

// GCRA: one unit is T = w/L ms; the bucket holds B units. In the comments
// d = (max(TAT, now) − now)·L, so one unit is w and the cap is B·w; admit
// iff d + c·w ≤ B·w; remaining floor((B·w − d')/w), reset ceil(d'/L),
// retry ceil((d + c·w − B·w)/L).
const GCRA_TABLE: &[Scenario] = &[
    Scenario {
        name: "3 per 10 s: a burst of 3, then one every 3333.3 ms",
        alg: GCRA,
        limits: &[(3, 10_000)],
        steps: &[
            // d' = 10000: reset ceil(10000/3).
            step(0, 1, &[ok(2, 3_334)]),
            // TAT 3333⅓: d = 7000, d' = 17000.
            step(1_000, 1, &[ok(1, 5_667)]),
            // TAT 6666⅔: d = 14000, d' = 24000.
            step(2_000, 1, &[ok(0, 8_000)]),
            // TAT 10000: d = 21000; 31000 > 30000: ceil(1000/3) = 334.
            step(3_000, 1, &[no(0, 7_000, Some(334))]),
            // d = 20001; 30001 > 30000: one ms.
            step(3_333, 1, &[no(0, 6_667, Some(1))]),
            // d = 19998; d' = 29998.
            step(3_334, 1, &[ok(0, 10_000)]),
            // The TAT has passed: a full bucket.
            step(30_000, 1, &[ok(2, 3_334)]),
        ],
    },
    Scenario {
        name: "burst above the rate: 5 at once, then one per second",
        alg: Algorithm::Gcra { burst: 5 },
        limits: &[(1, 1_000)],
        steps: &[
            step(0, 5, &[ok(0, 5_000)]),
            step(0, 1, &[no(0, 5_000, Some(1_000))]),
            // TAT 5000: d = 2500, d' = 4500.
            step(2_500, 2, &[ok(0, 4_500)]),
            // Cost above the burst: never.
            step(2_500, 6, &[no(0, 4_500, None)]),
            step(10_000, 1, &[ok(4, 1_000)]),
        ],
    },
    Scenario {
        name: "two limits, one denies: the other is not consumed",
        alg: GCRA,
        limits: &[(2, 10_000), (10, 60_000)],
        steps: &[
            step(0, 1, &[ok(1, 5_000), ok(9, 6_000)]),
            // TAT 5000 and 6000: d 8000 and 50000.
            step(1_000, 1, &[ok(0, 9_000), ok(8, 11_000)]),
            // TAT 10000 and 12000: d 16000 and 100000; the first denies
            // (26000 > 20000: ceil(6000/2)). The second shows d = 100000:
            // floor(500000/w) = 8 left, ceil(100000/10) ms to refill.
            step(2_000, 1, &[no(0, 8_000, Some(3_000)), ok(8, 10_000)]),
            // Had the second been consumed, its TAT would be 18000 and 6
            // would remain.
            step(5_000, 1, &[ok(0, 10_000), ok(7, 13_000)]),
        ],
    },
    Scenario {
        name: "cost zero probes without consuming",
        alg: GCRA,
        limits: &[(1, 10_000)],
        steps: &[
            step(0, 0, &[ok(1, 0)]),
            step(0, 1, &[ok(0, 10_000)]),
            step(5_000, 0, &[ok(0, 5_000)]),
            step(5_000, 1, &[no(0, 5_000, Some(5_000))]),
        ],
    },
    Scenario {
        name: "a denial by the other limit shows 3 of 100 counted, whatever its cost",
        alg: GCRA,
        limits: &[(100, 60_000), (3, 10_000)],
        steps: &[
            // TAT 600 and 3333⅓.
            step(0, 1, &[ok(99, 600), ok(2, 3_334)]),
            // d 59900 and 9997; TAT 1200 and 6666⅔.
            step(1, 1, &[ok(98, 1_199), ok(1, 6_666)]),
            // d 119800 and 19994; TAT 1800 and 10000.
            step(2, 1, &[ok(97, 1_798), ok(0, 9_998)]),
            // d 179700 and 29991. The first shows d itself:
            // floor((6000000 − 179700)/w) = 97, ceil(179700/100) = 1797.
            // The second denies: ceil((29991 + c·w − 30000)/3).
            step(3, 1, &[ok(97, 1_797), no(0, 9_997, Some(3_331))]),
            step(3, 3, &[ok(97, 1_797), no(0, 9_997, Some(9_997))]),
            // c = 10 > B = 3: never.
            step(3, 10, &[ok(97, 1_797), no(0, 9_997, None)]),
        ],
    },
];

/// Every algorithm: requests of `cost` every `step_ms` until one is denied;
/// then waiting exactly its Retry-After admits it and one ms less does not,
/// and the same with Retry-After in whole seconds, rounded up, as sent.
async fn check_retry_after_all(store: &impl Store, tag: &str) {
    // (limit, window, step, cost)
    const CASES: &[(u64, u64, u64, u64)] = &[
        (3, 10_000, 1_000, 1),
        (10, 60_000, 7_000, 3),
        (7, 1_000, 10, 2),
        (100, 3_600_000, 1_000, 9),
        (1, 1_000, 1, 1),
    ];
    let buckets = Algorithm::SlidingBuckets { precision_ms: 500 };
    for alg in [
        SW,
        FW,
        LOG,
        GCRA,
        Algorithm::Gcra { burst: 3 },
        MONTH,
        buckets,
    ] {
        for (n, &(limit, window_ms, step_ms, cost)) in CASES.iter().enumerate() {
            let algorithm = resolve(alg, limit);
            if matches!(algorithm, Algorithm::Gcra { burst } if cost > burst) {
                continue; // never admissible; the tables cover it
            }
            let decide = |copy: &'static str, at: u64| {
                let req = [LimitRequest {
                    key: format!("test:{{{tag}:retry-all:{algorithm:?}:{n}}}:{copy}").into(),
                    limit,
                    window_ms,
                    cost,
                    algorithm,
                    mode: Default::default(),
                }];
                async move {
                    store
                        .decide(T0 + at, &req)
                        .await
                        .unwrap_or_else(|e| panic!("{tag}: {algorithm:?} case {n}: {e}"))
                }
            };
            let mut at = 0;
            let denied = loop {
                let a = decide("ms", at).await;
                let b = decide("s", at).await;
                assert_eq!(a, b, "two copies agree");
                if !a.allowed {
                    break a;
                }
                at += step_ms;
                assert!(at < 1_000 * step_ms, "{algorithm:?} case {n}: never denied");
            };
            let retry = retry_after_ms(&denied).expect("admissible later");
            assert!(retry > 0);
            let what = format!("{tag}: {algorithm:?} case {n}, denied at +{at}, retry {retry}");
            assert!(
                !decide("ms", at + retry - 1).await.allowed,
                "{what}: 1 ms early"
            );
            assert!(
                decide("ms", at + retry).await.allowed,
                "{what}: at Retry-After"
            );
            let secs = retry.div_ceil(1000);
            if secs > 1 {
                assert!(
                    !decide("s", at + (secs - 1) * 1000).await.allowed,
                    "{what}: a second early"
                );
            }
            assert!(
                decide("s", at + secs * 1000).await.allowed,
                "{what}: at {secs} s"
            );
        }
    }
}

/// The algorithm as a request carries it: a gcra burst of 0 is the limit.
fn resolve(alg: Algorithm, limit: u64) -> Algorithm {
    match alg {
        Algorithm::Gcra { burst: 0 } => Algorithm::Gcra { burst: limit },
        other => other,
    }
}

fn requests(tag: &str, sc: &Scenario, cost: u64) -> Vec<LimitRequest> {
    sc.limits
        .iter()
        .enumerate()
        .map(|(i, &(limit, window_ms))| LimitRequest {
            key: format!("test:{{{tag}:{}:{}}}:{i}", sc.alg.name(), sc.name).into(),
            limit,
            window_ms,
            cost,
            algorithm: resolve(sc.alg, limit),
            mode: Default::default(),
        })
        .collect()
}

fn expected(step: &Step) -> Answer {
    let outcomes: Standings = step
        .expect
        .iter()
        .map(|&(admits, remaining, reset_ms, retry_after_ms)| Standing {
            admits,
            remaining,
            reset_ms,
            retry_after_ms,
        })
        .collect();
    Answer {
        allowed: outcomes.iter().all(|o| o.admits),
        outcomes,
    }
}

async fn run_table(store: &impl Store, tag: &str) {
    for sc in TABLES.iter().flat_map(|t| t.iter()) {
        for (n, st) in sc.steps.iter().enumerate() {
            let got = store
                .decide(T0 + st.at, &requests(tag, sc, st.cost))
                .await
                .unwrap_or_else(|e| panic!("{tag}: {}: step {n}: {e}", sc.name));
            assert_eq!(
                got,
                expected(st),
                "{tag}: {} {}: step {n} (at +{} ms, cost {})",
                sc.alg.name(),
                sc.name,
                st.at,
                st.cost
            );
        }
    }
}

/// The request waits exactly Retry-After and is admitted; with Retry-After
/// rendered as whole seconds (rounded up, as the header is), waiting those
/// seconds admits and one second less does not.
async fn check_retry_after(store: &impl Store, tag: &str) {
    // (limit, window, admitted history as (at, cost), probe at, probe cost)
    type Case = (u64, u64, &'static [(u64, u64)], u64, u64);
    const CASES: &[Case] = &[
        (3, 10_000, &[(0, 1), (1_000, 1), (2_000, 1)], 3_000, 1),
        (10, 60_000, &[(0, 4), (30_000, 5)], 40_000, 2),
        (
            10,
            10_000,
            &[(9_999, 8), (10_000, 1), (12_500, 1), (17_500, 5)],
            20_000,
            4,
        ),
        (1, 1_000, &[(0, 1)], 1, 1),
        (100, 3_600_000, &[(0, 100)], 1_800_000, 1),
        // Retry-After a whole number of seconds (1000 ms).
        (5, 10_000, &[(5_000, 5)], 15_000, 3),
    ];
    for (n, &(limit, window_ms, history, probe, cost)) in CASES.iter().enumerate() {
        let decide = |copy: &str, at: u64, cost: u64| {
            let req = [LimitRequest {
                key: format!("test:{{{tag}:retry:{n}}}:{copy}").into(),
                limit,
                window_ms,
                cost,
                algorithm: Algorithm::SlidingWindow,
                mode: Default::default(),
            }];
            async move {
                store
                    .decide(T0 + at, &req)
                    .await
                    .unwrap_or_else(|e| panic!("{tag}: case {n}: {e}"))
            }
        };
        // Two identical counters: admitting on one must not spoil the other.
        for copy in ["ms", "s"] {
            for &(at, c) in history {
                assert!(
                    decide(copy, at, c).await.allowed,
                    "{tag}: case {n}: history"
                );
            }
        }
        let denied = decide("ms", probe, cost).await;
        assert!(!denied.allowed, "{tag}: case {n}: probe must be denied");
        let retry = retry_after_ms(&denied).expect("admissible later");
        assert!(retry > 0);

        let at = |copy, d| decide(copy, probe + d, cost);
        assert!(
            !at("ms", retry - 1).await.allowed,
            "{tag}: case {n}: 1 ms early"
        );
        assert!(
            at("ms", retry).await.allowed,
            "{tag}: case {n}: at Retry-After"
        );

        let secs = retry.div_ceil(1000);
        assert!(
            !at("s", (secs - 1) * 1000).await.allowed,
            "{tag}: case {n}: a second early"
        );
        assert!(
            at("s", secs * 1000).await.allowed,
            "{tag}: case {n}: at {secs} s"
        );
    }
}

// --- both stores ------------------------------------------------------------

#[tokio::test]
async fn table_memory() {
    run_table(&MemoryStore::new(), "memory").await;
}

#[tokio::test]
async fn table_redis() {
    let server = RedisServer::start().await;
    let store = connected(&server).await;
    run_table(&store, "redis").await;
}

#[tokio::test]
async fn retry_after_memory() {
    check_retry_after(&MemoryStore::new(), "memory").await;
}

#[tokio::test]
async fn retry_after_redis() {
    let server = RedisServer::start().await;
    let store = connected(&server).await;
    check_retry_after(&store, "redis").await;
}

#[tokio::test]
async fn retry_after_every_algorithm_memory() {
    check_retry_after_all(&MemoryStore::new(), "memory").await;
}

#[tokio::test]
async fn retry_after_every_algorithm_redis() {
    let server = RedisServer::start().await;
    let store = connected(&server).await;
    check_retry_after_all(&store, "redis").await;
}

// --- Redis only -------------------------------------------------------------

fn config(url: String) -> RedisConfig {
    RedisConfig {
        url,
        timeout: TIMEOUT,
        ..RedisConfig::default()
    }
}

/// Waits, against a deadline, for the store's background connection.
async fn wait_connected(store: &RedisStore) {
    assert!(
        store.wait_connected(Duration::from_secs(10)).await,
        "store did not connect"
    );
}

async fn connected(server: &RedisServer) -> RedisStore {
    let store = RedisStore::connect(&config(server.url()))
        .await
        .expect("connect");
    wait_connected(&store).await;
    store
}

fn one(key: &str, limit: u64, window_ms: u64, cost: u64) -> LimitRequest {
    LimitRequest {
        key: key.to_owned().into(),
        limit,
        window_ms,
        cost,
        algorithm: Algorithm::SlidingWindow,
        mode: Default::default(),
    }
}

/// A write within the window a key already counts keeps the key's expiry
/// (the end of the next window, which the first write set and every later
/// one would set again), so Redis does not renew it on every request; a
/// write that rolls the window sets a new one; and a key a gateway ahead
/// wrote expires at the end of its own window's successor, not the
/// caller's.
#[tokio::test]
async fn a_write_within_the_window_keeps_the_expiry() {
    let server = RedisServer::start().await;
    let store = connected(&server).await;
    let mut conn = server.connection().await;
    let k = [one("k", 50, 10_000, 1)];
    assert!(store.decide(T0 + 2_500, &k).await.unwrap().allowed);
    let first: i64 = conn.pttl("k").await.unwrap();
    assert!((17_000..=17_500).contains(&first), "PTTL {first}");
    // Five seconds later by the caller's clock: PX would say 12,500; the
    // expiry the first write set stands.
    assert!(store.decide(T0 + 7_500, &k).await.unwrap().allowed);
    let kept: i64 = conn.pttl("k").await.unwrap();
    assert!(
        (16_500..=first).contains(&kept),
        "PTTL {kept} after {first}"
    );
    // The next window rolls the counts: a new expiry, 2w − e.
    assert!(store.decide(T0 + 11_000, &k).await.unwrap().allowed);
    let rolled: i64 = conn.pttl("k").await.unwrap();
    assert!((18_500..=19_000).contains(&rolled), "PTTL {rolled}");

    // Written in window 1 by a clock 200 ms ahead, then by one in window 0:
    // the key keeps window 1 and expires at the end of window 2.
    let a = [one("a", 50, 10_000, 1)];
    assert!(store.decide(T0 + 10_100, &a).await.unwrap().allowed);
    assert!(store.decide(T0 + 9_900, &a).await.unwrap().allowed);
    let raw: String = conn.get("a").await.unwrap();
    assert_eq!(raw, format!("{}:0:2", T0 / 10_000 + 1));
    let ahead: i64 = conn.pttl("a").await.unwrap();
    assert!((19_600..=20_100).contains(&ahead), "PTTL {ahead}");
}

#[tokio::test]
async fn writes_one_string_per_key_expiring_when_counts_decay() {
    let server = RedisServer::start().await;
    let store = connected(&server).await;
    let mut conn = server.connection().await;

    let d = store
        .decide(T0 + 2_500, &[one("k", 5, 10_000, 1)])
        .await
        .unwrap();
    assert!(d.allowed);
    let raw: String = conn.get("k").await.unwrap();
    assert_eq!(raw, format!("{}:0:1", T0 / 10_000));
    // cur > 0: both counts are gone 2w − e = 17500 ms from now.
    let pttl: i64 = conn.pttl("k").await.unwrap();
    assert!((17_000..=17_500).contains(&pttl), "PTTL {pttl}");

    // A denied request writes nothing, not even a fresh key.
    let d = store
        .decide(T0, &[one("never", 5, 10_000, 6)])
        .await
        .unwrap();
    assert!(!d.allowed);
    let exists: bool = conn.exists("never").await.unwrap();
    assert!(!exists);

    // Nothing counted (cost 0 on an empty counter) leaves nothing behind.
    let d = store
        .decide(T0, &[one("zero", 5, 10_000, 0)])
        .await
        .unwrap();
    assert!(d.allowed);
    let exists: bool = conn.exists("zero").await.unwrap();
    assert!(!exists);
}

#[tokio::test]
async fn garbage_in_a_key_is_an_error_not_a_decision() {
    let server = RedisServer::start().await;
    let store = connected(&server).await;
    let mut conn = server.connection().await;

    let _: () = conn.set("text", "x").await.unwrap();
    let _: () = conn.set("short", "1:2").await.unwrap();
    let _: () = conn.set("huge", "99999999999999999999:0:0").await.unwrap();
    let _: () = conn.set("signed", "-1:0:0").await.unwrap();
    let _: () = conn.rpush("list", "a").await.unwrap();
    for key in ["text", "short", "huge", "signed", "list"] {
        // The good key comes first: an error must leave it unwritten.
        let r = store
            .decide(T0, &[one("good", 5, 10_000, 1), one(key, 5, 10_000, 1)])
            .await;
        assert!(matches!(r, Err(StoreError::Protocol(_))), "{key}: {r:?}");
    }
    let exists: bool = conn.exists("good").await.unwrap();
    assert!(!exists, "a failed decision wrote a key");
    let text: String = conn.get("text").await.unwrap();
    assert_eq!(text, "x");

    // Arguments the script cannot compute exactly are refused too.
    let r = store.decide(T0, &[one("big", 1 << 40, 1 << 20, 1)]).await;
    assert!(matches!(r, Err(StoreError::Protocol(_))), "{r:?}");

    // The store is still fine for everything else.
    assert!(
        store
            .decide(T0, &[one("good", 5, 10_000, 1)])
            .await
            .unwrap()
            .allowed
    );
}

#[tokio::test]
async fn a_key_of_another_type_is_an_error_whatever_the_decision() {
    // A key of another type under a limit's name is an error however the
    // request would have ended — admitted, denied, at cost 0, or with its
    // other limit denying or absent — and nothing is written.
    let server = RedisServer::start().await;
    let store = connected(&server).await;
    let mut conn = server.connection().await;
    let _: () = conn.rpush("list", "a").await.unwrap();
    assert!(
        store
            .decide(T0, &[one("full", 1, 10_000, 1)])
            .await
            .unwrap()
            .allowed
    );
    let cases: [(&str, Vec<LimitRequest>); 5] = [
        ("admitted", vec![one("list", 5, 10_000, 1)]),
        (
            "denied, cost above the limit",
            vec![one("list", 5, 10_000, 6)],
        ),
        ("cost 0, nothing to write", vec![one("list", 5, 10_000, 0)]),
        (
            "the other limit denies",
            vec![one("full", 1, 10_000, 1), one("list", 5, 10_000, 1)],
        ),
        (
            "first of two, the other absent",
            vec![one("list", 5, 10_000, 1), one("fresh", 5, 10_000, 1)],
        ),
    ];
    for (what, requests) in cases {
        match store.decide(T0, &requests).await {
            Err(StoreError::Protocol(m)) => {
                assert!(m.contains("list") && m.contains("WRONGTYPE"), "{what}: {m}")
            }
            other => panic!("{what}: {other:?}"),
        }
    }
    let kind: String = redis::cmd("TYPE")
        .arg("list")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(kind, "list");
    let exists: bool = conn.exists("fresh").await.unwrap();
    assert!(!exists, "a failed decision wrote a key");
    let full: String = conn.get("full").await.unwrap();
    assert!(full.ends_with(":1"), "{full}");
}

#[tokio::test]
async fn script_flush_is_survived_by_reloading() {
    let server = RedisServer::start().await;
    let store = connected(&server).await;
    let mut conn = server.connection().await;
    let req = [one("k", 3, 10_000, 1)];

    assert_eq!(
        store.decide(T0, &req).await.unwrap().outcomes[0].remaining,
        2
    );
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut conn)
        .await
        .unwrap();
    // NOSCRIPT → SCRIPT LOAD → EVALSHA, and the count carries on.
    assert_eq!(
        store.decide(T0, &req).await.unwrap().outcomes[0].remaining,
        1
    );
    assert_eq!(
        store.decide(T0, &req).await.unwrap().outcomes[0].remaining,
        0
    );
}

#[tokio::test]
async fn starts_without_redis_and_fails_fast() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port(); // free now, and nothing will listen there
    let started = Instant::now();
    let store = RedisStore::connect(&config(format!("redis://127.0.0.1:{port}")))
        .await
        .expect("connect must not fail because Redis is down");
    assert!(
        started.elapsed() < Duration::from_millis(200),
        "connect blocked"
    );
    assert!(!store.is_connected());

    for _ in 0..3 {
        let started = Instant::now();
        let r = store.decide(T0, &[one("k", 1, 1_000, 1)]).await;
        assert!(matches!(r, Err(StoreError::Unavailable(_))), "{r:?}");
        assert!(
            started.elapsed() < Duration::from_millis(100),
            "decide waited for Redis"
        );
    }
}

#[tokio::test]
async fn malformed_url_is_refused() {
    for url in [
        "http://localhost",
        "redis://",
        // No scheme (never connected to: refused while parsing).
        "localhost:0",
        "redis://h:99999",
        "rediss://user:s3cret@localhost:99999",
    ] {
        let r = RedisStore::connect(&config(url.into())).await;
        assert!(matches!(r, Err(StoreError::Unavailable(_))), "{url}: {r:?}");
        let message = r.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(
            !message.contains("s3cret"),
            "the error repeats the password: {message}"
        );
    }
}

#[tokio::test]
async fn redis_going_away_fails_fast_and_coming_back_recovers() {
    let mut server = RedisServer::start().await;
    let store = connected(&server).await;
    let req = [one("k", 10, 60_000, 1)];
    assert!(store.decide(T0, &req).await.unwrap().allowed);

    server.stop();
    for n in 0..5 {
        let started = Instant::now();
        let r = store.decide(T0, &req).await;
        let took = started.elapsed();
        if n == 0 {
            // The first may race fred noticing the close; it is still bounded.
            assert!(
                matches!(r, Err(StoreError::Unavailable(_) | StoreError::Timeout)),
                "{r:?}"
            );
            assert!(took < TIMEOUT + Duration::from_millis(200), "{took:?}");
        } else {
            // Once the close is seen, nothing waits for a reconnect.
            assert!(matches!(r, Err(StoreError::Unavailable(_))), "{r:?}");
            assert!(took < Duration::from_millis(100), "{took:?}");
        }
    }
    assert!(!store.is_connected());

    // Same port, empty server (no data, no script): the backoff is capped
    // at a second, and the script is loaded again on NOSCRIPT.
    server.restart().await;
    wait_connected(&store).await;
    let d = store.decide(T0, &req).await.unwrap();
    assert!(d.allowed);
    assert_eq!(d.outcomes[0].remaining, 9, "fresh server, fresh count");
}

#[tokio::test]
async fn a_stalled_server_is_a_timeout() {
    let server = RedisServer::start().await;
    let store = connected(&server).await;
    let mut conn = server.connection().await;
    // Every client's commands wait for a second.
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(1_000)
        .query_async(&mut conn)
        .await
        .unwrap();
    let started = Instant::now();
    let r = store.decide(T0, &[one("k", 1, 1_000, 1)]).await;
    assert!(matches!(r, Err(StoreError::Timeout)), "{r:?}");
    let took = started.elapsed();
    assert!(
        took >= TIMEOUT && took < TIMEOUT + Duration::from_millis(200),
        "{took:?}"
    );
}

// --- batching: concurrent decisions share script calls ------------------------

/// A store whose timeout leaves debug builds on a busy machine room: these
/// tests are about batching, not the timeout.
async fn patient(server: &RedisServer) -> RedisStore {
    let store = RedisStore::connect(&RedisConfig {
        timeout: Duration::from_secs(5),
        ..config(server.url())
    })
    .await
    .expect("connect");
    wait_connected(&store).await;
    store
}

/// One decision, so the script is loaded and only later calls are counted.
async fn warm(store: &RedisStore) {
    assert!(
        store
            .decide(T0, &[one("warm", 1, 1_000, 1)])
            .await
            .unwrap()
            .allowed
    );
}

#[tokio::test]
async fn concurrent_decisions_on_distinct_keys_share_calls() {
    let server = RedisServer::start().await;
    let store = patient(&server).await;
    let mut conn = server.connection().await;
    warm(&store).await;

    const N: u64 = 300;
    let before = command_calls(&mut conn, "evalsha").await;
    // Two limits per request, of two algorithms; request i costs 1 + i % 3.
    let requests: Vec<Vec<LimitRequest>> = (0..N)
        .map(|i| {
            vec![
                one(&format!("{{id{i}}}:sw"), 10, 60_000, 1 + i % 3),
                LimitRequest {
                    algorithm: Algorithm::Gcra { burst: 10 },
                    ..one(&format!("{{id{i}}}:gcra"), 10, 60_000, 1 + i % 3)
                },
            ]
        })
        .collect();
    // All queued before the batcher runs (this runtime has one thread).
    let decided =
        futures_util::future::join_all(requests.iter().map(|r| store.decide(T0, r))).await;
    let sent = command_calls(&mut conn, "evalsha").await - before;
    for (i, d) in (0..N).zip(decided) {
        let d = d.unwrap_or_else(|e| panic!("request {i}: {e}"));
        assert!(d.allowed, "request {i}: {d:?}");
        let left = 10 - (1 + i % 3);
        assert_eq!(d.outcomes[0].remaining, left, "request {i}");
        assert_eq!(d.outcomes[1].remaining, left, "request {i}");
        let raw: String = conn.get(format!("{{id{i}}}:sw")).await.unwrap();
        assert_eq!(
            raw,
            format!("{}:0:{}", T0 / 60_000, 1 + i % 3),
            "request {i}"
        );
    }
    assert!(
        sent * 4 <= N,
        "{N} concurrent decisions took {sent} EVALSHA calls"
    );
}

/// One call deciding many requests — one and two sliding windows (the
/// script's fast paths) beside other shapes, several instants, keys shared
/// between requests, denials — answers each exactly as the in-process store
/// does deciding them one by one in the same order.
#[tokio::test]
async fn a_batch_decides_like_its_requests_one_by_one() {
    let server = RedisServer::start().await;
    let store = patient(&server).await;
    let mut conn = server.connection().await;
    warm(&store).await;
    let memory = MemoryStore::new();

    const N: u64 = 60;
    let limit = |id: u64, name: &str, limit, window_ms, algorithm| LimitRequest {
        algorithm,
        ..one(&format!("batch:{{{id}}}:{name}"), limit, window_ms, 1)
    };
    let requests: Vec<(u64, Vec<LimitRequest>)> = (0..N)
        .map(|i| {
            let id = i % 7;
            let limits = match i % 4 {
                0 | 1 => vec![limit(id, "s", 5, 10_000, SW)],
                2 => vec![limit(id, "s", 5, 10_000, SW), limit(id, "m", 8, 60_000, SW)],
                _ => vec![limit(id, "s", 5, 10_000, SW), limit(id, "f", 6, 60_000, FW)],
            };
            let cost = i % 3;
            let limits = limits
                .into_iter()
                .map(|r| LimitRequest { cost, ..r })
                .collect();
            // Runs of a few requests per instant, one stepping back.
            let at = T0 + 9_990 + i / 5 - u64::from(i == 33) * 3;
            (at, limits)
        })
        .collect();
    let before = command_calls(&mut conn, "evalsha").await;
    // All queued before the batcher runs (this runtime has one thread).
    let decided =
        futures_util::future::join_all(requests.iter().map(|(at, r)| store.decide(*at, r))).await;
    let sent = command_calls(&mut conn, "evalsha").await - before;
    assert_eq!(sent, 1, "{N} queued decisions took {sent} calls");
    let mut denied = 0;
    for (i, ((at, r), got)) in requests.iter().zip(decided).enumerate() {
        let want = memory.decide_now(*at, r);
        denied += usize::from(!want.allowed);
        assert_eq!(got.unwrap(), want, "request {i}");
    }
    assert!(denied > 0, "the batch should deny some requests");
}

#[tokio::test]
async fn concurrent_decisions_on_one_key_admit_exactly_the_limit() {
    let server = RedisServer::start().await;
    let store = patient(&server).await;
    let mut conn = server.connection().await;
    const L: u64 = 37;
    const N: usize = 200;
    for alg in [SW, FW, LOG, Algorithm::Gcra { burst: L }, MONTH] {
        let key = format!("hot:{}", alg.code());
        let request = [LimitRequest {
            algorithm: alg,
            ..one(&key, L, 60_000, 1)
        }];
        let before = command_calls(&mut conn, "evalsha").await;
        let decided =
            futures_util::future::join_all((0..N).map(|_| store.decide(T0, &request))).await;
        let sent = command_calls(&mut conn, "evalsha").await - before;
        assert!(
            (sent as usize) < N,
            "{alg:?}: {sent} calls for {N} decisions"
        );
        let mut left: Vec<u64> = Vec::new();
        for d in decided {
            let d = d.unwrap_or_else(|e| panic!("{alg:?}: {e}"));
            if d.allowed {
                left.push(d.outcomes[0].remaining);
            }
        }
        // Exactly L admitted, each seeing the ones before it: remaining
        // L-1, L-2, ..., 0, once each.
        left.sort_unstable();
        assert_eq!(left, (0..L).collect::<Vec<_>>(), "{alg:?}");
    }
}

#[tokio::test]
async fn garbage_fails_only_its_own_decision_in_a_batch() {
    let server = RedisServer::start().await;
    let store = patient(&server).await;
    let mut conn = server.connection().await;
    warm(&store).await;
    let _: () = conn.set("garbage", "1:2").await.unwrap();
    let _: () = conn.rpush("list", "a").await.unwrap();

    // What the garbage request is answered in a call of its own.
    let bad = [one("fine", 5, 10_000, 1), one("garbage", 5, 10_000, 1)];
    let alone = match store.decide(T0, &bad).await {
        Err(StoreError::Protocol(m)) => m,
        other => panic!("{other:?}"),
    };
    assert!(alone.contains("garbage"), "{alone}");

    let good: Vec<[LimitRequest; 1]> = (0..20)
        .map(|i| [one(&format!("good{i}"), 5, 10_000, 1)])
        .collect();
    let list = [one("list", 5, 10_000, 1)];
    let before = command_calls(&mut conn, "evalsha").await;
    let (bad_again, list_again, goods) = tokio::join!(
        store.decide(T0, &bad),
        store.decide(T0, &list),
        futures_util::future::join_all(good.iter().map(|r| store.decide(T0, r))),
    );
    assert_eq!(
        command_calls(&mut conn, "evalsha").await - before,
        1,
        "the 22 decisions went in one call"
    );
    match bad_again {
        Err(StoreError::Protocol(m)) => assert_eq!(m, alone, "the same error as alone"),
        other => panic!("{other:?}"),
    }
    assert!(
        matches!(list_again, Err(StoreError::Protocol(ref m)) if m.contains("list")),
        "{list_again:?}"
    );
    for (i, d) in goods.into_iter().enumerate() {
        let d = d.unwrap_or_else(|e| panic!("good{i}: {e}"));
        assert!(d.allowed);
        assert_eq!(d.outcomes[0].remaining, 4);
    }
    // The failed request wrote nothing, even to its good key.
    let exists: bool = conn.exists("fine").await.unwrap();
    assert!(!exists);
}

#[tokio::test]
async fn a_dropped_decision_leaves_its_batch_intact_and_consumes_nothing() {
    use futures_util::FutureExt;

    let server = RedisServer::start().await;
    let store = patient(&server).await;
    let mut conn = server.connection().await;
    let gone = [one("gone", 5, 10_000, 1)];
    // Queued, then dropped before its batch leaves (the client went away).
    assert!(store.decide(T0, &gone).now_or_never().is_none());
    let good: Vec<[LimitRequest; 1]> = (0..10)
        .map(|i| [one(&format!("good{i}"), 5, 10_000, 1)])
        .collect();
    let decided = futures_util::future::join_all(good.iter().map(|r| store.decide(T0, r))).await;
    for d in decided {
        assert!(d.expect("decided").allowed);
    }
    let exists: bool = conn.exists("gone").await.unwrap();
    assert!(!exists, "a request nobody waits for was decided");
}

#[tokio::test]
async fn every_queued_decision_times_out_on_its_own_when_calls_hang() {
    let server = RedisServer::start().await;
    let store = connected(&server).await;
    let mut conn = server.connection().await;
    warm(&store).await;
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(1_500)
        .query_async(&mut conn)
        .await
        .unwrap();
    // More than the calls allowed in flight can carry: some wait in the
    // queue behind calls that hang.
    let requests: Vec<[LimitRequest; 1]> = (0..300)
        .map(|i| [one(&format!("k{i}"), 5, 10_000, 1)])
        .collect();
    let started = Instant::now();
    let decided = futures_util::future::join_all(requests.iter().map(|r| async {
        let r = store.decide(T0, r).await;
        (r, started.elapsed())
    }))
    .await;
    for (r, took) in decided {
        assert!(matches!(r, Err(StoreError::Timeout)), "{r:?}");
        assert!(
            took >= TIMEOUT && took < TIMEOUT + Duration::from_millis(200),
            "{took:?}"
        );
    }
}

// --- the stores agree -------------------------------------------------------

/// (limit, window_ms, algorithm) per limit; (time step in ms, cost) per request.
type Trace = (Vec<(u64, u64, Algorithm)>, Vec<(i64, u64)>);

/// Any algorithm; gcra with a small burst, or a burst of the limit.
fn algorithm() -> impl Strategy<Value = Algorithm> {
    prop_oneof![
        Just(SW),
        Just(FW),
        Just(LOG),
        Just(GCRA),
        (1u64..=8).prop_map(|burst| Algorithm::Gcra { burst }),
        Just(MONTH),
        prop::sample::select(vec![500u64, 1_000, 2_000])
            .prop_map(|precision_ms| Algorithm::SlidingBuckets { precision_ms }),
    ]
}

/// Random limits and a random trace of (time step, cost); times may step
/// back a little, as clocks of a fleet do. Two regimes: small numbers, where
/// every branch is hit often, and large ones (a million per 30 days, costs in
/// the hundred thousands), where the script's doubles must stay exact. A
/// sliding log keeps one entry per unit, so its limits stay small.
fn trace() -> impl Strategy<Value = Trace> {
    let small = (
        prop::collection::vec(
            (
                0u64..=6,
                prop::sample::select(vec![2_000u64, 5_000, 10_000]),
                algorithm(),
            ),
            1..=3,
        ),
        prop::collection::vec(
            (
                prop_oneof![0i64..=50, -1_500i64..=12_000, 0i64..=25_000],
                0u64..=4,
            ),
            1..=40,
        ),
    );
    const DAY: u64 = 86_400_000;
    let large = (
        prop::collection::vec(
            (
                0u64..=1_000_000,
                prop::sample::select(vec![60_000u64, DAY, 30 * DAY]),
                prop_oneof![
                    Just(SW),
                    Just(FW),
                    Just(LOG),
                    Just(GCRA),
                    Just(Algorithm::SlidingBuckets {
                        precision_ms: 60_000
                    })
                ],
            ),
            1..=3,
        ),
        prop::collection::vec(
            (
                prop_oneof![
                    0i64..=1_000,
                    -3_600_000i64..=(DAY as i64),
                    0i64..=(40 * DAY as i64)
                ],
                prop_oneof![0u64..=4, 0u64..=400_000],
            ),
            1..=40,
        ),
    );
    prop_oneof![small, large].prop_map(|(limits, steps)| {
        let limits = limits
            .into_iter()
            .map(|(limit, w, alg)| match alg {
                Algorithm::SlidingLog => (limit.min(200), w, alg),
                Algorithm::Gcra { .. } => (limit.max(1), w, resolve(alg, limit.max(1))),
                _ => (limit, w, alg),
            })
            .collect();
        (limits, steps)
    })
}

fn trace_requests(tag: &str, limits: &[(u64, u64, Algorithm)], cost: u64) -> Vec<LimitRequest> {
    limits
        .iter()
        .enumerate()
        .map(|(i, &(limit, window_ms, algorithm))| LimitRequest {
            key: format!("prop:{{{tag}}}:{i}").into(),
            limit,
            window_ms,
            cost,
            algorithm,
            mode: Default::default(),
        })
        .collect()
}

#[test]
fn memory_and_redis_agree_on_random_traces() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = rt.block_on(RedisServer::start());
    let redis = rt.block_on(connected(&server));
    let case = AtomicU64::new(0);

    proptest!(ProptestConfig::with_cases(64), |((limits, steps) in trace())| {
        let case = case.fetch_add(1, Ordering::Relaxed);
        let memory = MemoryStore::new();
        let mut now = T0;
        for (n, &(dt, cost)) in steps.iter().enumerate() {
            now = now.saturating_add_signed(dt).max(T0);
            let reqs = trace_requests(&case.to_string(), &limits, cost);
            let want = memory.decide_now(now, &reqs);
            let got = rt.block_on(redis.decide(now, &reqs)).map_err(|e| e.to_string());
            prop_assert_eq!(got, Ok(want), "step {} at T0+{}", n, now - T0);
        }
    });
}

// --- invariants of each algorithm -------------------------------------------

/// One limit, an algorithm, and a trace of (time step ≥ 0, cost).
fn single() -> impl Strategy<Value = (u64, u64, Algorithm, Vec<(u64, u64)>)> {
    (
        1u64..=6,
        prop::sample::select(vec![1_000u64, 5_000, 10_000]),
        algorithm(),
        prop::collection::vec(
            (
                prop_oneof![0u64..=20, 0u64..=3_000, 0u64..=12_000],
                0u64..=4,
            ),
            1..=60,
        ),
    )
        .prop_map(|(l, w, alg, steps)| (l, w, resolve(alg, l), steps))
}

/// Runs a trace on a fresh memory store: (time, cost, decision) per step.
fn run_trace(limits: &[(u64, u64, Algorithm)], steps: &[(u64, u64)]) -> Vec<(u64, u64, Answer)> {
    let store = MemoryStore::new();
    let mut now = T0;
    steps
        .iter()
        .map(|&(dt, cost)| {
            now += dt;
            let d = store.decide_now(now, &trace_requests("inv", limits, cost));
            (now, cost, d)
        })
        .collect()
}

/// Admitted units with times in `from..=to`.
fn admitted_in(run: &[(u64, u64, Answer)], from: u64, to: u64) -> u64 {
    run.iter()
        .filter(|(t, _, d)| d.allowed && (from..=to).contains(t))
        .map(|(_, c, _)| c)
        .sum()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// No window of length w, wherever it starts, holds more admitted units
    /// than each algorithm's definition allows: L for the sliding log and
    /// precision buckets; L per
    /// window index for the fixed window; B + d·L/w in any span d for GCRA;
    /// and for the sliding-window counter its documented bound L + prev·f,
    /// below 2·L.
    #[test]
    fn admission_never_exceeds_the_definition((l, w, alg, steps) in single()) {
        let run = run_trace(&[(l, w, alg)], &steps);
        for &(tj, _, _) in &run {
            let last_window = admitted_in(&run, (tj + 1).saturating_sub(w), tj);
            match alg {
                // Precision buckets hold the log's promise: a bucket leaves
                // only when all of it is older than the window.
                Algorithm::SlidingLog | Algorithm::SlidingBuckets { .. } => {
                    prop_assert!(last_window <= l, "{} > {}", last_window, l)
                }
                Algorithm::SlidingWindow => prop_assert!(last_window < 2 * l),
                Algorithm::FixedWindow => {
                    let start = tj / w * w;
                    prop_assert!(admitted_in(&run, start, tj) <= l);
                }
                Algorithm::CalendarMonth => {
                    let start = calendar::month_start_ms(calendar::month_index(tj));
                    prop_assert!(admitted_in(&run, start, tj) <= l);
                }
                Algorithm::Gcra { burst } => {
                    for &(ti, _, _) in run.iter().filter(|(ti, _, _)| *ti <= tj) {
                        let units = admitted_in(&run, ti, tj);
                        prop_assert!(
                            units * w <= burst * w + (tj - ti) * l,
                            "{} units in {} ms", units, tj - ti
                        );
                    }
                }
            }
        }
    }

    /// Waiting Retry-After is enough, and one millisecond less is not:
    /// replaying what was admitted, then the denied request at
    /// now + Retry-After, admits it.
    #[test]
    fn waiting_retry_after_is_always_enough(
        limits in prop::collection::vec(
            (1u64..=6, prop::sample::select(vec![1_000u64, 5_000, 10_000]), algorithm()),
            1..=3,
        ),
        steps in prop::collection::vec((prop_oneof![0u64..=20, 0u64..=3_000], 0u64..=4), 1..=30),
    ) {
        let limits: Vec<_> = limits.into_iter().map(|(l, w, a)| (l, w, resolve(a, l))).collect();
        let run = run_trace(&limits, &steps);
        for (j, (tj, cj, d)) in run.iter().enumerate() {
            let Some(retry) = retry_after_ms(d).filter(|_| !d.allowed) else { continue };
            let replay = |at: u64| {
                let store = MemoryStore::new();
                for (t, c, d) in &run[..j] {
                    if d.allowed {
                        let again = store.decide_now(*t, &trace_requests("inv", &limits, *c));
                        assert!(again.allowed, "replay diverged");
                    }
                }
                store.decide_now(at, &trace_requests("inv", &limits, *cj)).allowed
            };
            prop_assert!(replay(tj + retry), "step {}: not admitted after {} ms", j, retry);
            prop_assert!(!replay(tj + retry - 1), "step {}: admitted before {} ms", j, retry);
        }
    }

    /// A request denied by one limit leaves every limit as it was, and shows
    /// them so: at each step each limit answers exactly as it does when only
    /// the requests admitted as a whole were ever counted against it —
    /// whether it admits at the request's cost and, when the request was
    /// denied, the remaining and reset a request of cost 0 sees (a denied
    /// request consumes nothing, so no limit shows it counted).
    #[test]
    fn a_denial_never_changes_another_limit(
        a in (1u64..=4, prop::sample::select(vec![1_000u64, 5_000]), algorithm()),
        b in (1u64..=8, prop::sample::select(vec![5_000u64, 10_000]), algorithm()),
        steps in prop::collection::vec((prop_oneof![0u64..=20, 0u64..=3_000], 0u64..=3), 1..=30),
    ) {
        let a = (a.0, a.1, resolve(a.2, a.0));
        let b = (b.0, b.1, resolve(b.2, b.0));
        let run = run_trace(&[a, b], &steps);
        for (k, limit) in [a, b].into_iter().enumerate() {
            let alone = MemoryStore::new();
            let only = |cost| trace_requests("inv", &[limit], cost);
            for (j, (t, c, d)) in run.iter().enumerate() {
                let want = if d.allowed {
                    alone.decide_now(*t, &only(*c)).outcomes[0]
                } else {
                    // Ask without consuming: a fresh copy of `alone`'s
                    // history, read at cost 0 before it is asked at cost c.
                    let copy = MemoryStore::new();
                    for (t2, c2, d2) in &run[..j] {
                        if d2.allowed {
                            copy.decide_now(*t2, &only(*c2));
                        }
                    }
                    let shown = copy.decide_now(*t, &only(0)).outcomes[0];
                    let verdict = copy.decide_now(*t, &only(*c)).outcomes[0];
                    if verdict.admits {
                        Standing {
                            remaining: shown.remaining,
                            reset_ms: shown.reset_ms,
                            ..verdict
                        }
                    } else {
                        verdict
                    }
                };
                prop_assert_eq!(want, d.outcomes[k], "limit {} step {}", k, j);
            }
        }
    }
}

// --- memory per key ---------------------------------------------------------

/// `MEMORY USAGE` of each algorithm's key after `n` admitted requests on a
/// limit of 100 per minute; printed for the table in docs/limits.md
/// (`cargo test --test limiter memory_per_key -- --nocapture`). The
/// counters stay one small string whatever the traffic; the log grows with
/// what it holds.
#[tokio::test]
async fn redis_memory_per_key_by_algorithm() {
    let server = RedisServer::start().await;
    let store = connected(&server).await;
    let conn = server.connection().await;
    let usage = |key: String| {
        let mut conn = conn.clone();
        async move {
            let bytes: Option<u64> = redis::cmd("MEMORY")
                .arg("USAGE")
                .arg(&key)
                .arg("SAMPLES")
                .arg(0)
                .query_async(&mut conn)
                .await
                .unwrap();
            bytes.unwrap_or(0)
        }
    };
    for alg in [SW, FW, LOG, GCRA] {
        let mut line = format!("{:>15}:", alg.name());
        let mut sizes = Vec::new();
        for n in [1u64, 10, 100] {
            // Shaped like the gateway's digested names (21 bytes).
            let key = format!("tg:{{{:0>12}}}{:0>4}", alg.code(), n);
            let req = [LimitRequest {
                key: key.clone().into(),
                limit: 100,
                window_ms: 60_000,
                cost: 1,
                algorithm: resolve(alg, 100),
                mode: Default::default(),
            }];
            for i in 0..n {
                assert!(store.decide(T0 + i, &req).await.unwrap().allowed);
            }
            let bytes = usage(key).await;
            sizes.push(bytes);
            line.push_str(&format!(" {bytes} B after {n};"));
        }
        println!("{line}");
        if alg == LOG {
            assert!(
                sizes[2] > 5 * sizes[0],
                "the log grows with its entries: {sizes:?}"
            );
        } else {
            // Only the digits of the counts change.
            assert!(
                sizes[2] <= sizes[0] + 32,
                "{}: a counter does not grow: {sizes:?}",
                alg.name()
            );
        }
    }
    // Precision buckets of 1 s on a minute: one field per bucket that
    // admitted, so the key grows with the buckets traffic spreads over, up
    // to 60 (a request a second for a minute).
    let buckets = Algorithm::SlidingBuckets {
        precision_ms: 1_000,
    };
    let mut line = format!("{:>15}:", "buckets 1s/1m");
    let mut sizes = Vec::new();
    for n in [1u64, 10, 60] {
        let key = format!("tg:{{{:0>12}}}{:0>4}", buckets.code(), n);
        let req = [LimitRequest {
            key: key.clone().into(),
            limit: 100,
            window_ms: 60_000,
            cost: 1,
            algorithm: buckets,
            mode: Default::default(),
        }];
        for i in 0..n {
            assert!(store.decide(T0 + i * 1_000, &req).await.unwrap().allowed);
        }
        let bytes = usage(key).await;
        sizes.push(bytes);
        line.push_str(&format!(" {bytes} B over {n} buckets;"));
    }
    println!("{line}");
    assert!(
        sizes[0] < sizes[2] && sizes[2] < 2_000,
        "a field per bucket, at most 60 of them: {sizes:?}"
    );
}

/// Every algorithm's key expires once nothing in it counts; fixed windows
/// and GCRA buckets, which can run out within milliseconds of a write, live
/// at least one window or 60 s, whichever is shorter.
#[tokio::test]
async fn every_key_expires_with_a_floor_for_short_lived_state() {
    let server = RedisServer::start().await;
    let store = connected(&server).await;
    let mut conn = server.connection().await;
    // (algorithm, limit, window, at, expected PTTL range)
    let cases: &[(Algorithm, u64, u64, u64, std::ops::RangeInclusive<i64>)] = &[
        // GCRA 1000 per minute: one unit refills in 60 ms; floor 60 s.
        (
            Algorithm::Gcra { burst: 1_000 },
            1_000,
            60_000,
            0,
            59_000..=60_000,
        ),
        // GCRA 10 per second: floor one window.
        (Algorithm::Gcra { burst: 10 }, 10, 1_000, 0, 900..=1_000),
        // Fixed 1 h window written 1 ms before its end: floor 60 s.
        (FW, 5, 3_600_000, 3_599_999, 59_000..=60_000),
        // Fixed 1 h window written at its start: the window's end.
        (FW, 5, 3_600_000, 0, 3_599_000..=3_600_000),
        // Sliding log: newest + w − now.
        (LOG, 5, 10_000, 0, 9_000..=10_000),
        // Precision buckets: until the newest bucket leaves, (b + 1)·p + w.
        (
            Algorithm::SlidingBuckets {
                precision_ms: 1_000,
            },
            5,
            10_000,
            0,
            10_000..=11_000,
        ),
    ];
    for (n, (alg, limit, window_ms, at, range)) in cases.iter().enumerate() {
        let key = format!("ttl:{{{n}}}");
        let req = [LimitRequest {
            key: key.clone().into(),
            limit: *limit,
            window_ms: *window_ms,
            cost: 1,
            algorithm: *alg,
            mode: Default::default(),
        }];
        assert!(store.decide(T0 + at, &req).await.unwrap().allowed);
        let ttl: i64 = redis::cmd("PTTL")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(range.contains(&ttl), "{alg:?}: PTTL {ttl} not in {range:?}");
    }
}

// --- settled costs: both stores alike ------------------------------------------

/// Scenarios of reserve-then-settle, run against a store; each probe (a
/// decision at cost 0) is recorded, so the two stores can be compared
/// number for number.
async fn settle_table(store: &impl Store) -> Vec<(String, u64, u64)> {
    use tollgate::limit::settle::Settlement;
    let algorithms = [
        Algorithm::SlidingWindow,
        Algorithm::FixedWindow,
        Algorithm::Gcra { burst: 100 },
        Algorithm::CalendarMonth,
        Algorithm::SlidingBuckets {
            precision_ms: 1_000,
        },
    ];
    // (name, reserve at, reserve, settle at, actual, extra request at)
    type Case = (&'static str, u64, u64, u64, u64, Option<u64>);
    let cases: [Case; 6] = [
        ("refund", 0, 10, 0, 3, None),
        ("extra", 0, 10, 0, 25, None),
        ("to_zero", 0, 10, 0, 0, None),
        ("gone_refund", 0, 10, 25_000, 0, None),
        ("gone_extra", 0, 10, 25_000, 30, None),
        ("previous", 9_000, 10, 11_000, 2, Some(11_000)),
    ];
    let mut seen = Vec::new();
    for alg in algorithms {
        for (name, at, reserve, settle_at, actual, extra) in cases {
            let tag = alg.key_tag().unwrap_or_else(|| alg.name().to_owned());
            let key = format!("{{settle}}:{tag}:{name}");
            let req = |cost| LimitRequest {
                key: key.clone().into(),
                limit: 100,
                window_ms: 10_000,
                cost,
                algorithm: alg,
                mode: Default::default(),
            };
            let d = store
                .decide(T0 + at, &[req(reserve)])
                .await
                .expect("decide");
            assert!(d.allowed, "{key}");
            if let Some(t) = extra {
                store.decide(T0 + t, &[req(1)]).await.expect("decide");
            }
            let s = Settlement {
                request: req(reserve),
                reserved_at_ms: T0 + at,
                actual,
            };
            store.settle(T0 + settle_at, &[s]).await.expect("settle");
            let probe = store
                .decide(T0 + settle_at, &[req(0)])
                .await
                .expect("probe");
            seen.push((key, probe.outcomes[0].remaining, probe.outcomes[0].reset_ms));
        }
    }
    seen
}

#[tokio::test]
async fn settled_costs_alike_in_memory_and_redis() {
    let memory = settle_table(&MemoryStore::new()).await;
    let remaining = |k: &str| memory.iter().find(|(key, ..)| key.ends_with(k)).unwrap().1;
    // Hand-checked: 10 reserved, then 3 / 25 / 0 charged in the same instant.
    assert_eq!(remaining("sliding_window:refund"), 97);
    assert_eq!(remaining("sliding_window:extra"), 75);
    assert_eq!(remaining("sliding_window:to_zero"), 100);
    assert_eq!(remaining("gcra:refund"), 97);
    assert_eq!(remaining("fixed_window:extra"), 75);
    // The reservation's window has gone: the extra 20 land in the current one.
    assert_eq!(remaining("fixed_window:gone_extra"), 80);
    assert_eq!(remaining("calendar_month:gone_extra"), 70);
    // Settled into the previous window: prev 2, cur 1, 10 % into the window.
    assert_eq!(remaining("sliding_window:previous"), 97);
    // Buckets: the reserved bucket moves while it counts; once gone, the
    // extra lands in now's bucket.
    assert_eq!(remaining("buckets_1000ms:refund"), 97);
    assert_eq!(remaining("buckets_1000ms:previous"), 97);
    assert_eq!(remaining("buckets_1000ms:gone_extra"), 80);
    assert_eq!(remaining("buckets_1000ms:gone_refund"), 100);
    let server = RedisServer::start().await;
    let redis = connected(&server).await;
    assert_eq!(settle_table(&redis).await, memory);
}
