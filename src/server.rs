//! The listener and the request pipeline: route → identity → decision →
//! forward or answer.
//!
//! [`run`] accepts on the given listeners (HTTP/1.1 and h2c on the same
//! port, or TLS with ALPN), serves each connection with hyper-util under the
//! caps of [`listener`](crate::listener), and on shutdown stops accepting
//! and lets in-flight requests finish. [`Gateway::handle`] is the
//! whole per-request pipeline; each phase returns a value to the next.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use arc_swap::ArcSwap;
use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderValue, RETRY_AFTER, WWW_AUTHENTICATE};
use http::{Request, Response};
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tracing::{debug, info, warn};

use crate::access::{self, Note};
use crate::clock::{Clock, SystemClock};
use crate::config::{Action, Config};
use crate::headers;
use crate::identity::{self, IdentityConfig};
use crate::limit::LimitRequest;
use crate::limit::limiter::Limiter;
use crate::metrics::{Metrics, Outcome, RouteMetrics, UpstreamErrorKind};
use crate::plans::{PlanChoice, PlanResolver};
use crate::problem::{GatewayError, PROBLEM_JSON};
use crate::proxy::{self, Body, Forwarder, Hop};
use crate::routing::{LimitView, Router};
use crate::shadow;
use crate::store::{StoreError, keys};
use crate::target;
use crate::top::TopOffenders;
use crate::{guard, listener, upgrade};

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
struct Runtime {
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

    /// Handles one request from `peer`; never fails — every error becomes a
    /// response. Counts it in the metrics and writes its access-log line.
    pub async fn handle(&self, req: Request<Incoming>, peer: SocketAddr) -> Response<Body> {
        // The access log is often filtered out (`RUST_LOG=warn`); then the
        // clock is not read for it.
        let start =
            tracing::enabled!(target: "tollgate::access", tracing::Level::INFO).then(Instant::now);
        let method = req.method().clone();
        let mut note = Note::default();
        let res = self.route_request(req, peer, &mut note).await;
        let status = res.status();
        match &note.metrics {
            Some(m) => m.count(note.outcome),
            None => {
                self.metrics.unmatched.inc();
            }
        }
        if let Some(start) = start {
            access::log(&note, &method, status, start.elapsed());
        }
        res
    }

    async fn route_request(
        &self,
        req: Request<Incoming>,
        peer: SocketAddr,
        note: &mut Note,
    ) -> Response<Body> {
        let rt = self.runtime.load_full();
        let cfg = &rt.config;
        if let Err(e) = guard::check(&req, &cfg.server) {
            let mut res = error_response(&e);
            // RFC 9112 §6.1: close after answering a request whose framing
            // is in doubt; the other refusals keep nothing worth reusing.
            res.headers_mut()
                .insert(http::header::CONNECTION, HeaderValue::from_static("close"));
            return res;
        }
        // One canonical target for routing and forwarding (see `target`).
        let target =
            match target::canonical(req.uri(), req.version(), req.headers(), &cfg.server.path) {
                Ok(t) => t,
                Err(e) => {
                    debug!(error = %e, "request target refused");
                    return error_response(&GatewayError::BadRequest(e.to_string()));
                }
            };
        let Some(route) = rt
            .router
            .find(req.method(), target.host(), &target.match_path)
        else {
            return error_response(&GatewayError::NoRoute {
                method: req.method().to_string(),
                path: target.path.into_owned(),
            });
        };
        let rewritten = target::Rewrite::of(&target, req.headers());
        drop(target);
        let mut req = req;
        if let Err(e) = rewritten.apply(&mut req) {
            return error_response(&GatewayError::BadRequest(format!(
                "the request target has no canonical form: {e}"
            )));
        }
        note.route = Some(route.route.name.clone());
        note.metrics = rt.route_metrics.get(route.index).cloned().flatten();
        let route_metrics = note.metrics.clone();
        let now_ms = self.clock.now_ms();

        // Identity, the caller's plan, and the decision.
        let mut view: Option<Arc<LimitView>> = None;
        let checked = if route.route.limits.is_empty() {
            None
        } else {
            let idc = IdentityConfig {
                client_ip: &cfg.client_ip,
                api_keys: &cfg.api_keys,
                users: &cfg.users,
            };
            let caller = identity::caller(idc, peer.ip(), req.headers());
            note.identity = access::identity_kind(&caller);
            if !route.plan_views.is_empty() {
                // Boxed: a Redis call's future is kilobytes, and this one
                // would otherwise sit in every request's future.
                let choice = Box::pin(rt.plans.plan_of(
                    caller.api_key,
                    self.limiter.redis(),
                    now_ms,
                ))
                .await;
                view = match choice {
                    PlanChoice::Plan(p) => route.plan_views.get(&p).cloned(),
                    PlanChoice::Reject => None,
                };
                if view.is_none() {
                    debug!(route = %route.route.name, "no plan for this caller");
                    note.outcome = Outcome::Rejected;
                    let mut res = error_response(&GatewayError::UnknownApiKey);
                    res.headers_mut()
                        .insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
                    return res;
                }
            }
            let (limits, suffixes) = match &view {
                Some(v) => (&v.limits[..], &v.key_suffixes[..]),
                None => (&route.route.limits[..], &route.key_suffixes[..]),
            };
            let digest = cfg.store.digest_keys();
            let mut text = String::new();
            let requests: Vec<LimitRequest> = limits
                .iter()
                .zip(suffixes)
                .map(|(l, suffix)| {
                    let mut key = String::with_capacity(cfg.store.prefix.len() + 48 + suffix.len());
                    key.push_str(&cfg.store.prefix);
                    key.push('{');
                    if digest {
                        text.clear();
                        identity::write_key(&mut text, &l.key, &caller);
                        keys::push_digest(&mut key, text.as_bytes(), keys::IDENTITY_CHARS);
                    } else {
                        identity::write_key(&mut key, &l.key, &caller);
                    }
                    key.push('}');
                    key.push_str(suffix);
                    LimitRequest {
                        key,
                        limit: l.limit.get(),
                        window_ms: l.window_ms.get(),
                        cost: l.cost.unwrap_or(route.route.cost),
                        algorithm: l.algorithm,
                    }
                })
                .collect();
            let rd = shadow::decide(
                &self.limiter,
                now_ms,
                limits,
                route.route.shadow,
                &requests,
                route.route.on_error,
            )
            .await;
            shadow::record(
                &rd,
                &route.route.name,
                limits,
                &caller,
                route_metrics.as_deref(),
                &self.top,
            );
            note.decided(&rd);
            Some(rd)
        };
        let (limits, policy_header) = match &view {
            Some(v) => (&v.limits[..], v.policy_header.as_ref()),
            None => (&route.route.limits[..], route.policy_header.as_ref()),
        };
        let decision = checked.as_ref().and_then(|rd| rd.decision.as_ref());
        if checked.as_ref().is_some_and(|rd| rd.unavailable) {
            debug!(route = %route.route.name, "limiter unavailable; failing closed (on_error: deny)");
            return error_response(&GatewayError::StoreUnavailable);
        }

        if let Some(rd) = checked.as_ref().filter(|rd| !rd.allowed) {
            let retry_ms = rd.retry_after_ms();
            let err = GatewayError::Limited {
                policies: rd.violated(limits),
                retry_after: retry_ms.map(headers::ceil_secs),
            };
            note.outcome = Outcome::Limited;
            debug!(route = %route.route.name, "limited");
            let mut res = error_response(&err);
            if let Some(ms) = retry_ms {
                res.headers_mut()
                    .insert(RETRY_AFTER, HeaderValue::from(headers::ceil_secs(ms)));
            }
            headers::apply(
                cfg.headers,
                res.headers_mut(),
                policy_header,
                limits,
                decision,
                now_ms,
            );
            return res;
        }

        let mut res = match &route.route.action {
            Action::Respond(r) => {
                let mut res = Response::new(Either::Right(Full::new(r.body.clone())));
                *res.status_mut() = r.status;
                if let Ok(ct) = HeaderValue::from_str(&r.content_type) {
                    res.headers_mut().insert(CONTENT_TYPE, ct);
                }
                res
            }
            Action::Upstream(up) => {
                let upgrade = if up.upgrade {
                    upgrade::take(&mut req)
                } else {
                    None
                };
                let hop = Hop {
                    peer: peer.ip(),
                    trusted: identity::is_trusted(&cfg.client_ip.trusted_proxies, peer.ip()),
                    scheme: if req.extensions().get::<listener::Secure>().is_some() {
                        "https"
                    } else {
                        "http"
                    },
                    user_header: &cfg.users.header,
                };
                if let Err(e) = proxy::rewrite(&mut req, up, hop) {
                    warn!(error = %e, "cannot build upstream request");
                    note.outcome = Outcome::Error;
                    if let Some(m) = &route_metrics {
                        m.upstream_error(UpstreamErrorKind::Failed);
                    }
                    return error_response(&GatewayError::UpstreamFailed(e.to_string()));
                }
                if let Some(u) = &upgrade {
                    u.restore(req.headers_mut());
                }
                let pool = rt.pools.get(route.index).and_then(Option::as_deref);
                let sent = Instant::now();
                match self
                    .forwarder
                    .send(req, up, pool, cfg.server.max_body_size)
                    .await
                {
                    Ok(mut res) => {
                        if let Some(m) = &route_metrics {
                            m.upstream_response(res.status(), sent.elapsed());
                        }
                        if let Some(u) = upgrade {
                            u.finish(&mut res);
                        }
                        res.map(Either::Left)
                    }
                    Err(e) => {
                        let mut res = error_response(&e);
                        match access::forward_fault(&e) {
                            access::ForwardFault::Upstream(kind) => {
                                warn!(route = %route.route.name, error = %e, "upstream error");
                                note.outcome = Outcome::Error;
                                if let Some(m) = &route_metrics {
                                    m.upstream_error(kind);
                                }
                            }
                            access::ForwardFault::Client(kind) => {
                                debug!(route = %route.route.name, error = %e, "client error while forwarding");
                                note.outcome = Outcome::ClientError;
                                if let Some(m) = &route_metrics {
                                    m.client_error(kind);
                                }
                                // The request body was not read to its end:
                                // the connection cannot carry another request.
                                res.headers_mut().insert(
                                    http::header::CONNECTION,
                                    HeaderValue::from_static("close"),
                                );
                            }
                        }
                        res
                    }
                }
            }
        };
        headers::apply(
            cfg.headers,
            res.headers_mut(),
            policy_header,
            limits,
            decision,
            now_ms,
        );
        res
    }
}

/// The problem+json answer for a gateway error.
pub fn error_response(err: &GatewayError) -> Response<Body> {
    let mut res = Response::new(Either::Right(Full::new(err.problem())));
    *res.status_mut() = err.status();
    res.headers_mut().insert(CONTENT_TYPE, PROBLEM_JSON.clone());
    res
}

/// Serves `config` on `listeners` until `shutdown` completes, then drains.
/// Without an admin listener and without reload; the binary uses
/// [`Gateway::new`], [`crate::admin::serve_with_admin`] and
/// [`crate::reload::Hangups`] for those.
///
/// # Errors
/// The gateway cannot be built (see [`Gateway::new`]).
pub async fn run(
    listeners: Vec<TcpListener>,
    config: Config,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), StartError> {
    let gateway = Arc::new(Gateway::new(config).await?);
    serve(gateway, listeners, shutdown).await;
    Ok(())
}

/// Serves an existing gateway on `listeners` until `shutdown` completes.
///
/// `listeners[i]` serves with the TLS settings of the configuration's
/// `listen[i]` (plain when there is none). On shutdown the listeners are
/// closed at once — new connections are refused — and in-flight requests get
/// `timeouts.drain` to finish; see [`listener`] for the per-connection caps.
pub async fn serve(
    gateway: Arc<Gateway>,
    listeners: Vec<TcpListener>,
    shutdown: impl Future<Output = ()> + Send,
) {
    let (shared, drain) = gateway.with_config(|c| {
        (
            Arc::new(listener::Shared::new(&c.server, &c.timeouts)),
            c.timeouts.drain,
        )
    });
    let graceful = Arc::new(GracefulShutdown::new());
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);

    let mut tasks = Vec::new();
    for (index, l) in listeners.into_iter().enumerate() {
        if let Ok(addr) = l.local_addr() {
            info!(%addr, "listening");
        }
        tasks.push(tokio::spawn(listener::accept_loop(
            index,
            l,
            gateway.clone(),
            shared.clone(),
            graceful.clone(),
            stop_rx.clone(),
        )));
    }

    shutdown.await;
    let _ = stop_tx.send(true);
    for t in tasks {
        let _ = t.await;
    }
    // Logged once the accept loops have ended and dropped their listeners,
    // so it is true when read.
    info!("shutting down: no new connections, draining in-flight requests");
    let graceful = Arc::try_unwrap(graceful).unwrap_or_else(|g| {
        // Listener tasks have ended, so this is the only reference left;
        // fall back to a fresh watcher if not, which drains nothing.
        drop(g);
        GracefulShutdown::new()
    });
    if tokio::time::timeout(drain, graceful.shutdown())
        .await
        .is_err()
    {
        warn!("drain deadline passed; closing remaining connections");
    }
}

/// A body of static bytes, for tests and local answers.
pub fn full(b: impl Into<Bytes>) -> Body {
    Either::Right(Full::new(b.into()))
}
