//! A response body read from a native connection as the client side polls
//! it; at its clean end the connection goes back to the idle connections, and a body
//! dropped before its end closes the connection.
//!
//! A request body the upstream has not taken whole when its response head
//! arrives is written on as the response body is polled. When the response
//! ends first, what follows is hyper's client's rule: a connection that may
//! carry another request goes on writing the request body — on a task of
//! its own, so the response ends now — and goes back to the idle
//! connections when it is all written; one that may not (`Connection:
//! close`, a body read to the close) is closed, and the rest of the
//! request body is not sent.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

use super::conn::Conn;
use super::decode::Decoder;
use super::error::NativeError;
use super::head::Delimited;
use super::idle::IdleConns;
use super::upload::Upload;
use crate::http1::chunked::Step;
use crate::http1::fields::Passed;
use crate::http1::text_fields::TextFields;

/// An upstream's response body on a native connection.
#[derive(Debug)]
pub struct NativeBody {
    /// `None` once the body ended (the connection given back or closed).
    conn: Option<Box<Conn>>,
    decoder: Decoder,
    keep_alive: bool,
    idle: Arc<IdleConns>,
    /// A failure held back for one poll (see [`NativeBody::fail`]);
    /// boxed, as failures are rare, to keep the body (and every answer
    /// that holds it, moved through the futures that poll it) small.
    failed: Option<Box<NativeError>>,
    /// The rest of the request body, when the response head came first.
    upload: Option<Box<Upload>>,
    /// The answer's fields as the upstream wrote them, for the native
    /// writer ([`crate::http1::fields`]); `None` when there are none or
    /// they were read into the answer's map.
    passed: Option<Box<Passed>>,
}

impl NativeBody {
    /// The body framed as `framing` on `conn`, carrying its answer's
    /// `passed` fields; a body without bytes gives the connection back at
    /// once.
    pub fn new(
        conn: Box<Conn>,
        framing: Delimited,
        keep_alive: bool,
        idle: &Arc<IdleConns>,
        upload: Option<Box<Upload>>,
        passed: Option<Box<Passed>>,
    ) -> Self {
        let mut body = Self {
            conn: Some(conn),
            decoder: Decoder::new(framing),
            keep_alive,
            idle: Arc::clone(idle),
            failed: None,
            upload,
            passed,
        };
        if body.decoder.is_done() {
            body.release();
        }
        body
    }

    /// The body ended cleanly: the connection goes back to the idle connections when
    /// it may carry another request and holds no byte beyond this
    /// response (an upstream that sends more than it framed is not trusted
    /// with another) — once the request body is all written.
    fn release(&mut self) {
        let Some(mut conn) = self.conn.take() else {
            return;
        };
        if !self.keep_alive || !conn.buf.is_empty() {
            return;
        }
        let Some(upload) = self.upload.take() else {
            self.idle.put(conn);
            return;
        };
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let idle = Arc::clone(&self.idle);
            runtime.spawn(async move {
                if upload.finish(&mut conn).await && conn.buf.is_empty() {
                    idle.put(conn);
                }
            });
        }
    }

    /// Writes what the request body has ready; a connection that failed a
    /// write is not kept, and its response is read on.
    fn poll_upload(&mut self, cx: &mut Context<'_>) -> Result<(), NativeError> {
        let (Some(upload), Some(conn)) = (self.upload.as_mut(), self.conn.as_mut()) else {
            return Ok(());
        };
        match upload.poll_send(conn, cx) {
            Poll::Pending => Ok(()),
            Poll::Ready(Ok(())) => {
                self.upload = None;
                Ok(())
            }
            Poll::Ready(Err(NativeError::Io(_))) => {
                self.upload = None;
                self.keep_alive = false;
                Ok(())
            }
            Poll::Ready(Err(e)) => Err(e),
        }
    }
}

impl NativeBody {
    /// The body failed: the connection is closed, and the failure is
    /// returned on the next poll, not this one. The one poll between lets
    /// the server write what it holds of the response (its head, the bytes
    /// that came) before the failure aborts it, so a client sees a body cut
    /// short rather than no response — as with hyper's client, whose
    /// failure reaches the body one channel hop later.
    fn fail(
        &mut self,
        e: NativeError,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, NativeError>>> {
        self.conn = None;
        self.upload = None;
        self.failed = Some(Box::new(e));
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

impl Body for NativeBody {
    type Data = Bytes;
    type Error = NativeError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, NativeError>>> {
        let this = self.get_mut();
        if let Some(e) = this.failed.take() {
            return Poll::Ready(Some(Err(*e)));
        }
        if let Err(e) = this.poll_upload(cx) {
            return this.fail(e, cx);
        }
        loop {
            let Some(conn) = this.conn.as_mut() else {
                return Poll::Ready(None);
            };
            let decoded = match this.decoder.decode(&mut conn.buf) {
                Ok(Step::More) => match ready!(conn.poll_fill(cx)) {
                    Ok(0) => this.decoder.eof(),
                    Ok(_) => continue,
                    Err(e) => return this.fail(e.into(), cx),
                },
                other => other,
            };
            let frame = match decoded {
                Ok(Step::Data(d)) => Frame::data(d),
                Ok(Step::Trailers(t)) => Frame::trailers(t),
                Ok(Step::End) => {
                    this.release();
                    return Poll::Ready(None);
                }
                Ok(Step::More) => continue,
                Err(e) => return this.fail(e.into(), cx),
            };
            if this.decoder.is_done() {
                this.release();
            }
            return Poll::Ready(Some(Ok(frame)));
        }
    }

    fn is_end_stream(&self) -> bool {
        self.failed.is_none() && (self.conn.is_none() || self.decoder.is_done())
    }

    fn size_hint(&self) -> SizeHint {
        match self.decoder.remaining() {
            Some(n) => SizeHint::with_exact(n),
            None => SizeHint::default(),
        }
    }
}

impl TextFields for NativeBody {
    fn passed(&self) -> Option<&Passed> {
        self.passed.as_deref()
    }

    fn take_passed(&mut self) -> Option<Box<Passed>> {
        self.passed.take()
    }
}
