//! A request sent over an upstream's native connections with the
//! keep-alive race's rules (see [`crate::proxy::keepalive`]): a request a
//! reused connection never wrote goes on another; one that was written,
//! had no byte of answer, is idempotent and bodiless goes once more on a
//! new connection — as the same bytes, so nothing is copied for it
//! beforehand.
//!
//! Each miss is told as hyper's client path tells it, so a pool counts a
//! try alike on either client: a new connection that cannot be made for
//! the second send is [`SendError::Connect`], with the request (read back
//! from its bytes) to go to another target; a second send that fails
//! after is [`SendError::Failed`].

use std::sync::Arc;

use http::{Request, Response};
use tracing::debug;

use super::body::NativeBody;
use super::conn::Conn;
use super::exchange::{Miss, exchange, resend};
use super::idle::IdleConns;
use crate::proxy::body::UpstreamBody;
use crate::proxy::dial::{Dial, SendError};

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
    let io = match dial.tcp().await {
        Ok(io) => io,
        Err(e) => {
            return Err(match request_of(&bytes) {
                Some(req) => SendError::Connect(e, Box::new(req)),
                None => SendError::Failed(e.into()),
            });
        }
    };
    match resend(Conn::new(io), bytes, method, idle).await {
        Ok(res) => Ok(res),
        Err(Miss::Failed { error, .. } | Miss::Unsent(_, error)) => {
            Err(SendError::Failed(Box::new(error)))
        }
    }
}

/// The bodiless request whose head [`super::write::head`] wrote as `bytes`,
/// read back: its method, origin-form target and fields, in order.
pub(super) fn request_of(bytes: &[u8]) -> Option<Request<UpstreamBody>> {
    let lines = bytes.windows(2).filter(|w| w == b"\r\n").count();
    let mut fields = vec![httparse::EMPTY_HEADER; lines];
    let mut head = httparse::Request::new(&mut fields);
    if !matches!(head.parse(bytes), Ok(httparse::Status::Complete(_))) {
        return None;
    }
    let mut req = Request::builder()
        .method(head.method?)
        .uri(head.path?)
        .body(UpstreamBody::empty())
        .ok()?;
    let map = req.headers_mut();
    map.reserve(head.headers.len());
    for f in head.headers.iter() {
        map.append(
            http::HeaderName::from_bytes(f.name.as_bytes()).ok()?,
            http::HeaderValue::from_bytes(f.value).ok()?,
        );
    }
    Some(req)
}
