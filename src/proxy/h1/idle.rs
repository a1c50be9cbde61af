//! The idle native connections to one upstream, and a request sent over
//! them with the keep-alive race's rules (see [`crate::proxy::keepalive`]):
//! a request a reused connection never wrote goes on another; one that was
//! written, had no byte of answer, is idempotent and bodiless goes once
//! more on a new connection — as the same bytes, so nothing is copied for
//! it beforehand.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use http::{Request, Response};
use tracing::debug;

use super::body::NativeBody;
use super::conn::{Conn, Miss, exchange, resend};
use crate::proxy::body::UpstreamBody;
use crate::proxy::dial::{Dial, SendError};

/// Idle connections kept per upstream.
const MAX_IDLE: usize = 256;

/// The idle connections to one upstream, most recently used last.
#[derive(Debug)]
pub struct IdleConns {
    idle: Mutex<Vec<(Box<Conn>, Instant)>>,
    idle_timeout: Duration,
}

impl IdleConns {
    /// No connections yet; an idle one is not reused after `idle_timeout`.
    pub fn new(idle_timeout: Duration) -> Self {
        Self {
            idle: Mutex::new(Vec::new()),
            idle_timeout,
        }
    }

    /// The most recently used connection that is still open and not
    /// expired; drops the others it passes.
    fn take(&self) -> Option<Box<Conn>> {
        let mut now = None;
        loop {
            let (conn, since) = self
                .idle
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .pop()?;
            let now = *now.get_or_insert_with(Instant::now);
            if now.saturating_duration_since(since) <= self.idle_timeout && conn.idle_and_open() {
                return Some(conn);
            }
        }
    }

    /// Keeps `conn` for the next request, when there is room.
    pub fn put(&self, mut conn: Box<Conn>) {
        conn.trim();
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        if idle.len() < MAX_IDLE {
            idle.push((conn, Instant::now()));
        }
    }
}

/// Sends `req` (origin-form, `Host` set) to the upstream `dial` reaches, on
/// an idle connection of `idle` or a new one, and waits for the response
/// head.
///
/// # Errors
/// [`SendError::Connect`] when nothing reached the upstream,
/// [`SendError::Failed`] when the exchange failed after.
pub async fn send(
    dial: &Dial,
    idle: &Arc<IdleConns>,
    mut req: Request<UpstreamBody>,
) -> Result<Response<NativeBody>, SendError> {
    loop {
        let (conn, reused) = match idle.take() {
            Some(c) => (c, true),
            // Boxed: connecting is rare and its future is large.
            None => match Box::pin(dial.tcp()).await {
                Ok(io) => (Conn::new(io), false),
                Err(e) => return Err(SendError::Connect(e, Box::new(req))),
            },
        };
        let method = req.method().clone();
        match exchange(conn, req, idle).await {
            Ok(res) => return Ok(res),
            Err(Miss::Unsent(back, _)) if reused => req = *back,
            Err(Miss::Unsent(back, e)) => {
                return Err(SendError::Connect(
                    format!("{}: {e}", dial.describe()),
                    back,
                ));
            }
            Err(Miss::Failed {
                error,
                unanswered: true,
                bytes: Some(bytes),
            }) if reused => {
                debug!(
                    upstream = %dial.authority,
                    %error,
                    "a reused connection failed before answering; sending the request again on a new one"
                );
                return Box::pin(send_fresh(dial, idle, bytes, &method)).await;
            }
            Err(Miss::Failed { error, .. }) => return Err(SendError::Failed(Box::new(error))),
        }
    }
}

/// Sends a bodiless request's `bytes` once on a new connection.
async fn send_fresh(
    dial: &Dial,
    idle: &Arc<IdleConns>,
    bytes: Vec<u8>,
    method: &http::Method,
) -> Result<Response<NativeBody>, SendError> {
    let io = dial.tcp().await.map_err(|e| SendError::Failed(e.into()))?;
    match resend(Conn::new(io), bytes, method, idle).await {
        Ok(res) => Ok(res),
        Err(Miss::Failed { error, .. } | Miss::Unsent(_, error)) => {
            Err(SendError::Failed(Box::new(error)))
        }
    }
}
