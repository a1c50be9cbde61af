//! A request sent over an upstream's native connections with the
//! keep-alive race's rules (see [`crate::proxy::keepalive`]): a request a
//! reused connection never wrote goes on another; one that was written,
//! had no byte of answer, is idempotent and bodiless goes once more on a
//! new connection.
//!
//! The request is borrowed, never taken: its head is written from it, and
//! only a body to send is moved out. So a second send writes it again from
//! the same request, and a caller that gets the request back (a pool,
//! sending it to another target) has it without a copy made beforehand.
//!
//! Each miss is told as hyper's client path tells it, so a pool counts a
//! try alike on either client: a new connection that cannot be made for
//! the second send is [`SendError::Connect`] (the request goes to another
//! target); a second send that fails after is [`SendError::Failed`].

use std::sync::Arc;

use http::{Request, Response};
use tokio::time::Instant;
use tracing::debug;

use super::body::NativeBody;
use super::conn::Conn;
use super::exchange::{Miss, exchange};
use super::idle::IdleConns;
use crate::proxy::body::UpstreamBody;
use crate::proxy::dial::{Dial, SendError, replayable};

/// Sends `req` (origin-form, `Host` set) to the upstream `dial` reaches, on
/// an idle connection of `idle` or a new one, and waits for the response
/// head until `until` at most: connecting, writing the request and reading
/// the head are bounded by it, through the connection's own timer (see
/// [`Conn::arm`]) once there is one.
///
/// `req` keeps its head whatever happens, and its body too when the
/// request was not written ([`SendError::Connect`]); a body that was
/// written, or begun, is gone from it.
///
/// # Errors
/// [`SendError::Connect`] when nothing reached the upstream,
/// [`SendError::Failed`] when the exchange failed after,
/// [`SendError::Expired`] when `until` passed first.
pub async fn send(
    dial: &Dial,
    idle: &Arc<IdleConns>,
    req: &mut Request<UpstreamBody>,
    until: Instant,
) -> Result<Response<NativeBody>, SendError> {
    loop {
        let (conn, reused) = match idle.take() {
            Some(mut c) => {
                c.arm(until);
                (c, true)
            }
            // Boxed: connecting is rare and its future is large.
            None => match Box::pin(connect(dial, until)).await? {
                Ok(conn) => (conn, false),
                Err(e) => return Err(SendError::Connect(e)),
            },
        };
        // Asked before the exchange, which may take the body out.
        let again = reused && replayable(req);
        match exchange(conn, req, idle).await {
            Ok(res) => return Ok(res),
            Err(Miss::Unsent(_)) if reused => {}
            Err(Miss::Unsent(e)) => {
                return Err(SendError::Connect(format!("{}: {e}", dial.describe())));
            }
            Err(Miss::Failed {
                error,
                unanswered: true,
            }) if again => {
                debug!(
                    upstream = %dial.authority,
                    %error,
                    "a reused connection failed before answering; sending the request again on a new one"
                );
                return Box::pin(send_fresh(dial, idle, req, until)).await;
            }
            Err(Miss::Failed { error, .. }) => return Err(SendError::Failed(Box::new(error))),
            Err(Miss::Expired) => return Err(SendError::Expired),
        }
    }
}

/// A new connection to the upstream, made by `until`; its timer is set
/// for `until` too.
///
/// # Errors
/// The outer error when `until` passed; the inner, the connect's failure.
async fn connect(dial: &Dial, until: Instant) -> Result<Result<Box<Conn>, String>, SendError> {
    match tokio::time::timeout_at(until, dial.tcp()).await {
        Ok(Ok(io)) => Ok(Ok(Conn::new(io, until))),
        Ok(Err(e)) => Ok(Err(e)),
        Err(_) => Err(SendError::Expired),
    }
}

/// Sends the bodiless `req` once on a new connection, by `until`.
async fn send_fresh(
    dial: &Dial,
    idle: &Arc<IdleConns>,
    req: &mut Request<UpstreamBody>,
    until: Instant,
) -> Result<Response<NativeBody>, SendError> {
    let conn = connect(dial, until).await?.map_err(SendError::Connect)?;
    match exchange(conn, req, idle).await {
        Ok(res) => Ok(res),
        Err(Miss::Failed { error, .. } | Miss::Unsent(error)) => {
            Err(SendError::Failed(Box::new(error)))
        }
        Err(Miss::Expired) => Err(SendError::Expired),
    }
}
