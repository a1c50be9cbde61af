//! Checks on a request head before it is routed: the size caps, the
//! malformed requests hyper lets through, and bodies announced larger than
//! the cap.
//!
//! **Size caps, answered here so that they carry a problem+json body.**
//! hyper answers what it refuses while parsing (400, 414, 431) by itself,
//! with an empty body, and its server offers no hook to shape those
//! answers: the request never reaches a service. So hyper's own bounds are
//! set *above* tollgate's, and the common oversize requests are refused
//! here, where they become problem+json like every other refusal:
//!
//! - a head larger than `server.max_header_size`, counted as HTTP/1.1 text
//!   (request line, `name: value` lines, blank line; [`head_size`]), is 431.
//!   hyper's HTTP/1.1 read buffer and the HTTP/2 `SETTINGS_MAX_HEADER_LIST_SIZE`
//!   are [`HEAD_SLACK`](crate::listener::HEAD_SLACK) bytes larger;
//! - a path and query longer than `server.max_uri_size` is 414; the loader
//!   keeps that under hyper's fixed stop of [`HYPER_URI_LIMIT`] bytes.
//!
//! What hyper still answers by itself, with an empty body: a head that does
//! not fit even in its larger buffer (431); more than 100 header fields in
//! an HTTP/1.1 head (431: httparse parses into a fixed array, and a larger
//! one costs hyper a heap allocation per request); a request target over
//! [`HYPER_URI_LIMIT`] bytes (414); and every head that does not parse —
//! request line, method, version, header syntax, control characters,
//! invalid or conflicting `Content-Length` (400). Over HTTP/2 the `h2`
//! crate answers a header list over the advertised limit with a bodiless
//! 431 and resets malformed streams without any response.
//!
//! **Requests that parse but must not be forwarded**, because a proxy that
//! forwards them may disagree with the upstream about where a request
//! starts or what it is for:
//!
//! - more than one `Host` (RFC 9112 §3.2: a server MUST answer 400);
//! - `Content-Length` together with `Transfer-Encoding` (RFC 9112 §6.1: the
//!   classic request-smuggling shape). hyper's HTTP/1.1 reader already reads
//!   such a request by `Transfer-Encoding` alone and closes the connection
//!   after it, as the RFC requires; the check here is the second line, for
//!   any path where both reach the pipeline, and answers 400 with
//!   `Connection: close`;
//! - a `Content-Length` over `server.max_body_size`: answered 413 before a
//!   byte is forwarded (bodies without a length are cut off while they
//!   stream, see [`proxy`](crate::proxy)).

use http::header::{CONTENT_LENGTH, HOST, TRANSFER_ENCODING};
use http::{Request, Version};

use crate::config::ServerSettings;
use crate::problem::GatewayError;

/// hyper's fixed bound on an HTTP/1.1 request target (`MAX_URI_LEN` in its
/// `proto::h1::role`): a longer one is answered 414 before any service sees it.
pub const HYPER_URI_LIMIT: usize = 65_534;

/// Whether the request may go on to routing.
///
/// # Errors
/// [`GatewayError::UriTooLong`], [`GatewayError::HeaderTooLarge`],
/// [`GatewayError::BadRequest`] or [`GatewayError::PayloadTooLarge`].
pub fn check<B>(req: &Request<B>, settings: &ServerSettings) -> Result<(), GatewayError> {
    // The target first: of an overlong target that also overfills the head,
    // 414 says more.
    let length = req.uri().path_and_query().map_or(0, |p| p.as_str().len());
    if length > settings.max_uri_size {
        return Err(GatewayError::UriTooLong {
            length,
            max: settings.max_uri_size,
        });
    }
    // One pass over the fields for the head's size and the fields the
    // checks below read, instead of a map lookup for each of them.
    let seen = Seen::of(req);
    if seen.size > settings.max_header_size {
        return Err(GatewayError::HeaderTooLarge {
            size: seen.size,
            max: settings.max_header_size,
        });
    }
    if seen.hosts > 1 {
        return Err(GatewayError::BadRequest(
            "more than one Host header".to_owned(),
        ));
    }
    if req.version() == Version::HTTP_11 && seen.hosts == 0 && req.uri().authority().is_none() {
        return Err(GatewayError::BadRequest(
            "an HTTP/1.1 request needs a Host header".to_owned(),
        ));
    }
    if seen.transfer_encoding && seen.content_length.is_some() {
        return Err(GatewayError::BadRequest(
            "both Content-Length and Transfer-Encoding".to_owned(),
        ));
    }
    if let Some(max) = settings.max_body_size {
        if seen
            .content_length
            .and_then(length_of)
            .is_some_and(|n| n > max)
        {
            return Err(GatewayError::PayloadTooLarge(max));
        }
    }
    Ok(())
}

/// The size of the request head as HTTP/1.1 text: the request line
/// (`METHOD target HTTP/1.1`, the target with its scheme and authority when
/// it carries them), `name: value` for every field, each line with its
/// CRLF, and the blank line. Optional whitespace the client wrote around
/// values is not counted (hyper has dropped it), so this is at most the size
/// on the wire. HTTP/2 requests are measured the same way, so one cap
/// means one thing for both.
pub fn head_size<B>(req: &Request<B>) -> usize {
    Seen::of(req).size
}

/// What [`check`] reads of a request's fields, found in one pass.
struct Seen<'a> {
    /// [`head_size`].
    size: usize,
    /// How many `Host` fields.
    hosts: usize,
    /// Whether there is a `Transfer-Encoding`.
    transfer_encoding: bool,
    /// The first `Content-Length`, as [`content_length`] reads it.
    content_length: Option<&'a http::HeaderValue>,
}

impl<'a> Seen<'a> {
    fn of<B>(req: &'a Request<B>) -> Self {
        const VERSION_AND_CRLF: usize = " HTTP/1.1\r\n".len();
        let uri = req.uri();
        let target = uri.scheme_str().map_or(0, |s| s.len() + "://".len())
            + uri.authority().map_or(0, |a| a.as_str().len())
            + uri.path_and_query().map_or(0, |p| p.as_str().len());
        let line = req.method().as_str().len() + 1 + target + VERSION_AND_CRLF;
        let mut seen = Seen {
            size: line + "\r\n".len(),
            hosts: 0,
            transfer_encoding: false,
            content_length: None,
        };
        for (name, value) in req.headers() {
            seen.size += name.as_str().len() + ": ".len() + value.len() + "\r\n".len();
            if *name == HOST {
                seen.hosts += 1;
            } else if *name == TRANSFER_ENCODING {
                seen.transfer_encoding = true;
            } else if *name == CONTENT_LENGTH && seen.content_length.is_none() {
                seen.content_length = Some(value);
            }
        }
        seen
    }
}

/// The request's `Content-Length`, when it announces one.
pub fn content_length(headers: &http::HeaderMap) -> Option<u64> {
    length_of(headers.get(CONTENT_LENGTH)?)
}

/// A `Content-Length` value as a number, when it is one.
fn length_of(value: &http::HeaderValue) -> Option<u64> {
    value.to_str().ok()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(headers: &[(&str, &str)]) -> Request<()> {
        let mut b = Request::builder().uri("/");
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(()).expect("valid test request")
    }

    #[test]
    fn rules() {
        let s = ServerSettings {
            max_body_size: Some(10),
            ..ServerSettings::default()
        };
        assert!(check(&req(&[("host", "a")]), &s).is_ok());
        assert!(check(&req(&[("host", "a"), ("host", "b")]), &s).is_err());
        assert!(check(&req(&[]), &s).is_err());
        assert!(
            check(
                &req(&[
                    ("host", "a"),
                    ("content-length", "3"),
                    ("transfer-encoding", "chunked")
                ]),
                &s
            )
            .is_err()
        );
        assert!(matches!(
            check(&req(&[("host", "a"), ("content-length", "11")]), &s),
            Err(GatewayError::PayloadTooLarge(10))
        ));
        assert!(check(&req(&[("host", "a"), ("content-length", "10")]), &s).is_ok());
    }

    #[test]
    fn head_size_is_the_http11_text() {
        let r = Request::builder()
            .method("POST")
            .uri("/a?b=c")
            .header("host", "x.example")
            .header("x-k", "1")
            .header("x-k", "22")
            .body(())
            .expect("valid test request");
        let text = "POST /a?b=c HTTP/1.1\r\nhost: x.example\r\nx-k: 1\r\nx-k: 22\r\n\r\n";
        assert_eq!(head_size(&r), text.len());
        // Absolute-form (and HTTP/2) targets count their scheme and authority.
        let r = Request::builder()
            .uri("http://x.example/a")
            .body(())
            .expect("valid test request");
        assert_eq!(
            head_size(&r),
            "GET http://x.example/a HTTP/1.1\r\n\r\n".len()
        );
    }

    #[test]
    fn size_caps_are_inclusive_and_the_target_comes_first() {
        let s = ServerSettings {
            max_header_size: 8 * 1024,
            max_uri_size: 1024,
            ..ServerSettings::default()
        };
        let uri = |n: usize| format!("/{}", "a".repeat(n - 1));
        let at = |target: String, value_len: usize| {
            Request::builder()
                .uri(target)
                .header("host", "a")
                .header("x-big", "v".repeat(value_len))
                .body(())
                .expect("valid test request")
        };
        assert!(check(&at(uri(1024), 0), &s).is_ok());
        assert!(matches!(
            check(&at(uri(1025), 0), &s),
            Err(GatewayError::UriTooLong {
                length: 1025,
                max: 1024
            })
        ));
        let fits = at("/".into(), 0);
        let room = 8 * 1024 - head_size(&fits);
        assert!(check(&at("/".into(), room), &s).is_ok());
        assert!(matches!(
            check(&at("/".into(), room + 1), &s),
            Err(GatewayError::HeaderTooLarge { size, max: 8192 }) if size == 8193
        ));
        assert!(matches!(
            check(&at(uri(1025), room + 1), &s),
            Err(GatewayError::UriTooLong { .. })
        ));
    }
}
