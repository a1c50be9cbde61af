//! One request's tries over a pool's targets.
//!
//! - A try that could not connect (TCP or TLS), or whose new connection
//!   failed before a byte of the request was written, reached no one: the
//!   request goes to another target at once, whatever its method, without
//!   counting as a retry. Each target is tried at most once this way.
//! - A try that may have reached the target — it timed out, or its
//!   connection broke after the request was written — is retried on
//!   another target only when the request is idempotent and has no body,
//!   at most `retries` times, and only while the pool's retry budget
//!   allows.
//! - Each try is bounded by `per_try_timeout`, all of them together by the
//!   route's `timeout`.
//! - A failure that is the client's (its body broke) ends the request and
//!   is not held against the target.
//!
//! Every failed try, and every answer 502, 503 or 504, counts towards the
//! target's passive ejection ([`Balancer::failed`]); another answer resets
//! it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::header::HOST;
use http::uri::{Parts, PathAndQuery, Scheme};
use http::{HeaderValue, Request, Response, Uri};
use hyper::body::Incoming;
use tracing::debug;

use super::balancer::{Balancer, Endpoint, InFlight, Tried, mark_tried};
use super::body::{UpstreamBody, error_chain, failed};
use super::client::UpstreamClient;
use super::pool::{SendError, copy_head, replayable};
use super::resolve::{Resolve, resolve_once};
use crate::config::{PoolTarget, TargetScheme, UpstreamPool};
use crate::metrics::targets::TryOutcome;
use crate::problem::GatewayError;

/// Which try answered, for the access log and the metrics; holds the
/// answering target's in-flight count until the response body ends.
#[derive(Debug)]
pub struct Answered {
    /// Tries made, the answering one included.
    pub tries: u32,
    /// The pool's name.
    pub pool: Arc<str>,
    /// The answering target, as written.
    pub target: Arc<str>,
    /// The address it was reached at (`None` for https targets).
    pub addr: Option<SocketAddr>,
    /// How long the answering try waited for its response head.
    pub elapsed: Duration,
    /// The request, counted in flight on the target until dropped.
    pub in_flight: InFlight,
}

/// How one try ended.
enum Try {
    /// A response head arrived.
    Answered(Response<Incoming>),
    /// Nothing reached the target; the request comes back when it can.
    Unsent(String, Option<Request<UpstreamBody>>),
    /// The try failed after the request may have reached the target.
    Failed(GatewayError),
}

/// Sends `req` (already rewritten) to a target of `b`, trying others as
/// the module docs say. `key` is the caller's hash for `balance: hash`;
/// `https` the client for `https://` targets.
///
/// # Errors
/// The last try's error: [`GatewayError::UpstreamConnect`] when no target
/// could be reached, [`GatewayError::UpstreamTimeout`],
/// [`GatewayError::UpstreamFailed`], or the client's body error.
pub async fn send(
    mut req: Request<UpstreamBody>,
    b: &Balancer,
    https: Option<&UpstreamClient>,
    resolver: &dyn Resolve,
    key: Option<u64>,
    timeout: Duration,
) -> Result<(Response<Incoming>, Answered), GatewayError> {
    let cfg = &b.config;
    let mut start = Instant::now();
    let deadline = start + timeout;
    if b.is_empty() {
        // Names not resolved yet (the first request after start).
        resolve_once(b, resolver).await;
        start = Instant::now();
    }
    let replay = replayable(&req);
    let may_retry = cfg.retries > 0 && replay;
    if may_retry {
        b.deposit();
    }
    let https_pool = prepare_head(&mut req, cfg);
    let mut tried = Tried::new();
    let mut tries = 0u32;
    let mut retries = 0u32;
    let mut last: Option<GatewayError> = None;
    loop {
        let Some(e) = b.pick(key, &tried) else {
            return Err(last.unwrap_or_else(|| {
                GatewayError::UpstreamConnect(format!("pool {}: no target to try", cfg.name))
            }));
        };
        mark_tried(&mut tried, &e);
        tries += 1;
        // The first try starts when the request did: one clock read less
        // on every request.
        let started = if tries == 1 { start } else { Instant::now() };
        let left = deadline.saturating_duration_since(started);
        let bound = cfg.per_try_timeout.map_or(left, |t| t.min(left));
        if bound.is_zero() {
            return Err(last.unwrap_or(GatewayError::UpstreamTimeout(timeout)));
        }
        // A copy to send again: for a retry, and for an https try, whose
        // client keeps the request even when it could not connect.
        let again = ((may_retry && retries < cfg.retries) || (https_pool && replay))
            .then(|| copy_head(&req));
        let in_flight = InFlight::start(&e);
        let target = &cfg.targets[e.target];
        match one_try(req, again.as_ref(), &e, target, https, bound).await {
            Try::Answered(res) => {
                let took = started.elapsed();
                record_answer(b, &e, res.status(), took);
                let answered = Answered {
                    tries,
                    pool: cfg.name.clone(),
                    target: target.url.clone(),
                    addr: e.addr,
                    elapsed: took,
                    in_flight,
                };
                return Ok((res, answered));
            }
            Try::Unsent(message, back) => {
                b.tried(&e, TryOutcome::ConnectError, None);
                b.failed(&e);
                b.resolve_now.notify_one();
                debug!(pool = %cfg.name, target = %target.url, error = %message, "target unreachable; trying another");
                last = Some(GatewayError::UpstreamConnect(message));
                match back.or(again) {
                    Some(r) => req = r,
                    None => return Err(last.unwrap_or(GatewayError::UpstreamTimeout(timeout))),
                }
            }
            Try::Failed(err) => {
                let Some(outcome) = target_failure(&err) else {
                    return Err(err);
                };
                b.tried(&e, outcome, None);
                b.failed(&e);
                let retry = again.filter(|_| {
                    may_retry && retries < cfg.retries && Instant::now() < deadline && b.withdraw()
                });
                match retry {
                    Some(r) => {
                        debug!(pool = %cfg.name, target = %target.url, error = %err, "try failed; retrying on another target");
                        retries += 1;
                        req = r;
                        last = Some(err);
                    }
                    None => return Err(err),
                }
            }
        }
    }
}

/// Makes `req` fit the pool's targets: plain `http://` ones take the
/// origin form and the first target's authority as `Host` when the request
/// names none. Whether the pool's targets are `https://` (their client
/// takes the absolute form as it is).
fn prepare_head(req: &mut Request<UpstreamBody>, cfg: &UpstreamPool) -> bool {
    let https_pool = cfg
        .targets
        .first()
        .is_some_and(|t| t.scheme != TargetScheme::Http);
    if !https_pool {
        origin_form(req);
        if !req.headers().contains_key(HOST)
            && let Some(h) = cfg
                .targets
                .first()
                .and_then(|t| HeaderValue::from_str(t.authority.as_str()).ok())
        {
            req.headers_mut().insert(HOST, h);
        }
    }
    https_pool
}

/// Records an answer of `e` that took `took`: a 502, 503 or 504 counts
/// against the target (a sick target, or one behind a sick proxy), any
/// other status for it.
fn record_answer(b: &Balancer, e: &Endpoint, status: http::StatusCode, took: Duration) {
    if matches!(status.as_u16(), 502..=504) {
        b.tried(e, TryOutcome::Unavailable, Some(took));
        b.failed(e);
    } else {
        b.tried(e, TryOutcome::Answered, Some(took));
        b.succeeded(e);
    }
}

/// How a failed try counts against its target; `None` when the failure
/// is the client's (its body), not the target's.
fn target_failure(err: &GatewayError) -> Option<TryOutcome> {
    match err {
        GatewayError::UpstreamTimeout(_) => Some(TryOutcome::Timeout),
        GatewayError::UpstreamFailed(_) => Some(TryOutcome::Failed),
        _ => None,
    }
}

/// One try of `req` on `e`, within `bound`.
async fn one_try(
    mut req: Request<UpstreamBody>,
    spare: Option<&Request<UpstreamBody>>,
    e: &Endpoint,
    target: &PoolTarget,
    https: Option<&UpstreamClient>,
    bound: Duration,
) -> Try {
    match (&e.state.conns, https) {
        (Some(conns), _) => match tokio::time::timeout(bound, conns.send_with(req, spare)).await {
            Err(_) => Try::Failed(GatewayError::UpstreamTimeout(bound)),
            Ok(Err(SendError::Connect(message, back))) => Try::Unsent(message, Some(*back)),
            Ok(Err(SendError::Failed(err))) => Try::Failed(failed(&err, None)),
            Ok(Ok(res)) => Try::Answered(res),
        },
        (None, Some(client)) => {
            aim(&mut req, target);
            let fault = req.body_mut().watch();
            match Box::pin(tokio::time::timeout(bound, client.request(req))).await {
                Err(_) => Try::Failed(GatewayError::UpstreamTimeout(bound)),
                Ok(Err(err)) if err.is_connect() => Try::Unsent(error_chain(&err), None),
                Ok(Err(err)) => Try::Failed(failed(&err, fault.as_deref())),
                Ok(Ok(res)) => Try::Answered(res),
            }
        }
        (None, None) => Try::Unsent(format!("{}: no client for this target", target.url), None),
    }
}

/// The request's URI as a path (what a connection of its own is told).
fn origin_form(req: &mut Request<UpstreamBody>) {
    let pq = req
        .uri()
        .path_and_query()
        .cloned()
        .unwrap_or_else(|| PathAndQuery::from_static("/"));
    let mut parts = Parts::default();
    parts.path_and_query = Some(pq);
    if let Ok(uri) = Uri::from_parts(parts) {
        *req.uri_mut() = uri;
    }
}

/// Points a request for hyper's client at `target`: its URI, and `Host`
/// over TLS (matching SNI and HTTP/2's `:authority`); over `h2c://` the
/// URI's authority alone.
fn aim(req: &mut Request<UpstreamBody>, target: &PoolTarget) {
    let h2c = target.scheme == TargetScheme::H2c;
    let mut parts = Parts::default();
    parts.scheme = Some(if h2c { Scheme::HTTP } else { Scheme::HTTPS });
    parts.authority = Some(target.authority.clone());
    parts.path_and_query = req.uri().path_and_query().cloned();
    if let Ok(uri) = Uri::from_parts(parts) {
        *req.uri_mut() = uri;
    }
    if h2c {
        // HTTP/2 names the target in `:authority`, from the URI; a `Host`
        // beside it is a duplicate some servers refuse.
        req.headers_mut().remove(HOST);
    } else if let Ok(h) = HeaderValue::from_str(target.authority.as_str()) {
        req.headers_mut().insert(HOST, h);
    }
}
