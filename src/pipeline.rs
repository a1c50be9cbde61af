//! The request path: one request through its phases, in order, with one
//! exit.
//!
//! [`Gateway::handle`] runs the phases — guard and route ([`route`]),
//! the request body's fields when the route's limits read them
//! ([`body`]), caller, plan and decision ([`decide`]), respond, forward or
//! upgrade ([`act`]) — each returning `Result<_, GatewayError>`: the route goes to
//! the decision, the decision's [`Holdings`](decide::Holdings) (slots,
//! reservations) to `act` and the settlement. Every refusal, whichever
//! phase made it, becomes its response in one place
//! ([`refusal::response`]), the rate-limit headers are applied once, and
//! [`observe`] counts the request and writes its access-log line from the
//! record the phases keep in the [`Exchange`].
//!
//! [`Gateway::decide_only`] runs the same phases up to `act` and stops
//! there: nothing is answered or forwarded, and no access-log line is
//! written (the limits consume, and their per-limit series count, as for a
//! served request). It is how `tollgate simulate` replays recorded requests through the routing,
//! identity and limiter code the gateway serves with.
//!
//! [`Gateway::caller_limits`] runs the decision's own steps (plan,
//! overrides, store keys) for one caller without deciding, for the admin
//! API. These methods are the ones that run phases, so they sit here,
//! above the phase files, which each take a `&Gateway`; the rest of
//! `impl Gateway` (building, reload, what it holds) is in [`gateway`].

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures_util::FutureExt;
use http::{Request, Response};

use crate::decision::settle::{self as settle_costs, Reported};
use crate::grpc;
use crate::identity::{self, Caller, Peer};
use crate::problem::GatewayError;
use crate::proxy::{Body, ClientBody, Deadline, Secure};
use crate::routing::CompiledRoute;
use callers::{CallerLimit, Found};
use decide::{Deciding, Holdings, Purpose, limit_requests, plan};
use overrides::Applied;

pub mod act;
pub mod body;
pub mod browsers;
pub mod callers;
pub mod decide;
pub mod delay;
pub mod exchange;
pub mod exempt;
pub mod gateway;
mod held;
pub mod observe;
pub mod overrides;
pub mod refusal;
pub mod route;
pub mod settle;
pub mod traces;

pub use exchange::{Exchange, Rehearsal};
pub use gateway::{Gateway, Snapshot, StartError};

impl Gateway {
    /// Handles one request from `peer`; never fails — every refusal
    /// becomes a response. Counts it in the metrics and writes its
    /// access-log line.
    ///
    /// The body may be a connection's [`Incoming`](hyper::body::Incoming)
    /// or bytes already in memory, so the pipeline can be called without a
    /// socket. The future holds a handle on the gateway, not a borrow, so
    /// a server keeps it as it is, without a block around it.
    pub fn handle<B: Into<ClientBody>>(
        &self,
        req: Request<B>,
        peer: SocketAddr,
    ) -> impl Future<Output = Response<Body>> + Send + use<B> {
        self.clone().answer(req.map(Into::into), peer)
    }

    /// [`handle`](Self::handle) on a gateway handle of its own.
    async fn answer(self, mut req: Request<ClientBody>, peer: SocketAddr) -> Response<Body> {
        let started = observe::started(self.access_log.as_ref());
        let rt = self.snapshot.load_full();
        let mut ex = Exchange::new(req.method().clone(), peer);
        let native = matches!(req.body(), ClientBody::Native(_));
        browsers::arrive(&rt, &mut req, &mut ex);
        traces::arrive(&self, &rt, req.headers_mut(), &mut ex);
        ex.grpc = grpc::Kind::of(req.method(), req.headers());
        if ex.grpc.is_some() {
            deadline(&mut req);
        }
        if started.is_some() && rt.config.access_log.replay {
            ex.record_for_replay(&req, self.clock.now_ms());
        }
        // Each large future on the request's way is pinned where it is
        // made and awaited through the pin: awaited by value it would be
        // copied whole into the awaiting future first (the exchange with
        // the upstream makes them several KiB).
        let answer = std::pin::pin!(self.phases(req, &rt, &mut ex)).await;
        observe::record(
            &mut ex,
            &answer,
            &self.metrics,
            self.access_log.as_ref(),
            started,
        );
        match answer {
            Ok(mut res) => {
                if !native {
                    // Only the native server's writer copies an answer's
                    // passed fields: hyper's server, and an application
                    // calling the service, get them in the map.
                    crate::http1::text_fields::materialize(&mut res);
                }
                if let Some(checked) = &ex.checked {
                    checked.write_headers(rt.config.headers, res.headers_mut());
                }
                browsers::leave(&rt, &ex, &mut res);
                res
            }
            Err(refusal) => refused(&rt, &ex, &refusal, native),
        }
    }

    /// Runs `req` from `peer` through the phases before `act` — guard,
    /// route, decide — at the gateway clock's time, and stops where `act`
    /// would take over. The limits consume as they do for a served
    /// request, and the per-limit metrics and top offenders count it;
    /// nothing is answered or forwarded, and no access-log line is
    /// written. The [`Rehearsal`] holds what the phases found, with the
    /// identity each limit counted.
    pub async fn decide_only<B>(&self, req: Request<B>, peer: SocketAddr) -> Rehearsal {
        let rt = self.snapshot.load();
        let mut ex = Exchange::new(req.method().clone(), peer);
        let mut identities = exchange::Identities::default();
        let reported = req.extensions().get::<Reported>().cloned();
        // The slots of the admission go back at once: a replay has no
        // responses to hold them. Costs read from a response body settle
        // at once with the amounts the log recorded.
        let ended = self
            .until_act(req, &rt, &mut ex, Purpose::Rehearse(&mut identities))
            .await;
        let ended = match (ended, reported) {
            (Ok((_, _, holdings)), Some(reported)) => {
                if let Some(r) = holdings.reservations {
                    let due = r.replayed(&reported);
                    settle_costs::settle(self.limiter.settler(), self.clock.now_ms(), due).await;
                }
                Ok(())
            }
            (ended, _) => ended.map(drop),
        };
        Rehearsal {
            exchange: ex,
            identities,
            refusal: ended.err(),
        }
    }

    /// The limits `caller` meets, on route `route` (all when `None`) and
    /// of limit `limit` (all when `None`). Without `has_ip` the caller's
    /// IP is unknown, and limits keyed by it are left out.
    pub async fn caller_limits(
        &self,
        caller: &Caller<'_>,
        has_ip: bool,
        route: Option<&str>,
        limit: Option<&str>,
    ) -> Found {
        let rt = self.snapshot.load();
        let now_ms = self.clock.now_ms();
        let found_overrides = self.overrides.of(caller, now_ms);
        let mut found = Found::default();
        for r in rt.router.routes() {
            if r.route.limits.is_empty() || route.is_some_and(|n| n != &*r.route.name) {
                continue;
            }
            let chosen = overrides::plan(&found_overrides);
            let Ok(view) = plan(&self.deciding(&rt), r, caller, now_ms, chosen).await else {
                found.no_plan_routes.push(r.route.name.clone());
                continue;
            };
            let view = match overrides::apply(&rt.config, r, view, &found_overrides) {
                Applied::Limits(v) => v,
                Applied::Exempt => {
                    found.exempt_routes.push(r.route.name.clone());
                    continue;
                }
            };
            let (limits, suffixes) = r.limits_in(view.as_deref());
            let requests = limit_requests(&rt.config, r, limits, suffixes, caller, None);
            for (l, request) in limits.iter().zip(requests) {
                if limit.is_some_and(|n| n != &*l.name) {
                    continue;
                }
                let mut text = String::new();
                identity::write_key(&mut text, &l.key, caller);
                if !has_ip && text.contains("ip=") {
                    continue;
                }
                found.limits.push(CallerLimit {
                    route: r.route.name.clone(),
                    override_: found_overrides
                        .iter()
                        .find(|o| o.about(&r.route.name, &l.name, l.share.as_deref()))
                        .cloned(),
                    limit: l.clone(),
                    request,
                    identity: text,
                });
            }
        }
        found
    }

    /// What the decision phase reads of this gateway, with `rt`'s
    /// configuration and plans.
    fn deciding<'a>(&'a self, rt: &'a Snapshot) -> Deciding<'a> {
        Deciding {
            config: &rt.config,
            plans: &rt.plans,
            limiter: &self.limiter,
            overrides: &self.overrides,
            waiting: &self.waiting,
            top: &self.top,
            clock: &*self.clock,
            // The access log names the strongest identity a caller
            // presented.
            sources: crate::identity::Sources::ALL,
        }
    }

    /// The phases in order; the first refusal ends the request.
    async fn phases(
        &self,
        mut req: Request<ClientBody>,
        rt: &Snapshot,
        ex: &mut Exchange,
    ) -> Result<Response<Body>, GatewayError> {
        // A CORS preflight is answered before identity and limits.
        if let Some(res) = browsers::preflight(rt, &req, ex)? {
            return Ok(res);
        }
        let route = self.routed(&mut req, rt, ex)?;
        // The body's fields before the decision, on a route whose limits
        // read them. Boxed: most routes read no body, and this future
        // would otherwise grow every request's by its size.
        if !route.body_reads.is_empty() {
            req = Box::pin(body::read(self, &route, req)).await;
        }
        let deciding = self.deciding(rt);
        let admission =
            std::pin::pin!(decide::decide(&deciding, &route, &req, ex, Purpose::Serve)).await?;
        let settling = settle::prepare(admission.reservations, &mut req);
        let answer = std::pin::pin!(act::act(
            self,
            rt,
            &route,
            req,
            ex.peer.ip(),
            admission.slots
        ))
        .await;
        match settling {
            None => answer,
            // Boxed: most requests settle nothing, and this future would
            // otherwise grow every request's by its size.
            settling => Box::pin(settle::finish(self, settling, answer)).await,
        }
    }

    /// The phases before `act`: the request, canonical, its route, and
    /// what the decision hands on.
    async fn until_act<B>(
        &self,
        mut req: Request<B>,
        rt: &Snapshot,
        ex: &mut Exchange,
        purpose: Purpose<'_>,
    ) -> Result<(Request<B>, Arc<CompiledRoute>, Holdings), GatewayError> {
        let route = self.routed(&mut req, rt, ex)?;
        let admission = decide::decide(&self.deciding(rt), &route, &req, ex, purpose).await?;
        Ok((req, route, admission))
    }

    /// The route of `req`, which is checked and left canonical.
    fn routed<B>(
        &self,
        req: &mut Request<B>,
        rt: &Snapshot,
        ex: &mut Exchange,
    ) -> Result<Arc<CompiledRoute>, GatewayError> {
        crate::guard::check(req, &rt.config.server)?;
        let route = route::route(req, rt)?;
        ex.entered(&route, rt);
        browsers::routed(req, ex);
        Ok(route)
    }
}

/// The gateway as a [`tower::Service`]: each request is [`Gateway::handle`]d
/// from the peer its [`Peer`] extension names (a request without one comes
/// from `0.0.0.0:0`), for a tower stack of an application's; the
/// listener serves [`Gateway::connection`]. Always ready, never failing:
/// every refusal is a response.
impl<B: Into<ClientBody> + Send + 'static> tower::Service<Request<B>> for Gateway {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let peer = req
            .extensions()
            .get::<Peer>()
            .map_or(SocketAddr::from(([0, 0, 0, 0], 0)), |p| p.0);
        Box::pin(self.handle(req, peer).map(Ok))
    }
}

impl Gateway {
    /// The gateway as the service of one connection from `peer`, `secure`
    /// when it came over TLS: each request is [`handle`](Self::handle)d
    /// from `peer`. Built once per connection by what serves the gateway
    /// (the listener's accept loop), so nothing per connection is put in a
    /// request's extensions but [`Secure`], and the answer's future is
    /// `handle`'s own, not boxed. Always ready, never failing.
    pub fn connection<B>(
        &self,
        peer: SocketAddr,
        secure: bool,
    ) -> impl tower::Service<
        Request<B>,
        Response = Response<Body>,
        Error = Infallible,
        Future: Send + 'static,
    > + Clone
    + Send
    + 'static
    where
        B: Into<ClientBody> + Send + 'static,
    {
        let gateway = self.clone();
        tower::service_fn(move |mut req: Request<B>| {
            if secure {
                req.extensions_mut().insert(Secure);
            }
            gateway.handle(req, peer).map(Ok)
        })
    }
}

/// The answer to `refusal`, with the rate-limit fields and the request id.
///
/// A native HTTP/1.1 connection (`native`) that asked anything but a gRPC
/// call, on a way out without response rules, gets the fields as
/// [`LateFields`](crate::http1::write::LateFields) carried by the body,
/// text its writer copies, made without a map's inserts; every other
/// request the same fields in the map.
#[inline(never)]
fn refused(rt: &Snapshot, ex: &Exchange, refusal: &GatewayError, native: bool) -> Response<Body> {
    if native && ex.grpc.is_none() && !browsers::has_rules(rt, ex) {
        let mut res = refusal::late(refusal, ex.request_id.as_ref());
        if let Some(checked) = &ex.checked
            && !checked.write_late(rt.config.headers, res.body_mut().fields_mut())
        {
            checked.write_headers(rt.config.headers, res.headers_mut());
        }
        browsers::leave_late(rt, ex, &mut res);
        return res.map(http_body_util::Either::Right);
    }
    let mut res = refusal::response(refusal, ex.request_id.as_ref(), ex.grpc);
    if let Some(checked) = &ex.checked {
        checked.write_headers(rt.config.headers, res.headers_mut());
    }
    browsers::leave(rt, ex, &mut res);
    res
}

/// Marks a gRPC call with its deadline, when it sent one (`grpc-timeout`),
/// counted from now: the forward waits for the upstream at most that long.
fn deadline(req: &mut Request<ClientBody>) {
    let Some(budget) = grpc::timeout(req.headers()) else {
        return;
    };
    // A deadline past what the clock can count is no deadline.
    if let Some(at) = std::time::Instant::now().checked_add(budget) {
        req.extensions_mut().insert(Deadline { at, budget });
    }
}

#[cfg(test)]
mod tests;
