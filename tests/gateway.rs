//! End-to-end tests: real gateways (library API and the built binary), real
//! upstream servers and a real `redis-server`, all on free loopback ports.

#[path = "support/mod.rs"]
mod support;

#[path = "gateway/early.rs"]
mod early;

#[path = "gateway/parked.rs"]
mod parked;

#[path = "gateway/pending.rs"]
mod pending;

#[path = "gateway/refusals.rs"]
mod refusals;

use std::net::IpAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::Full;
use tollgate::clock::ManualClock;

use support::gateway::{Gateway, Reply, Upstream, free_port, get, send, send_from};
use support::redis::RedisServer;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// A fixed instant well inside a window, so no test straddles a boundary.
const T0: u64 = 1_800_000_000_000;

fn clock() -> Arc<ManualClock> {
    Arc::new(ManualClock::new(T0))
}

fn demo_yaml() -> String {
    r#"
listen: 127.0.0.1:0
routes:
  - name: demo
    match: { path_prefix: /demo }
    respond: { status: 200, body: "hello from tollgate\n" }
    limits: [ { name: demo, key: ip, limit: 5, window: 10s } ]
"#
    .to_owned()
}

#[tokio::test]
async fn demo_route_sends_headers_then_429_with_problem_json() {
    let clock = clock();
    let gw = Gateway::start_with_clock(&demo_yaml(), clock.clone()).await;
    for i in 0..5u64 {
        let r = send(gw.addr, get("/demo", &[])).await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.text(), "hello from tollgate\n");
        assert_eq!(r.header("ratelimit-policy"), Some(r#""demo";q=5;w=10"#));
        // Fully restored after the current window and the next: 2w − e.
        let want = format!(r#""demo";r={};t={}"#, 4 - i, 20 - i);
        assert_eq!(r.header("ratelimit"), Some(want.as_str()));
        clock.advance(1000);
    }
    let r = send(gw.addr, get("/demo", &[])).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.header("content-type"), Some("application/problem+json"));
    // All five in window [T0, T0+10s) at e = 5s: only crossing the boundary
    // (5 s) and decaying `prev` to 4 (another 2 s) admits: 7 s.
    assert_eq!(r.header("retry-after"), Some("7"));
    assert_eq!(r.header("ratelimit"), Some(r#""demo";r=0;t=7"#));
    // The body ends with the request's id, which the response names too.
    let id = r.header("x-request-id").expect("a request id");
    assert_eq!(
        r.text(),
        format!(
            r#"{{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","title":"Too Many Requests","status":429,"detail":"Rate limit exceeded for demo; retry in 7 s","violated-policies":["demo"],"request_id":"{id}"}}"#
        )
    );
    // One second early is still denied; exactly Retry-After later is admitted.
    clock.advance(6000);
    assert_eq!(
        send(gw.addr, get("/demo", &[])).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    clock.advance(1000);
    assert_eq!(
        send(gw.addr, get("/demo", &[])).await.status,
        StatusCode::OK
    );
}

#[tokio::test]
async fn unmatched_request_is_404_problem() {
    let gw = Gateway::start(&demo_yaml()).await;
    let r = send(gw.addr, get("/nowhere", &[])).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert_eq!(r.header("content-type"), Some("application/problem+json"));
    assert!(r.text().contains("\"status\":404"), "{}", r.text());
}

/// A gateway with one route limited to 1 request per hour by `key`.
async fn one_per_hour(key: &str, trusted: &str, clock: Arc<ManualClock>) -> (Gateway, Upstream) {
    let up = Upstream::start().await;
    let yaml = format!(
        r#"
listen: 127.0.0.1:0
client_ip: {{ trusted_proxies: {trusted}, ipv6_prefix: 64 }}
users: {{ header: x-user }}
routes:
  - name: r
    match: {{ path_prefix: / }}
    upstream: {up}
    limits: [ {{ name: one, key: {key}, limit: 1, window: 1h }} ]
"#,
        up = up.url()
    );
    (Gateway::start_with_clock(&yaml, clock).await, up)
}

async fn status_from(gw: &Gateway, from: &str, headers: &[(&str, &str)]) -> StatusCode {
    send_from(ip(from), gw.addr, get("/x", headers))
        .await
        .status
}

#[tokio::test]
async fn spoofed_forwarded_for_from_untrusted_peer_is_ignored() {
    let (gw, up) = one_per_hour("ip", "[]", clock()).await;
    assert_eq!(
        status_from(&gw, "127.0.0.2", &[("x-forwarded-for", "1.1.1.1")]).await,
        StatusCode::OK
    );
    // Same peer, another claimed client: still the same bucket.
    assert_eq!(
        status_from(&gw, "127.0.0.2", &[("x-forwarded-for", "2.2.2.2")]).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        status_from(&gw, "127.0.0.2", &[("forwarded", "for=3.3.3.3")]).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    // Another peer has its own bucket.
    assert_eq!(status_from(&gw, "127.0.0.3", &[]).await, StatusCode::OK);
    // The upstream sees only the real peer, not the spoofed chain.
    assert_eq!(up.last().headers["x-forwarded-for"], "127.0.0.3");
}

#[tokio::test]
async fn trusted_peer_rightmost_untrusted_address_is_the_client() {
    let (gw, up) = one_per_hour("ip", "[127.0.0.0/8, 10.0.0.0/8]", clock()).await;
    let ok = StatusCode::OK;
    let limited = StatusCode::TOO_MANY_REQUESTS;
    // The client forged the left part; the proxy at 10.0.0.2 appended 1.1.1.1.
    assert_eq!(
        status_from(
            &gw,
            "127.0.0.2",
            &[("x-forwarded-for", "6.6.6.6, 1.1.1.1, 10.0.0.2")]
        )
        .await,
        ok
    );
    assert_eq!(
        status_from(&gw, "127.0.0.2", &[("x-forwarded-for", "7.7.7.7, 1.1.1.1")]).await,
        limited
    );
    // Several header lines are one list.
    assert_eq!(
        status_from(
            &gw,
            "127.0.0.2",
            &[
                ("x-forwarded-for", "8.8.8.8"),
                ("x-forwarded-for", "1.1.1.1")
            ]
        )
        .await,
        limited
    );
    assert_eq!(
        status_from(&gw, "127.0.0.2", &[("x-forwarded-for", "1.1.1.2")]).await,
        ok
    );
    // The upstream sees the chain with the peer appended.
    assert_eq!(up.last().headers["x-forwarded-for"], "1.1.1.2, 127.0.0.2");
    // Garbage ends the walk: the hop to its right (here the peer) is used.
    assert_eq!(
        status_from(
            &gw,
            "127.0.0.5",
            &[("x-forwarded-for", "9.9.9.9, not-an-ip")]
        )
        .await,
        ok
    );
    assert_eq!(
        status_from(&gw, "127.0.0.5", &[("x-forwarded-for", "5.5.5.5, garbage")]).await,
        limited
    );
    // `Forwarded` with a quoted IPv6 address and port.
    let fwd = r#"for="[2001:db8:cafe::17]:4711";proto=https"#;
    assert_eq!(
        status_from(&gw, "127.0.0.2", &[("forwarded", fwd)]).await,
        ok
    );
    // Same /64, another address: same bucket.
    assert_eq!(
        status_from(
            &gw,
            "127.0.0.2",
            &[("x-forwarded-for", "2001:db8:cafe::99")]
        )
        .await,
        limited
    );
    // Another /64: its own bucket.
    assert_eq!(
        status_from(
            &gw,
            "127.0.0.2",
            &[("x-forwarded-for", "2001:db8:cafe:1::17")]
        )
        .await,
        ok
    );
}

#[tokio::test]
async fn user_header_is_honoured_only_from_trusted_peers() {
    // Untrusted: x-user is ignored and the chain falls through to the IP.
    let (gw, up) = one_per_hour("user | ip", "[]", clock()).await;
    assert_eq!(
        status_from(&gw, "127.0.0.2", &[("x-user", "alice")]).await,
        StatusCode::OK
    );
    assert!(
        !up.last().headers.contains_key("x-user"),
        "spoofed user header reached the upstream"
    );
    assert_eq!(
        status_from(&gw, "127.0.0.2", &[("x-user", "bob")]).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    // Trusted: each user has a bucket.
    let (gw, up) = one_per_hour("user | ip", "[127.0.0.2/32]", clock()).await;
    assert_eq!(
        status_from(&gw, "127.0.0.2", &[("x-user", "alice")]).await,
        StatusCode::OK
    );
    assert_eq!(up.last().headers["x-user"], "alice");
    assert_eq!(
        status_from(&gw, "127.0.0.2", &[("x-user", "bob")]).await,
        StatusCode::OK
    );
    assert_eq!(
        status_from(&gw, "127.0.0.2", &[("x-user", "alice")]).await,
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test]
async fn compound_keys_absent_values_and_api_keys() {
    let c = clock();
    let (gw, _up) = one_per_hour("api_key", "[]", c.clone()).await;
    assert_eq!(
        status_from(&gw, "127.0.0.2", &[("x-api-key", "k1")]).await,
        StatusCode::OK
    );
    assert_eq!(
        status_from(&gw, "127.0.0.3", &[("authorization", "Bearer k1")]).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    // Requests without a key share one bucket instead of bypassing the limit.
    assert_eq!(status_from(&gw, "127.0.0.2", &[]).await, StatusCode::OK);
    assert_eq!(
        status_from(&gw, "127.0.0.3", &[]).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    // A 64 KB key is hashed, not stored raw, and still counted.
    let huge = "k".repeat(65_536);
    assert_eq!(
        status_from(&gw, "127.0.0.2", &[("x-api-key", &huge)]).await,
        StatusCode::OK
    );
    assert_eq!(
        status_from(&gw, "127.0.0.2", &[("x-api-key", &huge)]).await,
        StatusCode::TOO_MANY_REQUESTS
    );

    let (gw, _up) = one_per_hour("[ip, header:x-username]", "[]", c).await;
    assert_eq!(
        status_from(&gw, "127.0.0.2", &[("x-username", "a")]).await,
        StatusCode::OK
    );
    assert_eq!(
        status_from(&gw, "127.0.0.2", &[("x-username", "b")]).await,
        StatusCode::OK
    );
    assert_eq!(
        status_from(&gw, "127.0.0.3", &[("x-username", "a")]).await,
        StatusCode::OK
    );
    assert_eq!(
        status_from(&gw, "127.0.0.2", &[("x-username", "a")]).await,
        StatusCode::TOO_MANY_REQUESTS
    );
}

async fn proxy_gateway(up: &Upstream, extra_route: &str) -> Gateway {
    let yaml = format!(
        r#"
listen: 127.0.0.1:0
routes:
{extra_route}
  - name: all
    match: {{ path_prefix: / }}
    upstream: {up}
"#,
        up = up.url()
    );
    Gateway::start(&yaml).await
}

#[tokio::test]
async fn hop_by_hop_headers_removed_and_forwarding_headers_set() {
    let up = Upstream::start().await;
    let gw = proxy_gateway(&up, "").await;
    let r = send(
        gw.addr,
        get(
            "/plain?q=1",
            &[
                ("connection", "keep-alive, x-drop-me"),
                ("x-drop-me", "secret"),
                ("keep-alive", "timeout=5"),
                ("te", "trailers"),
                ("proxy-connection", "keep-alive"),
                ("x-kept", "yes"),
            ],
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.text(), "upstream ok");
    // The upstream's own hop-by-hop headers do not reach the client.
    assert!(r.header("x-upstream-hop").is_none());
    assert!(r.header("keep-alive").is_none());
    // No limits on this route: no rate-limit headers.
    assert!(r.header("ratelimit").is_none());
    let seen = up.last();
    assert_eq!(seen.uri, "/plain?q=1");
    for h in ["x-drop-me", "keep-alive", "te", "proxy-connection"] {
        assert!(!seen.headers.contains_key(h), "{h} was forwarded");
    }
    assert_eq!(seen.headers["x-kept"], "yes");
    assert_eq!(seen.headers["x-forwarded-for"], "127.0.0.1");
    assert_eq!(seen.headers["x-forwarded-proto"], "http");
    assert_eq!(seen.headers["x-forwarded-host"], "gateway.test");
    assert_eq!(seen.headers["host"], "gateway.test");
}

#[tokio::test]
async fn ten_megabyte_bodies_stream_both_ways() {
    let up = Upstream::start().await;
    let gw = proxy_gateway(&up, "").await;
    let body: Vec<u8> = (0..10 * 1024 * 1024u32).map(|i| (i % 251) as u8).collect();
    let req = Request::post("/echo")
        .header("host", "gateway.test")
        .body(Full::new(Bytes::from(body.clone())))
        .unwrap();
    let r = send(gw.addr, req).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body.len(), body.len());
    assert!(r.body == body, "echoed body differs");
    let r = send(gw.addr, get("/big?bytes=10485760", &[])).await;
    assert_eq!(r.body.len(), 10 * 1024 * 1024);
}

#[tokio::test]
async fn upstream_down_is_502_and_slow_upstream_is_504() {
    let up = Upstream::start().await;
    let dead = format!("http://127.0.0.1:{}", free_port());
    let routes = format!(
        r#"  - name: dead
    match: {{ path_prefix: /dead }}
    upstream: {dead}
  - name: slow
    match: {{ path_prefix: /slow }}
    upstream: {up}
    timeout: 200ms
"#,
        up = up.url()
    );
    let gw = proxy_gateway(&up, &routes).await;
    let r = send(gw.addr, get("/dead", &[])).await;
    assert_eq!(r.status, StatusCode::BAD_GATEWAY);
    assert_eq!(r.header("content-type"), Some("application/problem+json"));
    assert!(r.text().contains("\"status\":502"));
    let r = send(gw.addr, get("/slow?ms=3000", &[])).await;
    assert_eq!(r.status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(r.header("content-type"), Some("application/problem+json"));
    // The gateway still serves.
    assert_eq!(
        send(gw.addr, get("/slow?ms=1", &[])).await.status,
        StatusCode::OK
    );
}

#[tokio::test]
async fn h2c_prior_knowledge_is_served() {
    let gw = Gateway::start(&demo_yaml()).await;
    let stream = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    let req = Request::get(format!("http://{}/demo", gw.addr))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let res = sender.send_request(req).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.version(), http::Version::HTTP_2);
    assert!(res.headers().contains_key("ratelimit"));
}

/// Three gateways sharing one Redis. The bound on a Redis call is long:
/// a call past it is decided in process (`on_error: local`, the limit
/// divided), and the test counts what Redis decided, so a loaded machine
/// must not push calls past it.
fn redis_yaml(redis_url: &str, up: &Upstream, limit: u64) -> String {
    format!(
        r#"
listen: 127.0.0.1:0
store:
  redis: {{ url: "{redis_url}", timeout: 5s }}
  on_error: local
routes:
  - name: api
    match: {{ path_prefix: / }}
    upstream: {up}
    limits: [ {{ name: shared, key: header:x-tenant, limit: {limit}, window: 1h }} ]
"#,
        up = up.url()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_gateways_over_one_redis_admit_exactly_the_limit() {
    let redis = RedisServer::start().await;
    let up = Upstream::start().await;
    let clock = clock();
    let yaml = redis_yaml(&redis.url(), &up, 100);
    let mut gws = Vec::new();
    for _ in 0..3 {
        gws.push(Gateway::start_with_clock(&yaml, clock.clone()).await);
    }
    let addrs: Vec<_> = gws.iter().map(|g| g.addr).collect();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..300 {
        let addr = addrs[i % 3];
        tasks.spawn(async move { send(addr, get("/x", &[("x-tenant", "acme")])).await.status });
    }
    let mut ok = 0;
    let mut limited = 0;
    while let Some(s) = tasks.join_next().await {
        match s.unwrap() {
            StatusCode::OK => ok += 1,
            StatusCode::TOO_MANY_REQUESTS => limited += 1,
            other => panic!("unexpected status {other}"),
        }
    }
    assert_eq!((ok, limited), (100, 200));
    assert_eq!(up.count(), 100);
}

/// Runs the built binary as the README says.
struct Binary {
    child: std::process::Child,
    port: u16,
}

impl Binary {
    async fn start(config: &std::path::Path) -> Binary {
        Self::start_then(config, None).await
    }

    /// Starts it, then waits for a log line holding `needle` (the binary
    /// serves before Redis is connected and says when it is).
    async fn start_then(config: &std::path::Path, needle: Option<&str>) -> Binary {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"));
        cmd.arg("--config")
            .arg(config)
            .arg("--listen")
            .arg("127.0.0.1:0");
        let mut started = support::binary::spawn_listening(cmd, 1, None);
        if let Some(needle) = needle {
            assert!(
                started
                    .wait_for_line(needle, std::time::Duration::from_secs(10))
                    .await,
                "never logged {needle:?}"
            );
        }
        Binary {
            port: started.proxy[0].port(),
            child: started.child,
        }
    }

    async fn get(&self, path: &str) -> Reply {
        send(([127, 0, 0, 1], self.port).into(), get(path, &[])).await
    }
}

impl Drop for Binary {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn readme_quick_start_serves_demo_without_redis() {
    let config = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("gateway.yaml");
    let bin = Binary::start(&config).await;
    for _ in 0..5 {
        let r = bin.get("/demo").await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.header("ratelimit-policy"), Some(r#""demo";q=5;w=10"#));
        assert!(r.header("ratelimit").is_some());
    }
    let r = bin.get("/demo").await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(r.header("retry-after").is_some());
    assert!(r.text().contains("\"violated-policies\":[\"demo\"]"));
}

#[tokio::test]
async fn two_binaries_share_one_limit_through_redis() {
    let redis = RedisServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.yaml");
    std::fs::write(
        &path,
        format!(
            r#"
listen: 127.0.0.1:0
store: {{ redis: {{ url: "{}" }}, on_error: local }}
routes:
  - name: demo
    match: {{ path_prefix: /demo }}
    respond: {{ status: 200, body: "hello\n" }}
    limits: [ {{ name: demo, key: ip, limit: 5, window: 1h }} ]
"#,
            redis.url()
        ),
    )
    .unwrap();
    let a = Binary::start_then(&path, Some("redis connected")).await;
    let b = Binary::start_then(&path, Some("redis connected")).await;
    let mut ok = 0;
    for i in 0..10 {
        let bin = if i % 2 == 0 { &a } else { &b };
        if bin.get("/demo").await.status == StatusCode::OK {
            ok += 1;
        }
    }
    assert_eq!(ok, 5, "the limit is shared, not per process");
}

#[test]
fn check_reports_every_mistake_and_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.yaml");
    // `check` only reads the file; the upstream is never contacted.
    let up = format!("http://127.0.0.1:{}", free_port());
    std::fs::write(
        &path,
        format!("listen: 127.0.0.1:0\nroutes:\n  - name: a\n    upstream: {up}\n    limits:\n      - {{ name: x, key: ip, limit: 5, window: 5 minutes }}\n  - name: b\n    upstream: {up}\n    timout: 5s\n  - name: c\n    respond: {{ status: 200 }}\n    limits: [ {{ name: y, key: nobody, limit: 1, window: 1s }} ]\n"),
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .arg("check")
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("3 error(s)"), "{err}");
    assert!(
        err.contains("routes[0].limits[0].window") && err.contains("line 6"),
        "{err}"
    );
    assert!(
        err.contains("routes[1]") && err.contains("timout") && err.contains("line 9"),
        "{err}"
    );
    assert!(
        err.contains("routes[2].limits[0].key") && err.contains("line 12"),
        "{err}"
    );

    let good = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("gateway.yaml");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .arg("check")
        .arg(&good)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn proxy_authorization_reaches_the_upstream_only_where_a_route_allows_it() {
    let up = Upstream::start().await;
    let gw = proxy_gateway(
        &up,
        &format!(
            r#"
  - name: behind_a_proxy
    match: {{ path_prefix: /proxied }}
    upstream: {}
    forward_proxy_authorization: true"#,
            up.url()
        ),
    )
    .await;
    let creds = [("proxy-authorization", "Basic cHJveHk6c2VjcmV0")];
    let r = send(gw.addr, get("/plain", &creds)).await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(
        !up.last().headers.contains_key("proxy-authorization"),
        "forwarded by default"
    );
    let r = send(gw.addr, get("/proxied", &creds)).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(
        up.last().headers["proxy-authorization"],
        "Basic cHJveHk6c2VjcmV0"
    );
}
