//! The headers a browser or a client sends that the gateway reads before
//! any limit: the request id it may keep, and the `Origin` and preflight
//! headers a CORS policy answers.
//!
//! The input is split at `\n` into a request id, an `Origin`, an
//! `Access-Control-Request-Headers` and an upstream's
//! `Access-Control-Allow-Origin`. Beyond "never panics": the id the
//! request leaves with is always well formed, and is the client's exactly
//! when the client's was; an origin is allowed only when it is one the
//! policy lists (ASCII case aside: schemes and hosts are case-insensitive),
//! it is answered as the browser spelled it, and no CORS header of the
//! upstream's survives the policy.
#![no_main]

use std::net::IpAddr;
use std::sync::{Arc, OnceLock};

use http::header::{ACCESS_CONTROL_ALLOW_ORIGIN, ORIGIN};
use http::{HeaderMap, HeaderName, HeaderValue};
use libfuzzer_sys::fuzz_target;
use tollgate::config::{Config, Cors};
use tollgate::{cors, request_id};

const FILE: &str = r#"
listen: 127.0.0.1:0
request_id: { header: x-request-id, keep_from: any }
routes:
  - name: api
    match: { path_prefix: / }
    respond: {}
    cors:
      allow_origins: [ "https://app.example.com", "http://localhost:3000" ]
      allow_credentials: true
"#;
const LISTED: [&[u8]; 2] = [b"https://app.example.com", b"http://localhost:3000"];

fn setup() -> &'static (Config, Arc<Cors>) {
    static SETUP: OnceLock<(Config, Arc<Cors>)> = OnceLock::new();
    SETUP.get_or_init(|| {
        let config = tollgate::config::load::parse_str(FILE).expect("the target's file loads");
        let policy = config.routes[0].cors.clone().expect("the route has a policy");
        (config, policy)
    })
}

fuzz_target!(|data: &[u8]| {
    let (config, policy) = setup();
    let mut parts = data.splitn(4, |&b| b == b'\n');
    let mut next = || parts.next().and_then(|v| HeaderValue::from_bytes(v).ok());
    let (id, origin, asked, upstream) = (next(), next(), next(), next());

    let mut headers = HeaderMap::new();
    if let Some(v) = &id {
        headers.insert(HeaderName::from_static("x-request-id"), v.clone());
    }
    let peer: IpAddr = "203.0.113.9".parse().expect("literal address");
    let kept = request_id::assign(&config.request_id, &[], peer, &mut headers);
    assert!(request_id::well_formed(kept.as_bytes()), "{kept:?}");
    let sent_ok = id.as_ref().is_some_and(|v| request_id::well_formed(v.as_bytes()));
    assert_eq!(sent_ok, id.as_ref() == Some(&kept), "{id:?} became {kept:?}");

    if let Some(o) = &origin {
        headers.insert(ORIGIN, o.clone());
    }
    if let Some(a) = asked {
        headers.insert(http::header::ACCESS_CONTROL_REQUEST_HEADERS, a);
    }
    let answer = cors::preflight(policy, &headers);
    let mut response = HeaderMap::new();
    if let Some(u) = upstream {
        response.insert(ACCESS_CONTROL_ALLOW_ORIGIN, u);
    }
    cors::decorate(policy, origin.as_ref(), &mut response);
    let listed = origin
        .as_ref()
        .is_some_and(|o| LISTED.iter().any(|l| l.eq_ignore_ascii_case(o.as_bytes())));
    for allowed in [answer.headers(), &response].map(|h| h.get(ACCESS_CONTROL_ALLOW_ORIGIN)) {
        assert_eq!(allowed.is_some(), listed, "{origin:?} -> {allowed:?}");
        if let Some(a) = allowed {
            assert_eq!(Some(a), origin.as_ref());
        }
    }
});
