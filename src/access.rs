//! The access log: one `tracing` event per request, target
//! `tollgate::access`, written when the response head is ready.
//!
//! Fields: `route` (or `-` when none matched), `method`, `status`,
//! `identity` — the *kind* of identity the caller presented (`api_key`,
//! `user`, `ip`, or `none` on a route without limits), never its value —,
//! `decision` (`allowed`, `limited`, `shadow_limited`, `unchecked` when the
//! store failed open, `unavailable` when it failed closed (503), `none`
//! without limits) and `latency_ms` (to the
//! response head; a streamed body may take longer). The request path is left
//! out on purpose: paths carry tokens and user ids often enough. `main`
//! renders the events as text or JSON (`--log-format`); `RUST_LOG` filters
//! them like any other target (`tollgate::access=off` silences them).

use std::sync::Arc;
use std::time::Duration;

use http::{Method, StatusCode};
use tracing::info;

use crate::identity::Caller;
use crate::metrics::{Outcome, RouteMetrics, UpstreamErrorKind};
use crate::problem::GatewayError;
use crate::shadow::RouteDecision;

/// What the pipeline learnt about one request, for metrics and the log.
#[derive(Debug, Clone)]
pub struct Note {
    /// The route taken.
    pub route: Option<Arc<str>>,
    /// That route's metric handles.
    pub metrics: Option<Arc<RouteMetrics>>,
    /// Kind of identity the caller presented.
    pub identity: &'static str,
    /// What the limits said.
    pub decision: &'static str,
    /// The request's outcome for `tollgate_requests_total`.
    pub outcome: Outcome,
}

impl Default for Note {
    fn default() -> Self {
        Self {
            route: None,
            metrics: None,
            identity: "none",
            decision: "none",
            outcome: Outcome::Allowed,
        }
    }
}

impl Note {
    /// Takes the decision and, when a shadow limit would have denied, the
    /// `shadow_limited` outcome (an upstream error later overrides it).
    pub fn decided(&mut self, rd: &RouteDecision) {
        self.decision = if rd.unavailable {
            self.outcome = Outcome::Error;
            "unavailable"
        } else if rd.failed_open {
            "unchecked"
        } else if !rd.allowed {
            "limited"
        } else if rd.shadow_denied() {
            self.outcome = Outcome::ShadowLimited;
            "shadow_limited"
        } else {
            "allowed"
        };
    }
}

/// The strongest identity the caller presented: an API key, else an
/// authenticated user, else only the client IP.
pub fn identity_kind(caller: &Caller<'_>) -> &'static str {
    if caller.api_key.is_some() {
        "api_key"
    } else if caller.user.is_some() {
        "user"
    } else {
        "ip"
    }
}

/// The metric label of a failed forward.
pub fn upstream_error_kind(e: &GatewayError) -> UpstreamErrorKind {
    match e {
        GatewayError::UpstreamConnect(_) => UpstreamErrorKind::Connect,
        GatewayError::UpstreamTimeout(_) => UpstreamErrorKind::Timeout,
        GatewayError::UpstreamFailed(_)
        | GatewayError::NoRoute { .. }
        | GatewayError::Limited { .. }
        | GatewayError::StoreUnavailable
        | GatewayError::UnknownApiKey => UpstreamErrorKind::Failed,
        // Refusals of the client's request. A forward ends so only when a
        // streamed body passed `server.max_body_size`, which the pipeline
        // does not count as an upstream error.
        GatewayError::BadRequest(_)
        | GatewayError::PayloadTooLarge(_)
        | GatewayError::HeaderTooLarge { .. }
        | GatewayError::UriTooLong { .. } => UpstreamErrorKind::Failed,
    }
}

/// Writes the access-log line of one request.
pub fn log(note: &Note, method: &Method, status: StatusCode, latency: Duration) {
    info!(
        target: "tollgate::access",
        route = note.route.as_deref().unwrap_or("-"),
        method = method.as_str(),
        status = status.as_u16(),
        identity = note.identity,
        decision = note.decision,
        // Microsecond resolution is plenty for a log line.
        latency_ms = latency.as_micros() as f64 / 1000.0,
        "request"
    );
}
