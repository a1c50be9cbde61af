//! The request body of a service behind the layer, and the requests whose
//! limits need it.
//!
//! Every request reaches the inner service with its body as a
//! [`LayerRequestBody`]: the body the layer was given, passed as it is
//! (moved into the wrapper, no allocation), unless the layer's limits need
//! it. They need it in two ways, both as in the gateway:
//! - a `json:` key or a `reserve: { json: … }` reads fields of the JSON
//!   body before the decision: the body is read ahead by the gateway's own
//!   code ([`read_within`]: up to [`BODY_CAP`], under the layer's
//!   [`BODY_BUDGET`] of bytes held at once, a client that stalls waited
//!   for 30 s) and replayed byte for byte to the inner service. A body not
//!   read (larger than the cap, the budget spent, not JSON) leaves its
//!   fields absent: keys fall back, reservations take their `default`;
//! - a `bytes: request` (or `both`) quota reserves the `Content-Length`
//!   (else 1) at the decision and counts the bytes the inner service
//!   reads of the body, settled when the answer's body ends.
//!
//! [`read_within`]: crate::pipeline::body::read_within
//! [`BODY_CAP`]: crate::pipeline::body::BODY_CAP
//! [`BODY_BUDGET`]: crate::pipeline::gateway::BODY_BUDGET

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::Request;
use http_body::{Body, Frame, SizeHint};

use crate::limit::settle::Source;
use crate::proxy::{BodyBytes, Peekable, Replay};
use crate::routing::CompiledRoute;

/// The body of a request as the service behind the layer reads it: the
/// body the layer was given, or, when its limits read it first, what was
/// read replayed and then the rest. Its data, trailers and failure are the
/// original body's, in order.
pub struct LayerRequestBody<B: Body<Data = Bytes> + Unpin> {
    body: Kind<B>,
    /// Where the bytes read are counted, for a request byte quota.
    count: Option<BodyBytes>,
}

enum Kind<B: Body<Data = Bytes> + Unpin> {
    Passed(B),
    Replayed(Box<Replay<LayerRequestBody<B>>>),
}

impl<B: Body<Data = Bytes> + Unpin> std::fmt::Debug for LayerRequestBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LayerRequestBody")
            .field("replayed", &self.is_replayed())
            .field("counted", &self.count.is_some())
            .finish_non_exhaustive()
    }
}

impl<B: Body<Data = Bytes> + Unpin> LayerRequestBody<B> {
    /// `body`, passed as it is.
    pub fn new(body: B) -> Self {
        Self {
            body: Kind::Passed(body),
            count: None,
        }
    }

    /// Whether the layer read this body ahead (its bytes replayed).
    pub fn is_replayed(&self) -> bool {
        matches!(self.body, Kind::Replayed(_))
    }
}

impl<B: Body<Data = Bytes> + Unpin> Body for LayerRequestBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.get_mut();
        let polled = match &mut this.body {
            Kind::Passed(b) => Pin::new(b).poll_frame(cx),
            Kind::Replayed(r) => r.poll_frame(cx),
        };
        if let (Some(count), Poll::Ready(Some(Ok(frame)))) = (&this.count, &polled)
            && let Some(data) = frame.data_ref()
        {
            count.add(data.len() as u64);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        match &self.body {
            Kind::Passed(b) => b.is_end_stream(),
            Kind::Replayed(r) => r.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.body {
            Kind::Passed(b) => b.size_hint(),
            Kind::Replayed(r) => r.size_hint(),
        }
    }
}

impl<B: Body<Data = Bytes> + Unpin> Peekable for LayerRequestBody<B> {
    fn replaying(replay: Box<Replay<Self>>) -> Self {
        Self {
            body: Kind::Replayed(replay),
            count: None,
        }
    }
}

/// What a layer's limits need of the request body.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct BodyUse {
    /// A limit reads fields of the JSON body before the decision.
    pub(super) reads: bool,
    /// A limit counts the request's bytes.
    pub(super) counts: bool,
}

impl BodyUse {
    pub(super) fn of(route: &CompiledRoute) -> Self {
        Self {
            reads: !route.body_reads.is_empty(),
            counts: route
                .route
                .limits
                .iter()
                .any(|l| matches!(&l.settle, Some(Source::Bytes(b)) if b.request())),
        }
    }

    /// Whether any limit needs the body.
    pub(super) fn any(self) -> bool {
        self.reads || self.counts
    }
}

/// The inner service, handed a body that counts its bytes where the
/// decision asked for them (a [`BodyBytes`] in the request's extensions,
/// put there by [`settle::prepare`](crate::pipeline::settle::prepare)).
pub(super) struct Counting<S>(pub(super) S);

impl<S, B> tower::Service<Request<LayerRequestBody<B>>> for Counting<S>
where
    S: tower::Service<Request<LayerRequestBody<B>>>,
    B: Body<Data = Bytes> + Unpin,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<LayerRequestBody<B>>) -> S::Future {
        if let Some(count) = req.extensions_mut().remove::<BodyBytes>() {
            req.body_mut().count = Some(count);
        }
        self.0.call(req)
    }
}
