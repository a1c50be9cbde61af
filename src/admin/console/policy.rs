//! The headers every answer of the console carries, and the page's
//! Content-Security-Policy.

use bytes::Bytes;
use http::Response;
use http::header::{CACHE_CONTROL, HeaderName, HeaderValue};
use http_body_util::Full;

/// The page's policy: everything from this origin, no inline script or
/// style, no plugins, no framing, no forms posting elsewhere.
pub const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
     connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// Headers every console answer carries: its policy, no sniffing, no
/// referrer, no caching.
pub fn guard(res: &mut Response<Full<Bytes>>, csp: &'static str) {
    let h = res.headers_mut();
    h.insert(
        HeaderName::from_static("content-security-policy"),
        HeaderValue::from_static(csp),
    );
    h.insert(
        HeaderName::from_static("x-content-type-options"),
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        HeaderName::from_static("referrer-policy"),
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
}
