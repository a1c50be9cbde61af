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
use std::sync::Arc;

use arc_swap::ArcSwap;
use http::{Method, Request, Response};

use crate::clock::{Clock, SystemClock};
use crate::config::{Action, Config};
use crate::headers;
use crate::limit::limiter::Limiter;
use crate::metrics::{Metrics, RouteMetrics};
use crate::plans::PlanResolver;
use crate::problem::GatewayError;
use crate::proxy::{self, Body, ClientBody, Forwarder};
use crate::routing::{CompiledRoute, Router};
use crate::shadow::RouteDecision;
use crate::store::StoreError;
use crate::top::TopOffenders;

pub mod act;
pub mod decide;
pub mod observe;
pub mod refusal;
pub mod route;

/// Why the gateway could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The store cannot be set up.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A listener failed.
    #[error("listener: {0}")]
    Io(#[from] std::io::Error),
    /// TLS settings for upstreams cannot be built.
    #[error(transparent)]
    Tls(#[from] crate::tls::TlsError),
}

/// Configuration-derived state, swapped as a whole on reload.
#[derive(Debug)]
pub struct Runtime {
    config: Config,
    router: Router,
    /// Metric handles of every route, by route index.
    route_metrics: Vec<Option<Arc<RouteMetrics>>>,
    /// Upstream connection pools by route index, for routes that use one
    /// ([`proxy::upstream_pool`]); routes with the same upstream share it.
    pools: Vec<Option<Arc<proxy::Pool>>>,
    /// API key → plan, static and from the Redis hash.
    plans: PlanResolver,
}

impl Runtime {
    fn new(config: Config, metrics: &Metrics) -> Self {
        let router = Router::new(&config);
        let mut by_name = metrics.routes(&config);
        let route_metrics = config
            .routes
            .iter()
            .map(|r| by_name.remove(&r.name).map(Arc::new))
            .collect();
        let mut shared: Vec<(String, Arc<proxy::Pool>)> = Vec::new();
        let pools = config
            .routes
            .iter()
            .map(|r| {
                let Action::Upstream(up) = &r.action else {
                    return None;
                };
                let pool = proxy::upstream_pool(up, &config.timeouts)?;
                let key = pool.authority().as_str().to_ascii_lowercase();
                if let Some((_, p)) = shared.iter().find(|(k, _)| *k == key) {
                    return Some(p.clone());
                }
                let pool = Arc::new(pool);
                shared.push((key, pool.clone()));
                Some(pool)
            })
            .collect();
        let plans = PlanResolver::new(&config.api_keys, &config.plans, &config.store.prefix);
        Self {
            config,
            router,
            route_metrics,
            pools,
            plans,
        }
    }
}

/// The gateway: configuration, limiter and upstream client.
pub struct Gateway {
    runtime: ArcSwap<Runtime>,
    limiter: Limiter,
    forwarder: Forwarder,
    clock: Arc<dyn Clock>,
    metrics: Arc<Metrics>,
    top: TopOffenders,
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway")
            .field("limiter", &self.limiter)
            .finish_non_exhaustive()
    }
}

impl Gateway {
    /// Builds a gateway for `config` on the system clock.
    ///
    /// # Errors
    /// The store configuration cannot be used.
    pub async fn new(config: Config) -> Result<Self, StartError> {
        Self::with_clock(config, Arc::new(SystemClock)).await
    }

    /// Builds a gateway whose limiter reads time from `clock`.
    ///
    /// # Errors
    /// The store configuration cannot be used.
    pub async fn with_clock(config: Config, clock: Arc<dyn Clock>) -> Result<Self, StartError> {
        let metrics = Arc::new(Metrics::new());
        let limiter = Limiter::new(&config.store)
            .await?
            .with_metrics(metrics.store.clone());
        let forwarder = Forwarder::new(&config.timeouts)?;
        Ok(Self {
            runtime: ArcSwap::from_pointee(Runtime::new(config, &metrics)),
            limiter,
            forwarder,
            clock,
            metrics,
            top: TopOffenders::default(),
        })
    }

    /// Runs `f` on the configuration currently served.
    pub fn with_config<R>(&self, f: impl FnOnce(&Config) -> R) -> R {
        f(&self.runtime.load().config)
    }

    /// Whether limiter decisions go to Redis (for metrics).
    pub fn breaker_state(&self) -> crate::store::BreakerState {
        self.limiter.breaker_state()
    }

    /// The last known number of live gateway instances sharing Redis.
    pub fn live_instances(&self) -> u64 {
        self.limiter.live_instances()
    }

    /// The metrics registry.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The top-offenders summaries.
    pub fn top(&self) -> &TopOffenders {
        &self.top
    }

    /// The limiter (for readiness).
    pub fn limiter(&self) -> &Limiter {
        &self.limiter
    }

    /// The configuration now serving.
    pub fn config(&self) -> Config {
        self.runtime.load().config.clone()
    }

    /// Serves `config` for every request that starts from now on; requests
    /// already in flight finish with the configuration they started with.
    /// Counters live in the store and are not touched. See
    /// [`crate::reload`] for what a reload cannot change.
    pub fn reload(&self, config: Config) {
        self.runtime
            .store(Arc::new(Runtime::new(config, &self.metrics)));
    }

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
                checked.decision.decision.as_ref(),
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
    pub identity: observe::IdentityKind,
    /// The limits as this caller sees them and what they decided; `None`
    /// on routes without limits and for requests refused before deciding.
    pub checked: Option<decide::Checked>,
}

impl Exchange {
    fn new(method: Method, peer: SocketAddr) -> Self {
        Self {
            method,
            peer,
            route: None,
            metrics: None,
            identity: observe::IdentityKind::None,
            checked: None,
        }
    }

    fn entered(&mut self, route: &Arc<CompiledRoute>, rt: &Runtime) {
        self.metrics = rt.route_metrics.get(route.index).cloned().flatten();
        self.route = Some(route.clone());
    }

    /// What the limits decided, when they were asked.
    pub fn decision(&self) -> Option<&RouteDecision> {
        self.checked.as_ref().map(|c| &c.decision)
    }
}

#[cfg(test)]
mod tests;
