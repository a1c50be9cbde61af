//! One exchange on a native connection: the request head written from the
//! request's parts, its body streamed while the response head is read —
//! all on the task that sends the request.

use std::future::poll_fn;
use std::sync::Arc;
use std::task::Poll;

use http::{Method, Request, Response};
use http_body::Body as _;

use super::body::NativeBody;
use super::conn::{Conn, Unflushed};
use super::error::NativeError;
use super::head::{self, Head};
use super::idle::IdleConns;
use super::upload::Upload;
use super::write;
use crate::proxy::body::UpstreamBody;

/// How an exchange missed.
#[derive(Debug)]
pub enum Miss {
    /// Not a byte of the request was written: the request is whole.
    Unsent(NativeError),
    /// The request was written, or some of it.
    Failed {
        error: NativeError,
        /// No byte of a response had arrived.
        unanswered: bool,
    },
    /// The deadline [`Conn::arm`] set passed before the response head
    /// came; the connection is dropped.
    Expired,
}

/// Sends `req` on `conn` and reads the response head, both by the instant
/// `conn` is armed for; the response's body reads from the connection
/// and gives it back to `idle` at its end.
///
/// The head is written from `req`, which keeps it; a body to send is taken
/// out once the head is written, and is written as the head is waited
/// for, the rest of it as the response body is read ([`Upload`]).
///
/// # Errors
/// See [`Miss`].
pub async fn exchange(
    mut conn: Box<Conn>,
    req: &mut Request<UpstreamBody>,
    idle: &Arc<IdleConns>,
) -> Result<Response<NativeBody>, Miss> {
    conn.out.clear();
    let framing = write::head(req, &mut conn.out);
    match conn.flush().await {
        Ok(()) => {}
        Err(Unflushed::Io(0, e)) => return Err(Miss::Unsent(e.into())),
        Err(Unflushed::Io(_, e)) => {
            return Err(Miss::Failed {
                error: e.into(),
                unanswered: conn.buf.is_empty(),
            });
        }
        Err(Unflushed::Expired(_)) => return Err(Miss::Expired),
    }
    // A body that is not sent (a GET's of unknown size) is let go of here,
    // as one that is sent is handed to the upload.
    let upload = if req.body().is_end_stream() {
        None
    } else {
        Upload::new(req.body_mut().take_bytes(), framing)
    };
    if upload.is_some() {
        // The head is out; the buffer is the body's now.
        conn.out.clear();
    }
    respond(conn, req.method(), idle, upload).await
}

/// Reads the response head on `conn`, writing `upload` meanwhile, and
/// makes the response.
async fn respond(
    mut conn: Box<Conn>,
    method: &Method,
    idle: &Arc<IdleConns>,
    mut upload: Option<Box<Upload>>,
) -> Result<Response<NativeBody>, Miss> {
    let mut wrote = true;
    let head = match read_head(&mut conn, method, &mut upload, &mut wrote).await {
        Ok(head) => head,
        Err(Some((error, unanswered))) => return Err(Miss::Failed { error, unanswered }),
        Err(None) => return Err(Miss::Expired),
    };
    let Head {
        response,
        framing,
        keep_alive,
        passed,
    } = head;
    // A connection that failed a write carries no other request.
    let body = NativeBody::new(conn, framing, keep_alive && wrote, idle, upload, passed);
    Ok(response.map(|()| body))
}

/// The response head, read while `upload` is written; on failure, whether
/// no byte of it had arrived, or `None` when the deadline `conn` is armed
/// for passed first. The answer is read before the body is
/// written on, as hyper's dispatcher does. A write that fails ends the
/// upload and clears `wrote`, and the head is still waited for: an
/// upstream may answer and close without reading the whole body (a 413),
/// and when the connection is gone the read says so.
async fn read_head(
    conn: &mut Conn,
    method: &Method,
    upload: &mut Option<Box<Upload>>,
    wrote: &mut bool,
) -> Result<Head, Option<(NativeError, bool)>> {
    let mut got = 0;
    let mut fresh = false;
    poll_fn(|cx| {
        loop {
            if fresh {
                fresh = false;
                match head::parse(&mut conn.buf, method) {
                    Ok(Some(head)) => return Poll::Ready(Ok(head)),
                    Ok(None) => {}
                    Err(e) => return Poll::Ready(Err(Some((e.into(), false)))),
                }
            }
            match conn.poll_fill(cx) {
                Poll::Ready(Ok(0)) if got == 0 => {
                    return Poll::Ready(Err(Some((NativeError::Closed, true))));
                }
                Poll::Ready(Ok(0)) => {
                    return Poll::Ready(Err(Some((NativeError::HeadCut, false))));
                }
                Poll::Ready(Ok(n)) => {
                    got += n;
                    fresh = true;
                    continue;
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(Some((e.into(), got == 0)))),
                Poll::Pending => {}
            }
            if let Some(up) = upload {
                match up.poll_send(conn, cx) {
                    Poll::Pending => {}
                    Poll::Ready(Ok(())) => *upload = None,
                    Poll::Ready(Err(NativeError::Io(_))) => {
                        *upload = None;
                        *wrote = false;
                    }
                    Poll::Ready(Err(e)) => {
                        return Poll::Ready(Err(Some((e, conn.buf.is_empty()))));
                    }
                }
            }
            return conn.poll_expired(cx).map(|()| Err(None));
        }
    })
    .await
}
