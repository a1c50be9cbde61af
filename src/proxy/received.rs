//! The body of a response received from an upstream: from hyper's client
//! (HTTP/2, TLS, upgrades, and plain HTTP/1.1 under `server.http1: hyper`)
//! or from tollgate's own HTTP/1.1 client ([`super::h1`]).

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;

use super::h1::NativeBody;
use crate::http1::fields::Passed;
use crate::http1::text_fields::TextFields;

/// An upstream's response body, from whichever client received it.
#[derive(Debug)]
pub struct Received(Source);

#[derive(Debug)]
enum Source {
    Hyper(Incoming),
    Native(NativeBody),
}

impl Received {
    /// A body hyper's client received.
    pub fn hyper(body: Incoming) -> Self {
        Self(Source::Hyper(body))
    }

    /// A body tollgate's HTTP/1.1 client receives.
    pub fn native(body: NativeBody) -> Self {
        Self(Source::Native(body))
    }
}

/// Only tollgate's HTTP/1.1 client's bodies carry passed fields
/// ([`crate::http1::fields`]).
impl TextFields for Received {
    fn passed(&self) -> Option<&Passed> {
        match &self.0 {
            Source::Hyper(_) => None,
            Source::Native(b) => b.passed(),
        }
    }

    fn take_passed(&mut self) -> Option<Box<Passed>> {
        match &mut self.0 {
            Source::Hyper(_) => None,
            Source::Native(b) => b.take_passed(),
        }
    }
}

impl Body for Received {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match &mut self.get_mut().0 {
            Source::Hyper(b) => Pin::new(b).poll_frame(cx).map_err(Into::into),
            Source::Native(b) => Pin::new(b).poll_frame(cx).map_err(Into::into),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.0 {
            Source::Hyper(b) => b.is_end_stream(),
            Source::Native(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.0 {
            Source::Hyper(b) => b.size_hint(),
            Source::Native(b) => b.size_hint(),
        }
    }
}
