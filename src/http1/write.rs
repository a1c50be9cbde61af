//! A response written straight into the connection's write buffer: the
//! status line, the header fields, and the body's framing chosen as hyper's
//! server chooses it — `Content-Length` when the length is known, chunked
//! for an HTTP/1.1 client otherwise, the connection's end for an HTTP/1.0
//! one — with no body after `HEAD`, 1xx, 204 and 304 (RFC 9112 §6.3).
//!
//! A service that answers a native connection may carry some of its
//! answer's fields as [`LateFields`] in the response's body instead of in
//! its `HeaderMap`, already as text
//! ([`TextFields`](super::text_fields::TextFields)): they are copied after
//! the map's in one piece, and cost no insert into a map nobody else
//! reads.

use std::cell::RefCell;
use std::time::{SystemTime, UNIX_EPOCH};

use http::header::{CONNECTION, CONTENT_LENGTH, DATE, TRANSFER_ENCODING};
use http::response::Parts;
use http::{HeaderName, HeaderValue, Method, StatusCode, Version};
use http_body::SizeHint;

use super::fields::Passed;
use super::head::{digits, has_token};

/// How the body after a head is framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoder {
    /// Exactly this many bytes (0: no body).
    Length(u64),
    Chunked,
    /// Until the connection closes (an HTTP/1.0 client, length unknown).
    Close,
}

/// What the head of a response needs to know of its request.
#[derive(Debug, Clone, Copy)]
pub struct ResponseTo<'a> {
    pub method: &'a Method,
    pub version: Version,
    /// The connection may serve another request after this one.
    pub keep_alive: bool,
}

/// Header fields of a response kept beside its `HeaderMap`, in its body
/// ([`TextFields`](super::text_fields::TextFields)), already written as
/// HTTP/1.1 text for the writer to copy after the map's fields.
///
/// Only the native server's writer reads them: a service puts them there
/// only for a request that came from a native connection, and only when
/// nothing after it reads the answer's fields from the map (a route's
/// response rules do). The framing fields (`Content-Length`,
/// `Transfer-Encoding`) and `Date` are the writer's and are not taken; a
/// `Connection` field is read as the writer reads the map's, so that a
/// `close` among them closes the connection.
#[derive(Debug, Clone, Default)]
pub struct LateFields {
    /// `name: value\r\n` for each field, in the order they were added.
    text: Vec<u8>,
    /// A `Connection` field with `close`.
    close: bool,
    /// A `Connection` field with `keep-alive`.
    keep_alive: bool,
}

impl LateFields {
    /// Room for the fields of a refusal with its rate-limit fields and id.
    const ROOM: usize = 320;

    /// Adds a field after those already here; a field of the writer's own
    /// (framing, `Date`) is left out.
    pub fn push(&mut self, name: &HeaderName, value: &HeaderValue) {
        match *name {
            CONTENT_LENGTH | TRANSFER_ENCODING | DATE => return,
            CONNECTION => {
                self.close |= has_token(value, "close");
                self.keep_alive |= has_token(value, "keep-alive");
            }
            _ => {}
        }
        self.put(name, value.as_bytes());
    }

    /// Adds a field whose value is the number `n`.
    pub fn push_number(&mut self, name: &HeaderName, n: u64) {
        debug_assert!(!matches!(
            *name,
            CONTENT_LENGTH | TRANSFER_ENCODING | DATE | CONNECTION
        ));
        self.put(name, itoa::Buffer::new().format(n).as_bytes());
    }

    /// Adds a whole field line, `name: value\r\n`, made in advance;
    /// none of the fields the writer reads or writes itself.
    pub fn push_line(&mut self, line: &'static str) {
        debug_assert!(line.ends_with("\r\n") && line.contains(": "));
        if self.text.capacity() == 0 {
            self.text.reserve(Self::ROOM);
        }
        self.text.extend_from_slice(line.as_bytes());
    }

    /// Adds a field whose value is already text: `value` is valid as a
    /// field value (visible ASCII, spaces and tabs), and `name` is none of
    /// the fields the writer reads or writes itself.
    pub fn push_text(&mut self, name: &HeaderName, value: &[u8]) {
        debug_assert!(!matches!(
            *name,
            CONTENT_LENGTH | TRANSFER_ENCODING | DATE | CONNECTION
        ));
        debug_assert!(HeaderValue::from_bytes(value).is_ok());
        self.put(name, value);
    }

    fn put(&mut self, name: &HeaderName, value: &[u8]) {
        if self.text.capacity() == 0 {
            self.text.reserve(Self::ROOM);
        }
        self.text.extend_from_slice(name.as_str().as_bytes());
        self.text.extend_from_slice(b": ");
        self.text.extend_from_slice(value);
        self.text.extend_from_slice(b"\r\n");
    }

    /// The fields as they are written.
    pub fn as_bytes(&self) -> &[u8] {
        &self.text
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.text.is_empty()
    }
}

/// Whether a response to `method` with `status` may carry a body.
fn can_have_body(method: &Method, status: StatusCode) -> bool {
    !(method == Method::HEAD
        || method == Method::CONNECT && status.is_success()
        || status.is_informational()
        || matches!(status, StatusCode::NO_CONTENT | StatusCode::NOT_MODIFIED))
}

/// Whether its head may say a length.
fn can_have_length(method: &Method, status: StatusCode) -> bool {
    !(status.is_informational()
        || method == Method::CONNECT && status.is_success()
        || matches!(status, StatusCode::NO_CONTENT | StatusCode::NOT_MODIFIED))
}

/// Writes the head of `parts` into `dst`; returns the body's framing and
/// whether the connection may go on after it.
///
/// `body` is the body's size hint, `None` for a body already at its end;
/// `late` and `passed` the fields the body carries
/// ([`TextFields`](super::text_fields::TextFields)).
pub fn head(
    dst: &mut Vec<u8>,
    parts: &Parts,
    body: Option<SizeHint>,
    (late, passed): (Option<&LateFields>, Option<&Passed>),
    ex: ResponseTo<'_>,
) -> (Encoder, bool) {
    let status = parts.status;
    status_line(dst, ex.version, status);
    let mut said = Said {
        known: body.map(|h| h.exact()),
        keep_alive: ex.keep_alive,
        ..Said::default()
    };
    if let Some(passed) = passed {
        said.date |= passed.write(dst, &parts.headers);
    }
    for (name, value) in &parts.headers {
        said.field(dst, name, value, ex, status);
    }
    if let Some(late) = late {
        dst.extend_from_slice(&late.text);
        if late.close {
            said.keep_alive = false;
            said.close = true;
        }
        said.keep_alive_token |= late.keep_alive;
    }
    let mut keep_alive = said.keep_alive;
    let encoder = said
        .encoder
        .unwrap_or_else(|| framing(dst, said.known, ex, status));
    let encoder = if can_have_body(ex.method, status) {
        encoder
    } else {
        Encoder::Length(0)
    };
    if encoder == Encoder::Close {
        keep_alive = false;
    }
    if ex.version == Version::HTTP_10 {
        if keep_alive && !said.keep_alive_token {
            dst.extend_from_slice(b"connection: keep-alive\r\n");
        }
    } else if !keep_alive && !said.close {
        // The client asked to close, or the connection cannot go on: the
        // answer says so (RFC 9112 §9.6).
        dst.extend_from_slice(b"connection: close\r\n");
    }
    if !said.date {
        dst.extend_from_slice(b"date: ");
        date(dst);
        dst.extend_from_slice(b"\r\n");
    }
    dst.extend_from_slice(b"\r\n");
    (encoder, keep_alive)
}

/// What a head's fields said, as [`head`] writes them.
#[derive(Default)]
struct Said {
    /// The body's exact length if it has one (`None`: no body).
    known: Option<Option<u64>>,
    /// The framing a `Content-Length` field chose.
    encoder: Option<Encoder>,
    keep_alive: bool,
    /// A `Connection` field with `keep-alive`.
    keep_alive_token: bool,
    /// A `Connection` field with `close`.
    close: bool,
    date: bool,
}

impl Said {
    /// Writes one field into `dst`, unless the framing is the writer's.
    #[inline]
    fn field(
        &mut self,
        dst: &mut Vec<u8>,
        name: &HeaderName,
        value: &HeaderValue,
        ex: ResponseTo<'_>,
        status: StatusCode,
    ) {
        match *name {
            CONTENT_LENGTH => {
                if self.encoder.is_some() || !can_have_length(ex.method, status) {
                    return;
                }
                let n = match self.known {
                    Some(Some(n)) => n,
                    // A length header over an empty body: only a HEAD
                    // answer says it.
                    None if ex.method != Method::HEAD => return,
                    _ => match digits(value.as_bytes()) {
                        Some(n) => n,
                        None => return,
                    },
                };
                self.encoder = Some(Encoder::Length(n));
            }
            // The framing is this writer's to choose.
            TRANSFER_ENCODING => return,
            CONNECTION => {
                if has_token(value, "close") {
                    self.keep_alive = false;
                    self.close = true;
                }
                self.keep_alive_token |= has_token(value, "keep-alive");
            }
            DATE => self.date = true,
            _ => {}
        }
        dst.extend_from_slice(name.as_str().as_bytes());
        dst.extend_from_slice(b": ");
        dst.extend_from_slice(value.as_bytes());
        dst.extend_from_slice(b"\r\n");
    }
}

/// The status line: HTTP/1.0 to an HTTP/1.0 client, else HTTP/1.1.
fn status_line(dst: &mut Vec<u8>, version: Version, status: StatusCode) {
    if version != Version::HTTP_10 && status == StatusCode::OK {
        dst.extend_from_slice(b"HTTP/1.1 200 OK\r\n");
        return;
    }
    dst.extend_from_slice(if version == Version::HTTP_10 {
        b"HTTP/1.0 "
    } else {
        b"HTTP/1.1 "
    });
    dst.extend_from_slice(status.as_str().as_bytes());
    dst.push(b' ');
    dst.extend_from_slice(status.canonical_reason().unwrap_or("<none>").as_bytes());
    dst.extend_from_slice(b"\r\n");
}

/// The framing of a body whose head says no length, written into the
/// head: `known` is the body's exact length if it has one (`None`: no
/// body).
fn framing(
    dst: &mut Vec<u8>,
    known: Option<Option<u64>>,
    ex: ResponseTo<'_>,
    status: StatusCode,
) -> Encoder {
    match known {
        None | Some(Some(0)) => {
            if can_have_length(ex.method, status) && ex.method != Method::HEAD {
                dst.extend_from_slice(b"content-length: 0\r\n");
            }
            Encoder::Length(0)
        }
        Some(Some(n)) if can_have_length(ex.method, status) => {
            dst.extend_from_slice(b"content-length: ");
            dst.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
            dst.extend_from_slice(b"\r\n");
            Encoder::Length(n)
        }
        Some(Some(_)) => Encoder::Length(0),
        Some(None) if ex.version == Version::HTTP_10 || !can_have_body(ex.method, status) => {
            Encoder::Close
        }
        Some(None) => {
            dst.extend_from_slice(b"transfer-encoding: chunked\r\n");
            Encoder::Chunked
        }
    }
}

/// The head of a refusal hyper would send for a head it cannot read.
pub fn refusal(dst: &mut Vec<u8>, status: StatusCode) {
    dst.extend_from_slice(b"HTTP/1.1 ");
    dst.extend_from_slice(status.as_str().as_bytes());
    dst.push(b' ');
    dst.extend_from_slice(status.canonical_reason().unwrap_or("<none>").as_bytes());
    dst.extend_from_slice(b"\r\nconnection: close\r\ncontent-length: 0\r\ndate: ");
    date(dst);
    dst.extend_from_slice(b"\r\n\r\n");
}

/// `100 Continue`, for a client that waits for it before its body.
pub const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

thread_local! {
    /// The `Date` value of the current second, made once a second per
    /// thread (RFC 9110 §6.6.1 asks for the time the message is made; a
    /// second's resolution is the field's).
    static DATE_NOW: RefCell<(u64, [u8; 29])> = const { RefCell::new((0, [0; 29])) };
}

/// Appends the current `Date` value (IMF-fixdate).
fn date(dst: &mut Vec<u8>) {
    let now = SystemTime::now();
    let secs = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    DATE_NOW.with(|cell| {
        let mut cached = cell.borrow_mut();
        if cached.0 != secs {
            let text = httpdate::fmt_http_date(now);
            if text.len() == 29 {
                cached.1.copy_from_slice(text.as_bytes());
                cached.0 = secs;
            } else {
                dst.extend_from_slice(text.as_bytes());
                return;
            }
        }
        dst.extend_from_slice(&cached.1);
    });
}

/// Appends the size line of a chunk of `len` bytes.
pub fn chunk_size(dst: &mut Vec<u8>, len: usize) {
    let mut size = [0u8; 16];
    let mut n = len;
    let mut i = size.len();
    loop {
        i -= 1;
        size[i] = b"0123456789abcdef"[n % 16];
        n /= 16;
        if n == 0 {
            break;
        }
    }
    dst.extend_from_slice(&size[i..]);
    dst.extend_from_slice(b"\r\n");
}
