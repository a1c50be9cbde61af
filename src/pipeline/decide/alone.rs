//! The decision of an admitted request to limits the in-process store
//! alone answers: the part of the phase such a request reaches.

use std::net::IpAddr;
use std::sync::Arc;

use http::Request;

use super::{Deciding, Requests, caller_of, mode, push_requests};
use crate::decision::limiter::Limiter;
use crate::decision::settle;
use crate::decision::stages;
use crate::identity;
use crate::limit::{Algorithm, LimitRequest, Mode};
use crate::pipeline::exchange::CheckedLimits;
use crate::routing::CompiledRoute;
use crate::store::keys::StoreKey;

/// A route whose decisions the in-process store answers at once with
/// nothing besides to ask or hold ([`answered_by_store`]), with its limit
/// requests as far as they are known before the caller is.
#[derive(Debug)]
pub struct StoreAlone {
    /// Each limit's request but its address, when every limit counts by
    /// the client IP alone (a [`StoreKey::Address`]); `None` when a key is
    /// written out, and the requests are made as [`decide`](super::decide)
    /// makes them.
    by_address: Option<Vec<ByAddress>>,
}

/// A limit's request, made once, but for the caller's address.
#[derive(Debug, Clone, Copy)]
struct ByAddress {
    id: u32,
    limit: u64,
    window_ms: u64,
    cost: u64,
    algorithm: Algorithm,
    mode: Mode,
}

/// Whether the decisions of `route` on `limiter` are rate decisions the
/// in-process store answers at once with nothing besides to ask or hold:
/// no plan, `exempt:`, body, shadow, delay, slot, `sync` or settled cost.
/// An admitted request to such a route, from a caller without overrides
/// and where no metrics are kept, needs no more of the phase than its
/// limit requests and the store's answer ([`admitted_at_once`]).
pub fn answered_by_store(route: &CompiledRoute, limiter: &Limiter) -> Option<StoreAlone> {
    let r = &route.route;
    let alone = limiter.in_process()
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
        });
    alone.then(|| StoreAlone {
        by_address: r
            .limits
            .iter()
            .zip(&route.key_suffixes)
            .map(|(l, suffix)| {
                Some(ByAddress {
                    id: suffix.id()?,
                    limit: l.limit.get(),
                    window_ms: l.window_ms.get(),
                    cost: settle::reserve(l, r.cost, None, None),
                    algorithm: l.algorithm,
                    mode: mode(l, route),
                })
            })
            .collect(),
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
    alone: &StoreAlone,
    req: &Request<B>,
    peer: IpAddr,
) -> Option<CheckedLimits> {
    if !d.overrides.is_empty() {
        return None;
    }
    let now_ms = d.clock.now_ms();
    let mut requests = Requests::new();
    match &alone.by_address {
        Some(asked) => {
            // The limits read the client's address alone: the caller's
            // other values are not looked up.
            let ip = &d.config.client_ip;
            let net = identity::group(identity::client_ip(ip, peer, req.headers()), ip.ipv6_prefix);
            for a in asked {
                requests.push(LimitRequest {
                    key: StoreKey::Address { limit: a.id, net },
                    limit: a.limit,
                    window_ms: a.window_ms,
                    cost: a.cost,
                    algorithm: a.algorithm,
                    mode: a.mode,
                });
            }
        }
        None => {
            let caller = caller_of(d, route, req, peer);
            let (limits, suffixes) = route.limits_in(None);
            push_requests(
                &mut requests,
                d.config,
                route,
                limits,
                suffixes,
                &caller,
                None,
            );
        }
    }
    let answer = d.limiter.decide_now(now_ms, &requests)?;
    answer.allowed.then(|| CheckedLimits {
        route: route.clone(),
        view: None,
        decision: stages::enforced(answer),
        now_ms,
    })
}
