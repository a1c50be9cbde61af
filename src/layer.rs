//! tollgate's limits inside an application: [`RateLimitLayer`], a
//! [`tower::Layer`] that wraps any service of `http::Request`s (an axum
//! router, a tonic server, a hyper-util service) with the limits a route's
//! `limits:` are written in, on the same stores, with the same answers.
//!
//! The layer runs the gateway's own phases, not a copy: the caller is
//! worked out, overrides and plans applied and the limits decided by
//! [`decide::decide`], a refusal answered by [`refusal::response`]
//! (429 problem+json with `Retry-After`, or `RESOURCE_EXHAUSTED` with
//! pushback for a gRPC call), and the rate-limit headers put on every
//! answer by [`headers::apply`]. Its limits are those of one route, named
//! by [`Builder::name`] (`app` unless named), that takes every request.
//!
//! A limit with a `share:` counts on the key the gateway's limits of that
//! share count on (see [`keys::is_share`](crate::store::keys::is_share)):
//! with one Redis, a caller's quota is one quota whether its calls came
//! through the gateway or straight to the application. The layer's
//! limiter joins the instances `on_error: local` divides by (it takes
//! traffic, so it takes a share of the limit), and follows the support
//! API's overrides from Redis as every gateway does.
//!
//! The client IP needs the connection's address: the layer reads it from
//! the request's extensions, a [`Peer`] by default, or where
//! [`Builder::peer_from`] says (axum's `ConnectInfo<SocketAddr>`, tonic's
//! `TcpConnectInfo`). An application names its own caller with
//! [`Builder::key_from`]: the closure's answer stands for the user, so
//! limits keyed `user` count by it.
//!
//! The inner service reads the request body as a [`LayerRequestBody`]:
//! the body given, passed as it is, or read ahead and replayed when the
//! limits read its JSON fields.
//!
//! A decision made in process that waits for nothing (no Redis, plan
//! lookup, concurrency slot or delay) is made in [`tower::Service::call`]
//! itself, and the inner service called there: the answer's future
//! ([`ResponseFuture`]) is then the inner service's with the decision
//! beside it for the headers, not a boxed future of the whole exchange.
//! Where the in-process store alone answers the limits (no plan,
//! `exempt:`, override, body, shadow, delay, slot, `sync` or settled
//! cost), an admitted request takes only the part of the phase it would
//! reach: its caller, its limit requests and the store's answer
//! ([`decide::alone::admitted_at_once`]); a refused one goes through the
//! whole phase.

use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Extensions, Request, Response};
use http_body_util::{Either, Full};

use crate::clock::{Clock, SystemClock};
use crate::config::load::{self, ConfigErrors};
use crate::config::{Action, Config, HeaderMode, Limit, Respond, Route, StoreConfig};
use crate::decision::limiter::Limiter;
use crate::decision::overrides::{self, CallerOverrides, Watcher};
use crate::decision::shares;
use crate::grpc;
use crate::identity::{AppKey, Peer, Sources};
use crate::pipeline::decide::alone::StoreAlone;
use crate::pipeline::decide::{self, Deciding, Holdings, Purpose};
use crate::pipeline::delay::Waiting;
use crate::pipeline::exchange::CheckedLimits;
use crate::pipeline::{Exchange, refusal, settle};
use crate::plans::PlanResolver;
use crate::problem::GatewayError;
use crate::proxy::{PeekBudget, Watch, Watched};
use crate::routing::{CompiledRoute, Router};
use crate::store::StoreError;
use crate::top::TopOffenders;

mod answer;
mod body;

pub use answer::{BoxError, LayerBody};
pub use body::LayerRequestBody;
use body::{BodyUse, Counting};

/// Where a request's connection address is found in its extensions.
pub type PeerFrom = Arc<dyn Fn(&Extensions) -> Option<SocketAddr> + Send + Sync>;

/// The caller an application names for a request, if it names one.
pub type KeyFrom = Arc<dyn Fn(&http::request::Parts) -> Option<Arc<str>> + Send + Sync>;

/// Why a layer could not be built.
#[derive(Debug, thiserror::Error)]
pub enum LayerError {
    /// The YAML is not a layer's configuration; every error carries its
    /// field's path, line and column.
    #[error("{0}")]
    Config(#[from] ConfigErrors),
    /// The store cannot be set up.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A layer's settings before its store is set up: from YAML
/// ([`RateLimitLayer::from_yaml`], [`RateLimitLayer::from_file`]) or typed
/// ([`RateLimitLayer::builder`]).
pub struct Builder {
    config: Config,
    name: Arc<str>,
    peer: PeerFrom,
    key: Option<KeyFrom>,
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for Builder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Builder")
            .field("name", &self.name)
            .field("limits", &self.config.limits.len())
            .finish_non_exhaustive()
    }
}

impl Builder {
    fn new(config: Config) -> Self {
        Self {
            config,
            name: Arc::from("app"),
            peer: Arc::new(|ext: &Extensions| ext.get::<Peer>().map(|p| p.0)),
            key: None,
            clock: Arc::new(SystemClock),
        }
    }

    /// Adds a limit (typed: a limit as the loader makes it).
    #[must_use]
    pub fn limit(mut self, limit: Limit) -> Self {
        self.config.limits.push(limit);
        self
    }

    /// The name the layer's limits go by, as a route's name: in the
    /// support API, the keys of limits without a share, the logs
    /// (`app` unless named).
    #[must_use]
    pub fn name(mut self, name: &str) -> Self {
        self.name = Arc::from(name);
        self
    }

    /// Reads the connection's address with `f` (a [`Peer`] extension
    /// otherwise); a request without one comes from `0.0.0.0`.
    #[must_use]
    pub fn peer_from(
        mut self,
        f: impl Fn(&Extensions) -> Option<SocketAddr> + Send + Sync + 'static,
    ) -> Self {
        self.peer = Arc::new(f);
        self
    }

    /// Names the caller of each request with `f`: its answer counts as
    /// the user (`key: user`).
    #[must_use]
    pub fn key_from(
        mut self,
        f: impl Fn(&http::request::Parts) -> Option<Arc<str>> + Send + Sync + 'static,
    ) -> Self {
        self.key = Some(Arc::new(f));
        self
    }

    /// Decides on `clock` (the system's otherwise).
    #[must_use]
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Sets up the store (Redis connects in the background, as the
    /// gateway's does) and makes the layer.
    ///
    /// # Errors
    /// The store cannot be set up.
    pub async fn build(self) -> Result<RateLimitLayer, LayerError> {
        let Self {
            mut config,
            name,
            peer,
            key,
            clock,
        } = self;
        config.routes = vec![Route {
            name,
            matcher: crate::config::RouteMatch::default(),
            action: Action::Respond(Respond::default()),
            cost: 1,
            limits: std::mem::take(&mut config.limits),
            on_error: None,
            shadow: false,
            // A route's default `max_queue`.
            max_queue: 100,
            cors: None,
            request_headers: None,
            response_headers: None,
            exempt: config.exempt.clone(),
        }];
        let router = Router::new(&config);
        let route = router.routes()[0].clone();
        let limiter = Arc::new(
            Limiter::new(&config.store)
                .await?
                .with_clock(Arc::clone(&clock)),
        );
        let overrides = Arc::new(CallerOverrides::new(&config.store.prefix));
        let watcher = overrides::watch(Arc::clone(&overrides), Arc::clone(&limiter));
        let plans = PlanResolver::new(&config.api_keys, &config.plans, &config.store.prefix);
        if let Some(redis) = &config.store.redis {
            // The app's limits are counted beside the gateway's: a share
            // the two define apart is told, as between gateways.
            tokio::spawn(shares::check(
                Arc::clone(&limiter),
                config.store.prefix.clone(),
                shares::shared(std::iter::empty(), &route.route.limits),
                redis.startup_wait,
                None,
            ));
        }
        // Decided in `call` when nothing can make the decision wait.
        let at_once = limiter.in_process()
            && !std::iter::once(&route.route.limits)
                .chain(route.plan_views.values().map(|v| &v.limits))
                .flatten()
                .any(|l| l.delay.is_some() || l.concurrency.is_some());
        // The caller's values the limits read; every one where a plan
        // picks the limits.
        let sources = if route.plan_views.is_empty() {
            let mut read = Sources::of_keys(route.route.limits.iter().map(|l| &l.key));
            read.api_key |= route
                .route
                .exempt
                .as_ref()
                .is_some_and(|e| !e.api_keys.is_empty());
            read
        } else {
            Sources::ALL
        };
        // Its conditions hold `at_once`'s and leave the body unread.
        let store_alone = decide::alone::answered_by_store(&route, &limiter);
        Ok(RateLimitLayer {
            core: Arc::new(Core {
                at_once,
                store_alone,
                sources,
                config,
                body: BodyUse::of(&route),
                body_budget: PeekBudget::new(crate::pipeline::gateway::BODY_BUDGET),
                route,
                plans,
                limiter,
                overrides,
                _watcher: watcher,
                waiting: Waiting::default(),
                top: TopOffenders::default(),
                clock,
                peer,
                key,
            }),
        })
    }
}

/// What every service of one layer shares.
struct Core {
    config: Config,
    /// The layer's limits, compiled as a route's.
    route: Arc<CompiledRoute>,
    /// What the limits need of the request body.
    body: BodyUse,
    /// The caller's values the limits read besides the client IP.
    sources: Sources,
    /// Whether a decision may be made at once, in `call` (in process,
    /// without slots or delays; a plan looked up still waits).
    at_once: bool,
    /// Where an admitted request needs only its limit requests and the
    /// in-process store's answer ([`decide::alone::answered_by_store`]):
    /// what of them is known before the request.
    store_alone: Option<StoreAlone>,
    /// Request-body bytes read for the limits, held at once by the
    /// layer's services together (the gateway's `BODY_BUDGET`).
    body_budget: PeekBudget,
    plans: PlanResolver,
    limiter: Arc<Limiter>,
    overrides: Arc<CallerOverrides>,
    /// Keeps `overrides` in step with Redis; stops with the layer.
    _watcher: Option<Watcher>,
    waiting: Waiting,
    top: TopOffenders,
    clock: Arc<dyn Clock>,
    peer: PeerFrom,
    key: Option<KeyFrom>,
}

impl Core {
    /// `req` with the application's key for its caller put in its
    /// extensions, and its body wrapped: taken apart for the key's
    /// closure only where there is one, since every move of the head is
    /// a copy of a few hundred bytes.
    #[inline]
    fn named<B: http_body::Body<Data = Bytes> + Unpin>(
        &self,
        req: Request<B>,
    ) -> Request<LayerRequestBody<B>> {
        let Some(key) = &self.key else {
            return req.map(LayerRequestBody::new);
        };
        let (mut parts, body) = req.into_parts();
        if let Some(k) = key(&parts) {
            parts.extensions.insert(AppKey(k));
        }
        Request::from_parts(parts, LayerRequestBody::new(body))
    }

    /// The exchange record of a request with head `head`: the
    /// connection's address read from its extensions. Made where it is
    /// returned: the record is some hundreds of bytes, and nothing is
    /// written into it after, so it is not copied on its way out. Whether
    /// the request is a gRPC call is asked only of a refusal
    /// ([`refused`](Self::refused)).
    #[inline]
    fn exchange<B>(&self, head: &Request<B>) -> Exchange {
        Exchange::new(head.method().clone(), self.peer_of(head))
    }

    /// The connection's address of request `head`, read from its
    /// extensions; `0.0.0.0:0` where there is none.
    #[inline]
    fn peer_of<B>(&self, head: &Request<B>) -> SocketAddr {
        (self.peer)(head.extensions()).unwrap_or(SocketAddr::from(([0, 0, 0, 0], 0)))
    }

    /// The answer to request `head`, which the limits refused, with its
    /// rate-limit headers: a gRPC call's the gRPC way.
    fn refused<B, R>(
        &self,
        refusal: &GatewayError,
        head: &Request<B>,
        ex: &Exchange,
    ) -> Response<LayerBody<R>> {
        let grpc = grpc::Kind::of(head.method(), head.headers());
        let mut res = refusal::response(refusal, None, grpc).map(|body| match body {
            Either::Right(local) => LayerBody::refusal(local.into_full()),
            // A refusal's body is made here, never an upstream's.
            Either::Left(_) => LayerBody::refusal(Full::default()),
        });
        if let Some(checked) = &ex.checked {
            checked.write_headers(self.config.headers, res.headers_mut());
        }
        res
    }

    fn deciding(&self) -> Deciding<'_> {
        Deciding {
            config: &self.config,
            plans: &self.plans,
            limiter: &self.limiter,
            overrides: &self.overrides,
            waiting: &self.waiting,
            top: &self.top,
            clock: &*self.clock,
            sources: self.sources,
        }
    }
}

/// tollgate's limits as a [`tower::Layer`]; see the [module](self).
#[derive(Clone)]
pub struct RateLimitLayer {
    core: Arc<Core>,
}

impl std::fmt::Debug for RateLimitLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("route", &self.core.route.route.name)
            .finish_non_exhaustive()
    }
}

impl RateLimitLayer {
    /// A layer from YAML in the gateway's spelling: a `store:`, the
    /// caller sections its keys need (`client_ip:`, `api_keys:`, `users:`,
    /// `plans:`, `exempt:`) and a top-level `limits:` list.
    ///
    /// # Errors
    /// Every problem of the text, each with its path, line and column.
    pub fn from_yaml(yaml: &str) -> Result<Builder, LayerError> {
        Ok(Builder::new(load::parse_layer_str(yaml)?))
    }

    /// [`from_yaml`](Self::from_yaml) of the file at `path`.
    ///
    /// # Errors
    /// The file cannot be read, or its text has problems.
    pub fn from_file(path: &Path) -> Result<Builder, LayerError> {
        Ok(Builder::new(load::load_layer_file(path)?))
    }

    /// A typed builder on `store`, without limits yet
    /// ([`Builder::limit`]); callers' sections keep their defaults.
    pub fn builder(store: StoreConfig) -> Builder {
        let mut config = match load::parse_layer_str("limits: []") {
            Ok(c) => c,
            // The text above is a valid configuration.
            Err(e) => unreachable!("the empty layer configuration: {e}"),
        };
        config.store = store;
        Builder::new(config)
    }

    /// The limiter, for readiness checks.
    pub fn limiter(&self) -> &Limiter {
        &self.core.limiter
    }
}

impl<S> tower::Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;

    fn layer(&self, inner: S) -> RateLimit<S> {
        RateLimit {
            inner,
            core: Arc::clone(&self.core),
        }
    }
}

/// A service behind [`RateLimitLayer`]: the limits first, then `S`.
#[derive(Clone)]
pub struct RateLimit<S> {
    inner: S,
    core: Arc<Core>,
}

impl<S> std::fmt::Debug for RateLimit<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimit").finish_non_exhaustive()
    }
}

impl<S, B, R> tower::Service<Request<B>> for RateLimit<S>
where
    S: tower::Service<Request<LayerRequestBody<B>>, Response = Response<R>>
        + Clone
        + Send
        + 'static,
    S::Future: Send,
    S::Error: Send,
    B: http_body::Body<Data = Bytes> + Unpin + Send + 'static,
    B::Error: Send,
    R: http_body::Body<Data = Bytes> + Send + 'static,
{
    type Response = Response<LayerBody<R>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, R, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        // The clone that was driven to readiness serves this request.
        let ready = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, ready);
        let core = &self.core;
        let req = core.named(req);
        if core.body.any() {
            return ResponseFuture::boxed(limited_with_body(Arc::clone(core), inner, req));
        }
        if !core.at_once {
            return ResponseFuture::boxed(limited(Arc::clone(core), inner, req));
        }
        if let Some(alone) = &core.store_alone {
            let peer = core.peer_of(&req).ip();
            let deciding = core.deciding();
            if let Some(checked) =
                decide::alone::admitted_at_once(&deciding, &core.route, alone, &req, peer)
            {
                return ResponseFuture {
                    kind: Kind::Called {
                        checked: Some(checked),
                        mode: core.config.headers,
                        answer: inner.call(req),
                    },
                };
            }
        }
        let mut ex = core.exchange(&req);
        let kind = match decide::decide_at_once(&core.deciding(), &core.route, &req, &mut ex) {
            Some(Ok(Holdings {
                slots: None,
                reservations: None,
            })) => {
                // Made in the answer's future itself, not moved there.
                return ResponseFuture {
                    kind: Kind::Called {
                        checked: ex.checked,
                        mode: core.config.headers,
                        answer: inner.call(req),
                    },
                };
            }
            Some(Err(refusal)) => Kind::Refused {
                answer: Some(core.refused(&refusal, &req, &ex)),
            },
            // Costs to settle: the answer is waited on in a future of
            // its own.
            Some(Ok(holdings)) => {
                let core = Arc::clone(core);
                Kind::Boxed {
                    answer: Box::pin(
                        async move { answered(&core, inner, req, Ok(holdings), ex).await },
                    ),
                }
            }
            None => Kind::Boxed {
                answer: Box::pin(limited(Arc::clone(core), inner, req)),
            },
        };
        ResponseFuture { kind }
    }
}

pin_project_lite::pin_project! {
    /// The future of a [`RateLimit`] service's answer: the inner
    /// service's when the limits were decided in `call` and admitted the
    /// request, a refusal made there, or the whole exchange boxed when its
    /// decision waits.
    pub struct ResponseFuture<F, R, E> {
        #[pin]
        kind: Kind<F, R, E>,
    }
}

/// A boxed answer of the layer.
type BoxedAnswer<R, E> = Pin<Box<dyn Future<Output = Result<Response<LayerBody<R>>, E>> + Send>>;

pin_project_lite::pin_project! {
    #[project = KindProj]
    enum Kind<F, R, E> {
        // The inner service called, with the decision for the headers.
        Called {
            #[pin]
            answer: F,
            checked: Option<CheckedLimits>,
            mode: HeaderMode,
        },
        // Refused in `call`; taken when polled.
        Refused {
            answer: Option<Response<LayerBody<R>>>,
        },
        Boxed {
            answer: BoxedAnswer<R, E>,
        },
    }
}

impl<F, R, E> ResponseFuture<F, R, E> {
    fn boxed(
        answer: impl Future<Output = Result<Response<LayerBody<R>>, E>> + Send + 'static,
    ) -> Self {
        Self {
            kind: Kind::Boxed {
                answer: Box::pin(answer),
            },
        }
    }
}

impl<F, R, E> std::fmt::Debug for ResponseFuture<F, R, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl<F, R, E> Future for ResponseFuture<F, R, E>
where
    F: Future<Output = Result<Response<R>, E>>,
{
    type Output = Result<Response<LayerBody<R>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Called {
                answer,
                checked,
                mode,
            } => {
                let res = std::task::ready!(answer.poll(cx))?;
                let mut res = res.map(LayerBody::inner);
                if let Some(checked) = checked {
                    checked.write_headers(*mode, res.headers_mut());
                }
                Poll::Ready(Ok(res))
            }
            KindProj::Refused { answer } => match answer.take() {
                Some(res) => Poll::Ready(Ok(res)),
                // Polled again after it answered.
                None => Poll::Pending,
            },
            KindProj::Boxed { answer } => answer.as_mut().poll(cx),
        }
    }
}

/// Decides `req`'s limits with the gateway's phase and answers its
/// refusal, or calls `inner`; the rate-limit headers go on either answer.
async fn limited<S, B, R>(
    core: Arc<Core>,
    inner: S,
    req: Request<B>,
) -> Result<Response<LayerBody<R>>, S::Error>
where
    S: tower::Service<Request<B>, Response = Response<R>>,
    R: http_body::Body<Data = Bytes> + Send + 'static,
{
    // The limits read the head only; the body waits beside it, so it
    // need not be `Sync` to cross the decision's awaits.
    let (parts, body) = req.into_parts();
    let head = Request::from_parts(parts, ());
    let mut ex = core.exchange(&head);
    let decided = decide::decide(
        &core.deciding(),
        &core.route,
        &head,
        &mut ex,
        Purpose::Serve,
    )
    .await;
    let req = Request::from_parts(head.into_parts().0, body);
    answered(&core, inner, req, decided, ex).await
}

/// The answer to `req` once its limits are decided: `inner`'s, holding
/// the request's slots and settling its costs, or the refusal; the
/// rate-limit headers go on either.
async fn answered<S, B, R>(
    core: &Core,
    mut inner: S,
    mut req: Request<B>,
    decided: Result<Holdings, GatewayError>,
    ex: Exchange,
) -> Result<Response<LayerBody<R>>, S::Error>
where
    S: tower::Service<Request<B>, Response = Response<R>>,
    R: http_body::Body<Data = Bytes> + Send + 'static,
{
    let holdings = match decided {
        Ok(holdings) => holdings,
        Err(refusal) => return Ok(core.refused(&refusal, &req, &ex)),
    };
    let settling = settle::prepare(holdings.reservations, &mut req);
    let answer = inner.call(req).await;
    let (res, settles) = match settling {
        None => (answer?, None),
        // Boxed: most requests settle nothing, and this future
        // would otherwise grow every request's by its size.
        settling => {
            Box::pin(settle::settle_head(
                &core.limiter,
                &core.clock,
                settling,
                answer,
            ))
            .await?
        }
    };
    // The slots and what is left to settle go with the body, as
    // the gateway's do: given back, settled, when it ends.
    let slots = holdings.slots.map(|s| Box::new(s) as Box<dyn Watch>);
    let watches: Vec<Box<dyn Watch>> = settles.into_iter().chain(slots).collect();
    let mut res = if watches.is_empty() {
        res.map(LayerBody::inner)
    } else {
        res.map(|b| {
            let mut watched = Watched::new(Box::pin(b));
            for w in watches {
                watched.add_watch(w);
            }
            LayerBody::watched(watched)
        })
    };
    if let Some(checked) = &ex.checked {
        checked.write_headers(core.config.headers, res.headers_mut());
    }
    Ok(res)
}

/// [`limited`] for a request whose limits need its body: the fields the
/// limits read taken out first, the bytes the inner service reads counted.
async fn limited_with_body<S, B, R>(
    core: Arc<Core>,
    inner: S,
    mut req: Request<LayerRequestBody<B>>,
) -> Result<Response<LayerBody<R>>, S::Error>
where
    S: tower::Service<Request<LayerRequestBody<B>>, Response = Response<R>>,
    B: http_body::Body<Data = Bytes> + Unpin,
    R: http_body::Body<Data = Bytes> + Send + 'static,
{
    if core.body.reads {
        req = crate::pipeline::body::read_within(&core.body_budget, &core.route, req).await;
    }
    limited(core, Counting(inner), req).await
}
