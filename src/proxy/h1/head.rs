//! An upstream's response head, parsed in place with `httparse` and held
//! to what hyper's HTTP/1.1 client accepts: at most [`MAX_HEADERS`] fields
//! in at most [`MAX_HEAD`] bytes, no obs-fold, a three-digit status, and
//! one framing (RFC 9112 §6.3). Informational (1xx) heads are skipped.
//!
//! Stricter than hyper, on purpose: a head with both `Transfer-Encoding`
//! and `Content-Length` is refused (RFC 9112 §6.3 calls it a likely
//! smuggling attempt; hyper reads it as chunked and keeps the length
//! beside it), and so is a `101` or a `2xx` to `CONNECT`, which would hand
//! the connection over on a path that passes no upgrades.

use std::mem::MaybeUninit;

use bytes::{Bytes, BytesMut};
use http::header::CONTENT_LENGTH;
use http::{HeaderMap, HeaderValue, Method, Response, StatusCode, Version};

use crate::http1::fields::{MAX_NAME, Passed, is_token_of};

/// Header fields a response head may carry (hyper's default).
pub const MAX_HEADERS: usize = 100;
/// Bytes a response head may take, 1xx heads before it included (hyper's
/// default read buffer bound).
pub const MAX_HEAD: usize = 8192 + 4096 * 100;

/// How a response's body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delimited {
    /// `Content-Length` bytes (none for HEAD, 204 and 304).
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
    /// Until the upstream closes the connection.
    Close,
}

/// A parsed response head: the response without its body, how the body
/// is framed, and whether the connection may carry another request.
#[derive(Debug)]
pub struct Head {
    /// Status, version, headers and (for a reason phrase of its own) the
    /// phrase as an extension.
    pub response: Response<()>,
    /// How the body is delimited.
    pub framing: Delimited,
    /// HTTP/1.1 without `Connection: close`, or HTTP/1.0 with
    /// `Connection: keep-alive`.
    pub keep_alive: bool,
    /// The fields passed as the upstream wrote them, when there are any
    /// ([`crate::http1::fields`]): the body carries them on.
    pub passed: Option<Box<Passed>>,
}

/// Why a response head was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeadError {
    /// `httparse` refused it.
    #[error("malformed response head: {0}")]
    Syntax(httparse::Error),
    /// Longer than [`MAX_HEAD`] bytes.
    #[error("response head larger than {MAX_HEAD} bytes")]
    TooLarge,
    /// A header field `http` refuses.
    #[error("invalid response header field")]
    Field,
    /// `Transfer-Encoding` in an HTTP/1.0 response.
    #[error("Transfer-Encoding in an HTTP/1.0 response")]
    Http10Chunked,
    /// Both `Transfer-Encoding` and `Content-Length`.
    #[error("response with both Transfer-Encoding and Content-Length")]
    LengthAndChunked,
    /// `Content-Length` that is not one decimal number.
    #[error("invalid Content-Length in a response")]
    Length,
    /// `101`, or `2xx` to `CONNECT`: a switch of protocols this path does not
    /// pass.
    #[error("upstream switched protocols on a connection that passes no upgrades")]
    Upgrade,
}

impl From<httparse::Error> for HeadError {
    fn from(e: httparse::Error) -> Self {
        match e {
            httparse::Error::TooManyHeaders => Self::TooLarge,
            e => Self::Syntax(e),
        }
    }
}

/// Where one field lies in the head's bytes.
struct Span {
    name: (usize, usize),
    value: (usize, usize),
}

/// What `httparse` saw, as offsets into the buffer: filled in place by
/// [`tokenize`], as the spans alone take some hundred bytes to move.
#[derive(Default)]
struct Raw {
    len: usize,
    code: u16,
    version: u8,
    reason: (usize, usize),
    fields: smallvec::SmallVec<[Span; 24]>,
}

/// Parses the head at the start of `buf`, the response to a `method`
/// request, and takes its bytes (and those of any 1xx heads before it) out
/// of `buf`. `None`: the head is not complete yet.
///
/// # Errors
/// The head is malformed, too large, or frames its body in a way refused
/// (see the module docs).
pub fn parse(buf: &mut BytesMut, method: &Method) -> Result<Option<Head>, HeadError> {
    let mut raw = Raw::default();
    loop {
        if !tokenize(buf, &mut raw)? {
            return if buf.len() >= MAX_HEAD {
                Err(HeadError::TooLarge)
            } else {
                Ok(None)
            };
        }
        let bytes = buf.split_to(raw.len).freeze();
        if (100..200).contains(&raw.code) && raw.code != 101 {
            // Informational: skipped, as hyper's client does.
            continue;
        }
        return build(&bytes, &raw, method).map(Some);
    }
}

/// Reads the head at the start of `buf` into `raw`; `false` when it is not
/// complete yet.
fn tokenize(buf: &[u8], raw: &mut Raw) -> Result<bool, HeadError> {
    let mut slots = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
    let mut res = httparse::Response::new(&mut []);
    raw.len = match httparse::ParserConfig::default()
        .parse_response_with_uninit_headers(&mut res, buf, &mut slots)?
    {
        httparse::Status::Complete(len) => len,
        httparse::Status::Partial => return Ok(false),
    };
    let base = buf.as_ptr() as usize;
    let at = |s: &[u8]| {
        let from = s.as_ptr() as usize - base;
        (from, from + s.len())
    };
    let reason = res.reason.unwrap_or_default();
    raw.code = res.code.unwrap_or_default();
    raw.version = res.version.unwrap_or_default();
    raw.reason = if reason.is_empty() {
        (0, 0)
    } else {
        at(reason.as_bytes())
    };
    raw.fields.clear();
    raw.fields.extend(res.headers.iter().map(|h| Span {
        name: at(h.name.as_bytes()),
        value: at(h.value),
    }));
    Ok(true)
}

/// Fields an answer's map has room for: a map's first size (what the
/// first insert into an empty map makes), the size the client's request
/// maps come in too, so that the thread's maps serve both.
const ANSWER_FIELDS: usize = 6;

fn build(bytes: &Bytes, raw: &Raw, method: &Method) -> Result<Head, HeadError> {
    let status = StatusCode::from_u16(raw.code).map_err(|_| HeadError::Field)?;
    let version = if raw.version == 1 {
        Version::HTTP_11
    } else {
        Version::HTTP_10
    };
    let mut response = Response::new(());
    // A map the thread keeps, with room for `Content-Length` and the
    // fields the gateway adds (the request id, a limit's fields).
    *response.headers_mut() = crate::http1::spare::header_map(ANSWER_FIELDS);
    let mut keep_alive = version == Version::HTTP_11;
    let mut saw_close = false;
    // Some `Connection` line names fields of the answer's.
    let mut names = false;
    // The framing fields, noted as the fields go by (a name is told by
    // its length and first letter) rather than looked up after.
    let mut fields = Framing::default();
    let mut lengths = smallvec::SmallVec::<[(usize, usize); 2]>::new();
    let mut passed = Passed::new(bytes.clone());
    for f in &raw.fields {
        let name = &bytes[f.name.0..f.name.1];
        // `httparse` read a `token` and a value `HeaderValue` takes (see
        // `crate::http1::fields`); `HeaderName` also bounds the length.
        if name.len() > MAX_NAME {
            return Err(HeadError::Field);
        }
        let value = &bytes[f.value.0..f.value.1];
        match hop(name) {
            Some(Hop::Connection) => {
                // Once any line asks to close, a later `keep-alive` does
                // not undo it.
                if saw_close || has_token(value, "close") {
                    saw_close = true;
                    keep_alive = false;
                } else if !keep_alive {
                    keep_alive = has_token(value, "keep-alive");
                }
                names |= names_fields(value);
            }
            Some(Hop::TransferEncoding) => fields.last_coding = Some(value),
            Some(Hop::ContentLength) => {
                fields.length_lines = true;
                fields.length = fields.length.and_then(|l| fold_length(l, value));
                lengths.push(f.value);
            }
            Some(Hop::Other) => {}
            None => passed.push(f.name, f.value),
        }
    }
    let framing = framing(status, version, &fields, method)?;
    if names {
        // The fields a `Connection` line names are the hop's too.
        let named = |name: &[u8]| {
            raw.fields.iter().any(|f| {
                is_token_of(&bytes[f.name.0..f.name.1], b"connection")
                    && named_by(&bytes[f.value.0..f.value.1], name)
            })
        };
        passed.retain_names(|name| !named(name));
        if named(b"content-length") {
            lengths.clear();
        }
    }
    for (from, to) in lengths {
        let value =
            HeaderValue::from_maybe_shared(bytes.slice(from..to)).map_err(|_| HeadError::Field)?;
        response.headers_mut().append(CONTENT_LENGTH, value);
    }
    *response.status_mut() = status;
    *response.version_mut() = version;
    let reason = &bytes[raw.reason.0..raw.reason.1];
    if status.canonical_reason().map(str::as_bytes) != Some(reason)
        && let Ok(phrase) = hyper::ext::ReasonPhrase::try_from(reason)
    {
        response.extensions_mut().insert(phrase);
    }
    Ok(Head {
        response,
        framing,
        keep_alive: keep_alive && framing != Delimited::Close,
        // Not through `bool::then`: its closure would take the fields by
        // value, one more copy of them before the box's.
        passed: if passed.is_empty() {
            None
        } else {
            Some(Box::new(passed))
        },
    })
}

/// What a field is to the client: a framing field, another hop-by-hop
/// one (RFC 9110 §7.6.1, as [`crate::proxy::HOP_HEADERS`] lists them), or
/// (`None`) one to pass on.
enum Hop {
    Connection,
    TransferEncoding,
    ContentLength,
    Other,
}

/// What `name` is (see [`Hop`]), ASCII case aside; its length and first
/// letter pick the one name it may be.
fn hop(name: &[u8]) -> Option<Hop> {
    let first = name.first().map_or(0, |b| b | 0x20);
    let (hop, lower): (Hop, &[u8]) = match (name.len(), first) {
        (2, b't') => (Hop::Other, b"te"),
        (7, b'u') => (Hop::Other, b"upgrade"),
        (10, b'c') => (Hop::Connection, b"connection"),
        (10, b'k') => (Hop::Other, b"keep-alive"),
        (14, b'c') => (Hop::ContentLength, b"content-length"),
        (16, b'p') => (Hop::Other, b"proxy-connection"),
        (17, b't') => (Hop::TransferEncoding, b"transfer-encoding"),
        _ => return None,
    };
    is_token_of(name, lower).then_some(hop)
}

/// Whether a `Connection` line names a field that is not left out
/// anyway: a member other than `close` (the connection option, RFC 9112
/// §9.6) and the hop-by-hop names.
fn names_fields(line: &[u8]) -> bool {
    line.split(|&b| b == b',').map(<[u8]>::trim_ascii).any(|t| {
        !t.is_empty()
            && !t.eq_ignore_ascii_case(b"close")
            && !matches!(
                hop(t),
                Some(Hop::Connection | Hop::TransferEncoding | Hop::Other)
            )
    })
}

/// Whether the `Connection` line `line` names the field `name`, which is
/// then left out of the answer (`close` names none).
fn named_by(line: &[u8], name: &[u8]) -> bool {
    !name.eq_ignore_ascii_case(b"close")
        && line
            .split(|&b| b == b',')
            .any(|t| t.trim_ascii().eq_ignore_ascii_case(name))
}

/// What a head's fields say of its body's framing.
struct Framing<'a> {
    /// The last `Transfer-Encoding` line.
    last_coding: Option<&'a [u8]>,
    /// Some `Content-Length` line was there.
    length_lines: bool,
    /// What the `Content-Length` lines agree on so far: `Some(None)` before
    /// the first, `None` once one is not a number or two differ.
    length: Option<Option<u64>>,
}

impl Default for Framing<'_> {
    fn default() -> Self {
        Self {
            last_coding: None,
            length_lines: false,
            length: Some(None),
        }
    }
}

/// The body's framing (RFC 9112 §6.3), in hyper's client's order.
fn framing(
    status: StatusCode,
    version: Version,
    fields: &Framing<'_>,
    method: &Method,
) -> Result<Delimited, HeadError> {
    match status.as_u16() {
        101 => return Err(HeadError::Upgrade),
        204 | 304 => return Ok(Delimited::Length(0)),
        _ => {}
    }
    if method == Method::HEAD {
        return Ok(Delimited::Length(0));
    }
    if method == Method::CONNECT && status.is_success() {
        return Err(HeadError::Upgrade);
    }
    if let Some(coding) = &fields.last_coding {
        if version == Version::HTTP_10 {
            return Err(HeadError::Http10Chunked);
        }
        if fields.length_lines {
            return Err(HeadError::LengthAndChunked);
        }
        return Ok(if is_chunked(coding) {
            Delimited::Chunked
        } else {
            Delimited::Close
        });
    }
    if !fields.length_lines {
        return Ok(Delimited::Close);
    }
    fields
        .length
        .flatten()
        .map_or(Err(HeadError::Length), |n| Ok(Delimited::Length(n)))
}

/// The one length every `Content-Length` line and list member gives
/// (RFC 9110 §8.6: a list of one repeated value is that value); `None` when
/// one is not a decimal number or two differ.
pub fn content_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get_all(CONTENT_LENGTH)
        .iter()
        .try_fold(None, |length, line| fold_length(length, line.as_bytes()))?
}

/// `length`, the value of the `Content-Length` lines before, with `line`'s
/// members: `None` when one is not a decimal number or differs.
fn fold_length(mut length: Option<u64>, line: &[u8]) -> Option<Option<u64>> {
    for v in line.split(|&b| b == b',') {
        let n = digits(v.trim_ascii())?;
        if *length.get_or_insert(n) != n {
            return None;
        }
    }
    Some(length)
}

fn digits(s: &[u8]) -> Option<u64> {
    if s.is_empty() {
        return None;
    }
    s.iter().try_fold(0u64, |n, &b| {
        if b.is_ascii_digit() {
            n.checked_mul(10)?.checked_add(u64::from(b - b'0'))
        } else {
            None
        }
    })
}

/// Whether the last transfer coding of `line`, the last `Transfer-Encoding`
/// line, is `chunked` (a line with other than visible ASCII is not).
fn is_chunked(line: &[u8]) -> bool {
    visible(line)
        && line
            .rsplit(|&b| b == b',')
            .next()
            .is_some_and(|last| last.trim_ascii().eq_ignore_ascii_case(b"chunked"))
}

/// Whether a comma-separated line names `token` (ASCII case aside); a
/// line with other than visible ASCII (and tabs) names none. Read as
/// bytes, where `HeaderValue::to_str` and `str::trim` would take some
/// hundred instructions more on each `Connection` line.
fn has_token(line: &[u8], token: &str) -> bool {
    visible(line)
        && line
            .split(|&b| b == b',')
            .any(|t| t.trim_ascii().eq_ignore_ascii_case(token.as_bytes()))
}

/// Whether `line` is visible ASCII, spaces and tabs: what
/// `HeaderValue::to_str` takes.
fn visible(line: &[u8]) -> bool {
    line.iter()
        .all(|&b| b == b'\t' || (b' '..0x7f).contains(&b))
}
