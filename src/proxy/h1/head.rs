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
use http::header::{CONNECTION, CONTENT_LENGTH, TRANSFER_ENCODING};
use http::{HeaderMap, HeaderName, HeaderValue, Method, Response, StatusCode, Version};

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

/// Room for the fields the gateway adds to an answer (its request id and
/// the two rate-limit fields, and one more): a map made to the upstream's
/// count alone grows, and rehashes, on the first of them.
const ADDED_FIELDS: usize = 4;

fn build(bytes: &Bytes, raw: &Raw, method: &Method) -> Result<Head, HeadError> {
    let status = StatusCode::from_u16(raw.code).map_err(|_| HeadError::Field)?;
    let version = if raw.version == 1 {
        Version::HTTP_11
    } else {
        Version::HTTP_10
    };
    let mut response = Response::new(());
    let headers = response.headers_mut();
    headers.reserve(raw.fields.len() + ADDED_FIELDS);
    let mut keep_alive = version == Version::HTTP_11;
    let mut saw_close = false;
    // The framing fields, noted as the fields go by (a standard name
    // compares as a tag) rather than looked up after.
    let mut fields = Framing::default();
    for f in &raw.fields {
        let name = field_name(&bytes[f.name.0..f.name.1])?;
        let value = HeaderValue::from_maybe_shared(bytes.slice(f.value.0..f.value.1))
            .map_err(|_| HeadError::Field)?;
        if name == CONNECTION {
            // Once any line asks to close, a later `keep-alive` does not
            // undo it.
            if saw_close || has_token(&value, "close") {
                saw_close = true;
                keep_alive = false;
            } else if !keep_alive {
                keep_alive = has_token(&value, "keep-alive");
            }
        } else if name == TRANSFER_ENCODING {
            fields.last_coding = Some(value.clone());
        } else if name == CONTENT_LENGTH {
            fields.length_lines = true;
            fields.length = fields.length.and_then(|l| fold_length(l, value.as_bytes()));
        }
        headers.append(name, value);
    }
    let framing = framing(status, version, &fields, method)?;
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
    })
}

/// A field's name: one of the fields answers commonly carry, recognised
/// as is, or else what `HeaderName::from_bytes` makes of it (lower-cased
/// into a scratch buffer and looked up, or copied).
pub(super) fn field_name(name: &[u8]) -> Result<HeaderName, HeadError> {
    use http::header::{
        ACCEPT_RANGES, CACHE_CONTROL, CONTENT_ENCODING, CONTENT_TYPE, DATE, ETAG, EXPIRES,
        LAST_MODIFIED, LOCATION, SERVER, SET_COOKIE, VARY,
    };
    let first = name.first().map_or(0, |b| b | 0x20);
    let common = match (name.len(), first) {
        (4, b'd') => DATE,
        (4, b'e') => ETAG,
        (4, b'v') => VARY,
        (6, b's') => SERVER,
        (7, b'e') => EXPIRES,
        (8, b'l') => LOCATION,
        (10, b'c') => CONNECTION,
        (10, b's') => SET_COOKIE,
        (12, b'c') => CONTENT_TYPE,
        (13, b'a') => ACCEPT_RANGES,
        (13, b'c') => CACHE_CONTROL,
        (13, b'l') => LAST_MODIFIED,
        (14, b'c') => CONTENT_LENGTH,
        (16, b'c') => CONTENT_ENCODING,
        (17, b't') => TRANSFER_ENCODING,
        _ => return HeaderName::from_bytes(name).map_err(|_| HeadError::Field),
    };
    if is_token_of(name, common.as_str().as_bytes()) {
        Ok(common)
    } else {
        HeaderName::from_bytes(name).map_err(|_| HeadError::Field)
    }
}

/// Whether `token`, a field name `httparse` read, is `lower` (lower-case
/// letters and `-`, as long) but for ASCII case, compared eight bytes at a
/// time. Under `| 0x20` a token character becomes a lower-case letter only
/// when it is that letter in either case, and `-` only when it is `-`; so
/// `t | 0x20 == l` is that `t` is `l` but for case.
fn is_token_of(token: &[u8], lower: &[u8]) -> bool {
    const CASE: u64 = u64::from_ne_bytes([0x20; 8]);
    let word = |s: &[u8], at: usize| {
        s.get(at..)
            .and_then(<[u8]>::first_chunk::<8>)
            .map(|w| u64::from_ne_bytes(*w))
    };
    let len = lower.len();
    if token.len() != len {
        return false;
    }
    if len < 8 {
        return token.iter().zip(lower).all(|(&t, &l)| t | 0x20 == l);
    }
    // Whole words from the start, the last one ending at the end (and
    // overlapping the one before it).
    let mut at = 0;
    loop {
        let at_word = at.min(len - 8);
        match (word(token, at_word), word(lower, at_word)) {
            (Some(t), Some(l)) if t | CASE == l => {}
            _ => return false,
        }
        if at_word + 8 >= len {
            return true;
        }
        at += 8;
    }
}

/// What a head's fields say of its body's framing.
struct Framing {
    /// The last `Transfer-Encoding` line.
    last_coding: Option<HeaderValue>,
    /// Some `Content-Length` line was there.
    length_lines: bool,
    /// What the `Content-Length` lines agree on so far: `Some(None)` before
    /// the first, `None` once one is not a number or two differ.
    length: Option<Option<u64>>,
}

impl Default for Framing {
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
    fields: &Framing,
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
fn is_chunked(line: &HeaderValue) -> bool {
    line.to_str()
        .ok()
        .and_then(|line| line.rsplit(',').next())
        .is_some_and(|last| last.trim().eq_ignore_ascii_case("chunked"))
}

/// Whether a comma-separated line names `token` (ASCII case aside); a
/// line with other than visible ASCII (and tabs) names none. Read as
/// bytes, where `HeaderValue::to_str` and `str::trim` would take some
/// hundred instructions more on each `Connection` line.
fn has_token(value: &HeaderValue, token: &str) -> bool {
    let line = value.as_bytes();
    line.iter()
        .all(|&b| b == b'\t' || (b' '..0x7f).contains(&b))
        && line
            .split(|&b| b == b',')
            .any(|t| t.trim_ascii().eq_ignore_ascii_case(token.as_bytes()))
}
