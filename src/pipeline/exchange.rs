//! The per-request context the phases fill as they go, and what they fill
//! it with: the limits a caller met ([`Checked`]) and the kind of identity
//! it presented ([`IdentityKind`]).

use std::net::SocketAddr;
use std::sync::Arc;

use http::{HeaderValue, Method};

use super::gateway::Runtime;
use crate::config::Limit;
use crate::decision::shadow::RouteDecision;
use crate::identity::Caller;
use crate::metrics::RouteMetrics;
use crate::routing::{CompiledRoute, LimitView};

/// What the phases learnt about one request: filled as they go, read by
/// [`observe`] and for the rate-limit headers.
#[derive(Debug)]
pub struct Exchange {
    /// The request method, for the access log.
    pub method: Method,
    /// The TCP peer.
    pub peer: SocketAddr,
    /// The route taken, once one matched.
    pub route: Option<Arc<CompiledRoute>>,
    /// That route's metric handles.
    pub metrics: Option<Arc<RouteMetrics>>,
    /// The kind of identity the caller presented.
    pub identity: IdentityKind,
    /// The limits as this caller sees them and what they decided; `None`
    /// on routes without limits and for requests refused before deciding.
    pub checked: Option<Checked>,
}

impl Exchange {
    pub(super) fn new(method: Method, peer: SocketAddr) -> Self {
        Self {
            method,
            peer,
            route: None,
            metrics: None,
            identity: IdentityKind::None,
            checked: None,
        }
    }

    pub(super) fn entered(&mut self, route: &Arc<CompiledRoute>, rt: &Runtime) {
        self.metrics = rt.route_metrics.get(route.index).cloned().flatten();
        self.route = Some(route.clone());
    }

    /// What the limits decided, when they were asked.
    pub fn decision(&self) -> Option<&RouteDecision> {
        self.checked.as_ref().map(|c| &c.decision)
    }
}

/// The limits one caller met on one route, and what they decided.
#[derive(Debug)]
pub struct Checked {
    pub(super) route: Arc<CompiledRoute>,
    /// The route's limits as the caller's plan expands them; `None` when
    /// no limit comes from a plan.
    pub(super) view: Option<Arc<LimitView>>,
    /// What the limits said.
    pub decision: RouteDecision,
    /// The instant the decision was made at.
    pub now_ms: u64,
}

impl Checked {
    /// The limits decided, in order.
    pub fn limits(&self) -> &[Limit] {
        match &self.view {
            Some(v) => &v.limits,
            None => &self.route.route.limits,
        }
    }

    /// The `RateLimit-Policy` value of those limits.
    pub fn policy_header(&self) -> Option<&HeaderValue> {
        match &self.view {
            Some(v) => v.policy_header.as_ref(),
            None => self.route.policy_header.as_ref(),
        }
    }
}

/// The strongest identity a caller presented.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdentityKind {
    /// Not asked: the route has no limits, or the request ended first.
    None,
    /// Only the client IP.
    Ip,
    /// An authenticated user.
    User,
    /// An API key.
    ApiKey,
}

impl IdentityKind {
    /// An API key, else an authenticated user, else only the client IP.
    pub fn of(caller: &Caller<'_>) -> Self {
        if caller.api_key.is_some() {
            Self::ApiKey
        } else if caller.user.is_some() {
            Self::User
        } else {
            Self::Ip
        }
    }

    /// The access-log value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Ip => "ip",
            Self::User => "user",
            Self::ApiKey => "api_key",
        }
    }
}
