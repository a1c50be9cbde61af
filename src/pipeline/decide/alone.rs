//! The decision of an admitted request to limits the in-process store
//! alone answers: the part of the phase such a request reaches.

use std::net::IpAddr;
use std::sync::Arc;

use http::Request;

use super::{Deciding, Requests, caller_of, push_requests};
use crate::decision::limiter::Limiter;
use crate::decision::stages;
use crate::pipeline::exchange::CheckedLimits;
use crate::routing::CompiledRoute;

/// Whether the decisions of `route` on `limiter` are rate decisions the
/// in-process store answers at once with nothing besides to ask or hold:
/// no plan, `exempt:`, body, shadow, delay, slot, `sync` or settled cost.
/// An admitted request to such a route, from a caller without overrides
/// and where no metrics are kept, needs no more of the phase than its
/// limit requests and the store's answer ([`admitted_at_once`]).
pub fn answered_by_store(route: &CompiledRoute, limiter: &Limiter) -> bool {
    let r = &route.route;
    limiter.in_process()
        && !r.limits.is_empty()
        && route.plan_views.is_empty()
        && r.exempt.is_none()
        && route.body_reads.is_empty()
        && !r.shadow
        && r.limits.iter().all(|l| {
            !l.shadow
                && l.delay.is_none()
                && l.concurrency.is_none()
                && l.sync.is_none()
                && l.settle.is_none()
        })
}

/// The decision of `req` (from `peer`) to a route [`answered_by_store`]
/// when its limits admit it: the caller, its limit requests and the
/// store's answer, as [`decide`](super::decide) makes them, without the rest of the
/// phase, which an admitted request of such a route does not reach
/// (exemptions, plans, overrides, settling; recording, when nothing keeps
/// metrics: an application's layer). `None` when the caller has
/// overrides, or a limit refuses: [`decide`](super::decide) then decides it, and a
/// refusal counted nothing.
pub fn admitted_at_once<B>(
    d: &Deciding<'_>,
    route: &Arc<CompiledRoute>,
    req: &Request<B>,
    peer: IpAddr,
) -> Option<CheckedLimits> {
    if !d.overrides.is_empty() {
        return None;
    }
    let now_ms = d.clock.now_ms();
    let caller = caller_of(d, route, req, peer);
    let (limits, suffixes) = route.limits_in(None);
    let mut requests = Requests::new();
    push_requests(
        &mut requests,
        d.config,
        route,
        limits,
        suffixes,
        &caller,
        None,
    );
    let answer = d.limiter.decide_now(now_ms, &requests)?;
    answer.allowed.then(|| CheckedLimits {
        route: route.clone(),
        view: None,
        decision: stages::enforced(answer),
        now_ms,
    })
}
