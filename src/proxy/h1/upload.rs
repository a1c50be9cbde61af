//! A request body streamed to the upstream by polls, so that the future
//! that reads the answer can write the body in the same poll: the
//! exchange until the response head arrives, then the response body. An
//! upstream that answers while it reads (an echo) is read from as it is
//! written to, and neither direction's socket buffer fills and stalls the
//! other.
//!
//! Small data frames are copied into the connection's write buffer and go
//! out together; a large one is written after it without a copy
//! ([`write::data`]). What is buffered goes out as soon as the body has no
//! frame ready.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf as _, Bytes};
use http::HeaderName;
use http_body::Body as _;
use tokio::io::AsyncWrite as _;

use super::conn::Conn;
use super::error::NativeError;
use super::write::{self, Sending};
use crate::proxy::body::UpstreamBody;

/// A request body being written.
#[derive(Debug)]
pub struct Upload {
    body: UpstreamBody,
    chunked: bool,
    /// The trailer fields a chunked body may send (its `Trailer` field's).
    allowed: Vec<HeaderName>,
    /// Bytes a `Content-Length` body has still to give.
    left: u64,
    /// A large data frame, written after the write buffer without a copy.
    big: Option<Bytes>,
    /// How much of the write buffer is written.
    at: usize,
    /// The body has no frame ready: what is buffered goes now.
    waiting: bool,
    /// The body has ended: the write buffer holds its last bytes.
    ended: bool,
}

impl Upload {
    /// The body of a request whose head said `framing`; `None` when no
    /// body is sent.
    pub fn new(body: UpstreamBody, framing: Sending) -> Option<Box<Self>> {
        let (chunked, allowed, left) = match framing {
            Sending::Empty => return None,
            Sending::Chunked(allowed) => (true, allowed, u64::MAX),
            Sending::Length(n) => (false, Vec::new(), n),
        };
        Some(Box::new(Self {
            body,
            chunked,
            allowed,
            left,
            big: None,
            at: 0,
            waiting: false,
            ended: false,
        }))
    }

    /// Writes what the body has ready on `conn`, its write buffer empty
    /// at the first call; ready when the whole body is written.
    ///
    /// # Errors
    /// [`NativeError::Io`] when the connection failed;
    /// [`NativeError::Client`] or [`NativeError::BodyLength`] when the
    /// client's body failed or broke its length.
    pub fn poll_send(
        &mut self,
        conn: &mut Conn,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), NativeError>> {
        loop {
            if self.ended
                || self.waiting
                || self.big.is_some()
                || conn.out.len() >= write::COPY_BELOW
            {
                ready!(self.poll_write_out(conn, cx))?;
                self.waiting = false;
                if self.ended {
                    return Poll::Ready(Ok(()));
                }
            }
            match Pin::new(&mut self.body).poll_frame(cx) {
                Poll::Pending if conn.out.is_empty() => return Poll::Pending,
                Poll::Pending => self.waiting = true,
                Poll::Ready(None) => self.end(conn)?,
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Err(NativeError::Client(e))),
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => {
                        if !self.chunked {
                            self.left = self
                                .left
                                .checked_sub(data.len() as u64)
                                .ok_or(NativeError::BodyLength)?;
                        }
                        if !data.is_empty() {
                            self.big = write::data(&mut conn.out, self.chunked, data);
                        }
                    }
                    // A body of known length sends no trailers (as hyper).
                    Err(frame) => {
                        if self.chunked
                            && let Ok(trailers) = frame.into_trailers()
                        {
                            write::last_chunk(&mut conn.out, Some(&trailers), &self.allowed);
                            self.ended = true;
                        }
                    }
                },
            }
        }
    }

    /// The body's end without trailers: the last chunk, or the check that
    /// the length was met.
    fn end(&mut self, conn: &mut Conn) -> Result<(), NativeError> {
        if self.chunked {
            write::last_chunk(&mut conn.out, None, &self.allowed);
        } else if self.left != 0 {
            return Err(NativeError::BodyLength);
        }
        self.ended = true;
        Ok(())
    }

    /// Writes the write buffer, then the large frame and its chunk's CRLF.
    fn poll_write_out(&mut self, conn: &mut Conn, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.at < conn.out.len() {
            let n = ready!(Pin::new(&mut conn.io).poll_write(cx, &conn.out[self.at..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.at += n;
        }
        conn.out.clear();
        self.at = 0;
        if let Some(big) = &mut self.big {
            while !big.is_empty() {
                let n = ready!(Pin::new(&mut conn.io).poll_write(cx, big))?;
                if n == 0 {
                    return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
                }
                big.advance(n);
            }
            self.big = None;
            if self.chunked {
                conn.out.extend_from_slice(b"\r\n");
            }
        }
        Poll::Ready(Ok(()))
    }

    /// Writes the rest of the body on `conn`, whose response has ended;
    /// the connection is fit for another request when it all went.
    pub async fn finish(mut self: Box<Self>, conn: &mut Conn) -> bool {
        std::future::poll_fn(|cx| self.poll_send(conn, cx))
            .await
            .is_ok()
    }
}
