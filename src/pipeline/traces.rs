//! The pipeline's hooks for tracing ([`crate::telemetry`]): when a request
//! arrives, whether it is traced and the `traceparent` its upstream gets;
//! when its response head is ready (where [`observe`](super::observe)
//! writes the access log, and asks for it), its span's end. The span
//! itself, the sampling and the export live in `telemetry`; this file only
//! says where in one request they apply and what the span is told.
//!
//! With tracing off the gateway has no tracer, and a request pays one
//! `Option` check here and one in `observe`.

use std::sync::Arc;

use http::{HeaderMap, Response};

use super::exchange::Exchange;
use super::gateway::{Gateway, Snapshot};
use super::settle::LateLine;
use crate::config::Action;
use crate::cors;
use crate::identity;
use crate::problem::GatewayError;
use crate::proxy::Body;
use crate::telemetry::{Ended, ServerSpan, Tracer};

/// When a request arrives: its span, if it is traced, and in any case the
/// `traceparent` it is forwarded with. Inlined, so that with tracing off
/// the request pays a check and no call.
#[inline]
pub fn arrive(gw: &Gateway, rt: &Snapshot, headers: &mut HeaderMap, ex: &mut Exchange) {
    if let Some(tracer) = &gw.tracer {
        begin(tracer, rt, headers, ex);
    }
}

#[inline(never)]
fn begin(tracer: &Arc<Tracer>, rt: &Snapshot, headers: &mut HeaderMap, ex: &mut Exchange) {
    let trusted = identity::is_trusted(&rt.config.client_ip.trusted_proxies, ex.peer.ip());
    ex.span = tracer.begin(headers, trusted);
}

/// Ends a traced request's span when its response head is ready (for a
/// cost read from the response body, when that body ends), where
/// [`observe`](super::observe) writes the access log (which calls it,
/// with the outcome as the log names it): the status as the log records
/// it, the limits that refused, and the upstream's status (a response to
/// a route with an upstream, other than a preflight's, is the upstream's).
#[inline(never)]
pub fn end(
    span: ServerSpan,
    ex: &Exchange,
    answer: &Result<Response<Body>, GatewayError>,
    outcome: &'static str,
) {
    let forwarded = ex
        .route
        .as_ref()
        .is_some_and(|r| matches!(r.route.action, Action::Upstream(_)));
    let upstream_status = answer
        .as_ref()
        .ok()
        .filter(|res| forwarded && res.extensions().get::<cors::Preflight>().is_none())
        .map(|res| res.status().as_u16());
    let status = match answer {
        Ok(res) => res.status(),
        Err(e) => e.status(),
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
    let request_id = ex.request_id.as_ref().and_then(|v| v.to_str().ok());
    let route = ex.route.as_ref().map(|r| &*r.route.name);
    // A cost read from the response body: the span ends with the body,
    // carrying what it settled.
    if let Some(late) = answer
        .as_ref()
        .ok()
        .and_then(|r| r.extensions().get::<LateLine>())
    {
        let method = ex.method.as_str().to_owned();
        let route = route.map(str::to_owned);
        let refused_by: Vec<String> = refused_by.into_iter().map(str::to_owned).collect();
        let shadow: Vec<String> = shadow_refused_by.into_iter().map(str::to_owned).collect();
        let request_id = request_id.map(str::to_owned);
        let status = status.as_u16();
        late.span(Box::new(move |settled| {
            span.end(&Ended {
                method: &method,
                route: route.as_deref(),
                status,
                outcome,
                refused_by: refused_by.iter().map(String::as_str).collect(),
                shadow_refused_by: shadow.iter().map(String::as_str).collect(),
                upstream_status,
                request_id: request_id.as_deref(),
                settled: Some(settled),
            });
        }));
        return;
    }
    span.end(&Ended {
        method: ex.method.as_str(),
        route,
        status: status.as_u16(),
        outcome,
        refused_by,
        shadow_refused_by,
        upstream_status,
        request_id,
        settled: None,
    });
}
