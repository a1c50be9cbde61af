//! Request ids: one per request, so that a response a customer reports
//! (a 429 with its `x-request-id`) can be found in the access log and in
//! the upstream's logs.
//!
//! [`assign`] runs first, before any check can refuse the request, so every
//! answer carries the id — the upstream's, and each problem+json body the
//! gateway writes. An id a peer sent is kept when `keep_from` trusts that
//! peer (by default the proxies of `client_ip.trusted_proxies`, whose ids
//! tie the gateway's lines to theirs) and it is 1 to 128 visible ASCII
//! characters; any other is replaced, so a client cannot put line breaks,
//! megabytes or another request's id into the logs.
//!
//! A made id is a UUIDv7 (RFC 9562 §5.7): 48 bits of Unix milliseconds,
//! then 74 random bits from a thread-local ChaCha generator (`uuid`'s
//! `fast-rng`). Ids sort by time, and no lock is shared between requests:
//! `Uuid::now_v7`'s process-wide counter sits behind a mutex, so it is not
//! used.

use std::net::IpAddr;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue};
use ipnet::IpNet;
use uuid::{NoContext, Timestamp, Uuid};

use crate::config::{KeepFrom, RequestIdConfig};
use crate::identity;

/// The longest id kept from a peer, in bytes.
pub const MAX_LEN: usize = 128;

/// The request's id, left in `headers` for the upstream: the peer's when
/// `config.keep_from` keeps it and it is well formed, else a new one.
pub fn assign(
    config: &RequestIdConfig,
    trusted_proxies: &[IpNet],
    peer: IpAddr,
    headers: &mut HeaderMap,
) -> HeaderValue {
    let keep = match config.keep_from {
        KeepFrom::Any => true,
        KeepFrom::Trusted => identity::is_trusted(trusted_proxies, peer),
        KeepFrom::None => false,
    };
    if keep {
        let mut sent = headers.get_all(&config.header).iter();
        if let (Some(id), None) = (sent.next(), sent.next())
            && well_formed(id.as_bytes())
        {
            return id.clone();
        }
    }
    let id = make();
    headers.insert(config.header.clone(), id.clone());
    id
}

/// 1 to [`MAX_LEN`] visible ASCII characters (`!` to `~`).
pub fn well_formed(id: &[u8]) -> bool {
    (1..=MAX_LEN).contains(&id.len()) && id.iter().all(|b| (0x21..=0x7e).contains(b))
}

/// A new id: a UUIDv7 in its hyphenated lower-case form.
pub fn make() -> HeaderValue {
    let id = Uuid::new_v7(Timestamp::now(NoContext));
    let mut text = [0u8; uuid::fmt::Hyphenated::LENGTH];
    id.hyphenated().encode_lower(&mut text);
    // The text is the value's one allocation, shared by its clones (the
    // request's field, the response's, the problem body's): a `Vec` made
    // `Bytes` takes a second one at its first clone.
    // Hex digits and hyphens: always a valid value.
    HeaderValue::from_maybe_shared(Bytes::from_owner(text))
        .unwrap_or_else(|_| HeaderValue::from_static("-"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderName;

    fn config(keep_from: KeepFrom) -> RequestIdConfig {
        RequestIdConfig {
            header: HeaderName::from_static("x-request-id"),
            keep_from,
        }
    }

    #[test]
    fn made_ids_are_uuid_v7_and_differ() {
        let a = make();
        let b = make();
        assert_ne!(a, b);
        let parsed = Uuid::parse_str(a.to_str().unwrap()).unwrap();
        assert_eq!(parsed.get_version_num(), 7);
    }

    #[test]
    fn kept_only_from_whom_keep_from_trusts_and_only_when_well_formed() {
        let proxies: Vec<IpNet> = vec!["10.0.0.0/8".parse().unwrap()];
        let proxy: IpAddr = "10.1.2.3".parse().unwrap();
        let client: IpAddr = "192.0.2.7".parse().unwrap();
        let sent = |id: &'static str| {
            let mut h = HeaderMap::new();
            h.insert("x-request-id", HeaderValue::from_static(id));
            h
        };
        let cases = [
            (KeepFrom::Trusted, proxy, "abc-123", true),
            (KeepFrom::Trusted, client, "abc-123", false),
            (KeepFrom::Any, client, "abc-123", true),
            (KeepFrom::None, proxy, "abc-123", false),
            (KeepFrom::Any, client, "", false),
            (KeepFrom::Any, client, "has space", false),
        ];
        for (keep_from, peer, id, kept) in cases {
            let mut h = sent(id);
            let got = assign(&config(keep_from), &proxies, peer, &mut h);
            assert_eq!(got == id, kept, "{keep_from:?} {peer} {id:?}");
            assert_eq!(h["x-request-id"], got);
        }
        let long = "a".repeat(MAX_LEN);
        assert!(well_formed(long.as_bytes()));
        assert!(!well_formed(format!("{long}a").as_bytes()));
        assert!(!well_formed("é".as_bytes()));
        // Two ids are none.
        let mut h = sent("one");
        h.append("x-request-id", HeaderValue::from_static("two"));
        let got = assign(&config(KeepFrom::Any), &proxies, client, &mut h);
        assert_ne!(got, "one");
        assert_eq!(h.get_all("x-request-id").iter().count(), 1);
    }
}
