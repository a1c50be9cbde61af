//! Costs read out of a body: the tokens an AI API reports it used, found in
//! a JSON response or in the Server-Sent Events of a streamed one as the
//! bytes pass, and the reservation and keys found in a request's JSON body.
//!
//! A [`UsageSpec`] says what to read: a sum of terms, each a set of
//! alternative dotted paths ([`JsonPath`]). A [`UsageReader`] sees every
//! chunk of one response ([`UsageReader::feed`]) and answers the cost at
//! the end ([`UsageReader::finish`]), or why the reservation stands
//! ([`Kept`]). It never holds the body:
//!
//! - a JSON body (`application/json`, `…+json`) goes through a streaming
//!   scanner (`scan`) that keeps a few hundred bytes of state whatever the
//!   body's size, and records only numbers at wanted paths;
//! - an event stream (`text/event-stream`) is split into events (`sse`);
//!   each event's data is held up to [`EVENT_BUFFER`] bytes, and only an
//!   event that holds the quoted last segment of a wanted path (a
//!   `memchr::memmem` search, so the chunks between two usage reports cost
//!   a copy and a search) is scanned; an event past the buffer is scanned
//!   as it streams, without the search. Every event is a JSON document of
//!   its own; one that is not JSON (`[DONE]`, a keep-alive) is skipped.
//!
//! In a stream, each term takes the last value seen at any of its paths
//! ([`Stream::Last`], for cumulative reports) or the sum of all of them
//! ([`Stream::Sum`], for per-event deltas); the cost is the sum of the
//! terms. A body with `Content-Encoding: gzip` (or `x-gzip`) or `deflate`
//! (zlib, as RFC 9110 §8.4.1.2 defines it) is read decoded, up to
//! [`MAX_DECODED`] bytes; any other encoding keeps the reservation.
//!
//! Numbers count when they are non-negative integers up to 2^63 − 1,
//! written without fraction or exponent (`12`, not `12.0` or `1.2e1`). At a
//! wanted path, anything else — a string, `true`, a negative, fractional or
//! exponent number, one past 2^63 − 1, an object or array where the number
//! is due — makes the answer [`Kept::BadNumber`], as do two values for one
//! term in one document (a duplicate key, or two of its alternative paths
//! at once). `null` is no value (OpenAI's chunks carry `"usage": null`).
//! A JSON body that is not one JSON value (truncated, `NaN`, trailing
//! bytes, deeper than 128 containers) is [`Kept::NotJson`].

mod request;
mod scan;
mod spec;
mod sse;

use std::io::Write;
use std::sync::Arc;

use flate2::write::{GzDecoder, ZlibDecoder};

pub use request::{json_str, json_u64};
use scan::Scanner;
pub use spec::{JsonPath, MAX_PATHS, MAX_SEGMENT, MAX_SEGMENTS, MAX_TERMS, Stream, UsageSpec};

/// An SSE event's data held for the search before it is scanned as it
/// streams instead.
pub const EVENT_BUFFER: usize = 16 * 1024;
/// Decoded bytes of a compressed body read at most; past them the
/// reservation is kept ([`Kept::TooLarge`]), which bounds the work a small
/// compressed body can cause.
pub const MAX_DECODED: u64 = 64 * 1024 * 1024;

/// How a response's body is framed, by its `Content-Type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// One JSON document (`application/json`, `…/…+json`).
    Json,
    /// Server-Sent Events (`text/event-stream`), a JSON document per event.
    Sse,
}

impl Framing {
    /// The framing of a `Content-Type` value (parameters and case
    /// ignored), or `None` for a body the reader cannot read.
    pub fn of(content_type: &str) -> Option<Self> {
        let essence = content_type.split(';').next().unwrap_or("").trim();
        let (kind, sub) = essence.split_once('/')?;
        let (kind, sub) = (kind.trim(), sub.trim());
        if kind.eq_ignore_ascii_case("text") && sub.eq_ignore_ascii_case("event-stream") {
            Some(Self::Sse)
        } else if kind.eq_ignore_ascii_case("application") && sub.eq_ignore_ascii_case("json")
            || sub.len() > 5
                && sub.as_bytes()[sub.len() - 5..].eq_ignore_ascii_case(b"+json")
                && !kind.is_empty()
        {
            Some(Self::Json)
        } else {
            None
        }
    }
}

/// Why a reservation stands instead of being settled from the body.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kept {
    /// The body ended without a value for every term.
    NoUsage,
    /// A JSON body that is not one JSON value; or an event stream whose
    /// only events with a wanted key were not JSON.
    NotJson,
    /// A compressed body decoded past [`MAX_DECODED`] bytes.
    TooLarge,
    /// A value at a wanted path that is not a count (see the module docs),
    /// two in one document, or a sum past 2^63 − 1.
    BadNumber,
    /// A `Content-Encoding` the reader does not decode, or a body that did
    /// not decode.
    Encoded,
}

impl Kept {
    /// The `reason` label of `tollgate_settle_kept_total`.
    pub fn label(self) -> &'static str {
        match self {
            Self::NoUsage => "no_usage",
            Self::NotJson => "not_json",
            Self::TooLarge => "too_large",
            Self::BadNumber => "bad_number",
            Self::Encoded => "encoded",
        }
    }

    /// Every reason, for a metric's series made up front.
    pub const ALL: [Self; 5] = [
        Self::NoUsage,
        Self::NotJson,
        Self::TooLarge,
        Self::BadNumber,
        Self::Encoded,
    ];
}

/// What the body said so far, past the documents that ended.
#[derive(Debug, Clone, Copy, Default)]
struct Tally {
    /// Per term, the value kept (last or sum), when one was seen.
    terms: [Option<u64>; MAX_TERMS],
    bad_number: bool,
    /// An SSE event with a wanted key that was not JSON.
    bad_event: bool,
}

impl Tally {
    fn commit(&mut self, hits: &scan::Hits, stream: Stream) {
        for (kept, hit) in self.terms.iter_mut().zip(hits.terms.iter()) {
            if hit.bad || hit.count > 1 {
                self.bad_number = true;
            } else if hit.count == 1 {
                *kept = match (stream, *kept) {
                    (Stream::Sum, Some(sum)) => {
                        match sum.checked_add(hit.value).filter(|s| *s <= i64::MAX as u64) {
                            Some(s) => Some(s),
                            None => {
                                self.bad_number = true;
                                Some(sum)
                            }
                        }
                    }
                    (Stream::Sum | Stream::Last, _) => Some(hit.value),
                };
            }
        }
    }

    /// The cost, when every term has a value.
    fn cost(&self, n_terms: usize) -> Result<u64, Kept> {
        if self.bad_number {
            return Err(Kept::BadNumber);
        }
        let mut sum: u64 = 0;
        for t in &self.terms[..n_terms] {
            let v = t.ok_or(if self.bad_event {
                Kept::NotJson
            } else {
                Kept::NoUsage
            })?;
            sum = sum
                .checked_add(v)
                .filter(|s| *s <= i64::MAX as u64)
                .ok_or(Kept::BadNumber)?;
        }
        Ok(sum)
    }
}

/// The reader behind the decoder: framing, scanner and tally.
#[derive(Debug)]
struct Inner {
    spec: Arc<UsageSpec>,
    framing: Framing,
    scanner: Scanner,
    sse: sse::Splitter,
    /// The current SSE event's data while it fits [`EVENT_BUFFER`].
    event: Vec<u8>,
    /// The current event outgrew the buffer and is scanned as it streams.
    streaming: bool,
    has_data: bool,
    tally: Tally,
    /// Decoded bytes still allowed, for a compressed body.
    decoded_left: Option<u64>,
    too_large: bool,
}

impl Inner {
    fn read(&mut self, data: &[u8]) {
        match self.framing {
            Framing::Json => {
                let spec = Arc::clone(&self.spec);
                self.scanner.feed(data, &spec.paths);
            }
            Framing::Sse => {
                let mut sse = std::mem::take(&mut self.sse);
                sse.feed(data, self);
                self.sse = sse;
            }
        }
    }

    fn so_far(&self) -> Option<u64> {
        let n = self.spec.terms.len();
        match self.framing {
            Framing::Sse => self.tally.cost(n).ok(),
            Framing::Json if self.scanner.complete() => {
                let mut t = self.tally;
                t.commit(self.scanner.hits(), self.spec.stream);
                t.cost(n).ok()
            }
            Framing::Json => None,
        }
    }

    fn finish(mut self) -> Result<u64, Kept> {
        if self.too_large {
            return Err(Kept::TooLarge);
        }
        let n = self.spec.terms.len();
        match self.framing {
            Framing::Sse => self.tally.cost(n),
            Framing::Json => {
                let spec = Arc::clone(&self.spec);
                let whole = self.scanner.end(&spec.paths);
                self.tally.commit(self.scanner.hits(), spec.stream);
                if self.tally.bad_number {
                    Err(Kept::BadNumber)
                } else if !whole {
                    Err(Kept::NotJson)
                } else {
                    self.tally.cost(n)
                }
            }
        }
    }

    /// Ends the current event's scan: its values count when it was JSON.
    fn end_event(&mut self) {
        let spec = Arc::clone(&self.spec);
        if self.scanner.end(&spec.paths) {
            self.tally.commit(self.scanner.hits(), spec.stream);
        } else if self.scanner.hits().any() {
            self.tally.bad_event = true;
        }
    }
}

impl sse::Events for Inner {
    fn data(&mut self, bytes: &[u8]) {
        self.has_data = true;
        if self.streaming {
            self.scanner.feed(bytes, &self.spec.paths);
        } else if self.event.len() + bytes.len() <= EVENT_BUFFER {
            self.event.extend_from_slice(bytes);
        } else {
            self.streaming = true;
            let spec = Arc::clone(&self.spec);
            self.scanner.reset(&spec.paths);
            self.scanner.feed(&self.event, &spec.paths);
            self.scanner.feed(bytes, &spec.paths);
            self.event.clear();
        }
    }

    fn dispatch(&mut self) {
        if !self.has_data {
            return;
        }
        if self.streaming {
            self.end_event();
        } else if self.spec.wanted(&self.event) {
            let spec = Arc::clone(&self.spec);
            self.scanner.reset(&spec.paths);
            self.scanner.feed(&self.event, &spec.paths);
            self.end_event();
        }
        self.event.clear();
        self.streaming = false;
        self.has_data = false;
    }
}

impl Write for Inner {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if let Some(left) = &mut self.decoded_left {
            match left.checked_sub(buf.len() as u64) {
                Some(l) => *left = l,
                None => {
                    self.too_large = true;
                    return Err(std::io::Error::other("decoded body past the cap"));
                }
            }
        }
        self.read(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[derive(Debug)]
enum Decoder {
    Plain(Box<Inner>),
    Gzip(Box<GzDecoder<Inner>>),
    Zlib(Box<ZlibDecoder<Inner>>),
}

/// Reads one response body's usage as its chunks pass; see the module
/// docs.
#[derive(Debug)]
pub struct UsageReader {
    decoder: Decoder,
    /// Why the answer is already known to be "kept".
    failed: Option<Kept>,
}

impl UsageReader {
    /// A reader of a body framed as `framing`, with the response's
    /// `Content-Encoding` (`None` or `identity` when it has none).
    pub fn new(spec: Arc<UsageSpec>, framing: Framing, encoding: Option<&[u8]>) -> Self {
        let scanner = Scanner::new(&spec.paths);
        let mut inner = Inner {
            spec,
            framing,
            scanner,
            sse: sse::Splitter::default(),
            event: Vec::new(),
            streaming: false,
            has_data: false,
            tally: Tally::default(),
            decoded_left: None,
            too_large: false,
        };
        let encoding = encoding.map(<[u8]>::trim_ascii).unwrap_or_default();
        let is = |name: &str| encoding.eq_ignore_ascii_case(name.as_bytes());
        let mut failed = None;
        let decoder = if encoding.is_empty() || is("identity") {
            Decoder::Plain(Box::new(inner))
        } else if is("gzip") || is("x-gzip") {
            inner.decoded_left = Some(MAX_DECODED);
            Decoder::Gzip(Box::new(GzDecoder::new(inner)))
        } else if is("deflate") {
            inner.decoded_left = Some(MAX_DECODED);
            Decoder::Zlib(Box::new(ZlibDecoder::new(inner)))
        } else {
            failed = Some(Kept::Encoded);
            Decoder::Plain(Box::new(inner))
        };
        Self { decoder, failed }
    }

    /// Reads the next chunk of the body.
    pub fn feed(&mut self, chunk: &[u8]) {
        if self.failed.is_some() {
            return;
        }
        let res = match &mut self.decoder {
            Decoder::Plain(inner) => {
                inner.read(chunk);
                Ok(())
            }
            // Flushed, so what was decoded is read now, not with the next
            // chunk (`so_far` of a client gone mid-stream).
            Decoder::Gzip(d) => d.write_all(chunk).and_then(|()| d.flush()),
            Decoder::Zlib(d) => d.write_all(chunk).and_then(|()| d.flush()),
        };
        if res.is_err() {
            self.failed = Some(if self.inner().too_large {
                Kept::TooLarge
            } else {
                Kept::Encoded
            });
        }
    }

    fn inner(&self) -> &Inner {
        match &self.decoder {
            Decoder::Plain(inner) => inner,
            Decoder::Gzip(d) => d.get_ref(),
            Decoder::Zlib(d) => d.get_ref(),
        }
    }

    /// The cost the upstream had reported by now: the documents (SSE
    /// events, or the JSON body once complete) read so far gave every term
    /// a value and nothing bad. For a client gone mid-stream.
    pub fn so_far(&self) -> Option<u64> {
        if self.failed.is_some() {
            return None;
        }
        self.inner().so_far()
    }

    /// The cost at the body's end, or why the reservation stands.
    ///
    /// # Errors
    /// [`Kept`]: the reason.
    pub fn finish(self) -> Result<u64, Kept> {
        if let Some(kept) = self.failed {
            return Err(kept);
        }
        let inner = match self.decoder {
            Decoder::Plain(inner) => *inner,
            Decoder::Gzip(d) => d.finish().map_err(|_| Kept::Encoded)?,
            Decoder::Zlib(d) => d.finish().map_err(|_| Kept::Encoded)?,
        };
        inner.finish()
    }
}

#[cfg(test)]
mod tests;
