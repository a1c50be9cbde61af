//! Phase 1: which route takes the request, by its canonical target.
//!
//! The target is made canonical once ([`crate::target`]); the route is
//! matched on the canonical host and path, and the request is rewritten to
//! carry that target, so what is forwarded is what was routed.

use std::sync::Arc;

use http::Request;
use tracing::debug;

use super::gateway::Snapshot;
use crate::problem::GatewayError;
use crate::routing::CompiledRoute;
use crate::target;

/// The route for `req`, which is left carrying its canonical target.
/// The request is borrowed, not moved in and out: it is several hundred
/// bytes, copied at each move.
///
/// # Errors
/// [`GatewayError::BadTarget`] for a target with no canonical form,
/// [`GatewayError::NoRoute`] when no route takes it.
pub fn route<B>(req: &mut Request<B>, rt: &Snapshot) -> Result<Arc<CompiledRoute>, GatewayError> {
    let target = target::canonical(
        req.uri(),
        req.version(),
        req.headers(),
        &rt.config.server.path,
    )
    .inspect_err(|e| debug!(error = %e, "request target refused"))?;
    let Some(route) = rt
        .router
        .find(req.method(), target.host(), &target.match_path)
    else {
        return Err(GatewayError::NoRoute {
            method: req.method().to_string(),
            path: target.path.into_owned(),
        });
    };
    let route = route.clone();
    let rewrite = target::Rewrite::of(target);
    rewrite.apply(req).map_err(|e| {
        GatewayError::BadRequest(format!("the request target has no canonical form: {e}"))
    })?;
    Ok(route)
}
