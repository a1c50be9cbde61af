//! The answers the support API gives: JSON, and problem+json refusals
//! (a 400 names the field at fault).

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderValue};
use http::{Response, StatusCode};
use http_body_util::Full;

use super::request::BadField;
use crate::store::StoreError;

/// The digest of the token a request presented, for audit lines.
pub struct Who(pub String);

/// A problem+json answer; `field` names the input at fault.
pub fn problem(
    status: StatusCode,
    title: &str,
    detail: &str,
    field: Option<&str>,
) -> Response<Full<Bytes>> {
    let mut body = serde_json::json!({
        "type": "about:blank",
        "title": title,
        "status": status.as_u16(),
        "detail": detail,
    });
    if let Some(f) = field {
        body["field"] = f.into();
    }
    let mut res = Response::new(Full::new(Bytes::from(body.to_string())));
    *res.status_mut() = status;
    res.headers_mut()
        .insert(CONTENT_TYPE, crate::problem::PROBLEM_JSON.clone());
    res
}

/// 400 naming the field at fault.
pub fn bad_field(e: &BadField) -> Response<Full<Bytes>> {
    problem(
        StatusCode::BAD_REQUEST,
        "Bad Request",
        &e.to_string(),
        Some(&e.field),
    )
}

/// 503: the store could not answer.
pub fn store_failed(e: &StoreError) -> Response<Full<Bytes>> {
    problem(
        StatusCode::SERVICE_UNAVAILABLE,
        "Service Unavailable",
        &format!("the store cannot answer: {e}"),
        None,
    )
}

/// 200 with a JSON body.
pub fn json(body: &serde_json::Value) -> Response<Full<Bytes>> {
    let mut res = Response::new(Full::new(Bytes::from(body.to_string())));
    res.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    res
}
