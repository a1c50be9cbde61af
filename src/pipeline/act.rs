//! Phase 3: answer the admitted request — locally for `respond:` routes, or
//! by forwarding it upstream (passing an upgrade through when the route
//! allows one).

use std::time::Instant;

use http::header::CONTENT_TYPE;
use http::{Request, Response};
use http_body_util::Either;

use super::gateway::{Gateway, Snapshot};
use super::held;
use super::observe::{self, PoolAnswer};
use crate::config::{Action, PlansFrom, Respond, Upstream};
use crate::decision::slots::Slots;
use crate::identity;
use crate::problem::GatewayError;
use crate::proxy::{self, Answered, Balancer, Body, ClientBody, Hop, Local, Secure, Watched};
use crate::routing::CompiledRoute;
use crate::upgrade;

/// The answer of the route's action.
///
/// # Errors
/// A [`GatewayError`] of the forward: the upstream's fault (unreachable,
/// timed out, failed) or the client's (its body broke, ended early or
/// passed `server.max_body_size`).
pub async fn act(
    gw: &Gateway,
    rt: &Snapshot,
    route: &CompiledRoute,
    req: Request<ClientBody>,
    peer: std::net::IpAddr,
    slots: Option<Slots>,
) -> Result<Response<Body>, GatewayError> {
    match &route.route.action {
        // A local answer: the slots go back as it is made.
        Action::Respond(r) => Ok(respond(r)),
        // Pinned where it is made, not copied into this future (see
        // `Gateway::answer`).
        Action::Upstream(up) => std::pin::pin!(forward(gw, rt, route, req, up, peer, slots)).await,
    }
}

/// The caller's hash for a `balance: hash` pool; `None` for other pools
/// and for a caller without every part of the key, who is balanced by
/// least request instead of being one "absent" caller on one target.
fn hash_key(
    b: &Balancer,
    cfg: &crate::config::Config,
    peer: std::net::IpAddr,
    req: &Request<ClientBody>,
) -> Option<u64> {
    let spec = b.config.hash_key.as_ref()?;
    let idc = identity::IdentityConfig {
        client_ip: &cfg.client_ip,
        api_keys: &cfg.api_keys,
        users: &cfg.users,
        plans_from: &cfg.plans_from,
    };
    let caller = identity::caller(idc, peer, req.headers());
    let mut key = String::new();
    for chain in &spec.parts {
        key.push(',');
        if !chain
            .iter()
            .any(|source| identity::write_source(&mut key, source, &caller))
        {
            return None;
        }
    }
    Some(proxy::hash_key(key.as_bytes()))
}

/// Under `plans_from: header:NAME` only a trusted proxy names a plan: the
/// header the rewrite drops from anyone else, as it drops the user header.
fn plan_header(plans_from: &PlansFrom) -> Option<&http::HeaderName> {
    match plans_from {
        PlansFrom::Header(name) => Some(name),
        PlansFrom::ApiKey | PlansFrom::Claim(_) => None,
    }
}

/// Names the pool target that answered, and its tries, for the access
/// log; only when a line will be written.
#[inline]
fn name_target<B>(gw: &Gateway, b: &Balancer, a: &Answered, res: &mut Response<B>) {
    if observe::logging(gw.access_log.as_ref()) {
        res.extensions_mut().insert(PoolAnswer {
            tries: a.tries,
            target: b.config.targets[a.target].url.clone(),
            addr: a.addr,
        });
    }
}

fn respond(r: &Respond) -> Response<Body> {
    let mut res = Response::new(Either::Right(Local::new(r.body.clone())));
    *res.status_mut() = r.status;
    res.headers_mut()
        .insert(CONTENT_TYPE, r.content_type.clone());
    res
}

/// Rewrites `req` into the request to `up` from `peer`
/// ([`proxy::rewrite`]); with `native` (tollgate's own client writes it,
/// and nothing changes its headers before), as
/// [`proxy::rewrite_for_native`] does, returning the forwarding fields it
/// left out of the map.
#[inline]
fn rewrite(
    cfg: &crate::config::Config,
    req: &mut Request<ClientBody>,
    up: &Upstream,
    peer: std::net::IpAddr,
    native: bool,
) -> Result<Option<proxy::Forwarding>, GatewayError> {
    let hop = Hop {
        peer,
        trusted: identity::is_trusted(&cfg.client_ip.trusted_proxies, peer),
        scheme: if req.extensions().get::<Secure>().is_some() {
            "https"
        } else {
            "http"
        },
        user_header: &cfg.users.header,
        plan_header: plan_header(&cfg.plans_from),
    };
    if native {
        proxy::rewrite_for_native(req, up, hop)
    } else {
        proxy::rewrite(req, up, hop).map(|()| None)
    }
    .map_err(|e| GatewayError::UpstreamFailed(e.to_string()))
}

/// Whether tollgate's own client writes the head from the request as the
/// rewrite leaves it: its connections carry it, and nothing changes its
/// headers before.
fn writes_own_head(
    gw: &Gateway,
    route: &CompiledRoute,
    balancer: Option<&Balancer>,
    conns: Option<&proxy::KeepAlive>,
) -> bool {
    let own = match balancer {
        Some(b) => gw.forwarder.native_pool(&b.config),
        None => conns.is_some_and(proxy::KeepAlive::is_native),
    };
    own && route.route.request_headers.is_none()
}

async fn forward(
    gw: &Gateway,
    rt: &Snapshot,
    route: &CompiledRoute,
    mut req: Request<ClientBody>,
    up: &Upstream,
    peer: std::net::IpAddr,
    slots: Option<Slots>,
) -> Result<Response<Body>, GatewayError> {
    let cfg = &rt.config;
    let upgrade = if up.upgrade {
        upgrade::take(&mut req)
    } else {
        None
    };
    let balancer = rt
        .route_balancers
        .get(route.index)
        .and_then(Option::as_deref);
    // Read before the rewrite drops what an untrusted peer may not set;
    // only a pool that hashes calls for it.
    let key = balancer
        .filter(|b| b.config.hash_key.is_some())
        .and_then(|b| hash_key(b, cfg, peer, &req));
    let conns = match balancer {
        Some(_) => None,
        None => rt.keep_alive.get(route.index).and_then(Option::as_deref),
    };
    let native = writes_own_head(gw, route, balancer, conns) && upgrade.is_none();
    let forwarding = rewrite(cfg, &mut req, up, peer, native)?;
    if let Some(rules) = &route.route.request_headers {
        proxy::rules::apply(rules, req.headers_mut());
    }
    if let Some(u) = &upgrade {
        u.restore(req.headers_mut());
    }
    let sent = Instant::now();
    // Which of a pool's tries answered, written beside the response.
    let mut answered = None;
    let mut res = match balancer {
        Some(b) => {
            std::pin::pin!(gw.forwarder.send_to_pool(
                req,
                up,
                b,
                rt.resolver.as_ref(),
                key,
                cfg.server.max_body_size,
                sent,
                &mut answered,
                forwarding,
            ))
            .await?
        }
        None => {
            std::pin::pin!(gw.forwarder.send(
                req,
                up,
                conns,
                cfg.server.max_body_size,
                forwarding,
                sent
            ))
            .await?
        }
    };
    let answered = balancer.zip(answered);
    if let Some(m) = rt.route_metrics.get(route.index).and_then(Option::as_ref) {
        // A pool's answer read the clock already.
        let took = answered
            .as_ref()
            .map_or_else(|| sent.elapsed(), |(_, a)| a.since_sent);
        m.upstream_response(res.status(), took);
    }
    // The target stays counted in flight until the body ends.
    let in_flight = answered.map(|(b, a)| {
        name_target(gw, b, &a, &mut res);
        a.in_flight
    });
    // The slots live as long as the response: its body, or the tunnel.
    let mut slots = slots.filter(|s| !s.is_empty());
    if let Some(mut u) = upgrade {
        if let Some(s) = slots.take_if(|_| held::switching(&res)) {
            u.hold(Box::new(s));
        }
        u.finish(&mut res);
    }
    Ok(res.map(|b| {
        let mut body = Watched::new(b);
        if let Some(s) = slots {
            body.add_watch(held::watch(s));
        }
        if let Some(f) = in_flight {
            body.hold(f);
        }
        Either::Left(body)
    }))
}
