//! A response body read from a native connection as the client side polls
//! it; at its clean end the connection goes back to the idle connections, and a body
//! dropped before its end closes the connection.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

use super::conn::Conn;
use super::decode::Decoder;
use crate::http1::chunked::Step;
use super::error::NativeError;
use super::head::Delimited;
use super::idle::IdleConns;

/// An upstream's response body on a native connection.
#[derive(Debug)]
pub struct NativeBody {
    /// `None` once the body ended (the connection given back or closed).
    conn: Option<Box<Conn>>,
    decoder: Decoder,
    keep_alive: bool,
    idle: Arc<IdleConns>,
    /// A failure held back for one poll (see [`NativeBody::fail`]).
    failed: Option<NativeError>,
}

impl NativeBody {
    /// The body framed as `framing` on `conn`; a body without bytes gives
    /// the connection back at once.
    pub fn new(
        conn: Box<Conn>,
        framing: Delimited,
        keep_alive: bool,
        idle: &Arc<IdleConns>,
    ) -> Self {
        let mut body = Self {
            conn: Some(conn),
            decoder: Decoder::new(framing),
            keep_alive,
            idle: Arc::clone(idle),
            failed: None,
        };
        if body.decoder.is_done() {
            body.release();
        }
        body
    }

    /// The body ended cleanly: the connection goes back to the idle connections when
    /// it may carry another request and holds no byte beyond this
    /// response (an upstream that sends more than it framed is not trusted
    /// with another).
    fn release(&mut self) {
        if let Some(conn) = self.conn.take()
            && self.keep_alive
            && conn.buf.is_empty()
        {
            self.idle.put(conn);
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
        self.failed = Some(e);
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
            return Poll::Ready(Some(Err(e)));
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
