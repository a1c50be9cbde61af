//! The per-request context the phases fill as they go.

use std::net::SocketAddr;
use std::sync::Arc;

use http::Method;

use super::decide::Checked;
use super::gateway::Runtime;
use super::observe::IdentityKind;
use crate::metrics::RouteMetrics;
use crate::routing::CompiledRoute;
use crate::shadow::RouteDecision;

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
