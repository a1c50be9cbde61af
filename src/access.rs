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
use crate::metrics::{ClientErrorKind, Outcome, RouteMetrics, UpstreamErrorKind};
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

/// Whose fault a failed forward was, and its metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForwardFault {
    /// The upstream's: `outcome="error"`, `tollgate_upstream_errors_total`,
    /// logged at WARN (someone may need to look at the upstream).
    Upstream(UpstreamErrorKind),
    /// The client's request body: `outcome="client_error"`,
    /// `tollgate_client_errors_total`, logged at DEBUG (any client can
    /// cause it, so it must not page anyone).
    Client(ClientErrorKind),
}

/// Whose fault the failed forward `e` was.
pub fn forward_fault(e: &GatewayError) -> ForwardFault {
    match e {
        GatewayError::UpstreamConnect(_) => ForwardFault::Upstream(UpstreamErrorKind::Connect),
        GatewayError::UpstreamTimeout(_) => ForwardFault::Upstream(UpstreamErrorKind::Timeout),
        GatewayError::UpstreamFailed(_) => ForwardFault::Upstream(UpstreamErrorKind::Failed),
        GatewayError::BadRequestBody(_) => ForwardFault::Client(ClientErrorKind::BadBody),
        GatewayError::ClientAborted(_) => ForwardFault::Client(ClientErrorKind::Aborted),
        GatewayError::PayloadTooLarge(_) => ForwardFault::Client(ClientErrorKind::BodyTooLarge),
        // Not what a forward ends with; the request is refused before it.
        GatewayError::BadRequest(_) => ForwardFault::Client(ClientErrorKind::BadBody),
        GatewayError::NoRoute { .. }
        | GatewayError::Limited { .. }
        | GatewayError::StoreUnavailable
        | GatewayError::UnknownApiKey
        // Refused before anything is forwarded.
        | GatewayError::HeaderTooLarge { .. }
        | GatewayError::UriTooLong { .. } => ForwardFault::Upstream(UpstreamErrorKind::Failed),
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
