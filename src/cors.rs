//! CORS (the Fetch standard's CORS protocol) for routes with a `cors:`
//! policy.
//!
//! A preflight — `OPTIONS` with `Origin` and `Access-Control-Request-Method`
//! — asks whether the request it announces may be sent. The pipeline routes
//! it by the method it announces, and when that route has a policy,
//! [`preflight`] answers it: before identity and limits, so it is never
//! counted (a browser sends one before a page's first call with a new API
//! key, and that call must not be refused for it) and never forwarded.
//!
//! Every other response of a route with a policy goes through [`decorate`]
//! where it leaves the gateway, whoever made it — the upstream, or the
//! gateway's own 429, 401, 403, 503: the upstream's `Access-Control-*`
//! headers are removed, so the policy is the only one a browser reads, and
//! an allowed origin gets `Access-Control-Allow-Origin` and the exposed
//! headers (the rate-limit headers of the configured style, `Retry-After`
//! and the request-id header, so a page can read why it was refused and
//! what to quote to support). `Vary: Origin` goes on every such response:
//! what it carries depends on `Origin`.

use http::header::{
    ACCESS_CONTROL_ALLOW_CREDENTIALS, ACCESS_CONTROL_ALLOW_HEADERS, ACCESS_CONTROL_ALLOW_METHODS,
    ACCESS_CONTROL_ALLOW_ORIGIN, ACCESS_CONTROL_EXPOSE_HEADERS, ACCESS_CONTROL_MAX_AGE,
    ACCESS_CONTROL_REQUEST_HEADERS, ACCESS_CONTROL_REQUEST_METHOD, ORIGIN, VARY,
};
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::Either;

use crate::config::{Cors, CorsOrigins};
use crate::proxy::{Body, Local};

static ORIGIN_VALUE: HeaderValue = HeaderValue::from_static("origin");
static ANY: HeaderValue = HeaderValue::from_static("*");
static TRUE: HeaderValue = HeaderValue::from_static("true");

/// The method a preflight announces, when `req` is one: `OPTIONS` with
/// `Origin` and a valid `Access-Control-Request-Method`.
pub fn preflight_method<B>(req: &Request<B>) -> Option<Method> {
    if req.method() != Method::OPTIONS || !req.headers().contains_key(ORIGIN) {
        return None;
    }
    let asked = req.headers().get(ACCESS_CONTROL_REQUEST_METHOD)?;
    Method::from_bytes(asked.as_bytes()).ok()
}

/// Marks a response as the gateway's answer to a preflight, which
/// [`decorate`] leaves as it is.
#[derive(Debug, Clone, Copy)]
pub struct Preflight;

/// The gateway's answer to a preflight under `policy`: `204 No Content`,
/// with the CORS headers when its `Origin` is allowed and none when it is
/// not (the browser then refuses the call). Marked [`Preflight`].
pub fn preflight(policy: &Cors, headers: &HeaderMap) -> Response<Body> {
    let mut res = Response::new(Either::Right(Local::default()));
    *res.status_mut() = StatusCode::NO_CONTENT;
    res.extensions_mut().insert(Preflight);
    let out = res.headers_mut();
    out.insert(VARY, ORIGIN_VALUE.clone());
    let Some(allowed) = allowed_origin(policy, headers.get(ORIGIN)) else {
        return res;
    };
    out.insert(ACCESS_CONTROL_ALLOW_ORIGIN, allowed);
    out.insert(ACCESS_CONTROL_ALLOW_METHODS, policy.allow_methods.clone());
    let allow_headers = match &policy.allow_headers {
        Some(h) => Some(h.clone()),
        // No list configured: the headers the browser asks for, as Kong
        // and Envoy allow them by default.
        None => headers.get(ACCESS_CONTROL_REQUEST_HEADERS).cloned(),
    };
    if let Some(h) = allow_headers.filter(|h| !h.is_empty()) {
        out.insert(ACCESS_CONTROL_ALLOW_HEADERS, h);
    }
    if let Some(age) = &policy.max_age {
        out.insert(ACCESS_CONTROL_MAX_AGE, age.clone());
    }
    if policy.allow_credentials {
        out.insert(ACCESS_CONTROL_ALLOW_CREDENTIALS, TRUE.clone());
    }
    res
}

/// Applies `policy` to a response leaving for a request from `origin`:
/// the upstream's CORS headers replaced by the policy's, `Vary: Origin`
/// added.
pub fn decorate(policy: &Cors, origin: Option<&HeaderValue>, headers: &mut HeaderMap) {
    remove_cors_headers(headers);
    add_vary_origin(headers);
    let Some(allowed) = allowed_origin(policy, origin) else {
        return;
    };
    headers.insert(ACCESS_CONTROL_ALLOW_ORIGIN, allowed);
    if policy.allow_credentials {
        headers.insert(ACCESS_CONTROL_ALLOW_CREDENTIALS, TRUE.clone());
    }
    headers.insert(ACCESS_CONTROL_EXPOSE_HEADERS, policy.expose_headers.clone());
}

/// The `Access-Control-Allow-Origin` value for `origin`, if it is allowed.
fn allowed_origin(policy: &Cors, origin: Option<&HeaderValue>) -> Option<HeaderValue> {
    match &policy.origins {
        // Without credentials a wildcard is the answer browsers cache best;
        // with them the loader refuses `*`.
        CorsOrigins::Any => Some(ANY.clone()),
        CorsOrigins::List(list) => {
            let origin = origin?;
            list.iter()
                .any(|o| o.as_bytes().eq_ignore_ascii_case(origin.as_bytes()))
                .then(|| origin.clone())
        }
    }
}

/// Removes every `Access-Control-*` header.
fn remove_cors_headers(headers: &mut HeaderMap) {
    let names: Vec<HeaderName> = headers
        .keys()
        .filter(|k| k.as_str().starts_with("access-control-"))
        .cloned()
        .collect();
    for n in names {
        headers.remove(n);
    }
}

/// Adds `Origin` to `Vary` unless it is there already.
fn add_vary_origin(headers: &mut HeaderMap) {
    let listed = headers.get_all(VARY).iter().any(|v| {
        v.as_bytes()
            .split(|&b| b == b',')
            .map(<[u8]>::trim_ascii)
            .any(|t| t == b"*" || t.eq_ignore_ascii_case(b"origin"))
    });
    if !listed {
        headers.append(VARY, ORIGIN_VALUE.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(origins: CorsOrigins) -> Cors {
        Cors {
            origins,
            allow_credentials: false,
            allow_methods: HeaderValue::from_static("GET, POST"),
            allow_headers: None,
            expose_headers: HeaderValue::from_static(
                "ratelimit, ratelimit-policy, retry-after, x-request-id",
            ),
            max_age: Some(HeaderValue::from(600)),
        }
    }

    #[test]
    fn upstream_cors_headers_are_replaced_and_vary_kept_once() {
        let p = policy(CorsOrigins::List(vec!["https://app.example.com".into()]));
        let mut h = HeaderMap::new();
        h.insert(ACCESS_CONTROL_ALLOW_ORIGIN, ANY.clone());
        h.insert(ACCESS_CONTROL_ALLOW_CREDENTIALS, TRUE.clone());
        h.insert(VARY, HeaderValue::from_static("Accept-Encoding, Origin"));
        let origin = HeaderValue::from_static("https://app.example.com");
        decorate(&p, Some(&origin), &mut h);
        assert_eq!(h[ACCESS_CONTROL_ALLOW_ORIGIN], "https://app.example.com");
        assert!(!h.contains_key(ACCESS_CONTROL_ALLOW_CREDENTIALS));
        assert_eq!(h.get_all(VARY).iter().count(), 1);
        assert_eq!(
            h[ACCESS_CONTROL_EXPOSE_HEADERS],
            "ratelimit, ratelimit-policy, retry-after, x-request-id"
        );

        let mut h = HeaderMap::new();
        h.insert(ACCESS_CONTROL_ALLOW_ORIGIN, ANY.clone());
        let other = HeaderValue::from_static("https://evil.example");
        decorate(&p, Some(&other), &mut h);
        assert!(!h.contains_key(ACCESS_CONTROL_ALLOW_ORIGIN));
        assert_eq!(h[VARY], "origin");
    }

    #[test]
    fn preflights_are_recognised_by_their_headers() {
        let req = |m: Method, hs: &[(&str, &str)]| {
            let mut b = Request::builder().method(m).uri("/");
            for (k, v) in hs {
                b = b.header(*k, *v);
            }
            b.body(()).unwrap()
        };
        let both = [
            ("origin", "https://a.example"),
            ("access-control-request-method", "POST"),
        ];
        assert_eq!(
            preflight_method(&req(Method::OPTIONS, &both)),
            Some(Method::POST)
        );
        assert_eq!(preflight_method(&req(Method::GET, &both)), None);
        assert_eq!(preflight_method(&req(Method::OPTIONS, &both[..1])), None);
        assert_eq!(preflight_method(&req(Method::OPTIONS, &both[1..])), None);
    }

    #[test]
    fn wildcard_answers_any_origin_with_a_star() {
        let p = policy(CorsOrigins::Any);
        let mut h = HeaderMap::new();
        h.insert(ORIGIN, HeaderValue::from_static("https://x.example"));
        h.insert(
            ACCESS_CONTROL_REQUEST_HEADERS,
            HeaderValue::from_static("x-api-key"),
        );
        let res = preflight(&p, &h);
        assert_eq!(res.status(), StatusCode::NO_CONTENT);
        assert_eq!(res.headers()[ACCESS_CONTROL_ALLOW_ORIGIN], "*");
        assert_eq!(res.headers()[ACCESS_CONTROL_ALLOW_HEADERS], "x-api-key");
        assert_eq!(res.headers()[ACCESS_CONTROL_MAX_AGE], "600");
    }
}
