//! gRPC's conventions on top of HTTP/2, as far as a gateway needs them: which
//! requests are gRPC calls, the deadline a caller sends (`grpc-timeout`),
//! the status codes and how a status message is written.
//!
//! The gateway does not read gRPC messages; it passes calls through as
//! streams with their trailers. It needs these pieces only to answer a call
//! it refuses itself in a way a gRPC client understands — HTTP 200, no
//! body, `grpc-status` and `grpc-message` in the response's only header
//! block ("Trailers-Only" in gRPC's PROTOCOL-HTTP2 document) — and to hold
//! the upstream to the caller's deadline.

use std::time::Duration;

use http::header::{CONTENT_TYPE, HeaderName, HeaderValue};
use http::{HeaderMap, Method};

/// `grpc-status`.
pub static GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
/// `grpc-message`.
pub static GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");
/// `grpc-timeout`: the caller's deadline, relative to when it sent the call.
pub static GRPC_TIMEOUT: HeaderName = HeaderName::from_static("grpc-timeout");
/// `grpc-retry-pushback-ms` (gRFC A6): how long a client's retry policy
/// waits before the next attempt; a negative value stops its retries.
pub static GRPC_RETRY_PUSHBACK_MS: HeaderName = HeaderName::from_static("grpc-retry-pushback-ms");

/// The kind of gRPC call a request is, by its `Content-Type`
/// (`application/grpc`, `application/grpc+proto`, `application/grpc-web`,
/// `application/grpc-web-text+proto`, …): the answer to a refused call
/// carries the same kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// gRPC over HTTP/2.
    Grpc,
    /// gRPC-Web, binary.
    Web,
    /// gRPC-Web, base64 text.
    WebText,
}

impl Kind {
    /// The kind of call a request with `method` and `headers` starts, or
    /// `None` for a request that is not a gRPC call. Calls are POSTs
    /// (PROTOCOL-HTTP2, gRPC-Web alike), so other requests are told apart
    /// without a header lookup.
    pub fn of(method: &Method, headers: &HeaderMap) -> Option<Self> {
        if method != Method::POST {
            return None;
        }
        let ct = headers.get(CONTENT_TYPE)?.as_bytes();
        const PREFIX: &[u8] = b"application/grpc";
        if ct.len() < PREFIX.len() || !ct[..PREFIX.len()].eq_ignore_ascii_case(PREFIX) {
            return None;
        }
        let rest = &ct[PREFIX.len()..];
        let starts = |p: &[u8]| rest.len() >= p.len() && rest[..p.len()].eq_ignore_ascii_case(p);
        // `application/grpc` is followed by nothing, `+format`, `;params`,
        // or `-web…`; `application/grpcfoo` is something else.
        if starts(b"-web-text") {
            Some(Self::WebText)
        } else if starts(b"-web") {
            Some(Self::Web)
        } else if rest.is_empty() || rest[0] == b'+' || rest[0] == b';' {
            Some(Self::Grpc)
        } else {
            None
        }
    }

    /// The `Content-Type` of a body-less answer to such a call.
    pub fn content_type(self) -> HeaderValue {
        HeaderValue::from_static(match self {
            Self::Grpc => "application/grpc",
            Self::Web => "application/grpc-web",
            Self::WebText => "application/grpc-web-text",
        })
    }
}

/// gRPC status codes (gRPC's `statuscodes.md`), those the gateway answers
/// with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    /// 2: an error that fits no other code.
    Unknown = 2,
    /// 3: the request is wrong whatever the state of the system.
    InvalidArgument = 3,
    /// 4: the caller's deadline passed.
    DeadlineExceeded = 4,
    /// 7: the caller may not make this call.
    PermissionDenied = 7,
    /// 8: a quota or a size limit was reached.
    ResourceExhausted = 8,
    /// 12: no such method here.
    Unimplemented = 12,
    /// 13: the transport or protocol broke.
    Internal = 13,
    /// 14: the service cannot be reached now; retrying may help.
    Unavailable = 14,
    /// 16: the caller did not prove who it is.
    Unauthenticated = 16,
}

impl Code {
    /// The `grpc-status` value.
    pub fn header_value(self) -> HeaderValue {
        HeaderValue::from(self as u16)
    }
}

/// The `grpc-timeout` of `headers`, when present and well formed: at most
/// eight ASCII digits and a unit — `H`ours, `M`inutes, `S`econds,
/// `m`illiseconds, `u` (microseconds), `n`anoseconds.
pub fn timeout(headers: &HeaderMap) -> Option<Duration> {
    let v = headers.get(&GRPC_TIMEOUT)?.as_bytes();
    let (&unit, digits) = v.split_last()?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n = digits
        .iter()
        .fold(0u64, |n, d| n * 10 + u64::from(d - b'0'));
    Some(match unit {
        b'H' => Duration::from_secs(n * 3600),
        b'M' => Duration::from_secs(n * 60),
        b'S' => Duration::from_secs(n),
        b'm' => Duration::from_millis(n),
        b'u' => Duration::from_micros(n),
        b'n' => Duration::from_nanos(n),
        _ => return None,
    })
}

/// `text` as a `grpc-message` value: percent-encoded, every byte outside
/// printable ASCII and `%` itself as `%XX` (PROTOCOL-HTTP2, "Responses").
pub fn message(text: &str) -> HeaderValue {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut out = Vec::with_capacity(text.len());
    for &b in text.as_bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(b);
        } else {
            out.extend_from_slice(&[b'%', HEX[usize::from(b >> 4)], HEX[usize::from(b & 15)]]);
        }
    }
    // Only printable ASCII is left: always a valid header value.
    HeaderValue::from_bytes(&out).unwrap_or_else(|_| HeaderValue::from_static(""))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(name: &str, value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            HeaderName::from_bytes(name.as_bytes()).unwrap(),
            HeaderValue::from_str(value).unwrap(),
        );
        h
    }

    #[test]
    fn kinds_by_content_type() {
        for (ct, kind) in [
            ("application/grpc", Some(Kind::Grpc)),
            ("application/grpc+proto", Some(Kind::Grpc)),
            ("Application/GRPC+json", Some(Kind::Grpc)),
            ("application/grpc;charset=utf-8", Some(Kind::Grpc)),
            ("application/grpc-web", Some(Kind::Web)),
            ("application/grpc-web+proto", Some(Kind::Web)),
            ("application/grpc-web-text", Some(Kind::WebText)),
            ("application/grpc-web-text+proto", Some(Kind::WebText)),
            ("application/grpcx", None),
            ("application/json", None),
            ("application/grp", None),
        ] {
            let h = headers("content-type", ct);
            assert_eq!(Kind::of(&Method::POST, &h), kind, "{ct}");
            assert_eq!(Kind::of(&Method::GET, &h), None, "{ct}");
        }
        assert_eq!(Kind::of(&Method::POST, &HeaderMap::new()), None);
    }

    #[test]
    fn timeouts() {
        for (v, d) in [
            ("1H", Some(Duration::from_secs(3600))),
            ("2M", Some(Duration::from_secs(120))),
            ("3S", Some(Duration::from_secs(3))),
            ("250m", Some(Duration::from_millis(250))),
            ("99999999u", Some(Duration::from_micros(99_999_999))),
            ("5n", Some(Duration::from_nanos(5))),
            ("0m", Some(Duration::ZERO)),
            ("123456789m", None),
            ("m", None),
            ("10", None),
            ("10x", None),
            ("-1S", None),
            ("1.5S", None),
        ] {
            assert_eq!(timeout(&headers("grpc-timeout", v)), d, "{v}");
        }
    }

    #[test]
    fn messages_are_percent_encoded() {
        assert_eq!(
            message("Rate limit exceeded; retry in 3 s"),
            "Rate limit exceeded; retry in 3 s"
        );
        assert_eq!(message("100% ünï\n"), "100%25 %C3%BCn%C3%AF%0A");
        assert_eq!(Code::ResourceExhausted.header_value(), "8");
    }
}
