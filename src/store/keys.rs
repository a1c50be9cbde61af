//! Every key tollgate writes to a store is named here, and only here:
//! counter keys, the API-key hash and the instance registry.
//!
//! A key is `<prefix>{<identity>}<limit>`: the identity is the hash tag, so
//! every limit of one caller lives in one Redis Cluster slot and a
//! multi-limit decision stays one atomic script call. With Redis the
//! identity and the limit are written as digests
//! ([`StoreConfig::digest_keys`](crate::config::StoreConfig::digest_keys)):
//! Redis spends its memory per key mostly on fixed overheads, and a name
//! under 23 bytes keeps one identity and limit in 149 bytes where the
//! readable `tollgate:{key=k80215}:bench:all` took 164 (Redis 7.0, measured
//! with `benches/load.py`).
//!
//! The digests are prefixes of SHA-256 in URL-safe base64: 12 characters
//! (72 bits) for the identity, 4 (24 bits) for the limit. Two callers can
//! only share a key by a SHA-256 collision on 72 bits, which nobody can
//! aim at a given caller (a second preimage); colliding limit digests
//! within one configuration are detected at load and lengthened
//! ([`limit_digests`]). The identity digest is taken over the same text the
//! readable key holds (`key=k80215`), so an operator can find a caller's
//! key: `printf 'key=k80215' | sha256sum`, first 9 bytes, base64url.

use std::ops::Deref;

use sha2::{Digest, Sha256};

use crate::limit::Algorithm;
use crate::limit::key::limit_id;

pub use crate::limit::key::StoreKey;

/// A limit's key suffix ([`limit_suffix`], [`share_suffix`], or their
/// digest) and, for a limit whose counters are a [`StoreKey::Address`],
/// the number that names it with the store's prefix there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeySuffix {
    text: String,
    id: Option<u32>,
}

impl KeySuffix {
    /// `text` after `prefix`'s identities; numbered ([`limit_id`]) when
    /// `by_address`: its limit is counted by client IP alone in process.
    pub fn new(prefix: &str, text: String, by_address: bool) -> Self {
        let id = by_address.then(|| limit_id(prefix, &text)).flatten();
        Self { text, id }
    }

    /// The same suffix written as `text` (its digest), with the number of
    /// the text it replaces.
    #[must_use]
    pub fn written_as(&self, text: String) -> Self {
        Self { text, id: self.id }
    }

    /// The number of the prefix and this suffix, when its limit's
    /// counters are a [`StoreKey::Address`]: worked out once, when the
    /// route is compiled, not asked of the limit per request.
    pub fn id(&self) -> Option<u32> {
        self.id
    }
}

impl Deref for KeySuffix {
    type Target = str;

    fn deref(&self) -> &str {
        &self.text
    }
}

/// The counter key of one caller and one limit: `<prefix>{<identity>}<suffix>`,
/// the identity written by `identity` and replaced by its digest when
/// `digest` (`scratch` holds the text meanwhile, so a caller deciding
/// several limits allocates it once).
pub fn counter_key(
    prefix: &str,
    digest: bool,
    suffix: &str,
    scratch: &mut String,
    identity: impl FnOnce(&mut String),
) -> String {
    let mut key = String::with_capacity(prefix.len() + 48 + suffix.len());
    key.push_str(prefix);
    key.push('{');
    if digest {
        scratch.clear();
        identity(scratch);
        push_digest(&mut key, scratch.as_bytes(), IDENTITY_CHARS);
    } else {
        identity(&mut key);
    }
    key.push('}');
    key.push_str(suffix);
    key
}

/// `:<route>:<limit>`, and `:<algorithm>` for all but the default sliding
/// window: each algorithm keeps state of its own shape, so a limit whose
/// algorithm changes on reload starts a fresh key instead of misreading the
/// old one (and sliding-window keys stay what they always were). With
/// Redis the suffix is replaced by its digest ([`limit_digests`]).
pub fn limit_suffix(route: &str, limit: &str, algorithm: Algorithm) -> String {
    match algorithm.key_tag() {
        None => format!(":{route}:{limit}"),
        Some(tag) => format!(":{route}:{limit}:{tag}"),
    }
}

/// `:@<share>` (with `:<algorithm>` as [`limit_suffix`] adds it), the
/// limit part of a limit every route of the share counts on: neither the
/// route nor the limit's name, so every route's limit of the share is one
/// counter. `@` keeps it apart from `:<route>:<limit>` of a route named
/// like a share.
pub fn share_suffix(share: &str, algorithm: Algorithm) -> String {
    match algorithm.key_tag() {
        None => format!(":@{share}"),
        Some(tag) => format!(":@{share}:{tag}"),
    }
}

/// Whether `suffix` is a share's ([`share_suffix`],
/// [`share_concurrency_suffix`]): `@` is in no route's name. A share's
/// key is `<prefix>{<identity digest>}:@<share>[:<algorithm>]` whatever
/// the rest of the file says (`readable_keys`, the other limits' digest
/// length), so the gateway and an application's layer that name one share
/// count on one key.
pub fn is_share(suffix: &str) -> bool {
    suffix.starts_with(":@")
}

/// Where a share's fingerprint lies in Redis: `<prefix>{@<share>}definition`,
/// beside its counters' names, written by the first process that counts on
/// it ([`share_fingerprint`]).
pub fn share_definition(prefix: &str, share: &str) -> String {
    format!("{prefix}{{@{share}}}definition")
}

/// The fingerprint of a share's definition
/// ([`Limit::definition`](crate::config::Limit::definition)): 12
/// characters of its digest. Processes whose fingerprints differ count one
/// share by different numbers.
pub fn share_fingerprint(definition: &str) -> String {
    let mut out = String::with_capacity(IDENTITY_CHARS);
    push_digest(&mut out, definition.as_bytes(), IDENTITY_CHARS);
    out
}

/// `:@<share>:concurrency`: the slots of a shared concurrency limit.
pub fn share_concurrency_suffix(share: &str) -> String {
    format!(":@{share}:concurrency")
}

/// `:<route>:<limit>:concurrency`: a concurrency limit's slots
/// are a sorted set of leases in Redis, a shape of their own, so they
/// never share a key with a rate limit of the same name.
pub fn concurrency_suffix(route: &str, limit: &str) -> String {
    format!(":{route}:{limit}:concurrency")
}

/// The Redis hash of dynamic API keys: `<prefix>keys`.
pub fn api_key_hash(prefix: &str) -> String {
    format!("{prefix}keys")
}

/// The Redis hash of per-caller overrides set through the admin API:
/// `<prefix>{admin}overrides`, field = the override's id, value = JSON.
pub fn overrides(prefix: &str) -> String {
    format!("{prefix}{{admin}}overrides")
}

/// The counter every admin write bumps (`<prefix>{admin}generation`),
/// beside [`overrides`] in one slot: gateways watch it to reread the
/// overrides and forget their deny caches.
pub fn admin_generation(prefix: &str) -> String {
    format!("{prefix}{{admin}}generation")
}

/// The sorted set of live gateway instances: `<prefix>{instances}`.
pub fn instances(prefix: &str) -> String {
    format!("{prefix}{{instances}}")
}

/// The hash of what each live gateway last published for the console:
/// `<prefix>{instances}console`, in [`instances`]'s slot so that one
/// script reads both.
pub fn console(prefix: &str) -> String {
    format!("{prefix}{{instances}}console")
}

/// Characters of the identity digest.
pub const IDENTITY_CHARS: usize = 12;
/// Characters of a limit digest when no two limits collide.
pub const LIMIT_CHARS: usize = 4;

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/// Appends the first `chars` base64url characters of SHA-256(`text`);
/// `chars` is at most 43 (all 256 bits).
pub fn push_digest(out: &mut String, text: &[u8], chars: usize) {
    let digest = Sha256::digest(text);
    let mut written = 0;
    for group in digest.chunks(3) {
        let mut bits = 0u32;
        for (i, b) in group.iter().enumerate() {
            bits |= u32::from(*b) << (16 - 8 * i);
        }
        for shift in [18, 12, 6, 0] {
            if written == chars {
                return;
            }
            out.push(char::from(ALPHABET[(bits >> shift) as usize & 63]));
            written += 1;
        }
    }
}

/// The digest of each distinct limit name (`:<route>:<limit>[:<algorithm>]`)
/// of a configuration: [`LIMIT_CHARS`] characters, or more for all of them
/// until no two distinct names share one.
pub fn limit_digests<'a>(names: impl Iterator<Item = &'a str> + Clone) -> impl Fn(&str) -> String {
    let mut chars = LIMIT_CHARS;
    loop {
        let mut seen: Vec<(String, &str)> = Vec::new();
        let mut clash = false;
        for name in names.clone() {
            let mut d = String::new();
            push_digest(&mut d, name.as_bytes(), chars);
            match seen.iter().find(|(s, _)| *s == d) {
                Some((_, other)) if *other != name => {
                    clash = true;
                    break;
                }
                Some(_) => {}
                None => seen.push((d, name)),
            }
        }
        if !clash || chars >= 40 {
            return move |name: &str| {
                let mut d = String::with_capacity(chars);
                push_digest(&mut d, name.as_bytes(), chars);
                d
            };
        }
        chars += 2;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_precision_names_a_key_of_its_own() {
        // A reload that adds a precision (or changes it) meets a fresh key,
        // never the string counter of the same limit: no WRONGTYPE.
        let sw = limit_suffix("api", "per_ip", Algorithm::default());
        let with = |p| {
            limit_suffix(
                "api",
                "per_ip",
                Algorithm::default().with_precision(p).unwrap(),
            )
        };
        assert_eq!(sw, ":api:per_ip");
        assert_eq!(with(1_000), ":api:per_ip:buckets_1000ms");
        assert_ne!(with(1_000), with(2_000));
        let shared = share_suffix("ab", Algorithm::default().with_precision(500).unwrap());
        assert_eq!(shared, ":@ab:buckets_500ms");
    }

    #[test]
    fn digest_is_base64url_of_sha256() {
        // printf 'abc' | sha256sum → ba7816bf8f01cfea41…; base64url of
        // ba 78 16 bf 8f 01 cf ea 41 is ungWv48Bz-pB.
        let mut s = String::new();
        push_digest(&mut s, b"abc", IDENTITY_CHARS);
        assert_eq!(s, "ungWv48Bz-pB");
        let mut s = String::new();
        push_digest(&mut s, b"abc", 43);
        assert_eq!(s.len(), 43);
    }

    #[test]
    fn clashing_limit_digests_grow() {
        let names = [":a:x", ":a:y", ":b:x"];
        let f = limit_digests(names.iter().copied());
        assert_eq!(f(":a:x").len(), LIMIT_CHARS);
        assert_ne!(f(":a:x"), f(":a:y"));
        // Find two names whose 4-character digests agree: 24 bits, so a
        // few thousand candidates suffice.
        let mut seen = std::collections::HashMap::new();
        let (a, b) = (0..100_000)
            .find_map(|i| {
                let n = format!(":r:{i}");
                let mut d = String::new();
                push_digest(&mut d, n.as_bytes(), LIMIT_CHARS);
                seen.insert(d, n.clone()).map(|m| (m, n))
            })
            .expect("a 24-bit collision within 100,000 names");
        let f = limit_digests([a.as_str(), b.as_str()].into_iter());
        assert!(f(&a).len() > LIMIT_CHARS);
        assert_ne!(f(&a), f(&b));
    }
}
