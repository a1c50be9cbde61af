//! What `tollgate check` says about a valid file beyond "ok": limits that
//! do what they say, but not what a reader of the file expects.
//!
//! A `sliding_window` limit of `L` per window `w` weighs the previous
//! window's count: a caller that spends the whole quota at the start of a
//! window is told to wait until the previous window's weight has fallen
//! enough, `w + w/L` in the worst case. For `L ≥ 4` that is at most
//! 1.25 windows; for a small `L` it is 1.5 (`L = 2`) or 2 windows
//! (`L = 1`), which is honest arithmetic but not what "2 per minute"
//! reads as. Such limits are named, one line each, with the worst wait
//! and the exact alternative (`sliding_log`, whose worst wait is one
//! window).

use std::time::Duration;

use crate::config::{Config, Limit, PlanLimit};
use crate::limit::Algorithm;

/// Below this limit a `sliding_window` burst can wait more than 1.25
/// windows (`w + w/L > 1.25·w` iff `L < 4`).
const SMALL_SLIDING_WINDOW: u64 = 4;

/// One line per limit of `config` whose worst wait surprises; empty when
/// none does.
pub fn advice(config: &Config) -> Vec<String> {
    let mut out = Vec::new();
    for (i, route) in config.routes.iter().enumerate() {
        for (j, l) in route.limits.iter().enumerate() {
            if is_rate(l) {
                note(
                    &mut out,
                    &format!("routes[{i}].limits[{j}]"),
                    &l.name,
                    l.algorithm,
                    l.limit.get(),
                    l.window_ms.get(),
                );
            }
        }
    }
    for plan in &config.plans {
        for (j, l) in plan.limits.iter().enumerate() {
            let PlanLimit {
                name,
                limit,
                window_ms,
                algorithm,
                ..
            } = l;
            let path = format!("plans.{}[{j}]", plan.name);
            note(
                &mut out,
                &path,
                name,
                *algorithm,
                limit.get(),
                window_ms.get(),
            );
        }
    }
    out
}

/// A limit with its own numbers (not a concurrency cap, not a plan's
/// placeholder).
fn is_rate(l: &Limit) -> bool {
    l.concurrency.is_none() && !l.plan
}

fn note(out: &mut Vec<String>, path: &str, name: &str, alg: Algorithm, l: u64, w: u64) {
    if !alg.estimates() || l >= SMALL_SLIDING_WINDOW {
        return;
    }
    let worst = worst_wait_ms(alg, l, w);
    out.push(format!(
        "warning: {path} ({name:?}): a sliding_window limit of {l} per {} can tell a burst to wait up to {} (w + w/L, {} windows); write algorithm: sliding_log for a wait of at most one window",
        duration(w),
        duration(worst),
        windows(worst, w),
    ));
}

/// The longest a caller who spent its whole quota at once waits for its
/// next request (of cost 1), by algorithm, limit `l` and window `w` (ms).
/// docs/limits.md has the table.
pub fn worst_wait_ms(alg: Algorithm, l: u64, w: u64) -> u64 {
    alg.worst_wait_ms(l, w)
}

/// `90s`, `1m30s`, `2h`, `1500ms`: the shortest exact spelling.
fn duration(ms: u64) -> String {
    if !ms.is_multiple_of(1000) {
        return format!("{ms}ms");
    }
    let d = Duration::from_millis(ms).as_secs();
    let (h, m, s) = (d / 3600, d / 60 % 60, d % 60);
    let mut out = String::new();
    for (n, unit) in [(h, "h"), (m, "m"), (s, "s")] {
        if n > 0 {
            out.push_str(&format!("{n}{unit}"));
        }
    }
    out
}

/// `worst / w` with up to two decimals: `1.5`, `2`, `1.33`.
fn windows(worst: u64, w: u64) -> String {
    let hundredths = worst * 100 / w;
    let text = format!("{}.{:02}", hundredths / 100, hundredths % 100);
    text.trim_end_matches('0').trim_end_matches('.').to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worst_waits() {
        let minute = 60_000;
        assert_eq!(worst_wait_ms(Algorithm::SlidingWindow, 2, minute), 90_000);
        assert_eq!(worst_wait_ms(Algorithm::SlidingWindow, 1, minute), 120_000);
        assert_eq!(worst_wait_ms(Algorithm::SlidingWindow, 4, minute), 75_000);
        assert_eq!(worst_wait_ms(Algorithm::SlidingLog, 2, minute), minute);
        assert_eq!(
            worst_wait_ms(Algorithm::Gcra { burst: 2 }, 2, minute),
            30_000
        );
        assert_eq!(duration(90_000), "1m30s");
        assert_eq!(duration(1_500), "1500ms");
        assert_eq!(windows(90_000, minute), "1.5");
        assert_eq!(windows(120_000, minute), "2");
        assert_eq!(windows(80_000, minute), "1.33");
    }
}
