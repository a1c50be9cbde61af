//! What the replay counts, as it goes: per route and per limit, requests
//! and denials, by identity and by minute.
//!
//! Identities are kept by their text as the store key writes them
//! (`ip=192.0.2.7/32`, `key=…`), so the counts are exact; memory grows
//! with the distinct identities and minutes seen, never with the lines.
//! Digests for the report are made at the end, for the few shown.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hash, Hasher};
use std::sync::Arc;

use crate::config::{Config, Limit};
use crate::decision::Decision;
use crate::limit::Algorithm;
use crate::limit::Verdict;
use crate::pipeline::Rehearsal;
use crate::pipeline::exchange::Strongest;
use crate::problem::GatewayError;

/// Requests and the share of them denied.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RequestCounts {
    /// Requests counted.
    pub requests: u64,
    /// Of them, denied (would be, for a shadow limit).
    pub limited: u64,
}

impl RequestCounts {
    fn add(&mut self, limited: bool) {
        self.requests += 1;
        self.limited += u64::from(limited);
    }
}

/// One minute of a timeline.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Minute {
    /// Minutes since the epoch.
    pub minute: u64,
    /// Requests and denials in it.
    pub counts: RequestCounts,
    /// Of the requests, those only a shadow limit would have denied.
    pub shadow_limited: u64,
}

/// Counts per minute, in time order (the replay clock never goes back).
#[derive(Debug, Default, Clone)]
pub struct Timeline(pub Vec<Minute>);

impl Timeline {
    fn at(&mut self, minute: u64) -> &mut Minute {
        if self.0.last().is_none_or(|m| m.minute != minute) {
            self.0.push(Minute {
                minute,
                ..Minute::default()
            });
        }
        let last = self.0.len() - 1;
        &mut self.0[last]
    }
}

/// A fast hash for the tallies' maps (the multiply-rotate of rustc's
/// `FxHasher`). Not resistant to chosen collisions, which only a log
/// written to slow its own replay down could aim at.
#[derive(Debug, Default, Clone, Copy)]
pub struct Fx(u64);

impl Fx {
    #[inline]
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

impl Hasher for Fx {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0; 8];
            w.copy_from_slice(c);
            self.add(u64::from_le_bytes(w));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut w = [0; 8];
            w[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(w));
        }
    }

    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.add(u64::from(i));
    }

    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }

    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
}

/// Counts per identity.
#[derive(Debug, Clone)]
pub struct IdentityTally<K>(pub HashMap<K, RequestCounts, BuildHasherDefault<Fx>>);

impl<K> Default for IdentityTally<K> {
    fn default() -> Self {
        Self(HashMap::default())
    }
}

impl<K: Hash + Eq> IdentityTally<K> {
    fn add<Q>(&mut self, id: &Q, limited: bool)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned + ?Sized,
        Q::Owned: Into<K>,
    {
        match self.0.get_mut(id) {
            Some(c) => c.add(limited),
            None => {
                let mut c = RequestCounts::default();
                c.add(limited);
                self.0.insert(id.to_owned().into(), c);
            }
        }
    }

    /// Distinct identities, and how many of them were denied at least once.
    pub fn distinct(&self) -> (u64, u64) {
        let limited = self.0.values().filter(|c| c.limited > 0).count();
        (self.0.len() as u64, limited as u64)
    }
}

/// A limit's numbers, as the report states them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Quota {
    /// Every request met the same numbers.
    Fixed {
        /// Requests (cost units) per window.
        limit: u64,
        /// Window length in ms.
        window_ms: u64,
        /// The algorithm.
        algorithm: Algorithm,
    },
    /// The numbers came from callers' plans and differed between them.
    Varies,
}

impl Quota {
    fn of(l: &Limit) -> Self {
        Self::Fixed {
            limit: l.limit.get(),
            window_ms: l.window_ms.get(),
            algorithm: l.algorithm,
        }
    }
}

/// One limit of one route.
#[derive(Debug, Clone)]
pub struct LimitTally {
    /// Its name (a plan's limit names when it comes from plans).
    pub name: Arc<str>,
    /// Whether it is in shadow mode.
    pub shadow: bool,
    /// Its numbers.
    pub quota: Quota,
    /// Requests it decided and denied.
    pub counts: RequestCounts,
    /// By the identity it counts (its text in the store key).
    pub identities: IdentityTally<Box<str>>,
    /// By minute.
    pub timeline: Timeline,
}

/// One route.
#[derive(Debug, Clone)]
pub struct RouteTally {
    /// The route's name.
    pub name: Arc<str>,
    /// Requests the route took, and those answered 429.
    pub counts: RequestCounts,
    /// Forwarded, but a shadow limit would have denied them.
    pub shadow_limited: u64,
    /// Refused for want of a plan (401).
    pub rejected: u64,
    /// Let through uncounted: the caller is exempt.
    pub exempt: u64,
    /// By the caller's strongest identity (API key, user, IP); only on
    /// routes with limits.
    pub callers: IdentityTally<Strongest>,
    /// By minute.
    pub timeline: Timeline,
    /// The limits met, in order of first use.
    pub limits: Vec<LimitTally>,
}

/// Everything a replay counted for one configuration.
#[derive(Debug, Clone)]
pub struct Tally {
    /// Per route, in configuration order.
    pub routes: Vec<RouteTally>,
    /// Requests no route took (404).
    pub unrouted: u64,
    /// Requests refused before routing (a bad or oversized target, 400/414/431).
    pub refused: u64,
    /// The first few reasons for those refusals.
    pub refusals: Vec<String>,
}

/// Refusal reasons kept.
const REFUSALS_SHOWN: usize = 5;

impl Tally {
    /// An empty tally for `config`'s routes.
    pub fn new(config: &Config) -> Self {
        Self {
            routes: config
                .routes
                .iter()
                .map(|r| RouteTally {
                    name: r.name.clone(),
                    counts: RequestCounts::default(),
                    shadow_limited: 0,
                    rejected: 0,
                    exempt: 0,
                    callers: IdentityTally::default(),
                    timeline: Timeline::default(),
                    limits: Vec::new(),
                })
                .collect(),
            unrouted: 0,
            refused: 0,
            refusals: Vec::new(),
        }
    }

    /// Counts what the phases made of one request, in minute `minute`.
    pub fn add(&mut self, minute: u64, r: &Rehearsal) {
        let ex = &r.exchange;
        let Some(route) = ex.route.as_ref().and_then(|c| self.routes.get_mut(c.index)) else {
            match &r.refusal {
                Some(GatewayError::NoRoute { .. }) => self.unrouted += 1,
                other => {
                    self.refused += 1;
                    if self.refusals.len() < REFUSALS_SHOWN
                        && let Some(e) = other
                    {
                        self.refusals.push(format!("{} {e}", e.status().as_u16()));
                    }
                }
            }
            return;
        };
        let limited = matches!(r.refusal, Some(GatewayError::Limited { .. }));
        let shadow = ex.decision().is_some_and(Decision::shadow_denied) && !limited;
        route.counts.add(limited);
        route.shadow_limited += u64::from(shadow);
        route.rejected += u64::from(matches!(r.refusal, Some(GatewayError::UnknownApiKey)));
        route.exempt += u64::from(ex.exempt);
        let m = route.timeline.at(minute);
        m.counts.add(limited);
        m.shadow_limited += u64::from(shadow);
        let ids = &r.identities;
        if let Some(caller) = &ids.caller {
            route.callers.add(caller, limited || shadow);
        }
        let route_shadow = ex.route.as_ref().is_some_and(|c| c.route.shadow);
        let Some(checked) = &ex.checked else { return };
        let Decision::Decided(d) = &checked.decision else {
            return;
        };
        for ((limit, verdict), key) in checked.limits().iter().zip(&d.verdicts).zip(&ids.keys) {
            // `None`: only read, not decided (an enforced limit denied first).
            let Some(v) = verdict else { continue };
            let denied = matches!(v, Verdict::Limited | Verdict::ShadowLimited);
            let t = limit_tally(&mut route.limits, limit, route_shadow);
            t.counts.add(denied);
            t.identities.add(identity_of(key), denied);
            t.timeline.at(minute).counts.add(denied);
        }
    }
}

/// The identity part of a store key: between its first `{` and last `}`.
fn identity_of(key: &str) -> &str {
    match (key.find('{'), key.rfind('}')) {
        (Some(a), Some(b)) if a < b => &key[a + 1..b],
        _ => key,
    }
}

/// The tally of `limit` among `limits`, added on first use.
fn limit_tally<'a>(
    limits: &'a mut Vec<LimitTally>,
    limit: &Limit,
    route_shadow: bool,
) -> &'a mut LimitTally {
    let i = match limits.iter().position(|t| t.name == limit.name) {
        Some(i) => {
            let t = &mut limits[i];
            if t.quota != Quota::Varies && t.quota != Quota::of(limit) {
                t.quota = Quota::Varies;
            }
            i
        }
        None => {
            limits.push(LimitTally {
                name: limit.name.clone(),
                shadow: route_shadow || limit.shadow,
                quota: Quota::of(limit),
                counts: RequestCounts::default(),
                identities: IdentityTally::default(),
                timeline: Timeline::default(),
            });
            limits.len() - 1
        }
    };
    &mut limits[i]
}
