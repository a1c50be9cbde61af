//! Browsers and support: CORS preflights answered before identity and
//! limits, the CORS policy on every response, request ids, and header
//! rules — through real gateways and upstreams on free loopback ports, and
//! a real headless Chromium (`browsers/chromium.rs`); and the operators'
//! console driven in Chromium over the DevTools protocol
//! (`browsers/console.rs`, with the driver in `browsers/cdp.rs`).

#[path = "support/mod.rs"]
mod support;

#[path = "browsers/chromium.rs"]
mod chromium;

#[path = "browsers/cdp.rs"]
mod cdp;

#[path = "browsers/console.rs"]
mod console;

use std::net::IpAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::Full;
use tollgate::logs::AccessWriter;

use support::gateway::{Captured, Gateway, Reply, Upstream, get, send, send_from};

const APP: &str = "https://app.example.com";

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn preflight(path: &str, origin: &str, method: &str) -> Request<Full<Bytes>> {
    Request::builder()
        .method(Method::OPTIONS)
        .uri(path)
        .header("host", "gateway.test")
        .header("origin", origin)
        .header("access-control-request-method", method)
        .header("access-control-request-headers", "x-api-key")
        .body(Full::new(Bytes::new()))
        .unwrap()
}

fn post(path: &str, headers: &[(&str, &str)]) -> Request<Full<Bytes>> {
    let mut b = Request::builder()
        .method(Method::POST)
        .uri(path)
        .header("host", "gateway.test");
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(Full::new(Bytes::new())).unwrap()
}

/// Two routes on one path: POST with a CORS policy and a limit of 1 per
/// API key, GET without a policy.
fn two_routes(up: &Upstream) -> String {
    format!(
        r#"
listen: 127.0.0.1:0
routes:
  - name: writes
    match: {{ path_prefix: /api/, methods: [POST] }}
    upstream: {up}
    cors:
      allow_origins: [ "{APP}" ]
      allow_headers: [ x-api-key ]
      max_age: 10m
    limits: [ {{ name: per_key, key: api_key, limit: 1, window: 1h }} ]
  - name: reads
    match: {{ path_prefix: /api/, methods: [GET] }}
    upstream: {up}
"#,
        up = up.url()
    )
}

#[tokio::test]
async fn preflights_are_routed_by_the_method_they_ask_for_and_never_counted() {
    let up = Upstream::start().await;
    let gw = Gateway::start(&two_routes(&up)).await;
    // More preflights than the limit: all answered by the gateway.
    for _ in 0..5 {
        let r = send(gw.addr, preflight("/api/items", APP, "POST")).await;
        assert_eq!(r.status, StatusCode::NO_CONTENT);
        assert_eq!(r.header("access-control-allow-origin"), Some(APP));
        // The route's methods, as `allow_methods` is not written.
        assert_eq!(r.header("access-control-allow-methods"), Some("POST"));
        assert_eq!(r.header("access-control-allow-headers"), Some("x-api-key"));
        assert_eq!(r.header("access-control-max-age"), Some("600"));
        assert_eq!(r.header("vary"), Some("origin"));
        assert!(
            r.header("ratelimit").is_none(),
            "a preflight is not counted"
        );
        assert!(r.header("x-request-id").is_some());
    }
    assert_eq!(up.count(), 0, "preflights are never forwarded");
    // The limit of 1 is still whole.
    let key = [("x-api-key", "k1"), ("origin", APP)];
    assert_eq!(
        send(gw.addr, post("/api/items", &key)).await.status,
        StatusCode::OK
    );
    let r = send(gw.addr, post("/api/items", &key)).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    // A preflight for GET goes to the route that takes GET, which has no
    // policy: it is an ordinary OPTIONS, and no route takes OPTIONS.
    let r = send(gw.addr, preflight("/api/items", APP, "GET")).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert!(r.header("access-control-allow-origin").is_none());
    assert_eq!(up.count(), 1);
}

#[tokio::test]
async fn origins_not_listed_get_no_cors_headers() {
    let up = Upstream::start().await;
    let gw = Gateway::start(&two_routes(&up)).await;
    let r = send(
        gw.addr,
        preflight("/api/items", "https://evil.example", "POST"),
    )
    .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    assert!(r.header("access-control-allow-origin").is_none());
    assert!(r.header("access-control-allow-methods").is_none());
    assert_eq!(up.count(), 0);
    let r = send(
        gw.addr,
        post(
            "/api/items",
            &[("x-api-key", "k1"), ("origin", "https://evil.example")],
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(r.header("access-control-allow-origin").is_none());
    assert!(r.header("access-control-expose-headers").is_none());
    assert_eq!(r.header("vary"), Some("origin"));
}

#[tokio::test]
async fn the_policy_replaces_the_upstreams_cors_headers() {
    let up = Upstream::start().await;
    // The upstream's `/cors` answers with CORS headers of its own.
    let yaml = two_routes(&up).replace(
        "path_prefix: /api/, methods: [POST]",
        "path: /cors, methods: [POST]",
    );
    let gw = Gateway::start(&yaml).await;
    let r = send(
        gw.addr,
        post("/cors", &[("origin", APP), ("x-api-key", "k")]),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(
        r.headers
            .get_all("access-control-allow-origin")
            .iter()
            .count(),
        1
    );
    assert_eq!(r.header("access-control-allow-origin"), Some(APP));
    assert!(r.header("access-control-allow-credentials").is_none());
    assert_eq!(
        r.header("access-control-expose-headers"),
        Some("ratelimit, ratelimit-policy, retry-after, x-request-id")
    );
    // Without an allowed origin the upstream's are removed all the same.
    let r = send(gw.addr, post("/cors", &[("x-api-key", "k2")])).await;
    assert!(r.header("access-control-allow-origin").is_none());
    assert!(r.header("access-control-expose-headers").is_none());
}

#[tokio::test]
async fn the_gateways_own_refusals_carry_the_policy() {
    let up = Upstream::start().await;
    // Redis on a port nothing listens on: `on_error: deny` answers 503.
    let closed = support::gateway::free_port();
    let yaml = format!(
        r#"
listen: 127.0.0.1:0
headers: github
cors:
  allow_origins: [ "{APP}" ]
  allow_credentials: true
  expose_headers: [ x-trace ]
plans: {{ free: [ {{ name: per_hour, limit: 1, window: 1h }} ] }}
api_keys: {{ keys: {{ k1: free }}, unknown: reject }}
store: {{ redis: {{ url: "redis://127.0.0.1:{closed}", timeout: 20ms }}, on_error: local }}
routes:
  - name: limited
    match: {{ path: /limited }}
    upstream: {up}
    limits: [ {{ name: per_ip, key: ip, limit: 1, window: 1h }} ]
  - name: keyed
    match: {{ path: /keyed }}
    upstream: {up}
    limits: [ {{ name: plan, key: api_key, plan: true }} ]
  - name: forbidden
    match: {{ path: /forbidden }}
    respond: {{ status: 403 }}
  - name: closed
    match: {{ path: /closed }}
    upstream: {up}
    on_error: deny
    limits: [ {{ name: per_ip, key: ip, limit: 5, window: 1h }} ]
"#,
        up = up.url()
    );
    let gw = Gateway::start(&yaml).await;
    let origin = [("origin", APP)];
    assert_eq!(
        send(gw.addr, get("/limited", &origin)).await.status,
        StatusCode::OK
    );
    let cases: [(&str, StatusCode); 5] = [
        ("/limited", StatusCode::TOO_MANY_REQUESTS),
        ("/keyed", StatusCode::UNAUTHORIZED),
        ("/forbidden", StatusCode::FORBIDDEN),
        ("/closed", StatusCode::SERVICE_UNAVAILABLE),
        ("/nowhere", StatusCode::NOT_FOUND),
    ];
    for (path, status) in cases {
        let r = send(gw.addr, get(path, &origin)).await;
        assert_eq!(r.status, status, "{path}");
        assert_eq!(r.header("access-control-allow-origin"), Some(APP), "{path}");
        assert_eq!(
            r.header("access-control-allow-credentials"),
            Some("true"),
            "{path}"
        );
        assert_eq!(
            r.header("access-control-expose-headers"),
            Some(
                "x-ratelimit-limit, x-ratelimit-remaining, x-ratelimit-used, x-ratelimit-reset, x-ratelimit-resource, retry-after, x-request-id, x-trace"
            ),
            "{path}"
        );
        assert_eq!(r.header("vary"), Some("origin"), "{path}");
    }
}

#[test]
fn check_refuses_a_wildcard_with_credentials_and_rules_on_owned_names() {
    let yaml = r#"listen: 127.0.0.1:0
cors:
  allow_origins: "*"
  allow_credentials: true
request_headers:
  set: { host: a.example, "bad name": x, x-ok: "line\nbreak" }
  remove: [ x-forwarded-for, x-api-key ]
routes:
  - name: api
    match: { path_prefix: /api/ }
    upstream: http://127.0.0.1:9000
    cors: { allow_origins: [ "https://app.example.com/" ] }
    response_headers: { set: { access-control-allow-origin: "*" }, add: { x-request-id: a, connection: close, retry-after: "1" } }
    request_headers: { remove: [ x-user, te ] }
"#;
    let errors = tollgate::config::load::parse_str(yaml)
        .unwrap_err()
        .to_string();
    for want in [
        "cors.allow_credentials: true cannot go with allow_origins \"*\": browsers refuse credentials from a wildcard origin; list the origins instead (line 4, col 22)",
        "request_headers.set.host: host is owned by the gateway",
        "(line 6, col 10)",
        "request_headers.set.bad name: \"bad name\" is not a header name",
        "request_headers.set.x-ok: \"line\\nbreak\" is not a valid header value",
        "request_headers.remove[0]: x-forwarded-for is set by the gateway (X-Forwarded-*); a rule may not change it (line 7, col 13)",
        "request_headers.remove[1]: x-api-key is owned by the gateway",
        "routes[0].cors.allow_origins[0]: \"https://app.example.com/\" ends with /",
        "routes[0].response_headers.set.access-control-allow-origin: access-control-allow-origin is a CORS header; write the route's cors: instead",
        "routes[0].response_headers.add.x-request-id: x-request-id is the request-id header",
        "routes[0].response_headers.add.connection: connection is owned",
        "routes[0].response_headers.add.retry-after: retry-after is owned",
        "routes[0].request_headers.remove[0]: x-user is owned",
        "routes[0].request_headers.remove[1]: te is owned",
    ] {
        assert!(errors.contains(want), "missing {want:?} in:\n{errors}");
    }
    assert_eq!(errors.lines().count(), 13, "{errors}");
}

#[tokio::test]
async fn request_ids_are_made_kept_from_trusted_peers_bounded_and_everywhere() {
    let up = Upstream::start().await;
    let yaml = format!(
        r#"
listen: 127.0.0.1:0
client_ip: {{ trusted_proxies: [ 127.0.0.1/32 ] }}
routes:
  - name: api
    match: {{ path_prefix: /api/ }}
    upstream: {up}
    limits: [ {{ name: per_ip, key: ip, limit: 100, window: 1h }} ]
  - name: demo
    match: {{ path: /demo }}
    respond: {{ body: hi }}
    limits: [ {{ name: demo, key: ip, limit: 1, window: 1h }} ]
"#,
        up = up.url()
    );
    let captured = Captured::default();
    let (writer, flushed) = tollgate::logs::queue(captured.clone());
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter("tollgate::access=info")
        .finish();
    let mut ids = Vec::new();
    {
        let _guard = tracing::subscriber::set_default(subscriber);
        let gw = Gateway::start_logging(
            &yaml,
            Arc::new(tollgate::clock::SystemClock),
            Some(AccessWriter::new(writer, true)),
        )
        .await;
        // Made: a UUIDv7, sent upstream and answered.
        let r = send_from(ip("127.0.0.2"), gw.addr, get("/api/a", &[])).await;
        let made = r.header("x-request-id").unwrap().to_owned();
        assert_eq!(made.len(), 36, "{made}");
        assert_eq!(&made[14..15], "7", "version 7: {made}");
        assert_eq!(up.last().headers["x-request-id"], made.as_str());
        ids.push(made.clone());
        // Kept from a trusted proxy.
        let r = send_from(
            ip("127.0.0.1"),
            gw.addr,
            get("/api/a", &[("x-request-id", "lb-42")]),
        )
        .await;
        assert_eq!(r.header("x-request-id"), Some("lb-42"));
        assert_eq!(up.last().headers["x-request-id"], "lb-42");
        ids.push("lb-42".to_owned());
        // Replaced from any other peer.
        let r = send_from(
            ip("127.0.0.2"),
            gw.addr,
            get("/api/a", &[("x-request-id", "spoofed")]),
        )
        .await;
        let replaced = r.header("x-request-id").unwrap().to_owned();
        assert_ne!(replaced, "spoofed");
        assert_eq!(up.last().headers["x-request-id"], replaced.as_str());
        ids.push(replaced);
        // Bounded: 129 characters, or one that is not visible ASCII, from
        // a trusted proxy too.
        for bad in ["a".repeat(129), "tab\there".to_owned()] {
            let r = send_from(
                ip("127.0.0.1"),
                gw.addr,
                get("/api/a", &[("x-request-id", &bad)]),
            )
            .await;
            let id = r.header("x-request-id").unwrap().to_owned();
            assert_ne!(id, bad);
            assert_eq!(id.len(), 36);
            ids.push(id);
        }
        let r = send_from(
            ip("127.0.0.1"),
            gw.addr,
            get("/api/a", &[("x-request-id", &"b".repeat(128))]),
        )
        .await;
        assert_eq!(r.header("x-request-id"), Some("b".repeat(128).as_str()));
        ids.push("b".repeat(128));
        // In the problem+json bodies the gateway writes.
        assert_eq!(
            send(gw.addr, get("/demo", &[])).await.status,
            StatusCode::OK
        );
        let r: Reply = send(gw.addr, get("/demo", &[])).await;
        assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
        let body: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(body["request_id"], r.header("x-request-id").unwrap());
        assert_eq!(body["status"], 429);
        let r = send(gw.addr, get("/nowhere", &[("x-request-id", "lb-404")])).await;
        let body: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(body["request_id"], "lb-404");
        assert_eq!(r.header("x-request-id"), Some("lb-404"));
        gw.stop().await;
    }
    drop(flushed);
    let log = captured.text();
    let logged: Vec<String> = log
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            v["fields"]["request_id"].as_str().unwrap_or("").to_owned()
        })
        .collect();
    assert_eq!(logged.len(), ids.len() + 3, "{log}");
    assert_eq!(logged[..ids.len()], ids[..]);
    assert_eq!(logged.last().map(String::as_str), Some("lb-404"));
}

#[tokio::test]
async fn header_rules_on_the_forwarded_request_and_on_every_response() {
    let up = Upstream::start().await;
    let yaml = format!(
        r#"
listen: 127.0.0.1:0
request_headers: {{ set: {{ x-gateway: tollgate }}, remove: [ x-internal ] }}
response_headers: {{ set: {{ x-served-by: tollgate }}, remove: [ server, x-debug ] }}
routes:
  - name: cors
    match: {{ path: /cors }}
    upstream: {up}
  - name: own
    match: {{ path: /own }}
    upstream: {up}
    request_headers: {{ add: {{ via: 1.1 tollgate }} }}
    response_headers: {{ add: {{ x-route: own }} }}
  - name: demo
    match: {{ path: /demo }}
    respond: {{ body: hi }}
    limits: [ {{ name: demo, key: ip, limit: 1, window: 1h }} ]
"#,
        up = up.url()
    );
    let gw = Gateway::start(&yaml).await;
    let r = send(
        gw.addr,
        get(
            "/cors",
            &[("x-internal", "secret"), ("x-gateway", "client")],
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    let seen = up.last();
    assert!(!seen.headers.contains_key("x-internal"));
    assert_eq!(
        seen.headers.get_all("x-gateway").iter().collect::<Vec<_>>(),
        ["tollgate"]
    );
    assert!(r.header("server").is_none());
    assert!(r.header("x-debug").is_none());
    assert_eq!(r.header("x-served-by"), Some("tollgate"));
    // A route's own rules replace the top level's.
    let r = send(
        gw.addr,
        get("/own", &[("x-internal", "kept"), ("via", "1.1 cdn")]),
    )
    .await;
    let seen = up.last();
    assert_eq!(seen.headers["x-internal"], "kept");
    assert!(!seen.headers.contains_key("x-gateway"));
    assert_eq!(
        seen.headers.get_all("via").iter().collect::<Vec<_>>(),
        ["1.1 cdn", "1.1 tollgate"]
    );
    assert_eq!(r.header("x-route"), Some("own"));
    assert!(r.header("x-served-by").is_none());
    // The gateway's own answers: a local one, its 429, its 404.
    for (path, status) in [
        ("/demo", StatusCode::OK),
        ("/demo", StatusCode::TOO_MANY_REQUESTS),
        ("/nowhere", StatusCode::NOT_FOUND),
    ] {
        let r = send(gw.addr, get(path, &[])).await;
        assert_eq!(r.status, status);
        assert_eq!(r.header("x-served-by"), Some("tollgate"), "{path} {status}");
    }
}
