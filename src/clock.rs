//! Time as integer milliseconds since the Unix epoch.
//!
//! Limits shared by several gateway instances need one time line, so the
//! limiter works on wall-clock milliseconds (not `Instant`). The clock is a
//! trait so tests drive time.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Days since 1970-01-01 of the date `y`-`m`-`d` (proleptic Gregorian,
/// any year): Howard Hinnant's `days_from_civil`, integers only.
pub fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// `(year, month 1–12, day 1–31)` of the day `z` days after 1970-01-01:
/// the inverse, `civil_from_days`.
pub fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// A source of the current time in milliseconds since the Unix epoch.
pub trait Clock: Send + Sync + 'static {
    /// The current time, in milliseconds since the Unix epoch.
    fn now_ms(&self) -> u64;
}

/// The system's wall clock, read through the processor's time-stamp
/// counter between readings of the system time.
///
/// Every request reads the clock once, and the system's time costs about
/// 35 ns a reading (a `clock_gettime` through the vDSO) where the counter
/// costs about 10 ([`quanta`], which falls back to the system's monotonic
/// clock where the counter is not steady). Each thread reads the system
/// time at most every [`ANCHOR_NS`] and counts the nanoseconds since on
/// the counter: the time it gives is the system's within the counter's
/// drift over that span (some microseconds), and follows a step of the
/// system's clock within it.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

/// How long a thread counts on the time-stamp counter before it reads the
/// system time again.
const ANCHOR_NS: u64 = 100_000_000;

/// The time-stamp counter, calibrated against the monotonic clock at its
/// first reading (some milliseconds, once per process).
static COUNTER: std::sync::OnceLock<quanta::Clock> = std::sync::OnceLock::new();

thread_local! {
    /// The counter's reading at this thread's last reading of the system
    /// time, and that time in nanoseconds since the epoch; `(0, 0)` before
    /// the first.
    static ANCHOR: std::cell::Cell<(u64, u64)> = const { std::cell::Cell::new((0, 0)) };
}

impl SystemClock {
    /// Calibrates the time-stamp counter now, so that no request waits
    /// for it.
    pub fn calibrate() {
        COUNTER.get_or_init(quanta::Clock::new);
    }
}

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        let counter = COUNTER.get_or_init(quanta::Clock::new);
        let raw = counter.raw();
        ANCHOR.with(|anchor| {
            let (at, wall_ns) = anchor.get();
            // A counter behind the anchor (another core's) reads the
            // system time again.
            if at != 0 && raw >= at {
                let since = counter.delta_as_nanos(at, raw);
                if since < ANCHOR_NS {
                    return (wall_ns + since) / 1_000_000;
                }
            }
            let wall_ns = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| {
                d.as_secs()
                    .saturating_mul(1_000_000_000)
                    .saturating_add(u64::from(d.subsec_nanos()))
            });
            anchor.set((raw, wall_ns));
            wall_ns / 1_000_000
        })
    }
}

/// A clock that only moves when told to; for tests.
#[derive(Debug, Default, Clone)]
pub struct ManualClock(Arc<AtomicU64>);

impl ManualClock {
    /// A clock standing at `ms`.
    pub fn new(ms: u64) -> Self {
        Self(Arc::new(AtomicU64::new(ms)))
    }
    /// Sets the time to `ms`.
    pub fn set(&self, ms: u64) {
        self.0.store(ms, Ordering::SeqCst);
    }
    /// Moves the time forward by `ms`.
    pub fn advance(&self, ms: u64) {
        self.0.fetch_add(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn system_ms() -> u64 {
        let d = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
        d.as_secs() * 1000 + u64::from(d.subsec_millis())
    }

    /// Read through the counter, the time is the system's, to the
    /// millisecond either way (a reading and the counter's fall on either
    /// side of a millisecond's edge), past the anchor's span too.
    #[test]
    fn the_system_clock_keeps_to_the_system_time() {
        let start = std::time::Instant::now();
        while start.elapsed() < std::time::Duration::from_millis(250) {
            let before = system_ms();
            let now = SystemClock.now_ms();
            let after = system_ms();
            assert!(
                before <= now + 1 && now <= after + 1,
                "{before} <= {now} <= {after}"
            );
        }
    }
}
