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
use std::time::{Duration, Instant};

use http::header::HOST;
use http::uri::{Parts, PathAndQuery, Scheme};
use http::{HeaderValue, Request, Response, Uri};
use tracing::debug;

use super::balancer::{Balancer, Endpoint, InFlight, Tried, mark_tried};
use super::resolve::{Resolve, resolve_once};
use crate::config::{PoolTarget, TargetScheme, UpstreamPool};
use crate::metrics::targets::TryEnd;
use crate::problem::GatewayError;
use crate::proxy::body::{UpstreamBody, error_chain, failed};
use crate::proxy::client::UpstreamClient;
use crate::proxy::dial::{SendError, copy_head, replayable};
use crate::proxy::received::Received;

/// Which try answered, for the access log and the metrics; holds the
/// answering target's in-flight count until the response body ends.
#[derive(Debug)]
pub struct Answered {
    /// Tries made, the answering one included.
    pub tries: u32,
    /// The answering target: its index in the pool's `targets`.
    pub target: usize,
    /// The address it was reached at (`None` for https targets).
    pub addr: Option<SocketAddr>,
    /// How long the response head took, from when the request was sent
    /// (its first try).
    pub since_sent: Duration,
    /// The request, counted in flight on the target until dropped.
    pub in_flight: InFlight,
}

/// How one try ended: a response head arrived, or it missed.
type Try = Result<Response<Received>, Miss>;

/// How a try missed.
enum Miss {
    /// Nothing reached the target; `true` when the caller holds the
    /// request again (hyper's general client takes it, and leaves a copy
    /// only when the try keeps one).
    Unsent(String, bool),
    /// The try failed after the request may have reached the target.
    Failed(GatewayError),
}

/// Sends `req` (already rewritten; borrowed, so that no try moves it) to a
/// target of `b`, trying others as the module docs say; `sent` is when the request was sent, which the
/// first try and the route's timeout count from. `key` is the caller's
/// hash for `balance: hash`; `https` the client for `https://` targets.
/// Which try answered is written to `answered`, beside the response
/// rather than with it: the response is moved as one URL's is, no more.
///
/// The first try to a plain `http://` target — nearly every request to a
/// pool — is made here, as a request to one URL is: its future is part of
/// the caller's. What a second try needs (the tried set, the retry budget's
/// withdrawal, the loop) is built, boxed, only when the first did not
/// answer, and so is the whole of a request to `https://` targets or to a
/// pool whose names are not resolved yet.
///
/// # Errors
/// The last try's error: [`GatewayError::UpstreamConnect`] when no target
/// could be reached, [`GatewayError::UpstreamTimeout`],
/// [`GatewayError::UpstreamFailed`], or the client's body error.
// What one request's tries need; a struct for this one call would only
// rename them.
#[allow(clippy::too_many_arguments)]
pub async fn send(
    req: &mut Request<UpstreamBody>,
    b: &Balancer,
    https: Option<&UpstreamClient>,
    resolver: &dyn Resolve,
    key: Option<u64>,
    timeout: Duration,
    sent: Instant,
    answered: &mut Option<Answered>,
) -> Result<Response<Received>, GatewayError> {
    let picked = match https {
        None => b.pick(key, &Tried::new()),
        Some(_) => None,
    };
    let Some(e) = picked else {
        // https targets, or no endpoint yet (names not resolved).
        let all = send_all(req, b, https, resolver, key, timeout, sent, answered);
        return Box::pin(all).await;
    };
    let cfg = &b.config;
    let (replay, may_retry, _) = begin(req, b);
    // The whole timeout is left for the first try.
    let bound = cfg.per_try_timeout.map_or(timeout, |t| t.min(timeout));
    if bound.is_zero() {
        return Err(GatewayError::UpstreamTimeout(timeout));
    }
    let mut in_flight = Some(InFlight::start(&e));
    let miss = match &e.state.conns {
        Some(conns) => {
            // Bounded from `sent`: no clock read of its own.
            let until = tokio::time::Instant::from_std(sent + bound);
            // It borrows the request, which stays here for a try after it
            // (see `KeepAlive::send`): no copy is made for a retry that
            // rarely comes.
            let out = conns.send(req, may_retry, until).await;
            // The answer is recorded where it lies and then moved once,
            // straight to the caller (matched by value, it would be moved
            // twice: out of `out`, then into the result). The count in
            // flight passes to the answer, or ends here on a miss.
            if let (Ok(res), Some(f)) = (&out, in_flight.take()) {
                answer(answered, b, res, &e, f, 1, sent, sent);
            }
            match out {
                Ok(res) => return Ok(res),
                Err(err) => missed(err, bound),
            }
        }
        None => no_client(&cfg.targets[e.target]),
    };
    drop(in_flight);
    let mut tries = Tries {
        b,
        key,
        timeout,
        deadline: sent + timeout,
        replay,
        may_retry,
        // No https client: every try is on a target's own connections.
        https_pool: false,
        tried: Tried::new(),
        tries: 1,
        retries: 0,
        last: None,
    };
    mark_tried(&mut tries.tried, &e);
    Box::pin(tries.rest(miss, e, req, https, sent, answered)).await
}

/// A request's tries from the start, for what the first try of
/// [`send`] does not cover; its arguments are [`send`]'s.
#[allow(clippy::too_many_arguments)]
async fn send_all(
    req: &mut Request<UpstreamBody>,
    b: &Balancer,
    https: Option<&UpstreamClient>,
    resolver: &dyn Resolve,
    key: Option<u64>,
    timeout: Duration,
    sent: Instant,
    answered: &mut Option<Answered>,
) -> Result<Response<Received>, GatewayError> {
    let cfg = &b.config;
    let mut start = sent;
    let deadline = sent + timeout;
    if b.is_empty() {
        // Names not resolved yet (the first request after start).
        resolve_once(b, resolver).await;
        start = Instant::now();
    }
    let (replay, may_retry, https_pool) = begin(req, b);
    let mut tries = Tries {
        b,
        key,
        timeout,
        deadline,
        replay,
        may_retry,
        https_pool,
        tried: Tried::new(),
        tries: 0,
        retries: 0,
        last: None,
    };
    let e = tries.next()?;
    let bound = tries.bound(start)?;
    let in_flight = InFlight::start(&e);
    let keep = tries.keep();
    let target = &cfg.targets[e.target];
    let miss = match one_try(req, keep, &e, target, https, bound).await {
        Ok(res) => {
            answer(answered, b, &res, &e, in_flight, tries.tries, start, sent);
            return Ok(res);
        }
        Err(miss) => miss,
    };
    drop(in_flight);
    tries.rest(miss, e, req, https, sent, answered).await
}

/// What a request's tries keep from one to the next.
struct Tries<'a> {
    b: &'a Balancer,
    key: Option<u64>,
    /// The route's timeout, and when it passes.
    timeout: Duration,
    deadline: Instant,
    /// Whether the request may be sent twice (idempotent, no body), and
    /// whether it may be retried after reaching a target.
    replay: bool,
    may_retry: bool,
    /// The pool's targets are `https://` or `h2c://`.
    https_pool: bool,
    tried: Tried,
    tries: u32,
    retries: u32,
    /// The error of the last try that failed.
    last: Option<GatewayError>,
}

impl Tries<'_> {
    /// The tries after one on `e` that missed (`miss`); `req` is the
    /// request as that try left it.
    async fn rest(
        mut self,
        mut miss: Miss,
        mut e: Endpoint,
        req: &mut Request<UpstreamBody>,
        https: Option<&UpstreamClient>,
        sent: Instant,
        answered: &mut Option<Answered>,
    ) -> Result<Response<Received>, GatewayError> {
        let cfg = &self.b.config;
        loop {
            self.after(miss, &e)?;
            let next = self.next()?;
            let started = Instant::now();
            let bound = self.bound(started)?;
            let in_flight = InFlight::start(&next);
            let target = &cfg.targets[next.target];
            let keep = self.keep();
            miss = match one_try(req, keep, &next, target, https, bound).await {
                Ok(res) => {
                    let tries = self.tries;
                    answer(
                        answered, self.b, &res, &next, in_flight, tries, started, sent,
                    );
                    return Ok(res);
                }
                Err(miss) => miss,
            };
            drop(in_flight);
            e = next;
        }
    }

    /// The endpoint of the next try.
    ///
    /// # Errors
    /// No endpoint is left to try.
    fn next(&mut self) -> Result<Endpoint, GatewayError> {
        let cfg = &self.b.config;
        let Some(e) = self.b.pick(self.key, &self.tried) else {
            return Err(self.last.take().unwrap_or_else(|| no_target(cfg)));
        };
        mark_tried(&mut self.tried, &e);
        self.tries += 1;
        Ok(e)
    }

    /// Whether the next try keeps the request for a try after it: for a
    /// retry, and for an https try, whose client keeps the request even
    /// when it could not connect.
    fn keep(&self) -> bool {
        (self.may_retry && self.retries < self.b.config.retries) || (self.https_pool && self.replay)
    }

    /// How long a try that starts at `started` may take.
    ///
    /// # Errors
    /// The route's timeout has passed.
    fn bound(&mut self, started: Instant) -> Result<Duration, GatewayError> {
        let left = self.deadline.saturating_duration_since(started);
        let bound = self.b.config.per_try_timeout.map_or(left, |t| t.min(left));
        if bound.is_zero() {
            return Err(self
                .last
                .take()
                .unwrap_or(GatewayError::UpstreamTimeout(self.timeout)));
        }
        Ok(bound)
    }

    /// Counts a try on `e` that missed; whether the request goes on to
    /// another try.
    ///
    /// # Errors
    /// The request may not, or cannot, be tried again.
    fn after(&mut self, miss: Miss, e: &Endpoint) -> Result<(), GatewayError> {
        let b = self.b;
        let cfg = &b.config;
        let target = &cfg.targets[e.target];
        match miss {
            Miss::Unsent(message, whole) => {
                b.tried(e, TryEnd::ConnectError, None);
                b.failed(e);
                b.resolve_now.notify_one();
                debug!(pool = %cfg.name, target = %target.url, error = %message, "target unreachable; trying another");
                let err = GatewayError::UpstreamConnect(message);
                if !whole {
                    return Err(err);
                }
                self.last = Some(err);
                Ok(())
            }
            Miss::Failed(err) => {
                let Some(outcome) = target_failure(&err) else {
                    return Err(err);
                };
                b.tried(e, outcome, None);
                b.failed(e);
                // The try kept the request when these held as it began
                // (`keep`): a retry sends what it kept.
                let retry = self.may_retry
                    && self.retries < cfg.retries
                    && Instant::now() < self.deadline
                    && b.withdraw();
                if !retry {
                    return Err(err);
                }
                debug!(pool = %cfg.name, target = %target.url, error = %err, "try failed; retrying on another target");
                self.retries += 1;
                self.last = Some(err);
                Ok(())
            }
        }
    }
}

/// The request's answer `res` from `e`, on its `tries`th try, which
/// started at `started` (the request at `sent`): recorded against the
/// target, and what the caller is told written to `answered` (in place,
/// not copied there). One clock read for both.
#[inline]
#[allow(clippy::too_many_arguments)]
fn answer(
    answered: &mut Option<Answered>,
    b: &Balancer,
    res: &Response<Received>,
    e: &Endpoint,
    in_flight: InFlight,
    tries: u32,
    started: Instant,
    sent: Instant,
) {
    let now = Instant::now();
    let took = now.saturating_duration_since(started);
    record_answer(b, e, res.status(), took);
    *answered = Some(Answered {
        tries,
        target: e.target,
        addr: e.addr,
        // The first try starts when the request is sent.
        since_sent: if started == sent {
            took
        } else {
            now.saturating_duration_since(sent)
        },
        in_flight,
    });
}

/// The error when the pool has no endpoint to try.
fn no_target(cfg: &UpstreamPool) -> GatewayError {
    GatewayError::UpstreamConnect(format!("pool {}: no target to try", cfg.name))
}

/// A try on a target without a client: the request is not sent.
fn no_client(target: &PoolTarget) -> Miss {
    Miss::Unsent(format!("{}: no client for this target", target.url), true)
}

/// How a try on a target's own connections, bounded by `bound`, missed.
fn missed(err: SendError, bound: Duration) -> Miss {
    match err {
        // The request is the caller's again.
        SendError::Connect(message) => Miss::Unsent(message, true),
        SendError::Failed(err) => Miss::Failed(failed(&*err, None)),
        SendError::Expired => Miss::Failed(GatewayError::UpstreamTimeout(bound)),
    }
}

/// What every request's tries start with: whether `req` may be sent twice
/// (idempotent, no body); whether it may be retried after reaching a
/// target, which counts it in the pool's retry budget; and whether the
/// pool's targets are `https://` or `h2c://`. Its head is made to fit the
/// targets.
#[inline]
fn begin(req: &mut Request<UpstreamBody>, b: &Balancer) -> (bool, bool, bool) {
    let replay = replayable(req);
    let may_retry = b.config.retries > 0 && replay;
    if may_retry {
        b.deposit();
    }
    let https_pool = prepare_head(req, &b.config);
    (replay, may_retry, https_pool)
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
        // `rewrite_for_native` leaves it so.
        if req.uri().authority().is_some() {
            origin_form(req);
        }
        // The forwarding fields as text come with the client's one
        // `Host` in the map.
        if req.body().forwarding_fields().is_none()
            && !req.headers().contains_key(HOST)
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
#[inline]
fn record_answer(b: &Balancer, e: &Endpoint, status: http::StatusCode, took: Duration) {
    if matches!(status.as_u16(), 502..=504) {
        b.tried(e, TryEnd::Unavailable, Some(took));
        b.failed(e);
    } else {
        b.tried(e, TryEnd::Answered, Some(took));
        b.succeeded(e);
    }
}

/// How a failed try counts against its target; `None` when the failure
/// is the client's (its body), not the target's.
fn target_failure(err: &GatewayError) -> Option<TryEnd> {
    match err {
        GatewayError::UpstreamTimeout(_) => Some(TryEnd::Timeout),
        GatewayError::UpstreamFailed(_) => Some(TryEnd::Failed),
        _ => None,
    }
}

/// One try of `req` on `e`, within `bound`. With `keep`, `req` holds the
/// request (its head, when it had a body) after a miss, for the next try;
/// without, it holds it after a miss that sent nothing on a target's own
/// connections.
async fn one_try(
    req: &mut Request<UpstreamBody>,
    keep: bool,
    e: &Endpoint,
    target: &PoolTarget,
    https: Option<&UpstreamClient>,
    bound: Duration,
) -> Try {
    match (&e.state.conns, https) {
        (Some(conns), _) => {
            let until = tokio::time::Instant::now() + bound;
            conns
                .send(req, keep, until)
                .await
                .map_err(|err| missed(err, bound))
        }
        (None, Some(client)) => {
            // hyper's general client takes the request; a copy stays for
            // the next try.
            // It writes the map alone, and `aim` changes its `Host`.
            if let Some(f) = req.body_mut().take_forwarding() {
                f.materialize(req.headers_mut());
            }
            let left = if keep {
                copy_head(req)
            } else {
                Request::new(UpstreamBody::empty())
            };
            let mut sending = std::mem::replace(req, left);
            aim(&mut sending, target);
            let fault = sending.body_mut().watch();
            match Box::pin(tokio::time::timeout(bound, client.request(sending))).await {
                Err(_) => Err(Miss::Failed(GatewayError::UpstreamTimeout(bound))),
                Ok(Err(err)) if err.is_connect() => Err(Miss::Unsent(error_chain(&err), keep)),
                Ok(Err(err)) => Err(Miss::Failed(failed(&err, fault.as_deref()))),
                Ok(Ok(res)) => Ok(res.map(Received::hyper)),
            }
        }
        (None, None) => Err(no_client(target)),
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
