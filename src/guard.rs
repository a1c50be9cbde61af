//! Checks on a request head before it is routed: the malformed requests
//! hyper lets through, and bodies announced larger than the cap.
//!
//! hyper already refuses what cannot be parsed (bad request lines, control
//! characters in header values, oversized heads, broken chunked framing).
//! What remains is legal to parse but dangerous to forward, because a proxy
//! that forwards it may disagree with the upstream about where a request
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

/// Whether the request may go on to routing.
///
/// # Errors
/// [`GatewayError::BadRequest`] or [`GatewayError::PayloadTooLarge`].
pub fn check<B>(req: &Request<B>, settings: &ServerSettings) -> Result<(), GatewayError> {
    let headers = req.headers();
    if headers.get_all(HOST).iter().nth(1).is_some() {
        return Err(GatewayError::BadRequest(
            "more than one Host header".to_owned(),
        ));
    }
    if req.version() == Version::HTTP_11
        && !headers.contains_key(HOST)
        && req.uri().authority().is_none()
    {
        return Err(GatewayError::BadRequest(
            "an HTTP/1.1 request needs a Host header".to_owned(),
        ));
    }
    if headers.contains_key(TRANSFER_ENCODING) && headers.contains_key(CONTENT_LENGTH) {
        return Err(GatewayError::BadRequest(
            "both Content-Length and Transfer-Encoding".to_owned(),
        ));
    }
    if let Some(max) = settings.max_body_size {
        let announced = headers
            .get(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        if announced.is_some_and(|n| n > max) {
            return Err(GatewayError::PayloadTooLarge(max));
        }
    }
    Ok(())
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
}
