//! A request body as the service sees it ([`RequestBody`], an
//! `http_body::Body`), and the connection's side that decodes it from the
//! read buffer and hands it over ([`pump`]).
//!
//! The connection task reads the body while it polls the service, so the
//! two meet in a channel of one frame: the connection reads ahead by at
//! most one frame, and a service that stops reading stops the reads.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::{Notify, mpsc, oneshot};

use super::chunked::{Chunked, Step};
use super::head::BodyFraming;

/// How a request body failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum BodyError {
    /// The body broke its framing (RFC 9112 §7.1).
    #[error("malformed request body: {0}")]
    Malformed(&'static str),
    /// The connection ended, or failed, before the body did.
    #[error("client went away mid-body: {0}")]
    Aborted(String),
}

type Item = Result<Frame<Bytes>, BodyError>;

/// How much the read buffer grows by when it needs room.
pub(super) const READ_CHUNK: usize = 8 * 1024;

/// The most a request body's read asks for at once.
const READ_MAX: usize = 256 * 1024;

/// A request body read from a native HTTP/1.1 connection.
#[derive(Debug)]
pub struct RequestBody {
    rx: Option<mpsc::Receiver<Item>>,
    /// Bytes still to come of a body of known length; `None` when chunked.
    remaining: Option<u64>,
    /// Fired at the first poll, when the client waits for `100 Continue`.
    wanted: Option<oneshot::Sender<()>>,
}

impl RequestBody {
    /// A body without bytes.
    pub fn empty() -> Self {
        Self {
            rx: None,
            remaining: Some(0),
            wanted: None,
        }
    }

    /// The service's end of a body framed by `framing`.
    pub(super) fn channel(
        framing: BodyFraming,
        expect_continue: bool,
    ) -> (Self, mpsc::Sender<Item>, Option<oneshot::Receiver<()>>) {
        let (tx, rx) = mpsc::channel(1);
        let (wanted, gate) = if expect_continue {
            let (w, g) = oneshot::channel();
            (Some(w), Some(g))
        } else {
            (None, None)
        };
        let remaining = match framing {
            BodyFraming::Length(n) => Some(n),
            BodyFraming::Chunked => None,
        };
        let body = Self {
            rx: Some(rx),
            remaining,
            wanted,
        };
        (body, tx, gate)
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Item>> {
        let this = self.get_mut();
        if let Some(w) = this.wanted.take() {
            let _ = w.send(());
        }
        if this.remaining == Some(0) {
            return Poll::Ready(None);
        }
        let Some(rx) = this.rx.as_mut() else {
            return Poll::Ready(None);
        };
        let item = std::task::ready!(rx.poll_recv(cx));
        if let (Some(Ok(frame)), Some(left)) = (&item, this.remaining.as_mut()) {
            let n = frame.data_ref().map_or(0, |d| d.len() as u64);
            *left = left.saturating_sub(n);
        }
        if item.is_none() {
            this.rx = None;
        }
        Poll::Ready(item)
    }

    fn is_end_stream(&self) -> bool {
        self.remaining == Some(0) || self.rx.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        match self.remaining {
            Some(n) => SizeHint::with_exact(n),
            None if self.rx.is_none() => SizeHint::with_exact(0),
            None => SizeHint::default(),
        }
    }
}

/// How the connection's reading of a body ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PumpEnd {
    /// Read to its end: the connection may read the next head.
    Done,
    /// The service dropped the body before its end.
    Dropped,
    /// Broken framing, or the connection ended: the connection closes.
    Failed,
}

/// Reads the body framed by `framing` off `rd` (after what `buf` already
/// holds) into `tx`, one frame at a time; with `go`, only once it is
/// notified (the `100 Continue` is out).
pub(super) async fn pump<R: AsyncRead + Unpin>(
    rd: &mut R,
    buf: &mut BytesMut,
    framing: BodyFraming,
    tx: mpsc::Sender<Item>,
    go: Option<&Notify>,
) -> PumpEnd {
    if let Some(go) = go {
        go.notified().await;
    }
    let mut decoder = Decoder::new(framing);
    // Each read that fills the room it was given doubles the next one's,
    // up to `READ_MAX`: a large upload moves in few, large frames.
    let mut chunk = READ_CHUNK;
    loop {
        let item = match decoder.step(buf) {
            Ok(Step::Data(b)) => Ok(Frame::data(b)),
            Ok(Step::Trailers(t)) => Ok(Frame::trailers(t)),
            Ok(Step::End) => return PumpEnd::Done,
            Ok(Step::More) => {
                if buf.capacity() - buf.len() < 1024 {
                    buf.reserve(chunk);
                }
                let room = buf.capacity() - buf.len();
                match rd.read_buf(buf).await {
                    Ok(0) => Err(BodyError::Aborted("connection closed".to_owned())),
                    Ok(n) => {
                        if n == room {
                            chunk = (chunk * 2).min(READ_MAX);
                        }
                        continue;
                    }
                    Err(e) => Err(BodyError::Aborted(e.to_string())),
                }
            }
            Err(why) => Err(BodyError::Malformed(why)),
        };
        let failed = item.is_err();
        let ended = matches!(&item, Ok(f) if f.is_trailers()) || decoder.is_done();
        if tx.send(item).await.is_err() {
            return PumpEnd::Dropped;
        }
        if failed {
            return PumpEnd::Failed;
        }
        if ended {
            return PumpEnd::Done;
        }
    }
}

/// Either framing's decoder.
#[derive(Debug)]
enum Decoder {
    Length(u64),
    Chunked(Chunked),
}

impl Decoder {
    fn new(framing: BodyFraming) -> Self {
        match framing {
            BodyFraming::Length(n) => Self::Length(n),
            BodyFraming::Chunked => Self::Chunked(Chunked::default()),
        }
    }

    fn is_done(&self) -> bool {
        match self {
            Self::Length(n) => *n == 0,
            Self::Chunked(c) => c.is_done(),
        }
    }

    fn step(&mut self, buf: &mut BytesMut) -> Result<Step, &'static str> {
        match self {
            Self::Length(0) => Ok(Step::End),
            Self::Length(_) if buf.is_empty() => Ok(Step::More),
            Self::Length(n) => {
                let take = usize::try_from(*n).unwrap_or(usize::MAX).min(buf.len());
                *n -= take as u64;
                Ok(Step::Data(buf.split_to(take).freeze()))
            }
            Self::Chunked(c) => c.step(buf),
        }
    }
}

/// Decodes a whole body held in `buf` (for the differential fuzz target
/// and the tests): its bytes and trailers, or why it is refused. A body cut
/// short is an error too.
///
/// # Errors
/// The framing is broken or the bytes end before the body.
pub fn decode_all(
    framing: BodyFraming,
    buf: &mut BytesMut,
) -> Result<(Vec<u8>, Option<http::HeaderMap>), &'static str> {
    let mut decoder = Decoder::new(framing);
    let mut data = Vec::new();
    loop {
        match decoder.step(buf)? {
            Step::Data(b) => data.extend_from_slice(&b),
            Step::Trailers(t) => return Ok((data, Some(t))),
            Step::End => return Ok((data, None)),
            Step::More => return Err("body cut short"),
        }
    }
}
