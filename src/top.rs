//! The bounded "top offenders" view: who a limit denies (or, in shadow
//! mode, would deny), without a metric series per identity.
//!
//! Each limit keeps a Space-Saving summary (Metwally, Agrawal, El Abbadi,
//! "Efficient Computation of Frequent and Top-k Elements in Data Streams",
//! 2005) of at most [`CAPACITY`] entries. An identity already tracked is
//! counted exactly from the moment it entered; a new identity, when the
//! summary is full, replaces the smallest entry and inherits its count as an
//! over-estimate (`error`). Every identity whose true count exceeds
//! `denials / CAPACITY` is guaranteed to be in the summary, and a count is
//! never below the truth nor above it by more than its `error`. Memory is
//! `CAPACITY` entries per limit, whatever the traffic.
//!
//! Identities are shown as [`identity::write_shown`] writes them with every
//! value as its digest (`key=sha256:6ab9f1eb8f7d3388`, `ip=sha256:…`,
//! parts of compound keys joined with `,`): an API key by the digest the
//! support API takes in its place, other values pseudonymous, not
//! anonymous — an IPv4 address can be found by hashing all of them — so the
//! view lives on the admin listener only. An operator checks a suspect with
//! `printf %s 192.0.2.7/32 | sha256sum | cut -c1-16`. The API key of an
//! entry is kept beside it, never shown, so that the support API can
//! look up and reset a caller named by the digest ([`TopOffenders::api_key`]).
//!
//! Summaries are keyed by route and limit name and survive a reload; each
//! has its own lock, taken only when that limit denies.

use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, Hasher, RandomState};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use serde::Serialize;

use crate::identity;

/// Entries kept per limit.
pub const CAPACITY: usize = 32;

#[derive(Debug, Clone, Serialize)]
struct Entry {
    /// What is shown: the identity with every value as its digest.
    identity: String,
    /// The API key of the identity, if it holds one: never shown, kept for
    /// [`TopOffenders::api_key`].
    #[serde(skip)]
    api_key: Option<Box<[u8]>>,
    /// What entries are matched by: a per-process keyed hash of the raw
    /// identity, so a denial of an identity already tracked (the flood the
    /// view is for) costs no SHA-256. Never shown.
    #[serde(skip)]
    tag: u64,
    count: u64,
    error: u64,
}

/// A Space-Saving summary of one limit's denials.
#[derive(Debug, Default)]
struct Summary {
    shadow: bool,
    denied: u64,
    entries: Vec<Entry>,
}

impl Summary {
    fn record(&mut self, tag: u64, denied: &Denied<'_>) {
        self.denied += 1;
        if let Some(e) = self.entries.iter_mut().find(|e| e.tag == tag) {
            e.count += 1;
            return;
        }
        if self.entries.len() < CAPACITY {
            self.entries.push(Entry {
                identity: (denied.shown)(),
                api_key: denied.api_key.map(Box::from),
                tag,
                count: 1,
                error: 0,
            });
            return;
        }
        // Replace the smallest: the newcomer may have been counted there.
        if let Some(min) = self.entries.iter_mut().min_by_key(|e| e.count) {
            let floor = min.count;
            *min = Entry {
                identity: (denied.shown)(),
                api_key: denied.api_key.map(Box::from),
                tag,
                count: floor + 1,
                error: floor,
            };
        }
    }
}

/// One denied identity, as [`TopOffenders::record`] is told it.
pub struct Denied<'a> {
    /// The identity part of the store key, as written (matched on, never
    /// kept).
    pub identity: &'a str,
    /// How the identity is shown, made only when it enters the summary, so
    /// a denial of an identity already tracked costs no SHA-256.
    pub shown: &'a dyn Fn() -> String,
    /// The API key the identity holds, if any.
    pub api_key: Option<&'a [u8]>,
}

/// One limit's view, as `/admin/top` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct LimitTop {
    /// Route name.
    pub route: String,
    /// Limit name.
    pub limit: String,
    /// Whether the last recorded denial was a shadow one (would-be denial).
    pub shadow: bool,
    /// Every denial recorded for this limit.
    pub denied: u64,
    /// Heaviest identities first.
    top: Vec<Entry>,
}

impl LimitTop {
    /// Each entry's identity as shown and its count, heaviest first.
    pub fn counts(&self) -> impl Iterator<Item = (&str, u64)> {
        self.top.iter().map(|e| (e.identity.as_str(), e.count))
    }
}

/// A route and limit name.
type LimitId = (Arc<str>, Arc<str>);

/// Hashes the names of [`LimitId`]s: FNV-1a, unkeyed, since the names
/// come from the configuration, not from callers, and a denial looks its
/// limit up at a few instructions a byte instead of a keyed SipHash's
/// hundreds.
struct NameHasher(u64);

impl Default for NameHasher {
    fn default() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }
}

impl Hasher for NameHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// Summaries for every limit that has denied something.
#[derive(Debug, Default)]
pub struct TopOffenders {
    limits: RwLock<HashMap<LimitId, Arc<Mutex<Summary>>, BuildHasherDefault<NameHasher>>>,
    /// Keys [`Entry::tag`].
    tags: RandomState,
}

impl TopOffenders {
    /// Counts one denial of `denied` by `limit` of `route`.
    pub fn record(&self, route: &Arc<str>, limit: &Arc<str>, denied: &Denied<'_>, shadow: bool) {
        // The identity's bytes alone: one value needs no terminator.
        let mut tag = self.tags.build_hasher();
        tag.write(denied.identity.as_bytes());
        let tag = tag.finish();
        let key = (route.clone(), limit.clone());
        let summary = {
            let read = self.limits.read().unwrap_or_else(PoisonError::into_inner);
            read.get(&key).cloned()
        };
        let summary = match summary {
            Some(s) => s,
            None => self
                .limits
                .write()
                .unwrap_or_else(PoisonError::into_inner)
                .entry(key)
                .or_default()
                .clone(),
        };
        let mut s = summary.lock().unwrap_or_else(PoisonError::into_inner);
        s.shadow = shadow;
        s.record(tag, denied);
    }

    /// The API key whose [`identity::digest`] is `digest`, among the
    /// identities some limit's summary holds now.
    pub fn api_key(&self, digest: &str) -> Option<Box<[u8]>> {
        let read = self.limits.read().unwrap_or_else(PoisonError::into_inner);
        read.values().find_map(|s| {
            let s = s.lock().unwrap_or_else(PoisonError::into_inner);
            s.entries
                .iter()
                .filter_map(|e| e.api_key.as_ref())
                .find(|k| identity::digest(k) == digest)
                .cloned()
        })
    }

    /// Every limit's summary, heaviest identities first, at most `n` each.
    pub fn snapshot(&self, n: usize) -> Vec<LimitTop> {
        let read = self.limits.read().unwrap_or_else(PoisonError::into_inner);
        let mut out: Vec<LimitTop> = read
            .iter()
            .map(|((route, limit), s)| {
                let s = s.lock().unwrap_or_else(PoisonError::into_inner);
                let mut top = s.entries.clone();
                top.sort_by(|a, b| b.count.cmp(&a.count).then(a.identity.cmp(&b.identity)));
                top.truncate(n);
                LimitTop {
                    route: route.to_string(),
                    limit: limit.to_string(),
                    shadow: s.shadow,
                    denied: s.denied,
                    top,
                }
            })
            .collect();
        out.sort_by(|a, b| (&a.route, &a.limit).cmp(&(&b.route, &b.limit)));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn denial<'a>(
        identity: &'a str,
        shown: &'a dyn Fn() -> String,
        key: Option<&'a [u8]>,
    ) -> Denied<'a> {
        Denied {
            identity,
            shown,
            api_key: key,
        }
    }

    #[test]
    fn heavy_hitter_survives_a_flood_of_one_off_identities() {
        let top = TopOffenders::default();
        let (r, l): (Arc<str>, Arc<str>) = ("r".into(), "l".into());
        let heavy = || format!("key={}", identity::digest(b"heavy"));
        for i in 0..10_000u32 {
            let ip = format!("ip=10.0.{}.{}/32", i / 256, i % 256);
            let shown = || ip.clone();
            top.record(&r, &l, &denial(&ip, &shown, None), true);
            if i % 10 == 0 {
                top.record(&r, &l, &denial("key=heavy", &heavy, Some(b"heavy")), true);
            }
        }
        let snap = top.snapshot(3);
        assert_eq!(snap.len(), 1);
        assert_eq!(snap[0].denied, 11_000);
        let first = &snap[0].top[0];
        assert_eq!(first.identity, heavy());
        // Never under-counted, over-counted by at most `error`.
        assert!(first.count >= 1000 && first.count - first.error <= 1000);
        assert_eq!(
            top.limits.read().unwrap()[&(r, l)]
                .lock()
                .unwrap()
                .entries
                .len(),
            CAPACITY
        );
        // The key is found by its digest, and by nothing else.
        let digest = identity::digest(b"heavy");
        assert_eq!(top.api_key(&digest).as_deref(), Some(&b"heavy"[..]));
        assert_eq!(top.api_key(&identity::digest(b"light")), None);
        let json = serde_json::to_string(&snap).unwrap();
        assert!(!json.contains("\"heavy\""), "{json}");
    }
}
