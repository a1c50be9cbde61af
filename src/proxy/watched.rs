//! A response body with something watching it: the limits that live as
//! long as the response does (issue 15) — a concurrency slot released when
//! the body ends, a cost settled by a trailer or by the bytes sent.
//!
//! [`Watched`] passes every frame through untouched and tells its
//! [`Watch`] what went by: the length of each data frame, the trailers,
//! and, exactly once, the end — complete (the upstream's body ended), or
//! not (it failed, or the client went away and hyper dropped the body).
//! Dropping the body is an end too, so a slot or a settlement is never
//! left behind by a path that forgets it: the client closing mid-response,
//! a task that panics while it holds the body, a connection timed out.
//! A body without a watch costs one `Option` check per frame.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;

/// Told what a [`Watched`] body passes on.
pub trait Watch: Send + Sync + 'static {
    /// A data frame of `len` bytes went to the client.
    fn data(&mut self, _len: usize) {}
    /// The body's trailers went to the client.
    fn trailers(&mut self, _trailers: &HeaderMap) {}
    /// The body ended; called once. `complete` is false when it failed or
    /// was dropped before its end.
    fn end(&mut self, complete: bool);
}

/// An upstream's response body, with an optional [`Watch`].
pub struct Watched {
    inner: Incoming,
    watch: Option<Box<dyn Watch>>,
}

impl std::fmt::Debug for Watched {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watched")
            .field("inner", &self.inner)
            .field("watched", &self.watch.is_some())
            .finish()
    }
}

impl Watched {
    /// `inner` with nothing watching it.
    pub fn new(inner: Incoming) -> Self {
        Self { inner, watch: None }
    }

    /// Sets what watches this body; a watch set earlier ends at once
    /// (incomplete), so only one is ever told about the body.
    pub fn set_watch(&mut self, watch: Box<dyn Watch>) {
        if let Some(mut old) = self.watch.replace(watch) {
            old.end(false);
        }
    }

    fn end(&mut self, complete: bool) {
        if let Some(mut w) = self.watch.take() {
            w.end(complete);
        }
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        self.end(false);
    }
}

impl Body for Watched {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        let polled = ready!(Pin::new(&mut this.inner).poll_frame(cx));
        let Some(watch) = this.watch.as_mut() else {
            return Poll::Ready(polled);
        };
        match &polled {
            Some(Ok(frame)) => {
                if let Some(d) = frame.data_ref() {
                    watch.data(d.len());
                } else if let Some(t) = frame.trailers_ref() {
                    watch.trailers(t);
                }
                if this.inner.is_end_stream() {
                    this.end(true);
                }
            }
            Some(Err(_)) => this.end(false),
            None => this.end(true),
        }
        Poll::Ready(polled)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
