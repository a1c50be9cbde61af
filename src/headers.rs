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
//!
//! Two older header sets are offered for clients that already parse them;
//! both describe one limit only, the one closest to exhaustion (on a 429,
//! the violated limit with the longest wait):
//! - `github`: `X-RateLimit-Limit`, `-Remaining`, `-Used`, `-Reset` (epoch
//!   seconds, as GitHub's REST API sends it) and `-Resource` (the limit name);
//! - `legacy`: `RateLimit-Limit`, `RateLimit-Remaining`, `RateLimit-Reset`
//!   (seconds from now) of draft-ietf-httpapi-ratelimit-headers-03 and
//!   earlier.

use std::cell::RefCell;

use bytes::BytesMut;
use http::{HeaderMap, HeaderName, HeaderValue};

use crate::config::{HeaderMode, Limit};
use crate::limit::Standing;

/// `RateLimit-Policy`.
pub static RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// `RateLimit`.
pub static RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
/// `X-RateLimit-Limit` (github).
pub static X_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
/// `X-RateLimit-Remaining` (github).
pub static X_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
/// `X-RateLimit-Used` (github).
pub static X_USED: HeaderName = HeaderName::from_static("x-ratelimit-used");
/// `X-RateLimit-Reset` (github; epoch seconds).
pub static X_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");
/// `X-RateLimit-Resource` (github).
pub static X_RESOURCE: HeaderName = HeaderName::from_static("x-ratelimit-resource");
/// `RateLimit-Limit` (legacy).
pub static LEGACY_LIMIT: HeaderName = HeaderName::from_static("ratelimit-limit");
/// `RateLimit-Remaining` (legacy).
pub static LEGACY_REMAINING: HeaderName = HeaderName::from_static("ratelimit-remaining");
/// `RateLimit-Reset` (legacy; seconds from now).
pub static LEGACY_RESET: HeaderName = HeaderName::from_static("ratelimit-reset");

/// Milliseconds to whole seconds, rounded up.
pub fn ceil_secs(ms: u64) -> u64 {
    ms.div_ceil(1000)
}

/// The `RateLimit-Policy` value for a route's limits, or `None` when there
/// are no limits or headers are off.
pub fn policy_header(mode: HeaderMode, limits: &[Limit]) -> Option<HeaderValue> {
    if mode != HeaderMode::Ietf || limits.is_empty() {
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
        if l.concurrency.is_some() {
            // Requests in flight have no window; the draft's quota unit says what is counted.
            out.push_str(";qu=\"concurrent-requests\"");
            continue;
        }
        out.push_str(";w=");
        out.push_str(buf.format(ceil_secs(l.window_ms.get())));
        if let Some(crate::limit::settle::Source::Bytes(_)) = l.settle {
            // A byte quota (draft-11 §3.1's quota units).
            out.push_str(";qu=\"content-bytes\"");
        }
    }
    HeaderValue::from_str(&out).ok()
}

/// The `RateLimit` value for a decision's `outcomes`, one per limit.
///
/// The value is written straight into this thread's [`VALUES`] slab and
/// split off it: no buffer of its own to copy from, and an allocation
/// only when the slab runs out, not one per value.
pub fn ratelimit_value(limits: &[Limit], outcomes: &[Standing]) -> Option<HeaderValue> {
    VALUES.with(|slab| {
        let Ok(mut out) = slab.try_borrow_mut() else {
            // Not reached: nothing in here renders another value.
            let mut own = BytesMut::new();
            write_ratelimit(&mut own, limits, outcomes);
            return HeaderValue::from_maybe_shared(own.freeze()).ok();
        };
        if out.capacity() < VALUE_ROOM {
            // Takes the slab's allocation back when every value split off
            // it has been dropped, else starts a new one.
            out.reserve(SLAB_BYTES);
        }
        write_ratelimit(&mut out, limits, outcomes);
        HeaderValue::from_maybe_shared(out.split().freeze()).ok()
    })
}

/// Bytes of one slab of [`VALUES`]. A value split off a slab keeps all of
/// it allocated while the value lives: a few hundred bytes bounds what an
/// answer held open for long (a stream) keeps, and still gives a dozen
/// values per allocation.
const SLAB_BYTES: usize = 512;

/// Room a value usually needs (two limits with long names): below it the
/// slab is renewed before a value is written, so a value is seldom moved
/// while it is written.
const VALUE_ROOM: usize = 128;

thread_local! {
    /// The slab the `RateLimit` values of this thread are written into.
    static VALUES: RefCell<BytesMut> = RefCell::new(BytesMut::new());
}

/// Writes the `RateLimit` value of `outcomes` at the end of `out`.
fn write_ratelimit(out: &mut BytesMut, limits: &[Limit], outcomes: &[Standing]) {
    let mut buf = itoa::Buffer::new();
    for (i, (l, o)) in limits.iter().zip(outcomes).enumerate() {
        if i > 0 {
            out.extend_from_slice(b", ");
        }
        let t_ms = match (o.admits, o.retry_after_ms) {
            (false, Some(ms)) => ms,
            _ => o.reset_ms,
        };
        out.extend_from_slice(b"\"");
        out.extend_from_slice(l.name.as_bytes());
        out.extend_from_slice(b"\";r=");
        out.extend_from_slice(buf.format(o.remaining).as_bytes());
        if l.concurrency.is_some() {
            // The draft makes `t` optional: nothing tells when a slot frees.
            continue;
        }
        out.extend_from_slice(b";t=");
        out.extend_from_slice(buf.format(ceil_secs(t_ms)).as_bytes());
    }
}

/// The limit the single-limit header sets describe, with the milliseconds
/// until it is restored (its Retry-After on a deny): on a 429 the violated
/// limit with the longest wait, otherwise the one with the smallest share of
/// its quota left.
fn closest<'a>(
    limits: &'a [Limit],
    allowed: bool,
    outcomes: &[Standing],
) -> Option<(&'a Limit, u64, u64)> {
    let pairs = limits.iter().zip(outcomes);
    let pick = if allowed {
        // remaining/limit smallest: compare r1·l2 < r2·l1.
        pairs.min_by(|(l1, o1), (l2, o2)| {
            (u128::from(o1.remaining) * u128::from(l2.limit.get()))
                .cmp(&(u128::from(o2.remaining) * u128::from(l1.limit.get())))
        })
    } else {
        pairs
            .filter(|(_, o)| !o.admits)
            .max_by_key(|(_, o)| o.retry_after_ms.unwrap_or(u64::MAX))
    };
    pick.map(|(l, o)| {
        let t = match (o.admits, o.retry_after_ms) {
            (false, Some(ms)) => ms,
            _ => o.reset_ms,
        };
        (l, o.remaining, t)
    })
}

/// Adds the rate-limit headers of `mode` to a response: `outcomes` are
/// the limits' answers (none when they were not all read), `allowed`
/// whether the request was admitted, `now_ms` the time the decision was
/// made at (for GitHub's epoch `Reset`).
pub fn apply(
    mode: HeaderMode,
    headers: &mut HeaderMap,
    policy: Option<&HeaderValue>,
    limits: &[Limit],
    allowed: bool,
    outcomes: Option<&[Standing]>,
    now_ms: u64,
) {
    match mode {
        HeaderMode::None => {}
        HeaderMode::Ietf => {
            apply_to(mode, policy, limits, outcomes, |name, value| {
                headers.insert(name.clone(), value);
            });
        }
        HeaderMode::Github | HeaderMode::Legacy => {
            apply_single(mode, headers, limits, allowed, outcomes, now_ms);
        }
    }
}

/// [`apply`]'s single-limit sets, `github` and `legacy`: kept out of the
/// IETF fields' code, which every answer of the default runs.
#[inline(never)]
fn apply_single(
    mode: HeaderMode,
    headers: &mut HeaderMap,
    limits: &[Limit],
    allowed: bool,
    outcomes: Option<&[Standing]>,
    now_ms: u64,
) {
    let single = outcomes.and_then(|o| closest(limits, allowed, o));
    if let Some((limit, remaining, t_ms)) = single {
        let q = limit.limit.get();
        if mode == HeaderMode::Github {
            headers.insert(X_LIMIT.clone(), HeaderValue::from(q));
            headers.insert(X_REMAINING.clone(), HeaderValue::from(remaining));
            headers.insert(
                X_USED.clone(),
                HeaderValue::from(q.saturating_sub(remaining)),
            );
            headers.insert(
                X_RESET.clone(),
                HeaderValue::from(ceil_secs(now_ms.saturating_add(t_ms))),
            );
            if let Ok(v) = HeaderValue::from_str(&limit.name) {
                headers.insert(X_RESOURCE.clone(), v);
            }
        } else {
            headers.insert(LEGACY_LIMIT.clone(), HeaderValue::from(q));
            headers.insert(LEGACY_REMAINING.clone(), HeaderValue::from(remaining));
            headers.insert(LEGACY_RESET.clone(), HeaderValue::from(ceil_secs(t_ms)));
        }
    }
}

/// The IETF fields in `mode`, each handed to `put`: [`apply`] inserts
/// them into a map, a writer that renders them itself takes them as they
/// come; `false`, giving none, for `github` and `legacy`, whose fields only
/// `apply` writes.
pub fn apply_to(
    mode: HeaderMode,
    policy: Option<&HeaderValue>,
    limits: &[Limit],
    outcomes: Option<&[Standing]>,
    mut put: impl FnMut(&HeaderName, HeaderValue),
) -> bool {
    match mode {
        HeaderMode::None => true,
        HeaderMode::Ietf => {
            if let Some(p) = policy {
                put(&RATELIMIT_POLICY, p.clone());
            }
            if let Some(v) = outcomes.and_then(|o| ratelimit_value(limits, o)) {
                put(&RATELIMIT, v);
            }
            true
        }
        HeaderMode::Github | HeaderMode::Legacy => false,
    }
}

/// [`apply_to`]'s fields as text, each handed to `put` with its name and
/// its value's bytes, for a writer that copies them as they come: the
/// `RateLimit` value is written into this thread's [`SCRATCH`] and lent,
/// not made a `HeaderValue` split off a slab and counted by reference. A
/// value that would not be a valid field value is left out, as
/// [`ratelimit_value`] leaves it out. `false`, giving none, for `github`
/// and `legacy`, whose fields only [`apply`] writes.
pub fn apply_text(
    mode: HeaderMode,
    policy: Option<&HeaderValue>,
    limits: &[Limit],
    outcomes: Option<&[Standing]>,
    mut put: impl FnMut(&HeaderName, &[u8]),
) -> bool {
    match mode {
        HeaderMode::None => true,
        HeaderMode::Ietf => {
            if let Some(p) = policy {
                put(&RATELIMIT_POLICY, p.as_bytes());
            }
            if let Some(o) = outcomes {
                // `put` only copies the text: nothing under the borrow
                // writes another value.
                SCRATCH.with_borrow_mut(|text| {
                    text.clear();
                    write_ratelimit(text, limits, o);
                    if is_field_value(text) {
                        put(&RATELIMIT, text);
                    }
                });
            }
            true
        }
        HeaderMode::Github | HeaderMode::Legacy => false,
    }
}

/// Whether `text` is a valid field value as `HeaderValue` reads it
/// (visible ASCII or obs-text, spaces and tabs; no controls, no DEL).
fn is_field_value(text: &[u8]) -> bool {
    text.iter().fold(true, |ok, &b| {
        ok & ((b >= 0x20 && b != 0x7f) | (b == b'\t'))
    })
}

thread_local! {
    /// Where [`apply_text`] writes a `RateLimit` value before it lends it:
    /// cleared for each value, so its allocation is made once per thread.
    static SCRATCH: RefCell<BytesMut> = RefCell::new(BytesMut::new());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::KeySpec;
    use std::num::NonZeroU64;

    fn limit(name: &str, q: u64, w_ms: u64) -> Limit {
        Limit::new(
            name,
            KeySpec { parts: vec![] },
            NonZeroU64::new(q).unwrap(),
            NonZeroU64::new(w_ms).unwrap(),
        )
    }

    #[test]
    fn draft_11_syntax() {
        let limits = [
            limit("per_minute", 100, 60_000),
            limit("per_second", 10, 1_000),
        ];
        let p = policy_header(HeaderMode::Ietf, &limits).unwrap();
        assert_eq!(p, r#""per_minute";q=100;w=60, "per_second";q=10;w=1"#);
        let d: crate::limit::Standings = smallvec::smallvec![
            Standing {
                admits: true,
                remaining: 42,
                reset_ms: 17_001,
                retry_after_ms: Some(0),
            },
            Standing {
                admits: false,
                remaining: 0,
                reset_ms: 2_000,
                retry_after_ms: Some(700),
            },
        ];
        let v = ratelimit_value(&limits, &d).unwrap();
        assert_eq!(v, r#""per_minute";r=42;t=18, "per_second";r=0;t=1"#);
    }

    #[test]
    fn text_fields_are_the_map_fields() {
        let limits = [
            limit("per_minute", 100, 60_000),
            limit("bad\u{1}", 10, 1_000),
        ];
        let standing = Standing {
            admits: false,
            remaining: 0,
            reset_ms: 2_000,
            retry_after_ms: Some(700),
        };
        let policy = policy_header(HeaderMode::Ietf, &limits[..1]);
        for (limits, outcomes) in [
            (&limits[..1], Some(&[standing][..])),
            (&limits[..], Some(&[standing, standing][..])),
            (&limits[..1], None),
        ] {
            for mode in [HeaderMode::Ietf, HeaderMode::None, HeaderMode::Github] {
                let mut map = Vec::new();
                let by_map = apply_to(mode, policy.as_ref(), limits, outcomes, |n, v| {
                    map.push((n.clone(), v.as_bytes().to_vec()));
                });
                let mut text = Vec::new();
                let by_text = apply_text(mode, policy.as_ref(), limits, outcomes, |n, v| {
                    text.push((n.clone(), v.to_vec()));
                });
                assert_eq!((by_map, &map), (by_text, &text), "{mode:?}");
            }
        }
    }

    #[test]
    fn a_long_value_outgrows_the_slab() {
        let long = "l".repeat(150);
        let limits = [limit(&long, 5, 1_000), limit("second", 10, 1_000)];
        let standing = Standing {
            admits: true,
            remaining: 4,
            reset_ms: 1_000,
            retry_after_ms: Some(0),
        };
        let v = ratelimit_value(&limits, &[standing, standing]).unwrap();
        assert_eq!(
            v.to_str().unwrap(),
            format!(r#""{long}";r=4;t=1, "second";r=4;t=1"#)
        );
    }

    #[test]
    fn values_split_off_one_slab_stay_apart() {
        let limits = [limit("per_second", 10, 1_000)];
        let values: Vec<HeaderValue> = (0..100)
            .map(|remaining| {
                let standing = Standing {
                    admits: true,
                    remaining,
                    reset_ms: 1_000,
                    retry_after_ms: Some(0),
                };
                ratelimit_value(&limits, &[standing]).unwrap()
            })
            .collect();
        for (remaining, v) in values.iter().enumerate() {
            assert_eq!(
                v.to_str().unwrap(),
                format!(r#""per_second";r={remaining};t=1"#)
            );
        }
    }
}
