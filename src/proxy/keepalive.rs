//! Keep-alive HTTP/1.1 connections to one plain `http://` upstream.
//!
//! This is the path almost every forwarded request takes, so it is built on
//! hyper's connection API directly instead of hyper-util's general client:
//! that client keys its pool by scheme and authority in a hashed map, moves
//! large futures around per request and spawns a task per response to hand
//! the connection back, which the profile showed as a fifth of the
//! gateway's own instructions per request. Here the connections belong to the
//! route (built with the configuration), so finding it costs nothing, and a
//! connection is handed back as soon as the response head arrives: while
//! its body still streams the connection is not ready
//! ([`SendRequest::is_ready`]) and checkouts pass over it.
//!
//! A reused connection can have been closed by the upstream while it sat
//! idle, and the close can cross the next request on the wire (the
//! keep-alive race). A request such a connection never sent is retried on
//! another connection. One that was sent, and then saw the connection fail
//! before a single byte of response arrived, is sent once more on a *new*
//! connection when that is safe: its method is idempotent (RFC 9110
//! §9.2.2) and it has no body, so sending it again is what a client would
//! do (RFC 9110 §9.2.2, RFC 9112 §9.3.1; nginx's `proxy_next_upstream
//! error` does the same). Anything else that failed after being sent is not
//! replayed: the upstream may have acted on it. "No response byte" is
//! known exactly: each connection counts the bytes it has read
//! ([`ReadBytes`]).
//!
//! Idle connections are dropped after `timeouts.upstream_idle` (checked
//! when a checkout passes them), which is kept below upstreams' keep-alive
//! timeouts so the race is rare, or as soon as the upstream closes them; at
//! most [`MAX_IDLE`] are kept. https upstreams and routes that pass
//! upgrades through keep the general client (TLS, ALPN, HTTP/2, upgrades).
//!
//! Under `server.http1: native` the same connections are tollgate's own
//! ([`super::h1`]), kept by the same rules: the exchange runs on the
//! sending task, and a connection goes back when its response body ends
//! rather than when its head arrives.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use http::uri::Authority;
use http::{Request, Response};
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use tracing::debug;

use super::body::UpstreamBody;
use super::dial::{Dial, SendError, copy_head, replayable};
use super::h1::{self, IdleConns};
use super::io::{Observed, Observer};
use super::received::Received;
use crate::config::Http1;

/// Idle connections kept per upstream.
pub const MAX_IDLE: usize = 256;

/// What follows a request a connection gave back ([`KeepAlive::missed`]).
enum Missed {
    /// Never written: send it on another connection. (Boxed: rare, and
    /// the enum stays small.)
    Retry(Box<Request<UpstreamBody>>),
    /// Written, and the connection failed before answering: send this copy
    /// on a new connection.
    Fresh(Box<Request<UpstreamBody>>),
    /// A new connection failed before writing it: nothing reached the
    /// upstream, and the request comes back.
    Unsent(String, Box<Request<UpstreamBody>>),
    /// The exchange failed.
    Failed(SendError),
}

/// One connection: its request side and the bytes it has read so far.
struct Conn {
    sender: SendRequest<UpstreamBody>,
    read: Arc<AtomicU64>,
}

struct Idle {
    conn: Conn,
    since: Instant,
}

/// How connections to an upstream are made and kept.
#[derive(Debug, Clone, Copy)]
pub struct ConnSettings {
    /// How long a connect may take.
    pub connect_timeout: Duration,
    /// How long an idle connection may be kept.
    pub idle_timeout: Duration,
    /// Whose HTTP/1.1 client speaks on them.
    pub http1: Http1,
}

/// The connections to one upstream.
pub struct KeepAlive {
    dial: Dial,
    idle_timeout: Duration,
    /// hyper's connections (`server.http1: hyper`).
    idle: Mutex<Vec<Idle>>,
    /// tollgate's own (`server.http1: native`).
    native: Option<Arc<IdleConns>>,
}

impl std::fmt::Debug for KeepAlive {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeepAlive")
            .field("authority", &self.dial.authority)
            .finish_non_exhaustive()
    }
}

impl KeepAlive {
    /// No connections yet to the upstream at `authority` (`host:port`),
    /// made and kept as `settings` say.
    pub fn new(authority: Authority, settings: ConnSettings) -> Self {
        Self {
            dial: Dial {
                authority,
                addr: None,
                timeout: settings.connect_timeout,
            },
            idle_timeout: settings.idle_timeout,
            idle: Mutex::new(Vec::new()),
            native: (settings.http1 == Http1::Native)
                .then(|| Arc::new(IdleConns::new(settings.idle_timeout))),
        }
    }

    /// The connections to one resolved address of `authority` (a pool's target).
    pub fn to_addr(authority: Authority, addr: SocketAddr, settings: ConnSettings) -> Self {
        let mut conns = Self::new(authority, settings);
        conns.dial.addr = Some(addr);
        conns
    }

    /// Whether tollgate's own HTTP/1.1 client speaks on these connections
    /// (`server.http1: native`).
    pub fn is_native(&self) -> bool {
        self.native.is_some()
    }

    /// The upstream's `host:port`.
    pub fn authority(&self) -> &Authority {
        &self.dial.authority
    }

    /// Sends `req` (origin-form URI, `Host` set) on a pooled connection or
    /// a new one, and waits for the response head until `until` at most
    /// ([`SendError::Expired`] after). See the module docs for when a
    /// request is sent again.
    ///
    /// The request stays the caller's where that costs nothing, so that a
    /// pool sends it to another target without a copy made beforehand:
    /// after [`SendError::Connect`] `req` holds the whole request again.
    /// With `keep` (a pool's try that may be retried, of a request that is
    /// replayable) `req` holds its head also after [`SendError::Failed`] and
    /// [`SendError::Expired`]: the native client writes the request from
    /// `req` without taking it; hyper's takes it, and `req` keeps a copy of
    /// the head.
    ///
    /// The native client bounds the wait with its connection's own timer
    /// (see [`h1`]); hyper's exchange is wrapped in a timeout.
    pub async fn send(
        &self,
        req: &mut Request<UpstreamBody>,
        keep: bool,
        until: tokio::time::Instant,
    ) -> Result<Response<Received>, SendError> {
        match &self.native {
            Some(idle) => h1::send(&self.dial, idle, req, until)
                .await
                .map(|res| res.map(Received::native)),
            None => match tokio::time::timeout_at(until, self.send_hyper(req, keep)).await {
                Ok(sent) => sent.map(|res| res.map(Received::hyper)),
                Err(_) => Err(SendError::Expired),
            },
        }
    }

    /// [`Self::send`] on hyper's connections, with no bound of its own:
    /// for a caller that wraps it in its timeout, where the exchange's
    /// future is pinned once (one URL's forward).
    pub async fn send_by_hyper(
        &self,
        req: &mut Request<UpstreamBody>,
        keep: bool,
    ) -> Result<Response<Received>, SendError> {
        self.send_hyper(req, keep)
            .await
            .map(|res| res.map(Received::hyper))
    }

    /// [`Self::send`] on hyper's connections: `held` is left with a copy
    /// of the head when `keep`, and the request whenever it comes back
    /// unsent.
    async fn send_hyper(
        &self,
        held: &mut Request<UpstreamBody>,
        keep: bool,
    ) -> Result<Response<hyper::body::Incoming>, SendError> {
        // hyper writes the map alone.
        if let Some(f) = held.body_mut().take_forwarding() {
            f.materialize(held.headers_mut());
        }
        let left = if keep {
            copy_head(held)
        } else {
            Request::new(UpstreamBody::empty())
        };
        let mut req = std::mem::replace(held, left);
        loop {
            let (conn, reused) = match self.take() {
                Some(c) => (c, true),
                // Boxed: connecting is rare and its future is large.
                None => match Box::pin(self.connect()).await {
                    Ok(c) => (c, false),
                    Err(e) => {
                        *held = req;
                        return Err(SendError::Connect(e));
                    }
                },
            };
            // The copy costs a header map; only requests that may need it
            // pay for it. Boxed, to keep it out of every request's future.
            let again = (!keep && reused && replayable(&req)).then(|| Box::new(copy_head(&req)));
            let read_before = conn.read.load(Ordering::Relaxed);
            let Conn { mut sender, read } = conn;
            let e = match sender.try_send_request(req).await {
                Ok(res) => {
                    self.put(Conn { sender, read });
                    return Ok(res);
                }
                Err(e) => e,
            };
            let unanswered = read.load(Ordering::Relaxed) == read_before;
            let spare = keep.then_some(&*held);
            match self.missed(e, reused, unanswered, again, spare) {
                Missed::Retry(back) => req = *back,
                Missed::Fresh(head) => return Box::pin(self.send_fresh(*head, held)).await,
                Missed::Unsent(e, back) => {
                    *held = *back;
                    return Err(SendError::Connect(e));
                }
                Missed::Failed(e) => return Err(e),
            }
        }
    }

    /// What follows a request that `try_send_request` gave back as `e`:
    /// sent again on another connection, sent again on a new one, or
    /// failed. Out of [`Self::send_hyper`], so that its future, which every
    /// request's holds, is not made larger by the error.
    fn missed(
        &self,
        mut e: hyper::client::conn::TrySendError<Request<UpstreamBody>>,
        reused: bool,
        unanswered: bool,
        again: Option<Box<Request<UpstreamBody>>>,
        spare: Option<&Request<UpstreamBody>>,
    ) -> Missed {
        match e.take_message() {
            // Never written: the connection was closing when it was
            // taken. Another one gets it.
            Some(back) if reused => Missed::Retry(Box::new(back)),
            // A fresh connection that failed before writing (reset as it
            // opened): the upstream saw nothing.
            Some(back) => {
                let e = e.into_error();
                Missed::Unsent(format!("{}: {e}", self.dial.authority), Box::new(back))
            }
            None => {
                let e = e.into_error();
                let again =
                    again.or_else(|| spare.filter(|_| reused).map(|r| Box::new(copy_head(r))));
                match again {
                    // `is_user`: the failure was the request's own.
                    Some(head) if unanswered && !e.is_user() => {
                        debug!(
                            upstream = %self.dial.authority,
                            error = %e,
                            "a reused connection failed before answering; sending the request again on a new one"
                        );
                        Missed::Fresh(head)
                    }
                    _ => Missed::Failed(SendError::Failed(Box::new(e))),
                }
            }
        }
    }

    /// Sends `req` on a new connection, once; it goes back to `held` when
    /// none can be made.
    async fn send_fresh(
        &self,
        req: Request<UpstreamBody>,
        held: &mut Request<UpstreamBody>,
    ) -> Result<Response<hyper::body::Incoming>, SendError> {
        let Conn { mut sender, read } = match self.connect().await {
            Ok(c) => c,
            Err(e) => {
                *held = req;
                return Err(SendError::Connect(e));
            }
        };
        match sender.send_request(req).await {
            Ok(res) => {
                self.put(Conn { sender, read });
                Ok(res)
            }
            Err(e) => Err(SendError::Failed(Box::new(e))),
        }
    }

    /// The most recently used ready connection; drops closed and expired
    /// ones on the way. Connections whose last response is still streaming
    /// are passed over and stay.
    fn take(&self) -> Option<Conn> {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        let mut i = idle.len();
        let mut now = None;
        while i > 0 {
            i -= 1;
            let c = &mut idle[i];
            if c.conn.sender.is_closed() {
                idle.swap_remove(i);
                continue;
            }
            let now = *now.get_or_insert_with(Instant::now);
            if !c.conn.sender.is_ready() {
                // Still streaming a response, so not idle: its idle time
                // starts no earlier than now. (The upstream's keep-alive
                // clock starts when the response ends, later still.)
                c.since = now;
                continue;
            }
            if now.saturating_duration_since(c.since) > self.idle_timeout {
                idle.swap_remove(i);
                continue;
            }
            return Some(idle.swap_remove(i).conn);
        }
        None
    }

    fn put(&self, conn: Conn) {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        if idle.len() < MAX_IDLE {
            idle.push(Idle {
                conn,
                since: Instant::now(),
            });
        }
    }

    async fn connect(&self) -> Result<Conn, String> {
        let stream = self.dial.tcp().await?;
        let read = Arc::new(AtomicU64::new(0));
        let stream = Observed {
            inner: stream,
            observer: ReadBytes(read.clone()),
        };
        let (sender, conn) = http1::Builder::new()
            .handshake(TokioIo::new(stream))
            .await
            .map_err(|e| format!("{}: {e}", self.dial.describe()))?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                debug!(error = %e, "upstream connection ended with an error");
            }
        });
        Ok(Conn { sender, read })
    }
}

/// Counts the bytes a pooled connection has read.
#[derive(Debug)]
struct ReadBytes(Arc<AtomicU64>);

impl Observer for ReadBytes {
    fn read(&self, n: usize) {
        self.0.fetch_add(n as u64, Ordering::Relaxed);
    }

    fn wrote(&self, _: usize) {}
}
