//! The pipeline's hooks for tracing ([`crate::telemetry`]): when a request
//! arrives, whether it is traced and the `traceparent` its upstream gets;
//! when its response head is ready, its span's end. The span itself, the
//! sampling and the export live in `telemetry`; this file only says where
//! in one request they apply and what the span is told.
//!
//! With tracing off the gateway has no tracer, and a request pays one
//! `Option` check here and one at its end.

use http::{Request, Response};

use super::exchange::Exchange;
use super::gateway::{Gateway, Snapshot};
use super::observe::{AccessDecision, Answer};
use crate::config::Action;
use crate::cors;
use crate::identity;
use crate::proxy::Body;
use crate::telemetry::{Ended, ServerSpan};

/// When a request arrives: its span, if it is traced, and in any case the
/// `traceparent` it is forwarded with.
pub fn arrive<B>(gw: &Gateway, rt: &Snapshot, req: &mut Request<B>, ex: &mut Exchange) {
    if let Some(tracer) = &gw.tracer {
        let trusted = identity::is_trusted(&rt.config.client_ip.trusted_proxies, ex.peer.ip());
        ex.span = tracer.begin(req.headers_mut(), trusted);
    }
}

/// A traced request's span with what only its answer tells, kept while the
/// answer becomes the response.
#[derive(Debug)]
pub struct Answered {
    span: Box<ServerSpan>,
    outcome: AccessDecision,
    upstream_status: Option<u16>,
}

/// Takes the request's span, if it is traced, with what `answer` says: the
/// outcome as the access log names it and the upstream's status (a
/// response to a route with an upstream, other than a preflight's, is the
/// upstream's).
pub fn answered(ex: &mut Exchange, answer: &Answer) -> Option<Answered> {
    let span = ex.span.take()?;
    let forwarded = ex
        .route
        .as_ref()
        .is_some_and(|r| matches!(r.route.action, Action::Upstream(_)));
    let upstream_status = answer
        .as_ref()
        .ok()
        .filter(|res| forwarded && res.extensions().get::<cors::Preflight>().is_none())
        .map(|res| res.status().as_u16());
    Some(Answered {
        span,
        outcome: AccessDecision::of(answer, ex.decision()),
        upstream_status,
    })
}

/// Ends the span with the response the client gets.
pub fn leave(gw: &Gateway, answered: Answered, ex: &Exchange, res: &Response<Body>) {
    let Some(tracer) = &gw.tracer else {
        return;
    };
    let mut refused_by = Vec::new();
    let mut shadow_refused_by = Vec::new();
    if let Some(checked) = &ex.checked {
        let limits = checked.limits();
        for (i, shadow) in checked.decision.denied() {
            if let Some(l) = limits.get(i) {
                let list = if shadow {
                    &mut shadow_refused_by
                } else {
                    &mut refused_by
                };
                list.push(&*l.name);
            }
        }
    }
    let ended = Ended {
        method: ex.method.as_str(),
        route: ex.route.as_ref().map(|r| &*r.route.name),
        status: res.status().as_u16(),
        outcome: answered.outcome.as_str(),
        refused_by,
        shadow_refused_by,
        upstream_status: answered.upstream_status,
        request_id: ex.request_id.as_ref().and_then(|v| v.to_str().ok()),
    };
    tracer.end(*answered.span, &ended);
}
