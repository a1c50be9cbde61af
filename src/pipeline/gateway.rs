//! The gateway object: the configuration now served (swapped whole on
//! reload), the limiter, the upstream client and the metrics every request
//! shares. The per-request path is [`Gateway::handle`] in the pipeline's
//! root module.

use std::sync::Arc;

use arc_swap::ArcSwap;

use super::callers::LimitNames;
use super::delay::Waiting;
use crate::clock::{Clock, SystemClock};
use crate::config::{Action, Config};
use crate::decision::limiter::Limiter;
use crate::decision::overrides::{self, CallerOverrides, Watcher};
use crate::decision::shares;
use crate::logs::AccessWriter;
use crate::metrics::{Metrics, RouteMetrics};
use crate::plans::PlanResolver;
use crate::proxy::upstreams::resolve::{Resolve, SystemResolver};
use crate::proxy::{self, Balancer, Forwarder, PeekBudget};
use crate::routing::Router;
use crate::store::StoreError;
use crate::telemetry::Tracer;
use crate::top::TopOffenders;

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
    /// Tracing is configured and cannot start.
    #[error(transparent)]
    Telemetry(#[from] crate::telemetry::TelemetryError),
}

/// A snapshot of the configuration and what is built from it (router,
/// metric handles, upstream pools, plans), swapped as a whole on reload; a
/// request reads one snapshot from start to end (`rt` in the phases).
#[derive(Debug)]
pub struct Snapshot {
    pub(super) config: Config,
    pub(super) router: Router,
    /// Metric handles of every route, by route index.
    pub(super) route_metrics: Vec<Option<Arc<RouteMetrics>>>,
    /// Kept-alive upstream connections by route index, for routes that use
    /// them ([`proxy::keep_alive`]); routes with the same upstream share them.
    pub(super) keep_alive: Vec<Option<Arc<proxy::KeepAlive>>>,
    /// The balancer of each pool under `upstreams`, in the configuration's
    /// order.
    pub(super) balancers: Vec<Arc<Balancer>>,
    /// By route index: the balancer of the pool the route names, if any.
    pub(super) route_balancers: Vec<Option<Arc<Balancer>>>,
    /// Resolves the names of pools' targets.
    pub(super) resolver: Arc<dyn Resolve>,
    /// API key → plan, static and from the Redis hash.
    pub(super) plans: PlanResolver,
}

impl Snapshot {
    fn new(
        config: Config,
        metrics: &Metrics,
        forwarder: &Forwarder,
        previous: Option<&Self>,
        resolver: Arc<dyn Resolve>,
    ) -> Self {
        let balancers: Vec<Arc<Balancer>> = config
            .upstreams
            .iter()
            .map(|pool| {
                let before =
                    previous.and_then(|p| p.balancers.iter().find(|b| b.name() == &*pool.name));
                forwarder.balancer(pool.clone(), before.map(AsRef::as_ref), &resolver, metrics)
            })
            .collect();
        let route_balancers = config
            .routes
            .iter()
            .map(|r| match &r.action {
                Action::Upstream(up) => up
                    .pool
                    .as_ref()
                    .and_then(|pool| balancers.iter().find(|b| b.name() == &*pool.name).cloned()),
                Action::Respond(_) => None,
            })
            .collect();
        let router = Router::new(&config);
        let mut by_name = metrics.routes(&config);
        let route_metrics = config
            .routes
            .iter()
            .map(|r| by_name.remove(&r.name).map(Arc::new))
            .collect();
        let mut shared: Vec<(String, Arc<proxy::KeepAlive>)> = Vec::new();
        let keep_alive = config
            .routes
            .iter()
            .map(|r| {
                let Action::Upstream(up) = &r.action else {
                    return None;
                };
                if up.pool.is_some() {
                    return None;
                }
                let conns = proxy::keep_alive(up, &config.timeouts, config.server.http1)?;
                let key = conns.authority().as_str().to_ascii_lowercase();
                if let Some((_, p)) = shared.iter().find(|(k, _)| *k == key) {
                    return Some(p.clone());
                }
                let conns = Arc::new(conns);
                shared.push((key, conns.clone()));
                Some(conns)
            })
            .collect();
        let plans = PlanResolver::new(&config.api_keys, &config.plans, &config.store.prefix);
        Self {
            config,
            router,
            route_metrics,
            keep_alive,
            balancers,
            route_balancers,
            resolver,
            plans,
        }
    }
}

/// The gateway: configuration, limiter and upstream client, behind one
/// `Arc`, so a clone is a handle to the same gateway. It is a
/// [`tower::Service`] (see the pipeline's root module): hyper serves it
/// through hyper-util's `TowerToHyperService`, and so can any tower stack.
/// Its fields are [`Core`]'s, reached through `Deref`.
#[derive(Clone)]
pub struct Gateway(Arc<Core>);

impl std::ops::Deref for Gateway {
    type Target = Core;

    fn deref(&self) -> &Core {
        &self.0
    }
}

/// What a [`Gateway`] holds: the configuration now served, the limiter,
/// the upstream client, the metrics.
pub struct Core {
    pub(super) snapshot: ArcSwap<Snapshot>,
    pub(super) limiter: Arc<Limiter>,
    pub(super) forwarder: Forwarder,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) metrics: Arc<Metrics>,
    pub(super) top: TopOffenders,
    /// Where each request's access-log line goes, if anywhere.
    pub(super) access_log: Option<AccessWriter>,
    /// Requests waiting for `on_limit: delay` limits.
    pub(super) waiting: Waiting,
    /// Request-body bytes read for limits, held at once ([`BODY_BUDGET`]).
    pub(super) body_budget: PeekBudget,
    /// Decides which requests are traced and exports their spans; `None`
    /// when tracing is off (`tracing:` applies at start).
    pub(super) tracer: Option<Arc<Tracer>>,
    /// Per-caller overrides set through the admin API.
    pub(super) overrides: Arc<CallerOverrides>,
    /// Keeps `overrides` in step with Redis; stops with the gateway.
    _watcher: Option<Watcher>,
}

/// The most request-body bytes held for reading at once, gateway-wide
/// (`pipeline::body`): 64 bodies of a MiB, the most one body is read.
/// Past it, a body is forwarded unread.
pub const BODY_BUDGET: usize = 64 * 1024 * 1024;

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::fmt::Debug for Core {
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
            .with_metrics(metrics.store.clone())
            .with_clock(Arc::clone(&clock));
        let forwarder = Forwarder::new(&config.timeouts, config.server.http1)?;
        let resolver: Arc<dyn Resolve> = Arc::new(SystemResolver);
        let tracer = match &config.tracing {
            Some(t) => Some(Arc::new(Tracer::start(t, metrics.spans.clone())?)),
            None => None,
        };
        let limiter = Arc::new(limiter);
        let overrides = Arc::new(CallerOverrides::new(&config.store.prefix));
        let watcher = overrides::watch(Arc::clone(&overrides), Arc::clone(&limiter));
        Ok(Self(Arc::new(Core {
            snapshot: ArcSwap::from_pointee(Snapshot::new(
                config, &metrics, &forwarder, None, resolver,
            )),
            limiter,
            forwarder,
            clock,
            metrics,
            top: TopOffenders::default(),
            access_log: None,
            waiting: Waiting::default(),
            body_budget: PeekBudget::new(BODY_BUDGET),
            tracer,
            overrides,
            _watcher: watcher,
        })))
    }

    /// Writes an access-log line per request to `log`. Called on a gateway
    /// just built, before it is cloned; a clone keeps the log it has.
    #[must_use]
    pub fn with_access_log(mut self, log: Option<AccessWriter>) -> Self {
        if let Some(core) = Arc::get_mut(&mut self.0) {
            core.access_log = log;
        }
        self
    }

    /// Checks, in a task of its own, that every process counting on the
    /// shares now served agrees on them ([`shares`]); started with the
    /// gateway and at each reload. Outside a Tokio runtime it checks
    /// nothing.
    pub fn check_shares(&self) {
        let rt = self.snapshot.load();
        let limits = shares::shared(
            rt.config.routes.iter().map(|r| &r.limits[..]),
            &rt.config.limits,
        );
        let Some(wait) = rt.config.store.redis.as_ref().map(|r| r.startup_wait) else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if !limits.is_empty() {
            runtime.spawn(shares::check(
                Arc::clone(&self.limiter),
                rt.config.store.prefix.clone(),
                limits,
                wait,
                Some(self.metrics.store.share_mismatches.clone()),
            ));
        }
    }

    /// Runs `f` on the configuration currently served.
    pub fn with_config<R>(&self, f: impl FnOnce(&Config) -> R) -> R {
        f(&self.snapshot.load().config)
    }

    /// Whether limiter decisions go to Redis (for metrics).
    pub fn breaker_state(&self) -> crate::store::BreakerState {
        self.limiter.health().breaker_state()
    }

    /// The last known number of live gateway instances sharing Redis.
    pub fn live_instances(&self) -> u64 {
        self.limiter.health().live_instances()
    }

    /// The metrics registry.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The top-offenders summaries.
    pub fn top(&self) -> &TopOffenders {
        &self.top
    }

    /// The clock decisions are made on.
    pub fn clock(&self) -> &dyn Clock {
        &*self.clock
    }

    /// The per-caller overrides in force.
    pub fn overrides(&self) -> &CallerOverrides {
        &self.overrides
    }

    /// The limiter (for readiness and the admin API).
    pub fn limiter(&self) -> &Limiter {
        &self.limiter
    }

    /// The configuration now serving.
    pub fn config(&self) -> Config {
        self.snapshot.load().config.clone()
    }

    /// Serves `config` for every request that starts from now on; requests
    /// already in flight finish with the configuration they started with.
    /// Counters live in the store and are not touched. See
    /// [`crate::reload`] for what a reload cannot change.
    ///
    /// Pools that stay (by name) keep the state of their targets that stay
    /// — health, ejections, requests in flight, connections.
    pub fn reload(&self, config: Config) {
        let previous = self.snapshot.load_full();
        let resolver = previous.resolver.clone();
        self.snapshot.store(Arc::new(Snapshot::new(
            config,
            &self.metrics,
            &self.forwarder,
            Some(&previous),
            resolver,
        )));
        self.check_shares();
    }

    /// Resolves the names of pools' targets with `resolver` (the system's
    /// by default), from now on.
    #[must_use]
    pub fn with_resolver(self, resolver: Arc<dyn Resolve>) -> Self {
        let now = self.snapshot.load_full();
        self.snapshot.store(Arc::new(Snapshot::new(
            now.config.clone(),
            &self.metrics,
            &self.forwarder,
            None,
            resolver,
        )));
        self
    }

    /// Every pool's balancer, in the configuration's order (for
    /// `/admin/upstreams`).
    pub fn balancers(&self) -> Vec<Arc<Balancer>> {
        self.snapshot.load().balancers.clone()
    }

    /// Requests of this gateway waiting (`on_limit: delay`) in a line that
    /// counts `key`.
    pub fn waiting_on(&self, key: &str) -> u64 {
        self.waiting.waiting_on(key)
    }

    /// What an override may name: every `(route, limit)` a caller can
    /// meet — the routes' own limits and their plans' — the `share` names,
    /// and the plans' names.
    pub fn limit_names(&self) -> LimitNames {
        let rt = self.snapshot.load();
        let mut names = LimitNames::default();
        for r in rt.router.routes() {
            let views = r.plan_views.values().map(|v| &v.limits);
            for l in std::iter::once(&r.route.limits).chain(views).flatten() {
                let pair = (r.route.name.clone(), l.name.clone());
                if !l.plan && !names.limits.contains(&pair) {
                    names.limits.push(pair);
                }
                if let Some(s) = &l.share
                    && !names.shares.contains(s)
                {
                    names.shares.push(s.clone());
                }
            }
        }
        names.plans = rt.config.plans.iter().map(|p| p.name.clone()).collect();
        names
    }
}
