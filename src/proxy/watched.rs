//! A response body with something watching it: the limits that live as
//! long as the response does — a concurrency slot released when
//! the body ends, a cost settled by a trailer, by the bytes sent or by
//! the usage the body reports.
//!
//! [`Watched`] passes every frame through untouched and tells its
//! [`Watch`]es what went by: each data frame, the trailers,
//! and, exactly once, the end — complete (the upstream's body ended), or
//! not (it failed, or the client went away and hyper dropped the body).
//! Dropping the body is an end too, so a slot or a settlement is never
//! left behind by a path that forgets it: the client closing mid-response,
//! a task that panics while it holds the body, a connection timed out.
//! A body without a watch costs one emptiness check per frame.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};

use super::received::Received;
use super::upstreams::balancer::InFlight;

/// Told what a [`Watched`] body passes on.
pub trait Watch: Send + Sync + 'static {
    /// A data frame went to the client: `data` as it passed, never held
    /// (a watch that reads it keeps only what it works out).
    fn data(&mut self, _data: &Bytes) {}
    /// The body's trailers went to the client.
    fn trailers(&mut self, _trailers: &HeaderMap) {}
    /// The body ended; called once. `complete` is false when it failed or
    /// was dropped before its end.
    fn end(&mut self, complete: bool);
}

/// A response body, with the [`Watch`]es told about it: an upstream's
/// (`Received`: hyper's `Incoming` or the native client's body), or in an application's [`layer`](crate::layer) its inner
/// service's, boxed.
pub struct Watched<B = Received> {
    inner: B,
    /// Empty (no allocation) for most responses.
    watches: Vec<Box<dyn Watch>>,
    /// A pool target's count of requests in flight, held until the body
    /// ends or is dropped: kept here rather than as a [`Watch`], so the
    /// requests to pools pay no allocation for it.
    in_flight: Option<InFlight>,
}

impl<B: std::fmt::Debug> std::fmt::Debug for Watched<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watched")
            .field("inner", &self.inner)
            .field("watches", &self.watches.len())
            .finish()
    }
}

impl<B> Watched<B> {
    /// `inner` with nothing watching it.
    pub fn new(inner: B) -> Self {
        Self {
            inner,
            watches: Vec::new(),
            in_flight: None,
        }
    }

    /// The body watched.
    pub fn get_ref(&self) -> &B {
        &self.inner
    }

    /// The body watched, to change.
    pub fn get_mut(&mut self) -> &mut B {
        &mut self.inner
    }

    /// Counts the request in flight on its pool target until the body ends.
    pub fn hold(&mut self, in_flight: InFlight) {
        self.in_flight = Some(in_flight);
    }

    /// Adds `watch` to those told about this body, from its next frame on.
    pub fn add_watch(&mut self, watch: Box<dyn Watch>) {
        self.watches.push(watch);
    }

    /// Tells every watch the body ended, once: the list is emptied.
    fn end(&mut self, complete: bool) {
        self.in_flight = None;
        for mut w in self.watches.drain(..) {
            w.end(complete);
        }
    }
}

impl<B> Drop for Watched<B> {
    fn drop(&mut self) {
        self.end(false);
    }
}

impl<B: Body<Data = Bytes> + Unpin> Body for Watched<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.get_mut();
        let polled = ready!(Pin::new(&mut this.inner).poll_frame(cx));
        if this.watches.is_empty() {
            if this.in_flight.is_some()
                && (this.inner.is_end_stream() || !matches!(polled, Some(Ok(_))))
            {
                this.in_flight = None;
            }
            return Poll::Ready(polled);
        }
        match &polled {
            Some(Ok(frame)) => {
                for watch in &mut this.watches {
                    if let Some(d) = frame.data_ref() {
                        watch.data(d);
                    } else if let Some(t) = frame.trailers_ref() {
                        watch.trailers(t);
                    }
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
