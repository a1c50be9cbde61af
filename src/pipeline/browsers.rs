//! The pipeline's hooks for what browsers and support need: the request
//! id when a request arrives, CORS preflights before identity and limits,
//! and the CORS policy, header rules and request id where a response
//! leaves. The rules themselves live in [`crate::cors`],
//! [`crate::request_id`] and [`crate::proxy::rules`]; this file only says
//! where in one request they apply.
//!
//! A route without `cors` and header rules pays two `Option` checks here
//! and nothing else; the request id is paid by every request.

use http::header::ORIGIN;
use http::{Request, Response};

use super::exchange::Exchange;
use super::gateway::Snapshot;
use crate::config::{Cors, HeaderRules};
use crate::problem::GatewayError;
use crate::proxy::{self, Body, Local};
use crate::{cors, request_id, target};

/// When a request arrives, before any check: its id (kept or made, and
/// left in its headers for the upstream), and its `Origin` when the top
/// level has a CORS policy, for refusals made before a route is known.
pub fn arrive<B>(rt: &Snapshot, req: &mut Request<B>, ex: &mut Exchange) {
    let cfg = &rt.config;
    ex.request_id = Some(request_id::assign(
        &cfg.request_id,
        &cfg.client_ip.trusted_proxies,
        ex.peer.ip(),
        req.headers_mut(),
    ));
    if cfg.cors.is_some() {
        ex.origin = req.headers().get(ORIGIN).cloned();
    }
}

/// Once a route is known: the `Origin`, when the route has a CORS policy.
pub fn routed<B>(req: &Request<B>, ex: &mut Exchange) {
    if ex.origin.is_none()
        && let Some(route) = &ex.route
        && route.route.cors.is_some()
    {
        ex.origin = req.headers().get(ORIGIN).cloned();
    }
}

/// The answer to a CORS preflight, when `req` is one and the route that
/// takes the method it announces has a CORS policy: never counted, never
/// forwarded. `None` lets the request go on as an ordinary `OPTIONS`.
///
/// # Errors
/// The refusals of the guard and of the canonical target, as for any
/// request.
pub fn preflight<B>(
    rt: &Snapshot,
    req: &Request<B>,
    ex: &mut Exchange,
) -> Result<Option<Response<Body>>, GatewayError> {
    let Some(method) = cors::preflight_method(req) else {
        return Ok(None);
    };
    crate::guard::check(req, &rt.config.server)?;
    let target = target::canonical(
        req.uri(),
        req.version(),
        req.headers(),
        &rt.config.server.path,
    )?;
    let Some(route) = rt.router.find(&method, target.host(), &target.match_path) else {
        return Ok(None);
    };
    let Some(policy) = &route.route.cors else {
        return Ok(None);
    };
    let res = cors::preflight(policy, req.headers());
    ex.entered(route, rt);
    Ok(Some(res))
}

/// Where a response leaves: the route's response rules (the top level's
/// when no route took the request), its CORS policy, and the request id.
pub fn leave(rt: &Snapshot, ex: &Exchange, res: &mut Response<Body>) {
    decorate(rt, ex, res);
    if let Some(id) = &ex.request_id {
        res.headers_mut()
            .insert(rt.config.request_id.header.clone(), id.clone());
    }
}

/// [`leave`] for an answer whose body carries fields a native
/// connection's writer renders: the same, with the request id added to
/// those fields. Only for a way out without response rules
/// ([`has_rules`]), which read the fields from the map.
pub fn leave_late(rt: &Snapshot, ex: &Exchange, res: &mut Response<Local>) {
    if let (Some(policy), _) = policies(rt, ex) {
        cors::decorate(policy, ex.origin.as_ref(), res.headers_mut());
    }
    if let Some(id) = &ex.request_id {
        res.body_mut()
            .fields_mut()
            .push(&rt.config.request_id.header, id);
    }
}

/// Whether a response leaving `ex` passes through response rules.
pub fn has_rules(rt: &Snapshot, ex: &Exchange) -> bool {
    policies(rt, ex).1.is_some()
}

/// The CORS policy and the response rules where `ex`'s response leaves:
/// its route's, or the top level's when no route took the request.
fn policies<'a>(rt: &'a Snapshot, ex: &'a Exchange) -> (Option<&'a Cors>, Option<&'a HeaderRules>) {
    match &ex.route {
        Some(r) => (r.route.cors.as_deref(), r.route.response_headers.as_deref()),
        None => (
            rt.config.cors.as_deref(),
            rt.config.response_headers.as_deref(),
        ),
    }
}

/// The response rules and the CORS policy applied to `res`.
fn decorate(rt: &Snapshot, ex: &Exchange, res: &mut Response<Body>) {
    let (policy, rules) = policies(rt, ex);
    if policy.is_none() && rules.is_none() {
        return;
    }
    // Both read the answer's fields, and rules remove and append.
    crate::http1::text_fields::materialize(res);
    let preflight = policy.is_some() && res.extensions().get::<cors::Preflight>().is_some();
    let headers = res.headers_mut();
    if let Some(rules) = rules {
        proxy::rules::apply(rules, headers);
    }
    if let Some(policy) = policy.filter(|_| !preflight) {
        cors::decorate(policy, ex.origin.as_ref(), headers);
    }
}
