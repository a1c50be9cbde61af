//! The sliding log (docs/design.md#what-a-limit-promises): exact, one timestamp per admitted unit.
//!
//! A unit admitted at `s` counts at time `t` iff `s > t − w`. A request of
//! cost `c` is admitted iff the units counting at `now` plus `c` are at most
//! `L`; it then adds `c` timestamps `now`. Nothing is estimated, so no
//! window of length `w` ever holds more than `L` admitted units — at the
//! price of memory proportional to `L` per key (the Redis store keeps a
//! sorted set with one member per unit; see `store/redis/limits.lua`).

use std::collections::VecDeque;

use super::Standing;

/// Drops timestamps that no longer count at `now` from a sorted log.
pub fn prune(log: &mut VecDeque<u64>, now: u64, window: u64) {
    let Some(horizon) = now.checked_sub(window) else {
        return;
    };
    while log.front().is_some_and(|&s| s <= horizon) {
        log.pop_front();
    }
}

/// Adds `cost` timestamps `now`, keeping the log sorted (a gateway whose
/// clock is ahead may have written later ones).
pub fn add(log: &mut VecDeque<u64>, now: u64, cost: u64) {
    let at = log.partition_point(|&s| s <= now);
    for _ in 0..cost {
        log.insert(at, now);
    }
}

/// Decides one limit at `now` against a sorted, pruned `log`.
pub fn check(log: &VecDeque<u64>, now: u64, limit: u64, window: u64, cost: u64) -> Standing {
    let used = log.len() as u64;
    let admits = cost <= limit && used + cost <= limit;
    let after = if admits { used + cost } else { used };
    let newest = match (log.back(), admits && cost > 0) {
        (Some(&s), true) => Some(s.max(now)),
        (None, true) => Some(now),
        (last, false) => last.copied(),
    };
    Standing {
        admits,
        remaining: limit.saturating_sub(after),
        reset_ms: newest.map_or(0, |s| (s + window).saturating_sub(now)),
        retry_after_ms: if admits {
            Some(0)
        } else if cost > limit {
            None
        } else {
            // The k-th oldest unit must leave, k = used − (L − c) ≥ 1;
            // it stops counting at s_k + w.
            let k = (used - (limit - cost)) as usize;
            log.get(k - 1).map(|&s| (s + window).saturating_sub(now))
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_is_exact() {
        let w = 1000;
        let traces: &[&[u64]] = &[&[0, 0, 0], &[0, 100, 100, 900], &[5, 6, 7, 8]];
        for trace in traces {
            for l in 1..=4u64 {
                for c in 1..=l {
                    let mut log: VecDeque<u64> = trace.iter().copied().collect();
                    let now = 950;
                    prune(&mut log, now, w);
                    let o = check(&log, now, l, w, c);
                    if o.admits {
                        continue;
                    }
                    let d = o.retry_after_ms.unwrap();
                    for (t, want) in [(now + d, true), (now + d - 1, false)] {
                        let mut l2 = log.clone();
                        prune(&mut l2, t, w);
                        assert_eq!(check(&l2, t, l, w, c).admits, want, "{trace:?} l={l} c={c}");
                    }
                }
            }
        }
    }

    #[test]
    fn insert_keeps_order() {
        let mut log: VecDeque<u64> = [1, 5, 9].into_iter().collect();
        add(&mut log, 6, 2);
        assert_eq!(log, [1, 5, 6, 6, 9]);
    }
}
