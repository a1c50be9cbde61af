//! A request head read in place from the connection's read buffer with
//! `httparse`, and turned into the `http` types the gateway's service takes.
//!
//! What is accepted and refused is hyper's HTTP/1.1 server, rule for rule
//! (its `proto::h1::role`), so that switching `server.http1` changes no
//! answer: the same tokenizer, the same 100-field array (431 past it), the
//! same 65,534-byte stop on a target (414), `http`'s own checks of the
//! method and the target (400), and the same reading of `Content-Length`,
//! `Transfer-Encoding`, `Connection`, `Expect` and `Upgrade`. The checks
//! that come after parsing (two `Host`s, `Content-Length` beside
//! `Transfer-Encoding`, the size caps) are the [`guard`](crate::guard)'s,
//! for either server.

use bytes::{Bytes, BytesMut};
use http::header::{CONNECTION, CONTENT_LENGTH, EXPECT, TRANSFER_ENCODING, UPGRADE};
use http::{HeaderMap, HeaderName, HeaderValue, Method, Uri, Version};

/// Header fields one head may carry; more is 431 (hyper's
/// `DEFAULT_MAX_HEADERS`: httparse parses into a fixed array).
pub const MAX_HEADERS: usize = 100;

/// Fields the gateway adds to a request's header map on its way to the
/// upstream: the request id, `X-Forwarded-For`, `X-Forwarded-Proto` and
/// `X-Forwarded-Host` (`Host` itself is replaced in place). A traced
/// request's `traceparent` and a route's request rules may add more, and
/// grow the map.
///
/// No slack beyond them: the map's entries are one allocation of 104
/// bytes an entry, and a request of one or two fields keeps it at six
/// entries (624 bytes), which glibc serves from its per-thread cache
/// (chunks up to 1,032 bytes); two more fields of room would give it
/// twelve (1,248 bytes), whose allocation and free take the allocator's
/// slower general path.
const ADDED_FIELDS: usize = 4;

/// The longest request target hyper reads (its `MAX_URI_LEN`); longer is 414.
pub const MAX_TARGET: usize = (u16::MAX - 1) as usize;

/// How a request's body is framed (RFC 9112 §6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyFraming {
    /// This many bytes (no `Transfer-Encoding`; 0 without `Content-Length`).
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
}

/// A head read whole: the parts of the request and what the connection
/// needs to know of it.
#[derive(Debug)]
pub struct RequestHead {
    /// The head's bytes as read, for a request handed to hyper.
    pub raw: Bytes,
    pub method: Method,
    pub uri: Uri,
    pub version: Version,
    pub headers: HeaderMap,
    pub framing: BodyFraming,
    /// The connection may carry another request after this one.
    pub keep_alive: bool,
    /// `Expect: 100-continue`.
    pub expect_continue: bool,
    /// An `Upgrade` (HTTP/1.1) or a `CONNECT`: served by hyper, which owns
    /// the upgrade machinery.
    pub wants_upgrade: bool,
}

/// Why a head is refused, with the status hyper answers it with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// 400: the head does not parse, or its framing headers are invalid.
    BadRequest(&'static str),
    /// 414: a target over [`MAX_TARGET`].
    UriTooLong,
    /// 431: more than [`MAX_HEADERS`] fields, a head over the buffer, or
    /// a `Content-Length` over the largest length hyper reads.
    TooLarge,
}

impl Refusal {
    /// The status line, with the empty body hyper sends.
    pub fn status(self) -> http::StatusCode {
        match self {
            Self::BadRequest(_) => http::StatusCode::BAD_REQUEST,
            Self::UriTooLong => http::StatusCode::URI_TOO_LONG,
            Self::TooLarge => http::StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
        }
    }
}

/// What the start of the read buffer holds.
// The head is moved once, from the parser to the connection: a box would
// cost an allocation per request to spare the other variants' bytes.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum HeadRead {
    /// A whole head, taken off the buffer.
    Head(RequestHead),
    /// Not yet a whole head.
    Partial,
    /// An HTTP/2 request line (`PRI * HTTP/2.0`, the h2c preface).
    Preface,
    Refused(Refusal),
}

/// Reads one request head off the front of `buf`, leaving what follows.
pub fn parse(buf: &mut BytesMut) -> HeadRead {
    // Left uninitialised: httparse writes the fields it finds, and zeroing
    // a hundred of them would cost more than the parse.
    let mut fields =
        [const { std::mem::MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut []);
    let len = match req.parse_with_uninit_headers(buf, &mut fields) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return HeadRead::Partial,
        Err(httparse::Error::Token) if req.method.is_none() => {
            return HeadRead::Refused(Refusal::BadRequest("invalid method"));
        }
        Err(httparse::Error::Token) => {
            return HeadRead::Refused(Refusal::BadRequest("invalid target"));
        }
        Err(httparse::Error::Version) if is_preface(buf) => return HeadRead::Preface,
        Err(httparse::Error::TooManyHeaders) => return HeadRead::Refused(Refusal::TooLarge),
        Err(_) => return HeadRead::Refused(Refusal::BadRequest("invalid head")),
    };
    let (Some(method), Some(target), Some(minor)) = (req.method, req.path, req.version) else {
        return HeadRead::Refused(Refusal::BadRequest("incomplete request line"));
    };
    if target.len() > MAX_TARGET {
        return HeadRead::Refused(Refusal::UriTooLong);
    }
    let Ok(method) = Method::from_bytes(method.as_bytes()) else {
        return HeadRead::Refused(Refusal::BadRequest("invalid method"));
    };
    // Where each part lies in the buffer, so that the frozen head can be
    // sliced instead of copied.
    let base = buf.as_ptr() as usize;
    let at = |s: &[u8]| (s.as_ptr() as usize - base, s.len());
    let target_at = at(target.as_bytes());
    // Kept on the stack for the usual number of fields: the spans outlive
    // the parser's borrow of the buffer, which `split_to` needs back.
    // Filled where they lie: `collect` would return them by value, a copy
    // of the whole inline array.
    let mut spans = Spans::new();
    spans.extend(
        req.headers
            .iter()
            .map(|h| (at(h.name.as_bytes()), at(h.value))),
    );
    let head = buf.split_to(len).freeze();
    let slice = |(from, n): (usize, usize)| head.slice(from..from + n);
    let Ok(uri) = Uri::from_maybe_shared(slice(target_at)) else {
        return HeadRead::Refused(Refusal::BadRequest("invalid target"));
    };
    match fields_of(&head, &spans, minor == 1, method, uri, slice) {
        Ok(h) => HeadRead::Head(h),
        Err(r) => HeadRead::Refused(r),
    }
}

/// `PRI * HTTP/2.0`: the first line of HTTP/2's connection preface.
fn is_preface(buf: &[u8]) -> bool {
    buf.starts_with(b"PRI * HTTP/2.0\r\n")
}

/// Where a part of a head lies in the buffer: offset and length.
pub type Span = (usize, usize);

/// Where a head's fields lie: name and value. Inline for up to 24 fields
/// (more than most clients send), on the heap past that.
type Spans = smallvec::SmallVec<[(Span, Span); 24]>;

/// The header fields of a head, and what its framing headers say.
fn fields_of(
    head: &Bytes,
    spans: &[(Span, Span)],
    http11: bool,
    method: Method,
    uri: Uri,
    slice: impl Fn(Span) -> Bytes,
) -> Result<RequestHead, Refusal> {
    let mut keep_alive = http11;
    let mut saw_close = false;
    let mut framing = BodyFraming::Length(0);
    let mut length = None;
    let (mut is_cl, mut is_te, mut te_chunked) = (false, false, false);
    let mut expect_continue = false;
    let mut wants_upgrade = method == Method::CONNECT;
    // Room for the fields the gateway adds upstream (request id, forwarding
    // fields, `Host`), so the map is not grown and rehashed on the way: one
    // the thread keeps, when it has that room.
    let mut headers = super::spare::header_map(spans.len() + ADDED_FIELDS);
    for &(name, value) in spans {
        let Ok(name) = HeaderName::from_bytes(&head[name.0..name.0 + name.1]) else {
            return Err(Refusal::BadRequest("invalid header name"));
        };
        let Ok(value) = HeaderValue::from_maybe_shared(slice(value)) else {
            return Err(Refusal::BadRequest("invalid header value"));
        };
        match name {
            TRANSFER_ENCODING => {
                if !http11 {
                    return Err(Refusal::BadRequest("transfer-encoding in HTTP/1.0"));
                }
                is_te = true;
                if is_cl && length.take().is_some() {
                    headers.remove(CONTENT_LENGTH);
                }
                te_chunked = is_chunked(&value);
                if te_chunked {
                    framing = BodyFraming::Chunked;
                }
            }
            CONTENT_LENGTH => {
                is_cl = true;
                if is_te {
                    continue;
                }
                let Some(n) = digits(value.as_bytes()) else {
                    return Err(Refusal::BadRequest("invalid content-length"));
                };
                if let Some(prev) = length {
                    if prev != n {
                        return Err(Refusal::BadRequest("conflicting content-length"));
                    }
                    continue;
                }
                // hyper's largest length is two short of `u64::MAX` (its
                // `DecodedLength`); one over it is hyper's 431, not a 400.
                if n > u64::MAX - 2 {
                    return Err(Refusal::TooLarge);
                }
                framing = BodyFraming::Length(n);
                length = Some(n);
            }
            CONNECTION => {
                if saw_close || has_token(&value, "close") {
                    saw_close = true;
                    keep_alive = false;
                } else if !keep_alive {
                    keep_alive = has_token(&value, "keep-alive");
                }
            }
            EXPECT => expect_continue = value.as_bytes().eq_ignore_ascii_case(b"100-continue"),
            UPGRADE => wants_upgrade = http11,
            _ => {}
        }
        headers.append(name, value);
    }
    if is_te && !te_chunked {
        return Err(Refusal::BadRequest(
            "transfer-encoding not ending in chunked",
        ));
    }
    if is_te && is_cl {
        keep_alive = false;
    }
    Ok(RequestHead {
        raw: head.clone(),
        method,
        uri,
        version: if http11 {
            Version::HTTP_11
        } else {
            Version::HTTP_10
        },
        headers,
        framing,
        keep_alive,
        expect_continue,
        wants_upgrade,
    })
}

/// A decimal length, digits only (RFC 9110 §8.6), without overflow.
pub fn digits(b: &[u8]) -> Option<u64> {
    if b.is_empty() {
        return None;
    }
    b.iter().try_fold(0u64, |n, &d| {
        if d.is_ascii_digit() {
            n.checked_mul(10)?.checked_add(u64::from(d - b'0'))
        } else {
            None
        }
    })
}

/// Whether `value`, a comma-separated list, holds `token` (any case).
pub fn has_token(value: &HeaderValue, token: &str) -> bool {
    value
        .to_str()
        .is_ok_and(|s| s.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
}

/// Whether the last coding of a `Transfer-Encoding` line is `chunked`.
fn is_chunked(value: &HeaderValue) -> bool {
    value
        .to_str()
        .ok()
        .and_then(|s| s.rsplit(',').next())
        .is_some_and(|t| t.trim().eq_ignore_ascii_case("chunked"))
}
