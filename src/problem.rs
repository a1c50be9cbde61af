//! Errors the gateway answers itself, as `application/problem+json`
//! (RFC 9457).
//!
//! [`GatewayError`] names every way a request can end without an upstream
//! response; [`GatewayError::status`] and [`GatewayError::problem`] map each
//! to its answer with no catch-all arm, so a new error forces a decision.

use std::cell::RefCell;
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderValue, StatusCode};

/// `application/problem+json`.
pub static PROBLEM_JSON: HeaderValue = HeaderValue::from_static("application/problem+json");

/// IANA problem type for rate limiting (draft-ietf-httpapi-ratelimit-headers §7).
pub const QUOTA_EXCEEDED: &str = "https://iana.org/assignments/http-problem-types#quota-exceeded";

/// The start of every 429 body after its `{`: type, title and status.
const LIMITED_HEAD: &str = "\"type\":\"https://iana.org/assignments/http-problem-types#quota-exceeded\",\"title\":\"Too Many Requests\",\"status\":429";

/// What a 429's body up to its request id is made of: the limits that
/// denied, the seconds to wait, and whether it is about requests in flight.
type LimitedKey = (Vec<Arc<str>>, Option<u64>, bool);

/// Where a thread writes a problem body before it is copied out.
#[derive(Default)]
struct Scratch {
    /// The last body written: cleared or cut back for each body, so it
    /// allocates seldom.
    text: String,
    /// The 429 whose body `text` holds, if it holds one.
    limited: Option<LimitedKey>,
    /// Where in `text` the request id starts.
    start: usize,
}

thread_local! {
    /// This thread's [`Scratch`].
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// A request that ends at the gateway.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// No route takes the request.
    #[error("no route matches {method} {path}")]
    NoRoute {
        /// Request method.
        method: String,
        /// Request path.
        path: String,
    },
    /// A limit denied the request.
    #[error("rate limited by {policies:?}")]
    Limited {
        /// Names of the limits that denied.
        policies: Vec<Arc<str>>,
        /// Seconds until the request would be admitted; `None` if never,
        /// or if unknown (`in_flight`).
        retry_after: Option<u64>,
        /// A concurrency limit denied: too many of the caller's
        /// requests are in flight, and nothing tells when one will end.
        in_flight: bool,
    },
    /// The route's limits come from plans and the caller has none: no API
    /// key, or one that is not known, with `api_keys.unknown: reject`.
    #[error("no known API key")]
    UnknownApiKey,
    /// The upstream could not be reached.
    #[error("upstream unreachable: {0}")]
    UpstreamConnect(String),
    /// The upstream did not answer in time.
    #[error("upstream timed out after {0:?}")]
    UpstreamTimeout(std::time::Duration),
    /// A gRPC call's own deadline (`grpc-timeout`, shorter than the
    /// route's timeout) passed before the upstream answered.
    #[error("the caller's deadline of {0:?} passed before the upstream answered")]
    DeadlineExceeded(std::time::Duration),
    /// The upstream connection failed after connecting.
    #[error("upstream failed: {0}")]
    UpstreamFailed(String),
    /// The request is malformed in a way hyper lets through (RFC 9112 §3.2:
    /// more than one `Host`).
    #[error("bad request: {0}")]
    BadRequest(String),
    /// The request target has no canonical form ([`crate::target`]).
    #[error("bad request target: {0}")]
    BadTarget(#[from] crate::target::TargetError),
    /// The request body is larger than `server.max_body_size` (RFC 9110 §15.5.14).
    #[error("request body larger than {0} bytes")]
    PayloadTooLarge(u64),
    /// The request body broke its own framing while it was being forwarded
    /// (a malformed chunk, RFC 9112 §7.1).
    #[error("malformed request body: {0}")]
    BadRequestBody(String),
    /// The client went away (closed or reset its connection, or reset its
    /// HTTP/2 stream) before its request body was complete. The answer most
    /// likely reaches nobody; it is a 400 for a client that only closed its
    /// sending side.
    #[error("client went away before the request body was complete: {0}")]
    ClientAborted(String),
    /// The request head is larger than `server.max_header_size` (RFC 6585 §5).
    #[error("request header block of {size} bytes, over {max}")]
    HeaderTooLarge {
        /// The head's size, counted as HTTP/1.1 text.
        size: usize,
        /// `server.max_header_size`.
        max: usize,
    },
    /// The request target is longer than `server.max_uri_size` (RFC 9110 §15.5.15).
    #[error("request target of {length} bytes, over {max}")]
    UriTooLong {
        /// Length of the target's path and query.
        length: usize,
        /// `server.max_uri_size`.
        max: usize,
    },
    /// The limiter store cannot decide and `on_error: deny` refuses.
    #[error("rate limiter unavailable")]
    StoreUnavailable,
}

impl GatewayError {
    /// The status code answered.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::NoRoute { .. } => StatusCode::NOT_FOUND,
            Self::Limited { .. } => StatusCode::TOO_MANY_REQUESTS,
            Self::UnknownApiKey => StatusCode::UNAUTHORIZED,
            Self::UpstreamConnect(_) | Self::UpstreamFailed(_) => StatusCode::BAD_GATEWAY,
            Self::UpstreamTimeout(_) | Self::DeadlineExceeded(_) => StatusCode::GATEWAY_TIMEOUT,
            Self::BadRequest(_)
            | Self::BadTarget(_)
            | Self::BadRequestBody(_)
            | Self::ClientAborted(_) => StatusCode::BAD_REQUEST,
            Self::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Self::HeaderTooLarge { .. } => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            Self::UriTooLong { .. } => StatusCode::URI_TOO_LONG,
            Self::StoreUnavailable => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// The problem+json body.
    pub fn problem(&self) -> Bytes {
        self.problem_with_id(None)
    }

    /// The problem+json body, with the request's id as `"request_id"`
    /// when there is one, so a client can quote it and the access log
    /// line be found by it.
    ///
    /// The text is written into this thread's reused buffer ([`SCRATCH`])
    /// and copied into a body of its exact length: one allocation, where a
    /// `String` made `Bytes` takes two (the string's, and the shared
    /// count `Bytes` puts beside a buffer with room to spare). A 429 like
    /// the one before it on this thread (the same limits, wait and kind:
    /// a deny path's, refused many times a second) keeps that one's text
    /// up to its request id and writes only the id and the end.
    pub fn problem_with_id(&self, request_id: Option<&HeaderValue>) -> Bytes {
        SCRATCH.with(|scratch| {
            let Ok(mut scratch) = scratch.try_borrow_mut() else {
                // Not reached: nothing in here writes another body.
                let mut body = String::with_capacity(256);
                self.write_problem(&mut body, request_id);
                return Bytes::from(body);
            };
            let Scratch {
                text,
                limited,
                start,
            } = &mut *scratch;
            if self.starts_as(limited.as_ref()) {
                text.truncate(*start);
            } else {
                text.clear();
                self.write_start(text);
                *start = text.len();
                *limited = match self {
                    Self::Limited {
                        policies,
                        retry_after,
                        in_flight,
                    } => Some((policies.clone(), *retry_after, *in_flight)),
                    _ => None,
                };
            }
            write_end(text, request_id);
            Bytes::copy_from_slice(text.as_bytes())
        })
    }

    /// Whether this is the 429 `limited` describes, whose body starts
    /// with the same text.
    fn starts_as(&self, limited: Option<&LimitedKey>) -> bool {
        let (
            Self::Limited {
                policies,
                retry_after,
                in_flight,
            },
            Some((was, was_retry_after, was_in_flight)),
        ) = (self, limited)
        else {
            return false;
        };
        retry_after == was_retry_after
            && in_flight == was_in_flight
            && policies.len() == was.len()
            && policies
                .iter()
                .zip(was)
                .all(|(p, w)| Arc::ptr_eq(p, w) || p == w)
    }

    /// Writes the problem+json body into `body`.
    fn write_problem(&self, body: &mut String, request_id: Option<&HeaderValue>) {
        self.write_start(body);
        write_end(body, request_id);
    }

    /// Writes the problem+json body into `body` up to the request id.
    fn write_start(&self, body: &mut String) {
        body.push('{');
        match self {
            // The fixed part as literal JSON (the deny path renders this body
            // for every refused request); the unit test checks it against
            // the general rendering.
            Self::Limited { .. } => body.push_str(LIMITED_HEAD),
            Self::NoRoute { .. }
            | Self::UnknownApiKey
            | Self::UpstreamConnect(_)
            | Self::UpstreamTimeout(_)
            | Self::DeadlineExceeded(_)
            | Self::UpstreamFailed(_)
            | Self::BadRequest(_)
            | Self::BadTarget(_)
            | Self::PayloadTooLarge(_)
            | Self::BadRequestBody(_)
            | Self::ClientAborted(_)
            | Self::HeaderTooLarge { .. }
            | Self::UriTooLong { .. }
            | Self::StoreUnavailable => {
                let status = self.status();
                let title = status.canonical_reason().unwrap_or("Error");
                push_field(body, "type", "about:blank");
                body.push(',');
                push_common(body, title, status);
            }
        }
        body.push_str(",\"detail\":\"");
        self.push_detail(body, push_escaped);
        body.push('"');
        if let Self::Limited { policies, .. } = self {
            push_policies(body, policies);
        }
    }

    /// The problem's `detail`, what happened in words for the client, as
    /// plain text (a gRPC call's `grpc-message`).
    pub fn detail(&self) -> String {
        let mut out = String::with_capacity(64);
        self.push_detail(&mut out, String::push_str);
        out
    }

    /// The problem's `detail` written with `escape` (for the inside of a
    /// JSON string, or as it is). A 429's is written in place, escaping only
    /// the limit names: the deny path answers with it for every refused
    /// request.
    fn push_detail(&self, out: &mut String, escape: impl Fn(&mut String, &str)) {
        let text = match self {
            Self::Limited {
                policies,
                retry_after,
                in_flight,
            } => {
                let names = |out: &mut String| {
                    for (i, p) in policies.iter().enumerate() {
                        if i > 0 {
                            out.push_str(", ");
                        }
                        escape(out, p);
                    }
                };
                match (in_flight, retry_after) {
                    (true, _) => {
                        out.push_str("Too many requests in flight for ");
                        names(out);
                        out.push_str("; retry once one of them has ended");
                    }
                    (false, Some(s)) => {
                        out.push_str("Rate limit exceeded for ");
                        names(out);
                        out.push_str("; retry in ");
                        out.push_str(itoa::Buffer::new().format(*s));
                        out.push_str(" s");
                    }
                    (false, None) => {
                        out.push_str("The request costs more than the limit ");
                        names(out);
                        out.push_str(" allows in a window; it can never be admitted");
                    }
                }
                return;
            }
            Self::NoRoute { .. } => "No route matches this request".to_owned(),
            Self::UnknownApiKey => "This route needs an API key known to the gateway".to_owned(),
            // Upstream details stay in the logs, not in the answer.
            Self::UpstreamConnect(_) => "The upstream server could not be reached".to_owned(),
            Self::UpstreamTimeout(d) => format!(
                "The upstream server did not answer within {} ms",
                d.as_millis()
            ),
            Self::DeadlineExceeded(d) => format!(
                "The upstream server did not answer within the call's deadline of {} ms",
                d.as_millis()
            ),
            Self::StoreUnavailable => "The rate limiter cannot decide right now and this route fails closed; retry shortly".to_owned(),
            Self::UpstreamFailed(_) => "The upstream connection failed".to_owned(),
            Self::BadRequest(why) => format!("The request is malformed: {why}"),
            Self::BadTarget(why) => format!("The request target is refused: {why}"),
            Self::PayloadTooLarge(max) => format!("The request body is larger than {max} bytes"),
            Self::BadRequestBody(why) => format!("The request body is malformed: {why}"),
            Self::ClientAborted(_) => "The request body ended before it was complete".to_owned(),
            Self::HeaderTooLarge { size, max } => format!(
                "The request header block is {size} bytes; this gateway accepts at most {max}"
            ),
            Self::UriTooLong { length, max } => format!(
                "The request target's path and query are {length} bytes; this gateway accepts at most {max}"
            ),
        };
        escape(out, &text);
    }
}

/// `,"violated-policies":[…]`: the names of the limits that denied.
fn push_policies(body: &mut String, policies: &[Arc<str>]) {
    body.push_str(",\"violated-policies\":[");
    for (i, p) in policies.iter().enumerate() {
        if i > 0 {
            body.push(',');
        }
        push_json_string(body, p);
    }
    body.push(']');
}

/// Writes the end of a problem+json body: the request id, if any, and `}`.
fn write_end(body: &mut String, request_id: Option<&HeaderValue>) {
    if let Some(id) = request_id {
        body.push_str(",\"request_id\":");
        push_id(body, id.as_bytes());
    }
    body.push('}');
}

/// Writes a request id as a JSON string: a kept id is visible ASCII and a
/// made one hex and hyphens; an id that is not visible ASCII (which
/// `HeaderValue::to_str` refuses) is written as `"-"`. One pass over the
/// id tells both whether it is text and whether it needs an escape.
fn push_id(body: &mut String, id: &[u8]) {
    let (text, plain) = id.iter().fold((true, true), |(text, plain), &b| {
        (
            text & (((0x20..0x7f).contains(&b)) | (b == b'\t')),
            plain & (b != b'"') & (b != b'\\') & (b >= 0x20),
        )
    });
    let id = match std::str::from_utf8(id) {
        Ok(id) if text => id,
        _ => "-",
    };
    body.push('"');
    if plain {
        body.push_str(id);
    } else {
        push_escaped(body, id);
    }
    body.push('"');
}

fn push_common(body: &mut String, title: &str, status: StatusCode) {
    push_field(body, "title", title);
    body.push_str(",\"status\":");
    body.push_str(itoa::Buffer::new().format(status.as_u16()));
}

fn push_field(body: &mut String, name: &str, value: &str) {
    push_json_string(body, name);
    body.push(':');
    push_json_string(body, value);
}

/// Writes `s` as a JSON string literal.
fn push_json_string(out: &mut String, s: &str) {
    out.push('"');
    push_escaped(out, s);
    out.push('"');
}

/// Writes `s` escaped for the inside of a JSON string literal.
fn push_escaped(out: &mut String, s: &str) {
    // Most strings (limit names, request ids) need no escape: one test of
    // every byte, without an early exit so that it runs as a vector loop,
    // then one copy.
    let plain = s
        .bytes()
        .fold(true, |ok, b| ok & (b != b'"') & (b != b'\\') & (b >= 0x20));
    if plain {
        out.push_str(s);
        return;
    }
    // Else copy the runs that need no escape whole.
    let mut start = 0;
    for (i, b) in s.bytes().enumerate() {
        if b != b'"' && b != b'\\' && b >= 0x20 {
            continue;
        }
        out.push_str(&s[start..i]);
        match b {
            b'"' => out.push_str("\\\""),
            b'\\' => out.push_str("\\\\"),
            c => {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                out.push_str("\\u00");
                out.push(char::from(HEX[usize::from(c >> 4)]));
                out.push(char::from(HEX[usize::from(c & 15)]));
            }
        }
        start = i + 1;
    }
    out.push_str(&s[start..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_unavailable_is_a_503_problem() {
        let e = GatewayError::StoreUnavailable;
        assert_eq!(e.status(), StatusCode::SERVICE_UNAVAILABLE);
        let body = String::from_utf8_lossy(&e.problem()).into_owned();
        assert!(body.contains("\"status\":503"), "{body}");
        assert!(body.contains("\"title\":\"Service Unavailable\""), "{body}");
    }

    #[test]
    fn limited_body() {
        let e = GatewayError::Limited {
            policies: vec!["demo".into()],
            retry_after: Some(7),
            in_flight: false,
        };
        assert_eq!(
            e.problem(),
            "{\"type\":\"https://iana.org/assignments/http-problem-types#quota-exceeded\",\"title\":\"Too Many Requests\",\"status\":429,\"detail\":\"Rate limit exceeded for demo; retry in 7 s\",\"violated-policies\":[\"demo\"]}"
        );
    }

    #[test]
    fn limited_head_is_the_general_rendering() {
        let mut head = String::new();
        push_field(&mut head, "type", QUOTA_EXCEEDED);
        head.push(',');
        push_common(
            &mut head,
            "Too Many Requests",
            StatusCode::TOO_MANY_REQUESTS,
        );
        assert_eq!(head, LIMITED_HEAD);
    }

    #[test]
    fn strings_are_escaped_as_serde_json_does() {
        for s in [
            "",
            "plain",
            "quote \" and \\ backslash",
            "\u{1}\n\t\u{1f} controls",
            "ünïcode \"é\" 🦀",
            "\"",
            "end\\",
        ] {
            let mut out = String::new();
            push_json_string(&mut out, s);
            assert_eq!(
                out,
                serde_json::to_string(s)
                    .unwrap()
                    .replace("\\n", "\\u000a")
                    .replace("\\t", "\\u0009"),
                "{s:?}"
            );
        }
    }

    #[test]
    fn a_body_that_starts_as_the_last_is_the_same_as_one_written_whole() {
        let name: Arc<str> = "per_ip".into();
        let limited = |policies: Vec<Arc<str>>, retry_after, in_flight| GatewayError::Limited {
            policies,
            retry_after,
            in_flight,
        };
        let errors = [
            limited(vec![name.clone()], Some(3), false),
            limited(vec![name.clone()], Some(3), false),
            limited(vec!["per_ip".into()], Some(3), false),
            limited(vec![name.clone()], Some(4), false),
            limited(vec![name.clone()], None, true),
            limited(vec![name.clone()], None, false),
            limited(vec![name.clone(), "other".into()], None, false),
            limited(vec!["other".into()], None, false),
            GatewayError::StoreUnavailable,
            limited(vec![name.clone()], Some(3), false),
            GatewayError::UnknownApiKey,
        ];
        let ids = [
            Some(HeaderValue::from_static(
                "0190a5b2-7c3e-7d4f-8a1b-2c3d4e5f6a7b",
            )),
            None,
            Some(HeaderValue::from_static("x")),
        ];
        for (i, err) in errors.iter().enumerate() {
            for id in &ids {
                let mut whole = String::new();
                err.write_problem(&mut whole, id.as_ref());
                assert_eq!(
                    err.problem_with_id(id.as_ref()),
                    whole.as_bytes(),
                    "{i} {id:?}"
                );
            }
        }
    }

    #[test]
    fn request_ids_are_written_as_text_or_a_dash() {
        for (id, written) in [
            (
                &b"0190a5b2-7c3e-7d4f-8a1b-2c3d4e5f6a7b"[..],
                "0190a5b2-7c3e-7d4f-8a1b-2c3d4e5f6a7b",
            ),
            (b"kept\"quote\\", "kept\"quote\\"),
            (b"tab\there", "tab\there"),
            (b"obs\x80text", "-"),
        ] {
            let id = HeaderValue::from_bytes(id).unwrap();
            let body: serde_json::Value =
                serde_json::from_slice(&GatewayError::StoreUnavailable.problem_with_id(Some(&id)))
                    .unwrap();
            assert_eq!(body["request_id"], written, "{id:?}");
        }
    }

    #[test]
    fn limited_bodies_are_valid_json_with_their_details() {
        let names: Vec<Arc<str>> = vec!["per \"min\"".into(), "hour\\1".into()];
        for (retry_after, in_flight, detail) in [
            (
                Some(3),
                false,
                "Rate limit exceeded for per \"min\", hour\\1; retry in 3 s",
            ),
            (
                None,
                false,
                "The request costs more than the limit per \"min\", hour\\1 allows in a window; it can never be admitted",
            ),
            (
                None,
                true,
                "Too many requests in flight for per \"min\", hour\\1; retry once one of them has ended",
            ),
        ] {
            let e = GatewayError::Limited {
                policies: names.clone(),
                retry_after,
                in_flight,
            };
            let body: serde_json::Value = serde_json::from_slice(&e.problem()).unwrap();
            assert_eq!(body["detail"], detail);
            assert_eq!(
                body["violated-policies"],
                serde_json::json!(names.iter().map(|n| &**n).collect::<Vec<_>>())
            );
            assert_eq!(body["status"], 429);
        }
    }
}
