//! Every refusal becomes its response here, and only here.
//!
//! The status and the problem+json body come from [`GatewayError`]; the
//! headers that belong to a kind of refusal are added by the one match
//! below, which has no catch-all arm: a new kind of refusal does not
//! compile until someone decides what it carries.

use http::Response;
use http::header::{CONNECTION, CONTENT_TYPE, HeaderValue, RETRY_AFTER, WWW_AUTHENTICATE};
use http_body_util::{Either, Full};

use crate::problem::{GatewayError, PROBLEM_JSON};
use crate::proxy::Body;

/// The answer to a request refused with `err`; its problem+json body
/// names the request's id when it has one.
pub fn response(err: &GatewayError, request_id: Option<&HeaderValue>) -> Response<Body> {
    let mut res = Response::new(Either::Right(Full::new(err.problem_with_id(request_id))));
    *res.status_mut() = err.status();
    let headers = res.headers_mut();
    headers.insert(CONTENT_TYPE, PROBLEM_JSON.clone());
    match err {
        GatewayError::Limited {
            retry_after: Some(secs),
            ..
        } => {
            headers.insert(RETRY_AFTER, HeaderValue::from(*secs));
        }
        // A request that can never be admitted gets no Retry-After: there
        // is no time after which it would be.
        GatewayError::Limited {
            retry_after: None, ..
        } => {}
        // RFC 9110 §11.6.1: a 401 names the scheme that would be accepted.
        GatewayError::UnknownApiKey => {
            headers.insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        // The framing of the request is in doubt (RFC 9112 §6.1), or its
        // body was not read to its end: the connection cannot carry another
        // request.
        GatewayError::BadRequest(_)
        | GatewayError::PayloadTooLarge(_)
        | GatewayError::HeaderTooLarge { .. }
        | GatewayError::UriTooLong { .. }
        | GatewayError::BadRequestBody(_)
        | GatewayError::ClientAborted(_) => {
            headers.insert(CONNECTION, HeaderValue::from_static("close"));
        }
        // Well-framed requests: the connection stays usable.
        GatewayError::BadTarget(_)
        | GatewayError::NoRoute { .. }
        | GatewayError::UpstreamConnect(_)
        | GatewayError::UpstreamTimeout(_)
        | GatewayError::UpstreamFailed(_)
        | GatewayError::StoreUnavailable => {}
    }
    res
}
