//! A request body read before the decision, then forwarded byte for byte.
//!
//! A limit whose reservation or key comes from the request's JSON body
//! (`reserve: { json: max_tokens }`, `json:model`) needs the body before the
//! request is decided. [`peek`] reads it up to a cap and hands back a
//! request whose body replays what was read, then goes on with the rest of
//! the client's body ([`Replay`]); the caller gets the bytes when the whole
//! body fit, `None` otherwise (the limit's `default`). It reads any
//! [`Peekable`] body: the gateway's [`ClientBody`](super::ClientBody), and the request body
//! of an application's service behind the tower layer
//! ([`crate::layer::LayerRequestBody`]), so both read by the same rules.
//!
//! Three bounds keep reading from costing more than the answer is worth:
//! - the cap: a body announced (`Content-Length`) past it is not read at
//!   all, and one that grows past it stops being read;
//! - a gateway-wide [`PeekBudget`] of bytes held at once: each chunk read
//!   takes its length from it until the replay hands the bytes on; a chunk
//!   the budget cannot take ends the reading (so a request holds at most
//!   one chunk past its share);
//! - a wait: a client that stalls mid-body is given up on after it (the
//!   caller passes the route's upstream timeout, which bounds the upload of
//!   a body that is not read first as well), and the request goes on with
//!   what was read.
//!
//! A failure of the client's body while it is read (a reset, broken
//! chunks) is kept and replayed after the bytes read, so the forwarder
//! answers it as it would have without the peek.

use std::collections::VecDeque;
use std::future::poll_fn;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, Request};
use http_body::{Body, Frame, SizeHint};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// A request body [`peek`] can read ahead and put back as a body of its
/// own type.
pub trait Peekable: Body<Data = Bytes> + Unpin + Sized {
    /// The body that replays `replay`: the bytes read, then the rest.
    fn replaying(replay: Box<Replay<Self>>) -> Self;
}

/// A body after [`peek`]: the bytes read, then the rest.
#[derive(Debug)]
pub struct Replay<B: Body> {
    head: VecDeque<Bytes>,
    /// The trailers, when the body ended with them while it was read.
    trailers: Option<HeaderMap>,
    /// The failure the body ended with while it was read.
    error: Option<B::Error>,
    /// The rest of the body; `None` when it was read to its end.
    rest: Option<B>,
    /// The budget the head holds, given back once it is handed on.
    permit: Option<OwnedSemaphorePermit>,
}

impl<B: Body<Data = Bytes> + Unpin> Replay<B> {
    /// The next frame: of the bytes read, the failure or trailers the
    /// reading ended with, then the rest's.
    ///
    /// # Errors
    /// The body's own failure, where it came.
    pub fn poll_frame(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        if let Some(data) = self.head.pop_front() {
            if self.head.is_empty() {
                self.permit = None;
            }
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        if let Some(e) = self.error.take() {
            return Poll::Ready(Some(Err(e)));
        }
        if let Some(t) = self.trailers.take() {
            return Poll::Ready(Some(Ok(Frame::trailers(t))));
        }
        match &mut self.rest {
            Some(rest) => Pin::new(rest).poll_frame(cx),
            None => Poll::Ready(None),
        }
    }

    /// Whether nothing is left to replay or read.
    pub fn is_end_stream(&self) -> bool {
        self.head.is_empty()
            && self.error.is_none()
            && self.trailers.is_none()
            && self.rest.as_ref().is_none_or(B::is_end_stream)
    }

    /// The bytes held, and the rest's hint.
    pub fn size_hint(&self) -> SizeHint {
        let held: u64 = self.head.iter().map(|b| b.len() as u64).sum();
        let rest = self
            .rest
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), B::size_hint);
        let mut hint = SizeHint::new();
        hint.set_lower(rest.lower().saturating_add(held));
        if let Some(upper) = rest.upper() {
            hint.set_upper(upper.saturating_add(held));
        }
        hint
    }
}

/// Request body bytes read ahead and held at once, gateway-wide; clones
/// share the bytes.
#[derive(Debug, Clone)]
pub struct PeekBudget(Arc<Semaphore>);

impl PeekBudget {
    /// A budget of `bytes` (at most `u32::MAX`).
    pub fn new(bytes: usize) -> Self {
        Self(Arc::new(Semaphore::new(bytes.min(u32::MAX as usize))))
    }

    /// Bytes not held now.
    pub fn available(&self) -> usize {
        self.0.available_permits()
    }
}

/// How the reading ended.
enum Ended {
    /// The body's end (or its failure) was read.
    Whole,
    /// The cap, the budget or the wait stopped it; the rest is unread.
    Stopped,
}

/// Reads `req`'s body up to `cap` bytes, within `budget` and `wait`; the
/// request with a body that replays what was read and continues with the
/// rest, and the whole body when it was read to its end (without a
/// failure) within the cap. A body without bytes is not read (`None`).
pub async fn peek<B: Peekable>(
    req: Request<B>,
    cap: usize,
    budget: &PeekBudget,
    wait: Duration,
) -> (Request<B>, Option<Bytes>) {
    let (parts, mut body) = req.into_parts();
    let announced = body.size_hint().exact();
    if body.is_end_stream() || announced.is_some_and(|n| n > cap as u64) {
        return (Request::from_parts(parts, body), None);
    }
    let mut replay = Replay {
        head: VecDeque::new(),
        trailers: None,
        error: None,
        rest: None,
        permit: None,
    };
    let mut held = 0usize;
    let reading = async {
        loop {
            let Some(frame) = poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await else {
                return Ended::Whole;
            };
            let frame = match frame {
                Ok(frame) => frame,
                Err(e) => {
                    replay.error = Some(e);
                    return Ended::Whole;
                }
            };
            let data = match frame.into_data() {
                Ok(data) => data,
                Err(frame) => {
                    // Trailers end a body.
                    replay.trailers = frame.into_trailers().ok();
                    return Ended::Whole;
                }
            };
            held += data.len();
            let taken = u32::try_from(data.len())
                .ok()
                .and_then(|n| Arc::clone(&budget.0).try_acquire_many_owned(n).ok());
            replay.head.push_back(data);
            match (taken, &mut replay.permit) {
                (Some(p), Some(permit)) => permit.merge(p),
                (Some(p), None) => replay.permit = Some(p),
                (None, _) => return Ended::Stopped,
            }
            if held > cap {
                return Ended::Stopped;
            }
        }
    };
    let ended = tokio::time::timeout(wait, reading)
        .await
        .unwrap_or(Ended::Stopped);
    let whole = match ended {
        Ended::Whole if replay.error.is_none() && held <= cap => {
            let all = joined(&replay.head);
            replay.head = VecDeque::from([all.clone()]);
            Some(all)
        }
        Ended::Whole => None,
        Ended::Stopped => {
            replay.rest = Some(body);
            None
        }
    };
    let body = B::replaying(Box::new(replay));
    (Request::from_parts(parts, body), whole)
}

/// The chunks as one, copied only when there are several.
fn joined(chunks: &VecDeque<Bytes>) -> Bytes {
    match chunks.len() {
        0 => Bytes::new(),
        1 => chunks[0].clone(),
        _ => {
            let mut all = BytesMut::with_capacity(chunks.iter().map(Bytes::len).sum());
            for c in chunks {
                all.extend_from_slice(c);
            }
            all.freeze()
        }
    }
}

#[cfg(test)]
mod tests;
