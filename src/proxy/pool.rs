//! Keep-alive HTTP/1.1 connections to one plain `http://` upstream.
//!
//! This is the path almost every forwarded request takes, so it is built on
//! hyper's connection API directly instead of hyper-util's general client:
//! that client keys its pool by scheme and authority in a hashed map, moves
//! large futures around per request and spawns a task per response to hand
//! the connection back, which the profile showed as a fifth of the
//! gateway's own instructions per request. Here the pool belongs to the
//! route (built with the configuration), so finding it costs nothing, and a
//! connection is handed back as soon as the response head arrives: while
//! its body still streams the connection is not ready
//! ([`SendRequest::is_ready`]) and checkouts pass over it.
//!
//! A request that a reused connection never sent (the upstream closed it
//! while it sat idle) is retried on another connection; one that was sent
//! is never replayed. Idle connections are dropped after [`IDLE_TIMEOUT`]
//! (checked when a checkout passes them) or as soon as the upstream closes
//! them; at most [`MAX_IDLE`] are kept. https upstreams and routes that pass
//! upgrades through keep the general client (TLS, ALPN, HTTP/2, upgrades).

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use http::uri::Authority;
use http::{Request, Response};
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tracing::debug;

use super::UpstreamBody;

/// Idle connections kept per upstream.
pub const MAX_IDLE: usize = 256;
/// An idle connection older than this is closed instead of reused (nginx
/// closes idle upstream connections after 60 s, hyper-util after 90 s).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// Why a request could not be exchanged.
#[derive(Debug)]
pub enum SendError {
    /// No connection could be made.
    Connect(String),
    /// The exchange failed after the request was handed to a connection.
    Failed(hyper::Error),
}

struct Idle {
    sender: SendRequest<UpstreamBody>,
    since: Instant,
}

/// The connections to one upstream.
pub struct Pool {
    authority: Authority,
    connect_timeout: Duration,
    idle: Mutex<Vec<Idle>>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("authority", &self.authority)
            .finish_non_exhaustive()
    }
}

impl Pool {
    /// An empty pool for the upstream at `authority` (`host:port`).
    pub fn new(authority: Authority, connect_timeout: Duration) -> Self {
        Self {
            authority,
            connect_timeout,
            idle: Mutex::new(Vec::new()),
        }
    }

    /// The upstream's `host:port`.
    pub fn authority(&self) -> &Authority {
        &self.authority
    }

    /// Sends `req` (origin-form URI, `Host` set) on a pooled connection or
    /// a new one, and waits for the response head.
    pub async fn send(
        &self,
        mut req: Request<UpstreamBody>,
    ) -> Result<Response<Incoming>, SendError> {
        loop {
            let (mut sender, reused) = match self.take() {
                Some(s) => (s, true),
                // Boxed: connecting is rare and its future is large.
                None => (Box::pin(self.connect()).await?, false),
            };
            match sender.try_send_request(req).await {
                Ok(res) => {
                    self.put(sender);
                    return Ok(res);
                }
                Err(mut e) => match e.take_message() {
                    // Never written: the connection was closing when it was
                    // taken. Another one gets it; a fresh connection's
                    // failure is final.
                    Some(back) if reused => req = back,
                    _ => return Err(SendError::Failed(e.into_error())),
                },
            }
        }
    }

    /// The most recently used ready connection; drops closed and expired
    /// ones on the way. Connections whose last response is still streaming
    /// are passed over and stay.
    fn take(&self) -> Option<SendRequest<UpstreamBody>> {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        let mut i = idle.len();
        let mut now = None;
        while i > 0 {
            i -= 1;
            let c = &idle[i];
            if c.sender.is_closed() {
                idle.swap_remove(i);
                continue;
            }
            if !c.sender.is_ready() {
                continue;
            }
            let now = *now.get_or_insert_with(Instant::now);
            if now.saturating_duration_since(c.since) > IDLE_TIMEOUT {
                idle.swap_remove(i);
                continue;
            }
            return Some(idle.swap_remove(i).sender);
        }
        None
    }

    fn put(&self, sender: SendRequest<UpstreamBody>) {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        if idle.len() < MAX_IDLE {
            idle.push(Idle {
                sender,
                since: Instant::now(),
            });
        }
    }

    async fn connect(&self) -> Result<SendRequest<UpstreamBody>, SendError> {
        let host = self.authority.host();
        // `[::1]` in a URI is `::1` to the resolver.
        let host = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        let port = self.authority.port_u16().unwrap_or(80);
        let stream = match tokio::time::timeout(
            self.connect_timeout,
            TcpStream::connect((host, port)),
        )
        .await
        {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return Err(SendError::Connect(format!("{}: {e}", self.authority))),
            Err(_) => {
                return Err(SendError::Connect(format!(
                    "{}: connect timed out after {:?}",
                    self.authority, self.connect_timeout
                )));
            }
        };
        let _ = stream.set_nodelay(true);
        let (sender, conn) = http1::Builder::new()
            .handshake(TokioIo::new(stream))
            .await
            .map_err(|e| SendError::Connect(format!("{}: {e}", self.authority)))?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                debug!(error = %e, "upstream connection ended with an error");
            }
        });
        Ok(sender)
    }
}
