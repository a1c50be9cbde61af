//! The request body sent upstream: the client's body, capped at
//! `server.max_body_size`, whose failures say they are the client's.
//!
//! When the client's body fails while it is forwarded — a malformed chunk,
//! a client that closes or resets its connection mid-upload, a chunked body
//! that passes the cap — hyper's *client* reports it as a failed exchange
//! with the upstream. Over HTTP/1.1 that error has the body's error in its
//! source chain; over HTTP/2 hyper resets the stream and only logs the
//! body's error. So [`UpstreamBody`] turns every failure of the client's
//! body into a [`ClientBodyError`] (found in the chain) and, when asked with
//! [`UpstreamBody::watch`], also leaves it in a cell the forwarder reads
//! after an HTTP/2 failure. The forwarder then answers 400 or 413 and counts
//! a client error instead of blaming the upstream.

use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;
use hyper::body::Incoming;

use super::counted::BodyBytes;
use super::forwarding::Forwarding;
use super::peek::{Peekable, Replay};
use crate::problem::GatewayError;

/// How the client's request body failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ClientBodyError {
    /// More than this many bytes arrived (`server.max_body_size`).
    #[error("request body larger than {0} bytes")]
    TooLarge(u64),
    /// The body broke its framing (RFC 9112 §7.1: a chunk size line that
    /// is not hex, a chunk without its CRLF, and the like).
    #[error("malformed request body: {0}")]
    Malformed(String),
    /// The client closed or reset the connection (or its HTTP/2 stream)
    /// before the body was complete.
    #[error("client went away mid-body: {0}")]
    Aborted(String),
}

impl ClientBodyError {
    /// Sorts an error of the client's `Incoming` body. hyper's HTTP/1.1
    /// decoder reports broken framing as `InvalidData` or `InvalidInput`
    /// and a body cut short as `UnexpectedEof`; resets and HTTP/2 stream
    /// errors are the client leaving too.
    fn from_incoming(e: &hyper::Error) -> Self {
        let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
        while let Some(err) = cur {
            if let Some(io) = err.downcast_ref::<std::io::Error>()
                && matches!(
                    io.kind(),
                    std::io::ErrorKind::InvalidData | std::io::ErrorKind::InvalidInput
                )
            {
                return Self::Malformed(io.to_string());
            }
            cur = err.source();
        }
        Self::Aborted(error_chain(e))
    }

    /// The answer to the client.
    pub fn to_gateway_error(&self) -> GatewayError {
        match self {
            Self::TooLarge(max) => GatewayError::PayloadTooLarge(*max),
            Self::Malformed(why) => GatewayError::BadRequestBody(why.clone()),
            Self::Aborted(why) => GatewayError::ClientAborted(why.clone()),
        }
    }
}

/// The body of a client's request: as it arrives on a connection, or
/// whole, for a request handed to the pipeline in process (tests, or an
/// embedding that already holds the bytes).
#[derive(Debug)]
pub enum ClientBody {
    /// Streamed from the client's connection.
    Incoming(Incoming),
    /// Streamed from a connection of the native HTTP/1.1 server.
    Native(crate::http1::RequestBody),
    /// All of it, in memory.
    Whole(Full<Bytes>),
    /// Read ahead for the decision ([`super::peek`]): what was read, then
    /// the rest.
    Replayed(Box<Replay<ClientBody>>),
}

impl From<Incoming> for ClientBody {
    fn from(b: Incoming) -> Self {
        Self::Incoming(b)
    }
}

impl From<crate::http1::RequestBody> for ClientBody {
    fn from(b: crate::http1::RequestBody) -> Self {
        Self::Native(b)
    }
}

impl From<Full<Bytes>> for ClientBody {
    fn from(b: Full<Bytes>) -> Self {
        Self::Whole(b)
    }
}

impl From<Bytes> for ClientBody {
    fn from(b: Bytes) -> Self {
        Self::Whole(Full::new(b))
    }
}

impl ClientBody {
    pub(super) fn poll_frame(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, ClientBodyError>>> {
        match self {
            Self::Incoming(b) => Pin::new(b)
                .poll_frame(cx)
                .map_err(|e| ClientBodyError::from_incoming(&e)),
            Self::Native(b) => Pin::new(b).poll_frame(cx).map_err(|e| match e {
                crate::http1::BodyError::Malformed(why) => {
                    ClientBodyError::Malformed(why.to_owned())
                }
                crate::http1::BodyError::Aborted(why) => ClientBodyError::Aborted(why),
            }),
            Self::Whole(b) => Pin::new(b).poll_frame(cx).map_err(|never| match never {}),
            Self::Replayed(b) => b.poll_frame(cx),
        }
    }

    pub(super) fn is_end_stream(&self) -> bool {
        match self {
            Self::Incoming(b) => b.is_end_stream(),
            Self::Native(b) => b.is_end_stream(),
            Self::Whole(b) => b.is_end_stream(),
            Self::Replayed(b) => b.is_end_stream(),
        }
    }

    pub(super) fn size_hint(&self) -> SizeHint {
        match self {
            Self::Incoming(b) => b.size_hint(),
            Self::Native(b) => b.size_hint(),
            Self::Whole(b) => b.size_hint(),
            Self::Replayed(b) => b.size_hint(),
        }
    }
}

impl Body for ClientBody {
    type Data = Bytes;
    type Error = ClientBodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, ClientBodyError>>> {
        Self::poll_frame(self.get_mut(), cx)
    }

    fn is_end_stream(&self) -> bool {
        Self::is_end_stream(self)
    }

    fn size_hint(&self) -> SizeHint {
        Self::size_hint(self)
    }
}

impl Peekable for ClientBody {
    fn replaying(replay: Box<Replay<Self>>) -> Self {
        Self::Replayed(replay)
    }
}

/// Where a watched body leaves its failure (see [`UpstreamBody::watch`]).
pub type FaultCell = Arc<OnceLock<ClientBodyError>>;

/// The client's body on its way upstream; see the module docs.
#[derive(Debug)]
pub struct UpstreamBody {
    /// `None` for a body built empty (a request sent again).
    inner: Option<ClientBody>,
    /// The cap, for the error.
    limit: u64,
    /// Bytes the body may still carry.
    remaining: u64,
    fault: Option<FaultCell>,
    /// Where the bytes forwarded are counted, for a byte quota.
    count: Option<BodyBytes>,
    /// The forwarding fields the request's head is written with, when they
    /// are not in its map: carried by the body as an answer's fields are.
    forwarding: Option<Forwarding>,
}

impl UpstreamBody {
    /// Counts the bytes forwarded in `count`, when given.
    #[must_use]
    #[inline]
    pub fn counting(mut self, count: Option<BodyBytes>) -> Self {
        self.count = count;
        self
    }

    /// Carries `forwarding`, the fields the request's head is written with
    /// besides its map's.
    #[must_use]
    #[inline]
    pub fn forwarding(mut self, forwarding: Option<Forwarding>) -> Self {
        self.forwarding = forwarding;
        self
    }

    /// The forwarding fields the request's head is written with besides
    /// its map's.
    #[inline]
    pub fn forwarding_fields(&self) -> Option<&Forwarding> {
        self.forwarding.as_ref()
    }

    /// Takes the forwarding fields out, for a sender that needs them in the
    /// map ([`Forwarding::materialize`]).
    #[inline]
    pub fn take_forwarding(&mut self) -> Option<Forwarding> {
        self.forwarding.take()
    }

    /// The body's bytes, moved out to be sent; what the head is written
    /// with (its forwarding fields) stays, for a request written again.
    pub fn take_bytes(&mut self) -> Self {
        let mut left = Self::empty();
        left.forwarding = self.forwarding;
        std::mem::replace(self, left)
    }

    /// The client's `body`, cut off past `max` bytes.
    #[inline]
    pub fn new(body: ClientBody, max: Option<u64>) -> Self {
        let limit = max.unwrap_or(u64::MAX);
        Self {
            inner: Some(body),
            limit,
            remaining: limit,
            fault: None,
            count: None,
            forwarding: None,
        }
    }

    /// A body without bytes, for a request sent again.
    pub fn empty() -> Self {
        Self {
            inner: None,
            limit: 0,
            remaining: 0,
            fault: None,
            count: None,
            forwarding: None,
        }
    }

    /// A cell where this body leaves its failure, for clients that do not
    /// pass it on; `None` (and no allocation) for a body already at its end.
    pub fn watch(&mut self) -> Option<FaultCell> {
        if self.is_end_stream() {
            return None;
        }
        Some(self.fault.get_or_insert_with(FaultCell::default).clone())
    }

    fn fail(&self, err: ClientBodyError) -> Poll<Option<Result<Frame<Bytes>, ClientBodyError>>> {
        if let Some(cell) = &self.fault {
            let _ = cell.set(err.clone());
        }
        Poll::Ready(Some(Err(err)))
    }
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = ClientBodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, ClientBodyError>>> {
        let this = self.get_mut();
        let Some(inner) = this.inner.as_mut() else {
            return Poll::Ready(None);
        };
        match ready!(inner.poll_frame(cx)) {
            None => Poll::Ready(None),
            Some(Ok(frame)) => {
                let len = frame.data_ref().map_or(0, |d| d.len() as u64);
                match this.remaining.checked_sub(len) {
                    Some(left) => {
                        this.remaining = left;
                        if let Some(c) = &this.count {
                            c.add(len);
                        }
                        Poll::Ready(Some(Ok(frame)))
                    }
                    None => this.fail(ClientBodyError::TooLarge(this.limit)),
                }
            }
            Some(Err(e)) => this.fail(e),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.as_ref().is_none_or(ClientBody::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.inner
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), ClientBody::size_hint)
    }
}

pub(super) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// The error of a failed exchange: the client's, when its body failed
/// (in `e`'s source chain, or left in `fault` by a watched body), else the
/// upstream's.
pub(super) fn failed(
    e: &(dyn std::error::Error + 'static),
    fault: Option<&std::sync::OnceLock<ClientBodyError>>,
) -> GatewayError {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(client) = err.downcast_ref::<ClientBodyError>() {
            return client.to_gateway_error();
        }
        cur = err.source();
    }
    match fault.and_then(std::sync::OnceLock::get) {
        Some(client) => client.to_gateway_error(),
        None => GatewayError::UpstreamFailed(error_chain(e)),
    }
}
