//! Every refusal becomes its response here, and only here.
//!
//! The status and the problem+json body come from [`GatewayError`]; the
//! headers that belong to a kind of refusal are added by the one match
//! below, which has no catch-all arm: a new kind of refusal does not
//! compile until someone decides what it carries.
//!
//! A gRPC call ([`grpc::Kind`]) is refused the way gRPC answers: HTTP 200,
//! no body, and `grpc-status` and `grpc-message` in the one header block
//! (Trailers-Only), beside the same headers an HTTP refusal carries (the
//! rate-limit headers, added later, become metadata too). Its status keeps
//! the refusal's meaning ([`grpc_code`], again without a catch-all arm),
//! and a limit tells a retry policy when to try again
//! (`grpc-retry-pushback-ms`, gRFC A6). The access log and the metrics
//! keep the HTTP status of the refusal.
//!
//! A refusal to a native HTTP/1.1 connection's request ([`late`]) has the
//! same status, body and fields, its fields written as text for that
//! connection's writer rather than inserted into a header map (the 429
//! of a deny path is answered many times a second, and its map was a
//! good part of its cost).

use http::header::{
    CONNECTION, CONTENT_TYPE, HeaderName, HeaderValue, RETRY_AFTER, WWW_AUTHENTICATE,
};
use http::{Response, StatusCode};
use http_body_util::Either;

use crate::grpc::{self, Code};
use crate::http1::write::LateFields;
use crate::problem::{GatewayError, PROBLEM_JSON};
use crate::proxy::{Body, Local};

/// The answer to a request refused with `err`: its problem+json body
/// names the request's id when it has one; `grpc` is the kind of gRPC call
/// the request is, if it is one.
pub fn response(
    err: &GatewayError,
    request_id: Option<&HeaderValue>,
    grpc: Option<grpc::Kind>,
) -> Response<Body> {
    let mut res = match grpc {
        None => {
            let body = err.problem_with_id(request_id);
            let mut res = Response::new(Either::Right(Local::new(body)));
            *res.status_mut() = err.status();
            res.headers_mut().insert(CONTENT_TYPE, PROBLEM_JSON.clone());
            res
        }
        // Out of line: gRPC refusals are rare beside HTTP ones.
        Some(kind) => trailers_only(err, kind),
    };
    let headers = res.headers_mut();
    kind_fields(err, |name, value| {
        headers.insert(name, value);
    });
    res
}

/// The answer to a request refused with `err`, not a gRPC call, for a
/// native HTTP/1.1 connection's writer: [`response`]'s status, body and
/// fields, the fields as [`LateFields`] carried by its body, for the
/// caller to add to (the rate-limit fields, the request id), rather than
/// in its header map.
pub fn late(err: &GatewayError, request_id: Option<&HeaderValue>) -> Response<Local> {
    let body = err.problem_with_id(request_id);
    let mut fields = LateFields::default();
    fields.push_line(PROBLEM_JSON_LINE);
    match err {
        // [`kind_fields`]' Retry-After, written as a number without a
        // value made for it first.
        GatewayError::Limited {
            retry_after: Some(secs),
            ..
        } => fields.push_number(&RETRY_AFTER, *secs),
        _ => kind_fields(err, |name, value| fields.push(&name, &value)),
    }
    let mut res = Response::new(Local::with_fields(body, fields));
    *res.status_mut() = err.status();
    res
}

/// The `Content-Type` of a problem body as a field line.
const PROBLEM_JSON_LINE: &str = "content-type: application/problem+json\r\n";

/// The fields that belong to the kind of refusal `err` is, each given to
/// `put`.
fn kind_fields(err: &GatewayError, mut put: impl FnMut(HeaderName, HeaderValue)) {
    match err {
        GatewayError::Limited {
            retry_after: Some(secs),
            ..
        } => put(RETRY_AFTER, seconds(*secs)),
        // A request that can never be admitted gets no Retry-After: there
        // is no time after which it would be.
        GatewayError::Limited {
            retry_after: None, ..
        } => {}
        // RFC 9110 §11.6.1: a 401 names the scheme that would be accepted.
        GatewayError::UnknownApiKey => put(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer")),
        // The framing of the request is in doubt (RFC 9112 §6.1), or its
        // body was not read to its end: the connection cannot carry another
        // request.
        GatewayError::BadRequest(_)
        | GatewayError::PayloadTooLarge(_)
        | GatewayError::HeaderTooLarge { .. }
        | GatewayError::UriTooLong { .. }
        | GatewayError::BadRequestBody(_)
        | GatewayError::ClientAborted(_) => put(CONNECTION, HeaderValue::from_static("close")),
        // Well-framed requests: the connection stays usable.
        GatewayError::BadTarget(_)
        | GatewayError::NoRoute { .. }
        | GatewayError::UpstreamConnect(_)
        | GatewayError::UpstreamTimeout(_)
        | GatewayError::DeadlineExceeded(_)
        | GatewayError::UpstreamFailed(_)
        | GatewayError::StoreUnavailable => {}
    }
}

/// A number of seconds as a header value. Digits only, so always valid;
/// copied from the stack in one allocation (`HeaderValue::from(u64)`
/// writes into a growable buffer and takes a second one when it is frozen).
fn seconds(secs: u64) -> HeaderValue {
    HeaderValue::from_bytes(itoa::Buffer::new().format(secs).as_bytes())
        .unwrap_or_else(|_| HeaderValue::from(secs))
}

/// The Trailers-Only answer to a gRPC call refused with `err`.
#[inline(never)]
fn trailers_only(err: &GatewayError, kind: grpc::Kind) -> Response<Body> {
    let mut res = Response::new(Either::Right(Local::default()));
    *res.status_mut() = StatusCode::OK;
    let headers = res.headers_mut();
    headers.insert(CONTENT_TYPE, kind.content_type());
    headers.insert(grpc::GRPC_STATUS.clone(), grpc_code(err).header_value());
    headers.insert(grpc::GRPC_MESSAGE.clone(), grpc::message(&err.detail()));
    if let GatewayError::Limited {
        retry_after,
        in_flight,
        ..
    } = err
    {
        let pushback = match (retry_after, in_flight) {
            // A slot frees when another call ends, which nothing predicts:
            // the client's own backoff decides.
            (_, true) => None,
            (Some(secs), false) => Some(HeaderValue::from(secs.saturating_mul(1000))),
            // Never admissible: a negative pushback stops the retries.
            (None, false) => Some(HeaderValue::from_static("-1")),
        };
        if let Some(ms) = pushback {
            headers.insert(grpc::GRPC_RETRY_PUSHBACK_MS.clone(), ms);
        }
    }
    res
}

/// The gRPC status that keeps a refusal's meaning. Except for limits, sizes
/// and the caller's deadline, this is gRPC's own mapping of HTTP statuses
/// (`http-grpc-status-mapping.md`); docs/proxying.md has the table and
/// says where it differs.
pub fn grpc_code(err: &GatewayError) -> Code {
    match err {
        // 429: a quota, not an outage (the mapping document's UNAVAILABLE
        // would be retried at once by retry policies).
        GatewayError::Limited { .. } => Code::ResourceExhausted,
        // 413: gRPC's own answer to a message over its size limit.
        GatewayError::PayloadTooLarge(_) => Code::ResourceExhausted,
        // 414, 431: a head this gateway never takes, whatever its state;
        // not worth a retry (the mapping document says UNKNOWN).
        GatewayError::HeaderTooLarge { .. } | GatewayError::UriTooLong { .. } => {
            Code::InvalidArgument
        }
        // 400: the mapping document's INTERNAL, a request the transport
        // could not carry.
        GatewayError::BadRequest(_)
        | GatewayError::BadTarget(_)
        | GatewayError::BadRequestBody(_)
        | GatewayError::ClientAborted(_) => Code::Internal,
        GatewayError::UnknownApiKey => Code::Unauthenticated,
        GatewayError::NoRoute { .. } => Code::Unimplemented,
        GatewayError::UpstreamConnect(_)
        | GatewayError::UpstreamFailed(_)
        | GatewayError::UpstreamTimeout(_)
        | GatewayError::StoreUnavailable => Code::Unavailable,
        GatewayError::DeadlineExceeded(_) => Code::DeadlineExceeded,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_limited_call_is_resource_exhausted_with_pushback() {
        let err = GatewayError::Limited {
            policies: vec!["per_second".into()],
            retry_after: Some(2),
            in_flight: false,
        };
        let res = response(&err, None, Some(grpc::Kind::Grpc));
        assert_eq!(res.status(), StatusCode::OK);
        let h = res.headers();
        assert_eq!(h["content-type"], "application/grpc");
        assert_eq!(h["grpc-status"], "8");
        assert_eq!(h["grpc-retry-pushback-ms"], "2000");
        assert_eq!(h["retry-after"], "2");
        assert_eq!(
            h["grpc-message"],
            "Rate limit exceeded for per_second; retry in 2 s"
        );

        let never = GatewayError::Limited {
            policies: vec!["big".into()],
            retry_after: None,
            in_flight: false,
        };
        let res = response(&never, None, Some(grpc::Kind::Web));
        assert_eq!(res.headers()["grpc-retry-pushback-ms"], "-1");
        assert_eq!(res.headers()["content-type"], "application/grpc-web");

        let busy = GatewayError::Limited {
            policies: vec!["slots".into()],
            retry_after: None,
            in_flight: true,
        };
        let res = response(&busy, None, Some(grpc::Kind::Grpc));
        assert!(!res.headers().contains_key("grpc-retry-pushback-ms"));
    }

    #[test]
    fn late_fields_are_the_map_fields_as_text() {
        for err in [
            GatewayError::Limited {
                policies: vec!["per_ip".into()],
                retry_after: Some(7),
                in_flight: false,
            },
            GatewayError::UnknownApiKey,
            GatewayError::BadRequest("x".into()),
        ] {
            let res = response(&err, None, None);
            let mut text = Vec::new();
            for (name, value) in res.headers() {
                text.extend_from_slice(format!("{name}: ").as_bytes());
                text.extend_from_slice(value.as_bytes());
                text.extend_from_slice(b"\r\n");
            }
            let late_res = late(&err, None);
            assert_eq!(late_res.body().fields().as_bytes(), &text[..], "{err}");
            assert_eq!(late_res.status(), res.status());
        }
    }

    #[test]
    fn http_statuses_keep_their_meaning() {
        let d = std::time::Duration::from_secs(1);
        for (err, code) in [
            (GatewayError::UnknownApiKey, Code::Unauthenticated),
            (
                GatewayError::NoRoute {
                    method: "POST".into(),
                    path: "/x.Y/Z".into(),
                },
                Code::Unimplemented,
            ),
            (GatewayError::UpstreamConnect("x".into()), Code::Unavailable),
            (GatewayError::UpstreamTimeout(d), Code::Unavailable),
            (GatewayError::StoreUnavailable, Code::Unavailable),
            (GatewayError::DeadlineExceeded(d), Code::DeadlineExceeded),
            (GatewayError::PayloadTooLarge(10), Code::ResourceExhausted),
            (GatewayError::BadRequest("x".into()), Code::Internal),
        ] {
            let res = response(&err, None, Some(grpc::Kind::Grpc));
            assert_eq!(res.status(), StatusCode::OK, "{err}");
            assert_eq!(res.headers()["grpc-status"], code.header_value(), "{err}");
            let plain = response(&err, None, None);
            assert_eq!(plain.status(), err.status());
            assert_eq!(plain.headers()["content-type"], "application/problem+json");
        }
    }
}
