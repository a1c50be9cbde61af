//! Shadow limits decided beside the enforced ones: `shadow: true` on a route or on
//! one limit forwards every request but still decides, counts, logs and
//! shows (in the `RateLimit` header) what the limit would have done.
//!
//! What a shadow limit does to counters is chosen so that its numbers are
//! the ones enforcement would produce, and the enforced limits are untouched:
//!
//! - A route whose limits are all shadow is decided exactly as if enforced,
//!   in one store call: a would-be-denied request consumes nothing, as an
//!   enforced denial would not.
//! - A route mixing enforced and shadow limits makes two calls. The enforced
//!   limits are decided first, together, exactly as without the shadow ones.
//!   Only when they admit are the shadow limits decided (together, so a
//!   would-be-denied request consumes nothing from them); a request the
//!   enforced limits deny is never counted by a shadow limit, since
//!   enforcement would never have let it reach it. A shadow-denied request
//!   has been forwarded and stays counted by the enforced limits — it did
//!   use the upstream.
//! - When the enforced limits deny, the shadow limits are read without
//!   consuming (a call with cost 0) so the 429 still carries their
//!   `RateLimit` entries; such a read is not counted as a decision.
//!
//! So a shadow limit costs one more store call per request on routes that
//! mix the two; the roll-out recipe in docs/operations.md flips it to enforced once
//! its numbers look right.

use std::borrow::Borrow;
use tracing::info;

use super::limiter::Limiter;
use super::{Decided, RouteDecision};
use crate::config::{Limit, OnError};
use crate::identity::{self, Caller};
use crate::limit::{LimitOutcome, LimitRequest, Outcomes, Verdict};
use crate::metrics::RouteMetrics;
use crate::top::{self, TopOffenders};
use smallvec::SmallVec;
use std::sync::Arc;

/// Limit `l`'s `sync` interval in ms; 0 when it is decided in Redis.
fn sync_ms(l: &Limit) -> u64 {
    l.sync.map_or(0, |d| {
        u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
    })
}

/// Whether limit `l` of a route is in shadow mode.
pub fn is_shadow(route_shadow: bool, l: &Limit) -> bool {
    route_shadow || l.shadow
}

fn verdict(o: &LimitOutcome, shadow: bool) -> Verdict {
    match (o.admits, shadow) {
        (true, _) => Verdict::Allowed,
        (false, false) => Verdict::Limited,
        (false, true) => Verdict::ShadowLimited,
    }
}

/// Decides `requests` (one per limit of `limits`, same order) at `now_ms`.
/// The limits may be the route's own or references to some of them.
pub async fn decide<L: Borrow<Limit>>(
    limiter: &Limiter,
    now_ms: u64,
    limits: &[L],
    route_shadow: bool,
    requests: &[LimitRequest],
    on_error: Option<OnError>,
) -> RouteDecision {
    let n_shadow = limits
        .iter()
        .filter(|l| is_shadow(route_shadow, (*l).borrow()))
        .count();

    // All enforced, or all shadow: one call, exactly as enforcement decides.
    if n_shadow == 0 || n_shadow == limits.len() {
        let all_shadow = n_shadow > 0;
        let sync: SmallVec<[u64; 4]> = limits.iter().map(|l| sync_ms(l.borrow())).collect();
        return match limiter.decide_with(now_ms, requests, &sync, on_error).await {
            Ok(d) => RouteDecision::Decided(Decided {
                allowed: d.allowed || all_shadow,
                verdicts: d
                    .outcomes
                    .iter()
                    .map(|o| Some(verdict(o, all_shadow)))
                    .collect(),
                outcomes: Some(d.outcomes),
            }),
            Err(u) => RouteDecision::Undecided(u),
        };
    }
    decide_mixed(limiter, now_ms, limits, route_shadow, requests, on_error).await
}

/// Some limits enforced, some shadow: the enforced ones first, then the
/// shadow ones — for real when the request is admitted, only read when it
/// is denied.
async fn decide_mixed<L: Borrow<Limit>>(
    limiter: &Limiter,
    now_ms: u64,
    limits: &[L],
    route_shadow: bool,
    requests: &[LimitRequest],
    on_error: Option<OnError>,
) -> RouteDecision {
    let (enforced, shadowed): (Vec<usize>, Vec<usize>) =
        (0..limits.len()).partition(|&i| !is_shadow(route_shadow, limits[i].borrow()));
    let sync = |idx: &[usize]| -> SmallVec<[u64; 4]> {
        idx.iter()
            .filter_map(|&i| limits.get(i).map(|l| sync_ms(l.borrow())))
            .collect()
    };
    let pick = |idx: &[usize], cost_zero: bool| -> Vec<LimitRequest> {
        idx.iter()
            .filter_map(|&i| requests.get(i).cloned())
            .map(|mut r| {
                if cost_zero {
                    r.cost = 0;
                }
                r
            })
            .collect()
    };
    let de = match limiter
        .decide_with(now_ms, &pick(&enforced, false), &sync(&enforced), on_error)
        .await
    {
        Ok(d) => d,
        Err(u) => return RouteDecision::Undecided(u),
    };
    let mut verdicts = vec![None; limits.len()];
    let mut outcomes: Vec<Option<LimitOutcome>> = vec![None; limits.len()];
    for (&i, o) in enforced.iter().zip(&de.outcomes) {
        verdicts[i] = Some(verdict(o, false));
        outcomes[i] = Some(*o);
    }
    let read_only = !de.allowed;
    if let Ok(ds) = limiter
        .decide_with(
            now_ms,
            &pick(&shadowed, read_only),
            &sync(&shadowed),
            on_error,
        )
        .await
    {
        for (&i, o) in shadowed.iter().zip(&ds.outcomes) {
            if !read_only {
                verdicts[i] = Some(verdict(o, true));
            }
            outcomes[i] = Some(*o);
        }
    }
    RouteDecision::Decided(Decided {
        allowed: de.allowed,
        outcomes: outcomes.into_iter().collect::<Option<Outcomes>>(),
        verdicts,
    })
}

/// Counts each limit's verdict, feeds the top-offenders view with every
/// denial, and logs each would-be denial of a shadow limit.
/// The identity of a denial is written again from `caller` rather than
/// read from the store key, which may hold only its digest.
pub fn record(
    rd: &RouteDecision,
    route_name: &Arc<str>,
    limits: &[Limit],
    caller: &Caller<'_>,
    metrics: Option<&RouteMetrics>,
    top: &TopOffenders,
) {
    if let Some(m) = metrics {
        // Per-limit series exist for the route's configured limits; a plan
        // view (`plan: true` expanded) has other limits and is not counted
        // per limit.
        if m.limits.len() == limits.len() {
            match rd {
                RouteDecision::Decided(d) => {
                    for (lm, v) in m.limits.iter().zip(&d.verdicts) {
                        if let Some(v) = v {
                            lm.count(*v);
                        }
                    }
                }
                // Undecided: every limit counts an error.
                RouteDecision::Undecided(_) => {
                    for lm in &m.limits {
                        lm.count(Verdict::Error);
                    }
                }
            }
        }
    }
    for (i, shadow) in rd.denied() {
        let Some(limit) = limits.get(i) else {
            continue;
        };
        let mut identity = String::with_capacity(48);
        identity::write_key(&mut identity, &limit.key, caller);
        let identity = identity.as_str();
        top.record(route_name, &limit.name, identity, shadow);
        if shadow {
            info!(
                route = %route_name,
                limit = %limit.name,
                identity = %top::hash_identity(identity),
                "shadow limit would have denied this request"
            );
        }
    }
}
