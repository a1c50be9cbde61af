//! Rate-limit response headers (draft-ietf-httpapi-ratelimit-headers-11).
//!
//! ```text
//! RateLimit-Policy: "per_minute";q=100;w=60, "per_second";q=10;w=1
//! RateLimit: "per_minute";r=42;t=18, "per_second";r=9;t=1
//! ```
//! `q` is the quota, `w` the window in seconds, `r` the remaining quota and
//! `t` the seconds until the quota is fully restored (draft-11 §3, §4). On a
//! 429 the violated policy's `t` is its Retry-After. Seconds are rounded up
//! so a client that waits `t` is never early. The policy value does not
//! depend on the request and is rendered once per route at load time.

use http::{HeaderMap, HeaderName, HeaderValue};

use crate::config::{HeaderMode, Limit};
use crate::limit::Decision;

/// `RateLimit-Policy`.
pub static RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// `RateLimit`.
pub static RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// Milliseconds to whole seconds, rounded up.
pub fn ceil_secs(ms: u64) -> u64 {
    ms.div_ceil(1000)
}

/// The `RateLimit-Policy` value for a route's limits, or `None` when there
/// are no limits or headers are off.
pub fn policy_header(mode: HeaderMode, limits: &[Limit]) -> Option<HeaderValue> {
    if mode == HeaderMode::None || limits.is_empty() {
        return None;
    }
    let mut out = String::new();
    let mut buf = itoa::Buffer::new();
    for (i, l) in limits.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        out.push('"');
        out.push_str(&l.name);
        out.push_str("\";q=");
        out.push_str(buf.format(l.limit.get()));
        out.push_str(";w=");
        out.push_str(buf.format(ceil_secs(l.window_ms.get())));
    }
    HeaderValue::from_str(&out).ok()
}

/// The `RateLimit` value for a decision.
pub fn ratelimit_value(limits: &[Limit], decision: &Decision) -> Option<HeaderValue> {
    let mut out = String::with_capacity(32 * limits.len());
    let mut buf = itoa::Buffer::new();
    for (i, (l, o)) in limits.iter().zip(&decision.outcomes).enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        let t_ms = match (o.admits, o.retry_after_ms) {
            (false, Some(ms)) => ms,
            _ => o.reset_ms,
        };
        out.push('"');
        out.push_str(&l.name);
        out.push_str("\";r=");
        out.push_str(buf.format(o.remaining));
        out.push_str(";t=");
        out.push_str(buf.format(ceil_secs(t_ms)));
    }
    HeaderValue::from_str(&out).ok()
}

/// Adds the rate-limit headers of `mode` to a response.
pub fn apply(
    mode: HeaderMode,
    headers: &mut HeaderMap,
    policy: Option<&HeaderValue>,
    limits: &[Limit],
    decision: Option<&Decision>,
) {
    if mode == HeaderMode::None {
        return;
    }
    if let Some(p) = policy {
        headers.insert(RATELIMIT_POLICY.clone(), p.clone());
    }
    if let Some(v) = decision.and_then(|d| ratelimit_value(limits, d)) {
        headers.insert(RATELIMIT.clone(), v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::KeySpec;
    use crate::limit::LimitOutcome;
    use std::num::NonZeroU64;

    fn limit(name: &str, q: u64, w_ms: u64) -> Limit {
        Limit {
            name: name.into(),
            key: KeySpec { parts: vec![] },
            limit: NonZeroU64::new(q).unwrap(),
            window_ms: NonZeroU64::new(w_ms).unwrap(),
            cost: None,
            algorithm: Default::default(),
        }
    }

    #[test]
    fn draft_11_syntax() {
        let limits = [
            limit("per_minute", 100, 60_000),
            limit("per_second", 10, 1_000),
        ];
        let p = policy_header(HeaderMode::Ietf, &limits).unwrap();
        assert_eq!(p, r#""per_minute";q=100;w=60, "per_second";q=10;w=1"#);
        let d = Decision {
            allowed: false,
            outcomes: vec![
                LimitOutcome {
                    admits: true,
                    remaining: 42,
                    reset_ms: 17_001,
                    retry_after_ms: Some(0),
                },
                LimitOutcome {
                    admits: false,
                    remaining: 0,
                    reset_ms: 2_000,
                    retry_after_ms: Some(700),
                },
            ],
        };
        let v = ratelimit_value(&limits, &d).unwrap();
        assert_eq!(v, r#""per_minute";r=42;t=18, "per_second";r=0;t=1"#);
    }
}
