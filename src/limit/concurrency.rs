//! Concurrency limits (docs/limits.md#concurrency-limits): `{ name, key, concurrency: N }` caps a
//! caller's requests in flight instead of a rate.
//!
//! A request takes one slot per concurrency limit before it is forwarded
//! and gives it back when its response ends — body complete, client gone,
//! upstream failed, tunnel closed. There is no window and no cost: a slot
//! is held or it is not. The stores keep the slots (a count per key in
//! process, a sorted set of leases in Redis); this module holds the
//! arithmetic they share and the outcome a slot decision shows in the
//! rate-limit headers.

use crate::limit::Standing;

/// The `qu` of a concurrency limit's `RateLimit-Policy` item.
pub const QUOTA_UNIT: &str = "concurrent-requests";

/// Whether a key holding `held` slots of `cap` admits one more.
pub fn admits(held: u64, cap: u64) -> bool {
    held < cap
}

/// The outcome of a slot taken: `free` slots left after it (a released
/// request's own slot not counted as taken). No reset: nothing tells when
/// a request in flight will end.
pub fn held(free: u64) -> Standing {
    Standing {
        admits: true,
        remaining: free,
        reset_ms: 0,
        retry_after_ms: Some(0),
    }
}

/// The outcome of a full key: no slot free, and no Retry-After, since
/// nothing tells when a request in flight will end.
pub fn full() -> Standing {
    Standing {
        admits: false,
        remaining: 0,
        reset_ms: 0,
        retry_after_ms: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_key_denies_and_names_no_time() {
        assert!(admits(2, 3));
        assert!(!admits(3, 3));
        let o = full();
        assert_eq!((o.admits, o.remaining, o.retry_after_ms), (false, 0, None));
        assert_eq!(held(2).retry_after_ms, Some(0));
    }
}
