//! A request as HTTP/1.1 bytes: the head written from the request's
//! parts as they are (method, path and query, each header line in the
//! map's order, then the forwarding fields its body carries, see
//! [`crate::proxy::Forwarding`]), and how its body is framed, as hyper's client frames it:
//! a body known to be empty gets no framing of its own, a valid
//! `Content-Length` is kept, a body of known size without one gets one,
//! and any other body is chunked — but for GET, HEAD and CONNECT, which
//! are sent without one.

use bytes::Bytes;
use http::header::{CONTENT_LENGTH, HOST, TRAILER, TRANSFER_ENCODING};
use http::{HeaderMap, HeaderName, Method, Request};
use http_body::Body as _;

use super::head::content_length;
use crate::proxy::body::UpstreamBody;

/// How the body goes on the wire.
#[derive(Debug)]
pub enum Sending {
    /// No body is sent.
    Empty,
    /// Exactly this many bytes.
    Length(u64),
    /// Chunks; trailers named by the request's `Trailer` field are sent.
    Chunked(Vec<HeaderName>),
}

/// Writes the head of `req` into `out` and says how its body is framed.
pub fn head(req: &Request<UpstreamBody>, out: &mut Vec<u8>) -> Sending {
    let headers = req.headers();
    let framing = framing(req);
    out.reserve(64 + headers.len() * 32);
    out.extend_from_slice(req.method().as_str().as_bytes());
    out.push(b' ');
    let target = req.uri().path_and_query().map_or("/", |pq| pq.as_str());
    out.extend_from_slice(target.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    // The framing's own fields are written here; the request's
    // `Transfer-Encoding` never is (it is the hop's), nor a
    // `Content-Length` that a chunked body or a written one replaces.
    let keep_length = match &framing {
        Sending::Empty => true,
        Sending::Length(_) => content_length(headers).is_some(),
        Sending::Chunked(_) => false,
    };
    let mut host = None;
    for (name, value) in headers {
        if name == TRANSFER_ENCODING || (name == CONTENT_LENGTH && !keep_length) {
            continue;
        }
        if name == HOST {
            host = Some(value);
        }
        line(out, name.as_str().as_bytes(), value.as_bytes());
    }
    // The forwarding fields not in the map come where inserts into it
    // would have put them: after every field it had.
    if let Some(forwarding) = req.body().forwarding_fields() {
        forwarding.write(out, host);
    }
    match &framing {
        Sending::Length(n) if !keep_length => {
            let mut digits = itoa::Buffer::new();
            line(out, b"content-length", digits.format(*n).as_bytes());
        }
        Sending::Chunked(_) => line(out, b"transfer-encoding", b"chunked"),
        Sending::Empty | Sending::Length(_) => {}
    }
    out.extend_from_slice(b"\r\n");
    framing
}

fn framing(req: &Request<UpstreamBody>) -> Sending {
    let body = req.body();
    if body.is_end_stream() {
        return Sending::Empty;
    }
    if let Some(n) = content_length(req.headers()) {
        return Sending::Length(n);
    }
    if let Some(n) = body.size_hint().exact() {
        return Sending::Length(n);
    }
    if matches!(*req.method(), Method::GET | Method::HEAD | Method::CONNECT) {
        // As hyper: these almost never carry a body, and one of unknown
        // size is not sent.
        return Sending::Empty;
    }
    Sending::Chunked(trailer_names(req.headers()))
}

/// The fields the request's `Trailer` lines announce, but those that
/// frame or route a message (RFC 9110 §6.5.1).
fn trailer_names(headers: &HeaderMap) -> Vec<HeaderName> {
    headers
        .get_all(TRAILER)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|s| s.split(','))
        .filter_map(|s| HeaderName::from_bytes(s.trim().as_bytes()).ok())
        .filter(|n| {
            !matches!(
                n.as_str(),
                "content-length" | "transfer-encoding" | "trailer" | "host" | "te"
            )
        })
        .collect()
}

fn line(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// The size line of a chunk of `len` bytes.
pub fn chunk_size(out: &mut Vec<u8>, len: usize) {
    let mut digits = [0u8; 16];
    let mut i = digits.len();
    let mut n = len;
    loop {
        i -= 1;
        digits[i] = b"0123456789ABCDEF"[n & 15];
        n >>= 4;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
    out.extend_from_slice(b"\r\n");
}

/// The last chunk and the trailer fields `allowed` lets through.
pub fn last_chunk(out: &mut Vec<u8>, trailers: Option<&HeaderMap>, allowed: &[HeaderName]) {
    out.extend_from_slice(b"0\r\n");
    if let Some(t) = trailers {
        for (name, value) in t {
            if allowed.contains(name) {
                line(out, name.as_str().as_bytes(), value.as_bytes());
            }
        }
    }
    out.extend_from_slice(b"\r\n");
}

/// A data frame's bytes as the framing sends them: appended to `out` when
/// small, else returned to be written after `out` (no copy).
pub fn data(out: &mut Vec<u8>, chunked: bool, data: Bytes) -> Option<Bytes> {
    if chunked {
        chunk_size(out, data.len());
    }
    let rest = if data.len() <= COPY_BELOW {
        out.extend_from_slice(&data);
        None
    } else {
        Some(data)
    };
    if chunked && rest.is_none() {
        out.extend_from_slice(b"\r\n");
    }
    rest
}

/// Data frames up to this size are copied into the write buffer, so a
/// body of small frames goes out in few writes.
pub const COPY_BELOW: usize = 16 * 1024;
