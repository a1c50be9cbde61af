//! What is the resource: every spelling of a path or host reaches the
//! upstream counted by the route it means, or is refused with 400 — real
//! gateways, a real upstream, raw sockets and an HTTP/2 client.

#[path = "support/mod.rs"]
mod support;

use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use support::gateway::{Gateway, Reply, Upstream, h2c, send};

/// How a framework that decodes and normalises resolves a path it received:
/// every escape decoded (`%2F` too), `\` as `/`, servlet `;parameters`
/// dropped, dot segments resolved, slashes merged, a trailing slash
/// ignored. The union of what nginx, Express, Spring/Tomcat and Django do,
/// so a spelling that gets past the gateway's limits under any of them
/// shows here.
fn framework_resolve(path: &str) -> String {
    let bytes = path.as_bytes();
    let mut decoded = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len() + 1
            && let Some(v) = bytes
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
        {
            decoded.push(v);
            i += 3;
            continue;
        }
        decoded.push(bytes[i]);
        i += 1;
    }
    let decoded = String::from_utf8_lossy(&decoded).replace('\\', "/");
    let mut out: Vec<&str> = Vec::new();
    for seg in decoded.split('/') {
        let seg = seg.split(';').next().unwrap_or_default();
        match seg {
            "" | "." => {}
            ".." => {
                out.pop();
            }
            s => out.push(s),
        }
    }
    format!("/{}", out.join("/"))
}

fn yaml(upstream: &str, path_rules: &str) -> String {
    format!(
        r#"
listen: 127.0.0.1:0
server:
  path: {{ {path_rules} }}
routes:
  - name: admin_blocked
    match: {{ path_prefix: /api/admin/ }}
    respond: {{ status: 403, body: "blocked\n" }}
  - name: login
    match: {{ path: /api/auth/login, methods: [POST] }}
    upstream: {upstream}
    limits:
      - {{ name: login_ip, key: ip, limit: 1000, window: 1m }}
  - name: api
    match: {{ path_prefix: /api/ }}
    upstream: {upstream}
    limits:
      - {{ name: api_ip, key: ip, limit: 1000, window: 1m }}
"#
    )
}

fn request(method: &str, path: &str) -> Request<Full<Bytes>> {
    Request::builder()
        .method(method)
        .uri(path)
        .header("host", "gateway.test")
        .body(Full::new(Bytes::new()))
        .expect("a request hyper can send")
}

/// Which limit a forwarded answer was counted by, from its
/// `RateLimit-Policy`.
fn policy(reply: &Reply) -> String {
    reply
        .header("ratelimit-policy")
        .unwrap_or("")
        .split(';')
        .next()
        .unwrap_or("")
        .trim_matches('"')
        .to_owned()
}

const LOGIN_SPELLINGS: &[&str] = &[
    "/api/auth/login",
    "/api/auth/%6Cogin",
    "/api/auth/%6cogin",
    "/%61pi/auth/login",
    "/api/x/../auth/login",
    "/api/x/%2e%2e/auth/login",
    "/api/x/%2E%2E/auth/login",
    "/api/auth/./login",
    "/api/auth/%2E/login",
    "//api/auth/login",
    "/api//auth///login",
    "/api/auth/login/",
    "/api/auth/login;jsessionid=1",
    "/api/auth;v=1/login",
    "/api/auth%2Flogin",
    "/api/auth%2flogin",
    "/api/auth%5Clogin",
    "/api\\auth\\login",
    "/api/x/..;/auth/login",
    "/api/x/.;/../auth/login",
    "/api/auth/log%zzin",
    "/api/auth/%00login",
];

#[tokio::test]
async fn every_spelling_of_the_login_path_carries_the_login_limits_or_is_refused() {
    let up = Upstream::start().await;
    let gw = Gateway::start(&yaml(&up.url(), "")).await;
    let mut forwarded = 0;
    for spelled in LOGIN_SPELLINGS {
        let reply = send(gw.addr, request("POST", spelled)).await;
        match reply.status {
            StatusCode::OK => {
                forwarded += 1;
                assert_eq!(
                    policy(&reply),
                    "login_ip",
                    "{spelled} was not counted as login"
                );
                let seen = up.last().uri;
                assert_eq!(
                    framework_resolve(seen.path()),
                    "/api/auth/login",
                    "{spelled} forwarded as {seen}"
                );
                // What is forwarded is canonical: a framework has nothing
                // left to resolve.
                assert!(
                    !seen.path().contains("//")
                        && !seen.path().contains("/../")
                        && !seen.path().contains("/./")
                        && !seen.path().contains('\\'),
                    "{spelled} forwarded as {seen}"
                );
            }
            StatusCode::BAD_REQUEST => {
                assert_eq!(
                    reply.header("content-type"),
                    Some("application/problem+json"),
                    "{spelled}"
                );
            }
            other => panic!("{spelled}: unexpected {other}"),
        }
    }
    // The plain spellings all went through; only the ambiguous ones did not.
    assert_eq!(forwarded, 14, "forwarded spellings");
}

#[tokio::test]
async fn a_blocked_route_cannot_be_reached_by_any_spelling() {
    let up = Upstream::start().await;
    let gw = Gateway::start(&yaml(&up.url(), "")).await;
    for spelled in [
        "/api/admin/users",
        "/api/%61dmin/users",
        "/%61%70%69/admin/users",
        "/api/x/../admin/users",
        "/api/./admin/users",
        "//api//admin/users",
        "/api/admin",
        "/api/admin;x=1/users",
        "/api;x/admin/users",
        "/api/admin%2Fusers",
        "/api%2Fadmin/users",
        "/api\\admin\\users",
        "/api/v1/..;/admin/users",
        "/api/admin/%zz",
    ] {
        for method in ["GET", "POST", "DELETE"] {
            let reply = send(gw.addr, request(method, spelled)).await;
            assert!(
                reply.status == StatusCode::FORBIDDEN || reply.status == StatusCode::BAD_REQUEST,
                "{method} {spelled}: {}",
                reply.status
            );
        }
    }
    assert_eq!(up.count(), 0, "the upstream saw a blocked request");
    // Paths are case-sensitive (RFC 3986 §6.2.2.1): `/api/Admin/` is
    // another resource, which the catch-all route forwards.
    let reply = send(gw.addr, request("GET", "/api/%41dmin/users")).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(up.last().uri.path(), "/api/Admin/users");
}

#[tokio::test]
async fn encoded_slashes_can_be_decoded_or_kept_instead_of_refused() {
    let up = Upstream::start().await;
    let gw = Gateway::start(&yaml(&up.url(), "escaped_slashes: decode")).await;
    let reply = send(gw.addr, request("POST", "/api/auth%2Flogin")).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(policy(&reply), "login_ip");
    assert_eq!(up.last().uri.path(), "/api/auth/login");
    let reply = send(gw.addr, request("GET", "/api/admin%5cusers")).await;
    assert_eq!(reply.status, StatusCode::FORBIDDEN);
    gw.stop().await;

    // `keep`: forwarded encoded, and not a separator for routing either.
    let gw = Gateway::start(&yaml(&up.url(), "escaped_slashes: keep")).await;
    let reply = send(gw.addr, request("GET", "/api/files/a%2fb?x=%2F")).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(policy(&reply), "api_ip");
    assert_eq!(up.last().uri.to_string(), "/api/files/a%2Fb?x=%2F");
}

#[tokio::test]
async fn the_query_is_forwarded_as_sent_and_the_canonical_path_with_it() {
    let up = Upstream::start().await;
    let gw = Gateway::start(&yaml(&up.url(), "")).await;
    let reply = send(
        gw.addr,
        request("GET", "/api/x/../v%31/%7euser?q=%2e%2E/a&b=%zz"),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(up.last().uri.to_string(), "/api/v1/~user?q=%2e%2E/a&b=%zz");
}

#[tokio::test]
async fn normalisation_can_be_turned_off_for_an_upstream_that_needs_raw_bytes() {
    let up = Upstream::start().await;
    let gw = Gateway::start(&yaml(
        &up.url(),
        "normalize: false, merge_slashes: false, escaped_slashes: keep",
    ))
    .await;
    let reply = send(gw.addr, request("GET", "/api/raw/%61//b%2Fc")).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(up.last().uri.path(), "/api/raw/%61//b%2Fc");
}

#[tokio::test]
async fn a_bad_request_target_is_a_problem_json_400() {
    let up = Upstream::start().await;
    let gw = Gateway::start(&yaml(&up.url(), "")).await;
    let reply = send(gw.addr, request("GET", "/api/%zz")).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        reply.header("content-type"),
        Some("application/problem+json")
    );
    assert!(
        reply.text().contains("percent-encoding"),
        "{}",
        reply.text()
    );
    let reply = send(gw.addr, request("GET", "/api/a%2Fb")).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert!(reply.text().contains("%2F"), "{}", reply.text());
    assert_eq!(up.count(), 0);
}

fn hosts_yaml(upstream: &str) -> String {
    format!(
        r#"
listen: 127.0.0.1:0
routes:
  - name: admin_host
    match: {{ host: admin.example.com }}
    respond: {{ status: 403, body: "blocked\n" }}
  - name: www
    match: {{ host: www.example.com }}
    upstream: {upstream}
    limits:
      - {{ name: www_ip, key: ip, limit: 1000, window: 1m }}
  - name: rest
    upstream: {upstream}
"#
    )
}

/// Writes `head` on a new connection and reads the answer until the
/// gateway closes it or the head and a short body have arrived.
async fn raw(addr: std::net::SocketAddr, head: &str) -> String {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(head.as_bytes()).await.expect("write");
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
            .await
            .expect("an answer within 5 s")
            .expect("read");
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&out);
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let len = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().parse::<usize>().unwrap_or(0))
                })
                .unwrap_or(0);
            if body.len() >= len {
                break;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test]
async fn absolute_form_is_routed_and_forwarded_by_its_own_authority() {
    let up = Upstream::start().await;
    let gw = Gateway::start(&hosts_yaml(&up.url())).await;
    let answer = raw(
        gw.addr,
        "GET http://www.example.com/x HTTP/1.1\r\nHost: admin.example.com\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let seen = up.last();
    assert_eq!(seen.headers["host"], "www.example.com");
    assert_eq!(seen.headers["x-forwarded-host"], "www.example.com");

    // The other way round: the blocked virtual host named by the target.
    let answer = raw(
        gw.addr,
        "GET http://admin.example.com/x HTTP/1.1\r\nHost: www.example.com\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
    assert_eq!(up.count(), 1);
}

#[tokio::test]
async fn a_host_with_a_trailing_dot_or_capitals_is_the_same_host() {
    let up = Upstream::start().await;
    let gw = Gateway::start(&hosts_yaml(&up.url())).await;
    for host in [
        "admin.example.com.",
        "ADMIN.example.COM",
        "admin.example.com.:8080",
    ] {
        let answer = raw(
            gw.addr,
            &format!("GET /x HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"),
        )
        .await;
        assert!(answer.starts_with("HTTP/1.1 403"), "{host}: {answer}");
    }
    let answer = raw(
        gw.addr,
        "GET /x HTTP/1.1\r\nHost: WWW.example.com.\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert_eq!(up.last().headers["host"], "www.example.com");
    for bad in ["user@admin.example.com", "admin.example.com:x"] {
        let answer = raw(
            gw.addr,
            &format!("GET /x HTTP/1.1\r\nHost: {bad}\r\nConnection: close\r\n\r\n"),
        )
        .await;
        assert!(answer.starts_with("HTTP/1.1 400"), "{bad}: {answer}");
    }
    assert_eq!(up.count(), 1);
}

/// Sends `req` over a new cleartext HTTP/2 connection.
async fn h2(addr: std::net::SocketAddr, req: Request<Full<Bytes>>) -> (StatusCode, Bytes) {
    let (mut sender, conn) = h2c(addr).await;
    tokio::spawn(conn);
    let res = sender.send_request(req).await.expect("an h2 answer");
    let status = res.status();
    let body = res.into_body().collect().await.expect("body").to_bytes();
    (status, body)
}

fn h2_request(authority: &str, host: Option<&str>) -> Request<Full<Bytes>> {
    let mut b = Request::builder()
        .uri(format!("http://{authority}/x"))
        .version(http::Version::HTTP_2);
    if let Some(h) = host {
        b = b.header("host", h);
    }
    b.body(Full::new(Bytes::new())).expect("request")
}

#[tokio::test]
async fn over_http2_the_authority_wins_and_a_contradicting_host_is_refused() {
    let up = Upstream::start().await;
    let gw = Gateway::start(&hosts_yaml(&up.url())).await;

    let (status, _) = h2(gw.addr, h2_request("www.example.com", None)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(up.last().headers["host"], "www.example.com");

    let (status, body) = h2(
        gw.addr,
        h2_request("www.example.com", Some("admin.example.com")),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body:?}");
    let (status, _) = h2(
        gw.addr,
        h2_request("admin.example.com", Some("www.example.com")),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);

    // The same authority spelled twice is fine; a trailing dot is the host.
    let (status, _) = h2(
        gw.addr,
        h2_request("www.example.com", Some("WWW.example.com.")),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = h2(gw.addr, h2_request("admin.example.com.", None)).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(up.count(), 2);
}

#[test]
fn path_settings_and_route_paths_are_checked_at_load() {
    let src = r#"
listen: 127.0.0.1:0
server:
  path: { normalize: yes, escaped_slashes: drop }
routes:
  - name: a
    match: { path: /api/x/../login }
    respond: {}
  - name: b
    match: { path_prefix: "/api/%7euser;v=1/" }
    respond: {}
  - name: c
    match: { path: /api/%6Cogin }
    respond: {}
"#;
    let err = tollgate::config::load::parse_str(src)
        .expect_err("bad settings")
        .to_string();
    for expected in [
        "server.path.escaped_slashes: \"drop\" is not one of reject, keep, decode (line 4",
        "routes[0].match.path: \"/api/x/../login\" is not in the canonical form requests are matched in; write \"/api/login\" (line 7",
        "routes[1].match.path_prefix: \"/api/%7euser;v=1/\" holds ;parameters",
        "routes[2].match.path: \"/api/%6Cogin\" is not in the canonical form requests are matched in; write \"/api/login\"",
    ] {
        assert!(err.contains(expected), "missing {expected:?} in:\n{err}");
    }
    assert!(err.contains("server.path.normalize"), "{err}");
}
