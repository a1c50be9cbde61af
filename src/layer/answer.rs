//! The body of the layer's answers.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::{Either, Full};

use crate::proxy::Watched;

/// An error of a [`LayerBody`]: the inner service's body's, boxed.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What a [`LayerBody`] holds besides the inner service's body as it is:
/// that body watched (its end releases concurrency slots or settles
/// costs), or a refusal's.
type Other<B> = Either<Watched<Pin<Box<B>>>, Full<Bytes>>;

pin_project_lite::pin_project! {
    /// The body of the layer's answers: the inner service's — as it is,
    /// or watched when its end releases concurrency slots or settles
    /// costs — or a refusal's.
    ///
    /// The inner service's body is held in place and the rest boxed, so
    /// that an answer is no larger than the inner service's where its
    /// body is a boxed one (an axum `Body`): the answer is moved through
    /// every future that polls it, and a larger one is a copy of memory
    /// at each.
    pub struct LayerBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project_lite::pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Inner { #[pin] body: B },
        Other { body: Box<Other<B>> },
    }
}

impl<B> LayerBody<B> {
    /// The inner service's body, as it is.
    pub(super) fn inner(body: B) -> Self {
        Self {
            kind: Kind::Inner { body },
        }
    }

    /// The inner service's body, watched.
    pub(super) fn watched(body: Watched<Pin<Box<B>>>) -> Self {
        Self {
            kind: Kind::Other {
                body: Box::new(Either::Left(body)),
            },
        }
    }

    /// A refusal's body.
    pub(super) fn refusal(body: Full<Bytes>) -> Self {
        Self {
            kind: Kind::Other {
                body: Box::new(Either::Right(body)),
            },
        }
    }
}

impl<B> std::fmt::Debug for LayerBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match &self.kind {
            Kind::Inner { .. } => "inner",
            Kind::Other { body } => match **body {
                Either::Left(_) => "watched",
                Either::Right(_) => "refusal",
            },
        };
        f.debug_struct("LayerBody").field("kind", &kind).finish()
    }
}

impl<B> Body for LayerBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.project().kind.project() {
            KindProj::Inner { body } => body
                .poll_frame(cx)
                .map(|frame| frame.map(|f| f.map_err(Into::into))),
            KindProj::Other { body } => Pin::new(&mut **body).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body } => body.is_end_stream(),
            Kind::Other { body } => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body } => body.size_hint(),
            Kind::Other { body } => body.size_hint(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_with_a_boxed_body_is_no_larger_than_the_inner_one() {
        type Boxed = http_body_util::combinators::UnsyncBoxBody<Bytes, BoxError>;
        assert_eq!(
            size_of::<http::Response<LayerBody<Boxed>>>(),
            size_of::<http::Response<Boxed>>()
        );
    }

    #[tokio::test]
    async fn each_kind_passes_its_bytes() {
        use http_body_util::BodyExt;
        let inner = LayerBody::inner(Full::new(Bytes::from_static(b"in")));
        assert_eq!(inner.collect().await.unwrap().to_bytes(), "in");
        let watched = LayerBody::watched(Watched::new(Box::pin(Full::new(Bytes::from_static(
            b"watched",
        )))));
        assert_eq!(watched.collect().await.unwrap().to_bytes(), "watched");
        let refusal = LayerBody::<Full<Bytes>>::refusal(Full::new(Bytes::from_static(b"no")));
        assert!(!refusal.is_end_stream());
        assert_eq!(refusal.collect().await.unwrap().to_bytes(), "no");
    }
}
