//! The body of an answer the gateway makes itself — a refusal, a route's
//! `respond`, a CORS preflight — whole in memory, with the header fields
//! it carries as text for a native HTTP/1.1 connection's writer
//! ([`LateFields`]): kept in the body rather than in the response's
//! extensions, so that carrying them costs no map, no box and no lookup.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;

use crate::http1::text_fields::TextFields;
use crate::http1::write::LateFields;

/// An answer's body made by the gateway, and the fields it carries for
/// the native writer (none for most).
#[derive(Debug, Default)]
pub struct Local {
    body: Full<Bytes>,
    late: LateFields,
}

impl Local {
    /// `bytes`, carrying no fields.
    pub fn new(bytes: Bytes) -> Self {
        Self {
            body: Full::new(bytes),
            late: LateFields::default(),
        }
    }

    /// `bytes`, carrying `late` for the native writer.
    pub fn with_fields(bytes: Bytes, late: LateFields) -> Self {
        Self {
            body: Full::new(bytes),
            late,
        }
    }

    /// The fields it carries.
    pub fn fields(&self) -> &LateFields {
        &self.late
    }

    /// The fields it carries, to add to.
    pub fn fields_mut(&mut self) -> &mut LateFields {
        &mut self.late
    }

    /// The body alone, its fields dropped.
    pub fn into_full(self) -> Full<Bytes> {
        self.body
    }
}

impl Body for Local {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl TextFields for Local {
    fn late(&self) -> Option<&LateFields> {
        (!self.late.is_empty()).then_some(&self.late)
    }
}
