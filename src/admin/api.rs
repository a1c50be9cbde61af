//! The support API on the admin listener: `/admin/callers` (one caller's
//! limits, read and reset) and `/admin/overrides` (per-caller numbers,
//! plans and exemptions), and the console's data (`/admin/console/…`). Every endpoint asks for
//! `Authorization: Bearer <admin token>`: a lookup by API key must not be
//! an open oracle on a listener that may face a network. Without a token
//! configured they answer 403 saying how to set one; a missing or wrong
//! token is 401. The token is compared as SHA-256 digests in constant time
//! (`subtle`), so neither its bytes nor its length leak through timing.
//!
//! Every refusal of input is a 400 `application/problem+json` naming the
//! field (`request`); every write is an audit line (target
//! `tollgate::audit`) with the token's digest, what changed, before and
//! after.

use bytes::Bytes;
use http::header::{AUTHORIZATION, HeaderValue, WWW_AUTHENTICATE};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::callers;
use super::overrides;
use super::reply::{Who, bad_field, problem};
use super::request::{BadField, MAX_BODY};
use crate::pipeline::Gateway;

/// Whether `path` is served here.
pub fn serves(path: &str) -> bool {
    matches!(path, "/admin/callers" | "/admin/overrides") || super::console::serves_data(path)
}

/// The answer to one request for [`serves`]'s paths.
pub async fn answer<B>(gw: &Gateway, req: Request<B>) -> Response<Full<Bytes>>
where
    B: http_body::Body,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let who = match authorize(gw, &req) {
        Ok(who) => who,
        Err(res) => return *res,
    };
    let query = req.uri().query().unwrap_or("").as_bytes().to_vec();
    let path = req.uri().path().to_owned();
    let method = req.method().clone();
    if super::console::serves_data(&path) {
        if method != Method::GET {
            return not_allowed("GET");
        }
        let query = String::from_utf8_lossy(&query).into_owned();
        return super::console::data(gw, &path, &query);
    }
    match (path.as_str(), &method) {
        ("/admin/callers", &Method::GET) => callers::show(gw, &query).await,
        ("/admin/callers", &Method::DELETE) => callers::reset(gw, &query, &who).await,
        ("/admin/overrides", &Method::GET) => overrides::list(gw),
        ("/admin/overrides", &Method::DELETE) => overrides::remove(gw, &query, &who).await,
        ("/admin/overrides", &Method::PUT) => {
            let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
                Ok(b) => b.to_bytes(),
                Err(e) => {
                    let detail = if e.is::<http_body_util::LengthLimitError>() {
                        format!("is over {} KiB", MAX_BODY / 1024)
                    } else {
                        format!("could not be read: {e}")
                    };
                    return bad_field(&BadField {
                        field: "body".into(),
                        detail,
                    });
                }
            };
            overrides::put(gw, &body, &who).await
        }
        ("/admin/callers", _) => not_allowed("GET, DELETE"),
        _ => not_allowed("GET, PUT, DELETE"),
    }
}

fn authorize<B>(gw: &Gateway, req: &Request<B>) -> Result<Who, Box<Response<Full<Bytes>>>> {
    let Some(token) = gw.with_config(|c| c.admin_token.clone()) else {
        return Err(Box::new(problem(
            StatusCode::FORBIDDEN,
            "Forbidden",
            "no admin token is configured; set admin: { addr, token_file } (or token) in the configuration and reload",
            None,
        )));
    };
    let given = req
        .headers()
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(str::trim);
    let Some(given) = given else {
        return Err(Box::new(unauthorized(
            "send Authorization: Bearer <admin token>",
        )));
    };
    let (a, b) = (
        Sha256::digest(given.as_bytes()),
        Sha256::digest(token.as_bytes()),
    );
    if bool::from(a.ct_eq(&b)) {
        Ok(Who(crate::identity::digest(given.as_bytes())))
    } else {
        Err(Box::new(unauthorized("the admin token is wrong")))
    }
}

fn unauthorized(detail: &str) -> Response<Full<Bytes>> {
    let mut res = problem(StatusCode::UNAUTHORIZED, "Unauthorized", detail, None);
    res.headers_mut()
        .insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    res
}

fn not_allowed(allow: &'static str) -> Response<Full<Bytes>> {
    let mut res = problem(
        StatusCode::METHOD_NOT_ALLOWED,
        "Method Not Allowed",
        &format!("use {allow}"),
        None,
    );
    res.headers_mut()
        .insert(http::header::ALLOW, HeaderValue::from_static(allow));
    res
}
