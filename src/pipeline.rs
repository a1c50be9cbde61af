//! The request path: one request through its phases, in order, with one
//! exit.
//!
//! [`Gateway::handle`] runs the phases — guard and route ([`route`]),
//! caller, plan and decision ([`decide`]), respond, forward or upgrade
//! ([`act`]) — each returning `Result<_, GatewayError>`. Every refusal,
//! whichever phase made it, becomes its response in one place
//! ([`refusal::response`]), the rate-limit headers are applied once, and
//! [`observe`] counts the request and writes its access-log line from what
//! the phases left in the [`Exchange`].

use std::net::SocketAddr;

use http::{Request, Response};

use crate::headers;
use crate::problem::GatewayError;
use crate::proxy::{Body, ClientBody};

pub mod act;
pub mod decide;
pub mod exchange;
pub mod gateway;
pub mod observe;
pub mod refusal;
pub mod route;

pub use exchange::Exchange;
pub use gateway::{Gateway, Runtime, StartError};

impl Gateway {
    /// Handles one request from `peer`; never fails — every refusal
    /// becomes a response. Counts it in the metrics and writes its
    /// access-log line.
    ///
    /// The body may be a connection's [`Incoming`](hyper::body::Incoming)
    /// or bytes already in memory, so the pipeline can be called without a
    /// socket.
    pub async fn handle<B: Into<ClientBody>>(
        &self,
        req: Request<B>,
        peer: SocketAddr,
    ) -> Response<Body> {
        let req = req.map(Into::into);
        let started = observe::started();
        let rt = self.runtime.load_full();
        let mut ex = Exchange::new(req.method().clone(), peer);
        let answer = self.phases(req, &rt, &mut ex).await;
        observe::record(&ex, &answer, &self.metrics, started);
        let mut res = answer.unwrap_or_else(|refusal| refusal::response(&refusal));
        if let Some(checked) = &ex.checked {
            headers::apply(
                rt.config.headers,
                res.headers_mut(),
                checked.policy_header(),
                checked.limits(),
                checked.decision.outcomes(),
                checked.now_ms,
            );
        }
        res
    }

    /// The phases in order; the first refusal ends the request.
    async fn phases(
        &self,
        req: Request<ClientBody>,
        rt: &Runtime,
        ex: &mut Exchange,
    ) -> Result<Response<Body>, GatewayError> {
        crate::guard::check(&req, &rt.config.server)?;
        let (req, route) = route::route(req, rt)?;
        ex.entered(&route, rt);
        decide::decide(self, rt, &route, &req, ex).await?;
        act::act(self, rt, &route, req, ex.peer.ip()).await
    }
}

#[cfg(test)]
mod tests;
