//! Forwarding to upstreams: request rewriting, hop-by-hop removal and the
//! pooled HTTP client.
//!
//! Bodies are never buffered: the client's body is handed to the upstream
//! request and the upstream's ([`Received`]) is handed back to the client,
//! so both directions stream with back-pressure. The request
//! body is wrapped in [`UpstreamBody`], so a body past `server.max_body_size`
//! that was not announced by `Content-Length` is cut off while it streams
//! and answered 413, and a client body that fails on the way (malformed
//! chunks, a client gone mid-upload) is answered and counted as the
//! client's fault, not the upstream's.
//!
//! How an upstream is spoken to follows its URL's scheme ([`Protocol`]):
//! `http://` over HTTP/1.1 on the route's own [`KeepAlive`] connections
//! (hyper's client, or tollgate's own under `server.http1: native`), `h2c://` over
//! cleartext HTTP/2 with prior knowledge (hyper-util's client, one
//! multiplexed connection per upstream), `https://` through hyper-rustls:
//! SNI and certificate checks against the upstream's host name, the webpki
//! roots or the route's `upstream_ca`, and HTTP/2 when the upstream offers
//! it by ALPN. Clients for routes with their own CA are built on first use
//! and cached by the identity of their TLS settings, which a reload
//! replaces.
//!
//! Requests to upstreams that may speak HTTP/2 (`h2c://`, `https://`) keep
//! `te: trailers`, the one `te` an HTTP/2 request may carry (RFC 9113
//! §8.2.2) and the one gRPC servers insist on; trailers pass both ways as
//! frames of the streamed bodies. A gRPC call's deadline
//! ([`Deadline`]) bounds the wait for the response head when it is shorter
//! than the route's timeout.
//!
//! A route naming a pool under `upstreams` forwards through the pool's
//! [`Balancer`]: each try goes to the target it picks, a target that
//! cannot be reached costs nothing but a try elsewhere, and idempotent
//! bodiless requests are retried within the pool's budget (`tries`). The
//! balancer's names are kept resolved (`resolve`) and its targets checked
//! (`health`) by tasks that end with it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use tokio_rustls::rustls::ClientConfig;

use crate::config::{Http1, TargetScheme, Timeouts, Upstream, UpstreamPool};
use crate::problem::GatewayError;
use http::header::{HOST, HeaderValue};
use http::uri::PathAndQuery;
use http::{Request, Response, Uri};
use http_body_util::Either;

mod body;
mod client;
mod counted;
pub mod dial;
mod forwarding;
pub mod h1;
mod hop_by_hop;
pub mod io;
mod keepalive;
mod local;
mod peek;
mod protocol;
mod received;
mod rewrite;
pub mod rules;
pub mod upstreams;
mod watched;
pub use body::{ClientBody, ClientBodyError, UpstreamBody};
use body::{error_chain, failed};
use client::{UpstreamClient, build_client};
pub use counted::BodyBytes;
pub use forwarding::{Forwarding, X_FORWARDED_FOR, X_FORWARDED_HOST, X_FORWARDED_PROTO};
pub use hop_by_hop::{HOP_HEADERS, strip_hop_by_hop, strip_request_hop_by_hop};
pub use keepalive::{ConnSettings, KeepAlive};
pub use local::Local;
pub use peek::{PeekBudget, Peekable, Replay, peek};
pub use protocol::Protocol;
pub use received::Received;
pub use rewrite::{Hop, rewrite, rewrite_for_native};
pub use upstreams::balancer::{Balancer, Endpoint, EndpointState, hash64 as hash_key};
pub use upstreams::tries::Answered;
use upstreams::{health, resolve, tries};
pub use watched::{Watch, Watched};

/// Body of every response the gateway sends: streamed from an upstream
/// (with whatever watches it end, [`Watched`]), or made by the gateway
/// ([`Local`]).
pub type Body = Either<Watched, Local>;

impl crate::http1::text_fields::TextFields for Body {
    fn late(&self) -> Option<&crate::http1::write::LateFields> {
        match self {
            Either::Left(_) => None,
            Either::Right(local) => local.late(),
        }
    }

    fn passed(&self) -> Option<&crate::http1::fields::Passed> {
        match self {
            Either::Left(watched) => watched.get_ref().passed(),
            Either::Right(_) => None,
        }
    }

    fn take_passed(&mut self) -> Option<Box<crate::http1::fields::Passed>> {
        match self {
            Either::Left(watched) => watched.get_mut().take_passed(),
            Either::Right(_) => None,
        }
    }
}

/// Request extension marking a request that arrived over TLS; the
/// forwarder reads it to set `X-Forwarded-Proto: https`.
#[derive(Debug, Clone, Copy)]
pub struct Secure;

/// Request extension: a gRPC call's deadline (its `grpc-timeout`, counted
/// from its arrival). The forwarder waits for the response head at most
/// until then when it comes before the route's timeout, and answers
/// [`GatewayError::DeadlineExceeded`] when it passes.
#[derive(Debug, Clone, Copy)]
pub struct Deadline {
    /// When the deadline passes.
    pub at: Instant,
    /// The `grpc-timeout` the caller sent.
    pub budget: Duration,
}

/// What stands for a timeout past what the clock counts (as tokio's
/// timers take one): about 30 years.
const FAR_FUTURE: Duration = Duration::from_secs(86_400 * 365 * 30);

/// A client for one route's own CA, keyed by the TLS settings it was built
/// from.
type CustomClient = (Arc<ClientConfig>, UpstreamClient);

/// The pooled keep-alive client to upstreams.
#[derive(Clone, Debug)]
pub struct Forwarder {
    /// For `http://` upstreams and `https://` ones checked against the
    /// webpki roots.
    client: UpstreamClient,
    /// For `h2c://` upstreams: HTTP/2 only, one multiplexed connection
    /// per upstream.
    h2c: UpstreamClient,
    /// Clients for routes with their own CA file, by their TLS settings.
    custom: Arc<ArcSwap<Vec<CustomClient>>>,
    connect_timeout: Duration,
    idle_timeout: Duration,
    /// Whose client speaks to pools' plain `http://` targets.
    http1: Http1,
}

impl Forwarder {
    /// A client with the connect and idle timeouts of `timeouts`, speaking
    /// to pools' plain `http://` targets with `http1`'s client.
    ///
    /// # Errors
    /// The TLS settings for https upstreams cannot be built.
    pub fn new(timeouts: &Timeouts, http1: Http1) -> Result<Self, crate::tls::TlsError> {
        let tls = crate::tls::client_config(None)?;
        Ok(Self {
            client: build_client(
                &tls,
                timeouts.upstream_connect,
                timeouts.upstream_idle,
                false,
            ),
            h2c: build_client(
                &tls,
                timeouts.upstream_connect,
                timeouts.upstream_idle,
                true,
            ),
            custom: Arc::default(),
            connect_timeout: timeouts.upstream_connect,
            idle_timeout: timeouts.upstream_idle,
            http1,
        })
    }

    /// The client for `upstream`: a shared one borrowed (a clone of the
    /// client is several reference counts, paid per request otherwise), or
    /// the route's own.
    fn client_for(&self, upstream: &Upstream) -> std::borrow::Cow<'_, UpstreamClient> {
        if Protocol::of(&upstream.uri) == Protocol::H2c {
            return std::borrow::Cow::Borrowed(&self.h2c);
        }
        let Some(tls) = &upstream.tls else {
            return std::borrow::Cow::Borrowed(&self.client);
        };
        std::borrow::Cow::Owned(self.custom_client(tls))
    }

    fn custom_client(&self, tls: &Arc<ClientConfig>) -> UpstreamClient {
        if let Some((_, c)) = self.custom.load().iter().find(|(t, _)| Arc::ptr_eq(t, tls)) {
            return c.clone();
        }
        let client = build_client(tls, self.connect_timeout, self.idle_timeout, false);
        self.custom.rcu(|cached| {
            // Settings only this cache still holds belong to a configuration
            // that was replaced: drop their clients.
            let mut next: Vec<_> = cached
                .iter()
                .filter(|(t, _)| Arc::strong_count(t) > 1)
                .cloned()
                .collect();
            next.push((tls.clone(), client.clone()));
            next
        });
        client
    }

    /// Sends the rewritten request to `upstream` and waits at most its
    /// timeout from `sent` — or until the request's [`Deadline`], when that
    /// comes first — for the response head; the body then streams without
    /// a deadline. The request body is cut off past `max_body` bytes.
    ///
    /// # Errors
    /// [`GatewayError::UpstreamConnect`] when no connection could be made,
    /// [`GatewayError::UpstreamTimeout`] past the timeout,
    /// [`GatewayError::DeadlineExceeded`] past the deadline,
    /// [`GatewayError::PayloadTooLarge`] when the body passed `max_body`,
    /// [`GatewayError::BadRequestBody`] and [`GatewayError::ClientAborted`]
    /// when the client's body broke or stopped (see [`ClientBodyError`]),
    /// and [`GatewayError::UpstreamFailed`] when the connection broke.
    ///
    /// With `conns` (a plain `http://` upstream without upgrades, see
    /// [`keep_alive`]) the request goes over its kept-alive HTTP/1.1
    /// connections; otherwise over the general client. `forwarding` are
    /// the forwarding fields [`rewrite_for_native`] left out of the map.
    // What one send needs; a struct for this one call would only rename
    // them.
    #[allow(clippy::too_many_arguments)]
    pub async fn send(
        &self,
        req: Request<ClientBody>,
        upstream: &Upstream,
        conns: Option<&KeepAlive>,
        max_body: Option<u64>,
        forwarding: Option<Forwarding>,
        sent: Instant,
    ) -> Result<Response<Received>, GatewayError> {
        let count = req.extensions().get::<BodyBytes>().cloned();
        let (bound, deadline) = bound(upstream, sent, req.extensions().get::<Deadline>());
        // When the head must have come.
        let until = tokio::time::Instant::from_std(
            sent.checked_add(bound).unwrap_or_else(|| sent + FAR_FUTURE),
        );
        let expired = || match deadline {
            Some(budget) => GatewayError::DeadlineExceeded(budget),
            None => GatewayError::UpstreamTimeout(upstream.timeout),
        };
        let mut req = req.map(|b| {
            UpstreamBody::new(b, max_body)
                .counting(count)
                .forwarding(forwarding)
        });
        let sent = match conns {
            Some(conns) => {
                addressed_to_connection(&mut req, conns);
                if conns.is_native() {
                    // The connections bound the wait themselves: no timer
                    // is made for this request.
                    match conns.send(&mut req, false, until).await {
                        Err(dial::SendError::Expired) => Err(expired()),
                        Err(dial::SendError::Connect(e)) => Err(GatewayError::UpstreamConnect(e)),
                        Err(dial::SendError::Failed(e)) => Err(failed(&*e, None)),
                        Ok(res) => {
                            // Sent: its header map goes back to the
                            // thread, for the next head read there.
                            crate::http1::spare::give_map(std::mem::take(req.headers_mut()));
                            Ok(res)
                        }
                    }
                } else {
                    // Pinned where it is made: the timeout holds a pointer
                    // to it, and the exchange's future is not copied into
                    // the timeout's and then into this one.
                    let exchange = std::pin::pin!(conns.send_by_hyper(&mut req, false));
                    match tokio::time::timeout_at(until, exchange).await {
                        Err(_) | Ok(Err(dial::SendError::Expired)) => Err(expired()),
                        Ok(Err(dial::SendError::Connect(e))) => {
                            Err(GatewayError::UpstreamConnect(e))
                        }
                        Ok(Err(dial::SendError::Failed(e))) => Err(failed(&*e, None)),
                        Ok(Ok(res)) => Ok(res),
                    }
                }
            }
            None => {
                // Over HTTP/2 hyper resets the stream on a body error and
                // keeps the error to itself; the body leaves it here too.
                if let Some(f) = req.body_mut().take_forwarding() {
                    f.materialize(req.headers_mut());
                }
                let fault = req.body_mut().watch();
                let client = self.client_for(upstream);
                // Boxed: https, h2c and upgrade routes only, kept out of the
                // size of every request's future.
                match Box::pin(tokio::time::timeout_at(until, client.request(req))).await {
                    Err(_) => Err(expired()),
                    Ok(Err(e)) if e.is_connect() => {
                        Err(GatewayError::UpstreamConnect(error_chain(&e)))
                    }
                    Ok(Err(e)) => Err(failed(&e, fault.as_deref())),
                    Ok(Ok(res)) => Ok(res.map(Received::hyper)),
                }
            }
        };
        sent.map(|mut res| {
            strip_hop_by_hop(res.headers_mut());
            res
        })
    }
}

/// How long from `sent` an upstream's answer head may take: `upstream`'s
/// timeout, or what is left of a gRPC call's `deadline` when that comes
/// first, with the call's budget to name in its error.
fn bound(
    upstream: &Upstream,
    sent: Instant,
    deadline: Option<&Deadline>,
) -> (Duration, Option<Duration>) {
    let left = deadline.map(|d| (d.at.saturating_duration_since(sent), d.budget));
    match left {
        Some((left, budget)) if left < upstream.timeout => (left, Some(budget)),
        _ => (upstream.timeout, None),
    }
}

/// `req` as a connection of its own to `conns`' upstream is told it: the
/// path, not the URI (which `rewrite_for_native` leaves so), and a `Host`
/// when the forwarding fields as text do not come with the client's one.
fn addressed_to_connection(req: &mut Request<UpstreamBody>, conns: &KeepAlive) {
    if req.uri().authority().is_some() {
        let pq = req.uri().path_and_query().cloned();
        let mut parts = http::uri::Parts::default();
        parts.path_and_query = Some(pq.unwrap_or_else(|| PathAndQuery::from_static("/")));
        if let Ok(uri) = Uri::from_parts(parts) {
            *req.uri_mut() = uri;
        }
    }
    if req.body().forwarding_fields().is_none()
        && !req.headers().contains_key(HOST)
        && let Ok(h) = HeaderValue::from_str(conns.authority().as_str())
    {
        req.headers_mut().insert(HOST, h);
    }
}

impl Forwarder {
    /// Sends the rewritten request to a target of `balancer`'s pool,
    /// trying others as [`tries`] describes, all within `upstream`'s
    /// timeout from `sent` (when the caller sends it), or a gRPC call's
    /// [`Deadline`] when it comes first; `key` is the
    /// caller's hash for `balance: hash`. Returns the response, and writes
    /// which try answered it to `answered`.
    ///
    /// `forwarding` are the forwarding fields [`rewrite_for_native`] left
    /// out of the map.
    ///
    /// # Errors
    /// As [`Forwarder::send`], for the last try.
    // What a pool's tries need of the request; a struct for this one call
    // would only rename them.
    #[allow(clippy::too_many_arguments)]
    pub async fn send_to_pool(
        &self,
        req: Request<ClientBody>,
        upstream: &Upstream,
        balancer: &Balancer,
        resolver: &dyn resolve::Resolve,
        key: Option<u64>,
        max_body: Option<u64>,
        sent: Instant,
        answered: &mut Option<Answered>,
        forwarding: Option<Forwarding>,
    ) -> Result<Response<Received>, GatewayError> {
        let count = req.extensions().get::<BodyBytes>().cloned();
        let client = self.pool_client(&balancer.config);
        // A gRPC call's deadline, as `send` keeps it: only `https://` and
        // `h2c://` targets (those with a client here) speak HTTP/2, which
        // gRPC needs, so a pool of `http://` targets does not look.
        let (timeout, deadline) = bound(
            upstream,
            sent,
            client
                .as_ref()
                .and_then(|_| req.extensions().get::<Deadline>()),
        );
        let mut req = req.map(|b| {
            UpstreamBody::new(b, max_body)
                .counting(count)
                .forwarding(forwarding)
        });
        // Not boxed: the first try is the common path, as a request to
        // one URL is; `tries` boxes what only the rest need. Pinned where
        // it is made and awaited through the pin.
        let mut out = {
            let tries = std::pin::pin!(tries::send(
                &mut req,
                balancer,
                client.as_deref(),
                resolver,
                key,
                timeout,
                sent,
                answered,
            ));
            tries.await
        };
        // Sent: its header map goes back to the thread, as `send`'s does.
        crate::http1::spare::give_map(std::mem::take(req.headers_mut()));
        if let (Err(GatewayError::UpstreamTimeout(_)), Some(budget)) = (&out, deadline) {
            // The call's deadline came first, as `send` says it.
            return Err(GatewayError::DeadlineExceeded(budget));
        }
        // Stripped where it lies and passed on as it is: bound by value
        // (`?`), the answer would be moved once more.
        if let Ok(res) = &mut out {
            strip_hop_by_hop(res.headers_mut());
        }
        out
    }

    /// Whether tollgate's own HTTP/1.1 client speaks to `pool`'s targets
    /// (plain `http://` ones under `server.http1: native`).
    pub fn native_pool(&self, pool: &UpstreamPool) -> bool {
        self.http1 == Http1::Native
            && pool
                .targets
                .first()
                .is_some_and(|t| t.scheme == TargetScheme::Http)
    }

    /// The client for a pool's `https://` or `h2c://` targets (`None` for
    /// `http://` ones, which use each endpoint's own connections).
    fn pool_client(&self, pool: &UpstreamPool) -> Option<std::borrow::Cow<'_, UpstreamClient>> {
        match pool.targets.first().map(|t| t.scheme) {
            Some(TargetScheme::Https) => {}
            Some(TargetScheme::H2c) => return Some(std::borrow::Cow::Borrowed(&self.h2c)),
            Some(TargetScheme::Http) | None => return None,
        }
        Some(match &pool.tls {
            Some(tls) => std::borrow::Cow::Owned(self.custom_client(tls)),
            None => std::borrow::Cow::Borrowed(&self.client),
        })
    }

    /// The balancer of `pool`, with its background work started: names
    /// resolved through `resolver`, active checks. `previous` is the same
    /// pool's balancer in the configuration being replaced, whose targets'
    /// state carries over.
    pub fn balancer(
        &self,
        pool: Arc<UpstreamPool>,
        previous: Option<&Balancer>,
        resolver: &Arc<dyn resolve::Resolve>,
        metrics: &crate::metrics::Metrics,
    ) -> Arc<Balancer> {
        let b = Arc::new(Balancer::new(
            pool,
            previous,
            ConnSettings {
                connect_timeout: self.connect_timeout,
                idle_timeout: self.idle_timeout,
                http1: self.http1,
            },
            Some(&metrics.targets),
        ));
        let health: std::sync::Weak<dyn crate::metrics::targets::PoolHealth> =
            Arc::downgrade(&b) as _;
        metrics.targets.watch(health);
        resolve::spawn(&b, resolver.clone());
        health::spawn(
            &b,
            self.pool_client(&b.config)
                .map(std::borrow::Cow::into_owned),
        );
        b
    }
}

/// The kept-alive connections for `upstream` when it takes that HTTP/1.1
/// path: a plain `http://` upstream whose route does not pass upgrades,
/// spoken to by `http1`'s client.
pub fn keep_alive(upstream: &Upstream, timeouts: &Timeouts, http1: Http1) -> Option<KeepAlive> {
    if upstream.upgrade || Protocol::of(&upstream.uri) != Protocol::Http1 {
        return None;
    }
    let authority = upstream.uri.authority()?.clone();
    Some(KeepAlive::new(
        authority,
        ConnSettings {
            connect_timeout: timeouts.upstream_connect,
            idle_timeout: timeouts.upstream_idle,
            http1,
        },
    ))
}

#[cfg(test)]
mod tests;
