//! Precision buckets: a sliding window of `w` counted in buckets of `p`
//! (`algorithm: sliding_window` with `precision`): a count per bucket,
//! which Redis holds in one hash with the window's total.
//!
//! A unit admitted at `t` counts in bucket `b = ⌊t/p⌋`. A bucket leaves
//! only when all of it is older than the window: bucket `b` counts at
//! `now` while `(b + 1)·p + w > now`, so every unit of the trailing window
//! `(now − w, now]` still counts, and no span of one window ever holds more
//! than `L`. The price is the other way: a bucket's earliest units count
//! up to `p` longer than a window, so a burst at the start of a bucket
//! waits `w + p` at worst (the two-count sliding window's `w + w/L`).
//! Memory is one count per bucket, at most `w/p + 1` of them (the
//! configuration allows 60 buckets per window).
//!
//! Every number is an integer well inside the bounds the Redis script
//! computes exactly in (`(b + 1)·p + w` is below 2^53 for an instant below
//! 2^53, and a total stays at most `L`).

use super::Standing;

/// The counts of one key: `(bucket index, units)`, ascending by bucket,
/// without empty buckets.
pub type BucketCounts = Vec<(u64, u64)>;

/// The first bucket that counts at `now`: the smallest `b` with
/// `(b + 1)·p > now − w`.
pub fn first(now: u64, w: u64, p: u64) -> u64 {
    now.checked_sub(w).map_or(0, |x| x / p.max(1))
}

/// Drops the buckets that do not count at `now`: those wholly older than
/// the window.
pub fn prune(counts: &mut BucketCounts, now: u64, w: u64, p: u64) {
    let first = first(now, w, p);
    let gone = counts.partition_point(|&(b, _)| b < first);
    counts.drain(..gone);
}

/// Adds `units` to bucket `b`.
pub fn add(counts: &mut BucketCounts, b: u64, units: u64) {
    if units == 0 {
        return;
    }
    let at = counts.partition_point(|&(x, _)| x < b);
    match counts.get_mut(at) {
        Some((x, n)) if *x == b => *n = n.saturating_add(units),
        _ => counts.insert(at, (b, units)),
    }
}

/// When bucket `b` stops counting.
fn leaves(b: u64, w: u64, p: u64) -> u64 {
    b.saturating_add(1).saturating_mul(p).saturating_add(w)
}

/// Decides a request of cost `c` at `now` against `counts` (already
/// pruned to `now`) for a limit of `l` per window `w` in buckets of `p`.
/// Does not modify the counts; the caller adds `c` to bucket `now / p`
/// when the whole request is admitted.
pub fn check(counts: &[(u64, u64)], now: u64, l: u64, (w, p): (u64, u64), c: u64) -> Standing {
    let p = p.max(1);
    let total: u64 = counts.iter().map(|&(_, n)| n).sum();
    let admits = c <= l && total.saturating_add(c) <= l;
    let after = if admits { total + c } else { total };
    let mut newest = counts.last().map(|&(b, _)| b);
    if admits && c > 0 {
        newest = Some(newest.map_or(now / p, |b| b.max(now / p)));
    }
    let reset_ms = newest.map_or(0, |b| leaves(b, w, p).saturating_sub(now));
    let retry_after_ms = if admits {
        Some(0)
    } else if c > l {
        None
    } else {
        // The oldest buckets leave first: wait for the first whose leaving
        // makes room for c.
        let mut left = total;
        counts.iter().find_map(|&(b, n)| {
            left -= n;
            (left + c <= l).then(|| leaves(b, w, p).saturating_sub(now))
        })
    };
    Standing {
        admits,
        remaining: l.saturating_sub(after),
        reset_ms,
        retry_after_ms,
    }
}

/// Whether nothing in `counts` still counts at `now`.
pub fn is_idle(counts: &[(u64, u64)], now: u64, w: u64, p: u64) -> bool {
    counts.last().is_none_or(|&(b, _)| leaves(b, w, p) <= now)
}

/// `counts` after settling `delta` for a reservation made in bucket
/// `reserved` (`limit::settle`'s rules, bucket for window): while that
/// bucket counts and is held, its count moves within `[0, max(L,
/// count)]`; otherwise a refund has nothing to give back (`None`: no
/// change) and an extra charge goes into now's bucket.
pub fn settled(
    mut counts: BucketCounts,
    (reserved, now): (u64, u64),
    (l, w, p): (u64, u64, u64),
    delta: i128,
) -> Option<BucketCounts> {
    prune(&mut counts, now, w, p);
    let moved = |n: u64| {
        let v = (i128::from(n) + delta).clamp(0, i128::from(l.max(n)));
        u64::try_from(v).unwrap_or(0)
    };
    match counts.iter().position(|&(b, _)| b == reserved) {
        Some(i) => {
            counts[i].1 = moved(counts[i].1);
            if counts[i].1 == 0 {
                counts.remove(i);
            }
            Some(counts)
        }
        None if delta > 0 => {
            let b = (now / p.max(1)).max(reserved);
            let at = counts.partition_point(|&(x, _)| x < b);
            match counts.get_mut(at) {
                Some((x, n)) if *x == b => *n = moved(*n),
                _ => counts.insert(at, (b, moved(0))),
            }
            Some(counts)
        }
        None => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: u64 = 60_000;
    const P: u64 = 10_000;

    #[test]
    fn a_bucket_leaves_when_all_of_it_is_older_than_the_window() {
        // Bucket 0 holds [0, 10s): it counts until 70s.
        assert_eq!(first(69_999, W, P), 0);
        assert_eq!(first(70_000, W, P), 1);
        let mut c = vec![(0, 3), (5, 2)];
        prune(&mut c, 69_999, W, P);
        assert_eq!(c, [(0, 3), (5, 2)]);
        prune(&mut c, 70_000, W, P);
        assert_eq!(c, [(5, 2)]);
    }

    #[test]
    fn a_full_window_waits_for_its_oldest_buckets() {
        let c = vec![(0, 3), (2, 2)];
        // L = 5: full. The first bucket leaves at 70s, which frees 3.
        let o = check(&c, 25_000, 5, (W, P), 1);
        assert!(!o.admits);
        assert_eq!(o.retry_after_ms, Some(45_000));
        assert_eq!(o.reset_ms, 90_000 - 25_000);
        assert_eq!(o.remaining, 0);
        // A cost of 4 waits for both.
        assert_eq!(check(&c, 25_000, 5, (W, P), 4).retry_after_ms, Some(65_000));
        assert_eq!(check(&c, 25_000, 5, (W, P), 6).retry_after_ms, None);
        let ok = check(&c, 25_000, 6, (W, P), 1);
        assert!(ok.admits);
        assert_eq!((ok.remaining, ok.reset_ms), (0, 90_000 - 25_000));
    }

    #[test]
    fn the_worst_wait_is_a_window_and_a_bucket() {
        // A burst at the very start of bucket 1 fills L = 2.
        let c = vec![(1, 2)];
        let o = check(&c, P, 2, (W, P), 1);
        assert_eq!(o.retry_after_ms, Some(W + P));
    }

    #[test]
    fn settling_moves_the_reserved_bucket_or_charges_now() {
        let c = vec![(0, 3), (2, 2)];
        assert_eq!(
            settled(c.clone(), (2, 25_000), (10, W, P), -2),
            Some(vec![(0, 3)])
        );
        assert_eq!(
            settled(c.clone(), (0, 25_000), (10, W, P), 4),
            Some(vec![(0, 7), (2, 2)])
        );
        assert_eq!(settled(c.clone(), (1, 25_000), (10, W, P), -1), None);
        assert_eq!(
            settled(c, (1, 25_000), (10, W, P), 1),
            Some(vec![(0, 3), (2, 3)])
        );
        assert_eq!(
            settled(vec![], (0, 80_000), (10, W, P), 2),
            Some(vec![(8, 2)])
        );
    }
}
