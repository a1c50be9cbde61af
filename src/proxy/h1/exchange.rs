//! One exchange on a native connection: the request head written from the
//! request's parts, its body streamed, the response head read — all on the
//! task that sends the request.

use std::future::poll_fn;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Method, Request, Response};
use http_body_util::BodyExt as _;
use tokio::io::AsyncWriteExt as _;

use super::body::NativeBody;
use super::conn::Conn;
use super::error::NativeError;
use super::head::{self, Head};
use super::idle::IdleConns;
use super::write::{self, Sending};
use crate::proxy::body::UpstreamBody;

/// How an exchange missed.
#[derive(Debug)]
pub enum Miss {
    /// Not a byte of the request was written: it comes back whole.
    Unsent(Box<Request<UpstreamBody>>, NativeError),
    /// The request was written, or some of it.
    Failed {
        error: NativeError,
        /// No byte of a response had arrived.
        unanswered: bool,
        /// The request's bytes, when it had no body: what a second send
        /// writes.
        bytes: Option<Vec<u8>>,
    },
}

/// Sends `req` on `conn` and reads the response head; the response's body
/// reads from the connection and gives it back to `idle` at its end.
///
/// # Errors
/// See [`Miss`].
pub async fn exchange(
    mut conn: Box<Conn>,
    req: Request<UpstreamBody>,
    idle: &Arc<IdleConns>,
) -> Result<Response<NativeBody>, Miss> {
    conn.out.clear();
    let framing = write::head(&req, &mut conn.out);
    let replayable = crate::proxy::dial::replayable(&req);
    let method = req.method().clone();
    match conn.flush().await {
        Ok(()) => {}
        Err((0, e)) => return Err(Miss::Unsent(Box::new(req), e.into())),
        Err((_, e)) => return Err(failed(&mut conn, e.into(), replayable)),
    }
    if !matches!(framing, Sending::Empty)
        && let Err(e) = send_body(&mut conn, req.into_body(), framing).await
    {
        return Err(failed(&mut conn, e, false));
    }
    respond(conn, &method, idle, replayable).await
}

/// Sends `bytes`, a bodiless `method` request written before, on `conn`
/// and reads the response head.
///
/// # Errors
/// The exchange failed ([`Miss::Failed`], never to be sent again).
pub async fn resend(
    mut conn: Box<Conn>,
    bytes: Vec<u8>,
    method: &Method,
    idle: &Arc<IdleConns>,
) -> Result<Response<NativeBody>, Miss> {
    conn.out = bytes;
    if let Err((_, e)) = conn.flush().await {
        return Err(failed(&mut conn, e.into(), false));
    }
    respond(conn, method, idle, false).await
}

fn failed(conn: &mut Conn, error: NativeError, replayable: bool) -> Miss {
    Miss::Failed {
        error,
        unanswered: conn.buf.is_empty(),
        bytes: replayable.then(|| std::mem::take(&mut conn.out)),
    }
}

/// Reads the response head on `conn` and makes the response.
async fn respond(
    mut conn: Box<Conn>,
    method: &Method,
    idle: &Arc<IdleConns>,
    replayable: bool,
) -> Result<Response<NativeBody>, Miss> {
    let head = match read_head(&mut conn, method).await {
        Ok(head) => head,
        Err((error, unanswered)) => {
            return Err(Miss::Failed {
                error,
                unanswered,
                bytes: (replayable && unanswered).then(|| std::mem::take(&mut conn.out)),
            });
        }
    };
    let Head {
        response,
        framing,
        keep_alive,
    } = head;
    let body = NativeBody::new(conn, framing, keep_alive, idle);
    Ok(response.map(|()| body))
}

/// The response head; on failure, whether no byte of it had arrived.
async fn read_head(conn: &mut Conn, method: &Method) -> Result<Head, (NativeError, bool)> {
    let mut got = 0;
    loop {
        if got > 0 {
            match head::parse(&mut conn.buf, method) {
                Ok(Some(head)) => return Ok(head),
                Ok(None) => {}
                Err(e) => return Err((e.into(), false)),
            }
        }
        match poll_fn(|cx| conn.poll_fill(cx)).await {
            Ok(0) if got == 0 => return Err((NativeError::Closed, true)),
            Ok(0) => return Err((NativeError::HeadCut, false)),
            Ok(n) => got += n,
            Err(e) => return Err((e.into(), got == 0)),
        }
    }
}

/// Streams `body` to the upstream as `framing` says.
async fn send_body(
    conn: &mut Conn,
    mut body: UpstreamBody,
    framing: Sending,
) -> Result<(), NativeError> {
    let (chunked, allowed, mut left) = match framing {
        Sending::Chunked(allowed) => (true, allowed, u64::MAX),
        Sending::Length(n) => (false, Vec::new(), n),
        Sending::Empty => return Ok(()),
    };
    conn.out.clear();
    loop {
        // A frame that is not ready yet lets what is buffered go first.
        let frame = match poll_fn(|cx| Poll::Ready(poll_once(&mut body, cx))).await {
            Some(f) => f,
            None => {
                flush_body(conn).await?;
                body.frame().await
            }
        };
        let frame = match frame {
            None => break,
            Some(Err(e)) => return Err(NativeError::Client(e)),
            Some(Ok(f)) => f,
        };
        let frame = match frame.into_data() {
            Ok(data) => {
                if !chunked {
                    left = left
                        .checked_sub(data.len() as u64)
                        .ok_or(NativeError::BodyLength)?;
                }
                if data.is_empty() {
                    continue;
                }
                if let Some(big) = write::data(&mut conn.out, chunked, data) {
                    flush_body(conn).await?;
                    conn.io.write_all(&big).await?;
                    if chunked {
                        conn.out.extend_from_slice(b"\r\n");
                    }
                } else if conn.out.len() >= write::COPY_BELOW {
                    flush_body(conn).await?;
                }
                continue;
            }
            Err(frame) => frame,
        };
        if chunked && let Ok(trailers) = frame.into_trailers() {
            write::last_chunk(&mut conn.out, Some(&trailers), &allowed);
            return flush_body(conn).await;
        }
    }
    if chunked {
        write::last_chunk(&mut conn.out, None, &allowed);
    } else if left != 0 {
        return Err(NativeError::BodyLength);
    }
    flush_body(conn).await
}

/// The next frame of `body` if it is ready now.
#[allow(clippy::type_complexity)]
fn poll_once(
    body: &mut UpstreamBody,
    cx: &mut Context<'_>,
) -> Option<Option<Result<http_body::Frame<bytes::Bytes>, crate::proxy::body::ClientBodyError>>> {
    match http_body::Body::poll_frame(std::pin::Pin::new(body), cx) {
        Poll::Ready(f) => Some(f),
        Poll::Pending => None,
    }
}

async fn flush_body(conn: &mut Conn) -> Result<(), NativeError> {
    let flushed = conn.flush().await;
    conn.out.clear();
    flushed.map_err(|(_, e)| e.into())
}
