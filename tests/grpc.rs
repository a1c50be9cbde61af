//! gRPC through the gateway, end to end with a real gRPC server and client:
//! Python's grpcio (installed by scripts/test.sh), driven by the scripts in
//! tests/grpc/ with raw-bytes messages, so no `.proto` is compiled.
//!
//! The server (`server.py`) runs per test on a free port, over h2c or TLS;
//! the client (`client.py`) makes one call through the gateway and prints
//! its status, details, metadata and messages as JSON. What the gateway
//! answers by itself is also read at the HTTP/2 level (hyper's client), where
//! the headers of a Trailers-Only answer are visible one by one.

#[path = "support/mod.rs"]
mod support;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::Full;
use serde_json::{Value, json};

use support::admin::{AdminGateway, value};
use support::gateway::{Reply, Upstream, h2c, send};
use support::pki::{Pki, new_pki};

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/grpc")
        .join(name)
}

/// `server.py` on a free port; killed on drop.
struct GrpcServer {
    child: Child,
    port: u16,
}

impl GrpcServer {
    /// Over h2c, or over TLS with `pki`'s certificate.
    fn start(tls: Option<&Pki>) -> GrpcServer {
        let mut cmd = Command::new("python3");
        cmd.arg(script("server.py"));
        if let Some(pki) = tls {
            cmd.arg("--tls").arg(&pki.cert).arg(&pki.key);
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("python3 runs (scripts/test.sh installs it with grpcio)");
        // Ready once it prints its port: it has bound and started serving.
        let mut line = String::new();
        let stdout = child.stdout.take().expect("piped stdout");
        let _ = BufReader::new(stdout).read_line(&mut line);
        let Ok(port) = line.trim().parse() else {
            let _ = child.kill();
            panic!(
                "the gRPC server script printed {line:?} instead of its port; is grpcio installed? (scripts/test.sh installs it)"
            );
        };
        GrpcServer { child, port }
    }
}

impl Drop for GrpcServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One call through `gateway` by `client.py`: its JSON result.
async fn call(gateway: SocketAddr, kind: &str, options: Value) -> Value {
    let (kind, options) = (kind.to_owned(), options.to_string());
    let out = tokio::task::spawn_blocking(move || {
        Command::new("python3")
            .arg(script("client.py"))
            .arg(gateway.to_string())
            .arg(&kind)
            .arg(&options)
            .stderr(Stdio::inherit())
            .output()
            .expect("python3 runs")
    })
    .await
    .expect("client task");
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("client.py printed {text:?} ({e}); status {}", out.status))
}

/// A gateway with one route, `grpc`, for the service's prefix, to
/// `upstream` with the extra route fields `more` (YAML, indented).
async fn gateway(upstream: &str, more: &str) -> AdminGateway {
    let yaml = format!(
        r#"
listen: 127.0.0.1:0
admin: 127.0.0.1:0
routes:
  - name: grpc
    match: {{ path_prefix: /demo.Echo/ }}
    upstream: "{upstream}"
{more}
"#
    );
    AdminGateway::start(&yaml, Arc::new(tollgate::clock::SystemClock)).await
}

/// Unary, server-streaming and bidirectional calls, metadata and trailers
/// (a binary one too) and an upstream's own error status all pass.
async fn assert_calls_pass(gw: SocketAddr) {
    let r = call(gw, "unary", json!({"metadata": {"x-client-meta": "abc"}})).await;
    assert_eq!(r["code"], "OK", "{r}");
    assert_eq!(r["responses"], json!(["hello"]), "{r}");
    assert_eq!(r["initial"]["x-echo"], "abc", "request metadata: {r}");
    assert_eq!(r["trailing"]["x-trailer"], "done", "trailers: {r}");
    assert_eq!(r["trailing"]["x-bin-bin"], "AAH+", "binary trailer: {r}");

    let r = call(gw, "server_stream", json!({})).await;
    assert_eq!(r["code"], "OK", "{r}");
    assert_eq!(r["responses"], json!(["0", "1", "2"]), "{r}");
    assert_eq!(r["trailing"]["x-count"], "3", "{r}");

    // Lock-step: each message leaves the client only after the answer to
    // the one before came back, so a gateway that held either direction
    // until its end would stall this call until its deadline.
    let r = call(gw, "bidi", json!({})).await;
    assert_eq!(r["code"], "OK", "{r}");
    assert_eq!(
        r["responses"],
        json!(["echo:m0", "echo:m1", "echo:m2"]),
        "{r}"
    );
    assert_eq!(r["trailing"]["x-messages"], "3", "{r}");

    let r = call(gw, "fail", json!({})).await;
    assert_eq!(r["code"], "NOT_FOUND", "{r}");
    assert_eq!(r["details"], "no such thing", "{r}");
    assert_eq!(r["trailing"]["x-why"], "testing", "{r}");
}

#[tokio::test]
async fn calls_pass_to_an_h2c_upstream() {
    let server = GrpcServer::start(None);
    let gw = gateway(&format!("h2c://127.0.0.1:{}", server.port), "").await;
    assert_calls_pass(gw.addr).await;
}

/// A pool of `h2c://` targets carries the same calls: each try goes to a
/// target the balancer picks, over HTTP/2 with prior knowledge.
#[tokio::test]
async fn calls_pass_to_a_pool_of_h2c_targets() {
    let (a, b) = (GrpcServer::start(None), GrpcServer::start(None));
    let yaml = format!(
        r#"
listen: 127.0.0.1:0
admin: 127.0.0.1:0
upstreams:
  echo:
    targets: [ "h2c://127.0.0.1:{}", "h2c://127.0.0.1:{}" ]
    balance: round_robin
routes:
  - name: grpc
    match: {{ path_prefix: /demo.Echo/ }}
    upstream: echo
"#,
        a.port, b.port
    );
    let gw = AdminGateway::start(&yaml, Arc::new(tollgate::clock::SystemClock)).await;
    assert_calls_pass(gw.addr).await;
    assert_calls_pass(gw.addr).await;
}

#[tokio::test]
async fn calls_pass_to_a_tls_upstream() {
    let pki = new_pki();
    let server = GrpcServer::start(Some(&pki));
    let more = format!("    upstream_ca: \"{}\"", pki.ca.display());
    let gw = gateway(&format!("https://localhost:{}", server.port), &more).await;
    assert_calls_pass(gw.addr).await;
}

/// A gRPC request at the HTTP/2 level: `POST path`, one message of one
/// byte, `message`, with `headers`; the answer read whole (trailers, if
/// any, left out).
async fn raw_call(gw: SocketAddr, path: &str, message: u8, headers: &[(&str, &str)]) -> Reply {
    let (mut sender, conn) = h2c(gw).await;
    tokio::spawn(conn);
    let mut req = Request::post(format!("http://gateway.test{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req
        .body(Full::new(Bytes::from(vec![0, 0, 0, 0, 1, message])))
        .expect("request");
    Reply::read(sender.send_request(req).await.expect("response")).await
}

/// A route series of the gateway's metrics.
async fn series(gw: &AdminGateway, name: &str, labels: &str) -> f64 {
    value(
        &gw.scrape().await,
        &format!("{name}{{route=\"grpc\",{labels}}}"),
    )
    .unwrap_or(0.0)
}

#[tokio::test]
async fn a_limited_call_is_resource_exhausted_with_pushback() {
    let server = GrpcServer::start(None);
    let limits = "    limits: [ { name: per_ip, key: ip, limit: 1, window: 1m } ]";
    let gw = gateway(&format!("h2c://127.0.0.1:{}", server.port), limits).await;
    let r = call(gw.addr, "unary", json!({})).await;
    assert_eq!(r["code"], "OK", "{r}");

    let r = call(gw.addr, "unary", json!({})).await;
    assert_eq!(r["code"], "RESOURCE_EXHAUSTED", "{r}");
    let details = r["details"].as_str().unwrap_or_default();
    assert!(
        details.starts_with("Rate limit exceeded for per_ip; retry in "),
        "{r}"
    );
    let trailing = &r["trailing"];
    assert_eq!(trailing["ratelimit-policy"], "\"per_ip\";q=1;w=60", "{r}");
    assert!(
        trailing["ratelimit"]
            .as_str()
            .is_some_and(|v| v.contains("r=0")),
        "{r}"
    );

    // The same answer, header by header.
    let res = raw_call(gw.addr, "/demo.Echo/Say", b'x', &[]).await;
    assert_eq!(res.status, StatusCode::OK);
    assert!(res.body.is_empty(), "Trailers-Only has no body");
    assert_eq!(res.header("content-type"), Some("application/grpc"));
    assert_eq!(res.header("grpc-status"), Some("8"));
    let retry_after: u64 = res
        .header("retry-after")
        .and_then(|v| v.parse().ok())
        .expect("Retry-After");
    assert_eq!(
        res.header("grpc-retry-pushback-ms"),
        Some((retry_after * 1000).to_string().as_str())
    );
    assert!(res.header("ratelimit").is_some());

    // Counted as what it is at the HTTP level: limited, not allowed.
    assert_eq!(
        series(&gw, "tollgate_requests_total", "outcome=\"limited\"").await,
        2.0
    );
    assert_eq!(
        series(&gw, "tollgate_requests_total", "outcome=\"allowed\"").await,
        1.0
    );
}

#[tokio::test]
async fn a_retry_policy_waits_for_the_pushback() {
    let server = GrpcServer::start(None);
    let limits = "    limits: [ { name: per_ip, key: ip, limit: 1, window: 2s } ]";
    let gw = gateway(&format!("h2c://127.0.0.1:{}", server.port), limits).await;
    // Two calls in a row: the second is limited, and its three attempts
    // 10 ms apart would all be; the pushback makes the client wait until
    // the limit admits it.
    let r = call(gw.addr, "unary", json!({"retry": true, "calls": 2})).await;
    assert_eq!(r["codes"], json!(["OK", "OK"]), "{r}");
    assert_eq!(
        series(&gw, "tollgate_requests_total", "outcome=\"limited\"").await,
        1.0
    );
    assert_eq!(
        series(&gw, "tollgate_requests_total", "outcome=\"allowed\"").await,
        2.0
    );
}

#[tokio::test]
async fn an_unknown_method_is_unimplemented() {
    let server = GrpcServer::start(None);
    let gw = gateway(&format!("h2c://127.0.0.1:{}", server.port), "").await;
    let r = call(gw.addr, "unary", json!({"method": "/other.Service/Call"})).await;
    assert_eq!(r["code"], "UNIMPLEMENTED", "{r}");
    assert_eq!(r["details"], "No route matches this request", "{r}");
}

#[tokio::test]
async fn a_slow_upstream_past_the_callers_deadline_is_deadline_exceeded() {
    let server = GrpcServer::start(None);
    let gw = gateway(&format!("h2c://127.0.0.1:{}", server.port), "").await;
    // grpcio's client keeps its own deadline too: whichever side sees it
    // first, the call ends DEADLINE_EXCEEDED.
    let r = call(gw.addr, "slow", json!({"seconds": 5, "timeout": 0.3})).await;
    assert_eq!(r["code"], "DEADLINE_EXCEEDED", "{r}");

    // (Counted when the gateway's timer won the race.)
    let deadline = "kind=\"deadline\"";
    let before = series(&gw, "tollgate_client_errors_total", deadline).await;

    // A caller that keeps no timer of its own hears it from the gateway.
    slow_call_past_its_deadline(gw.addr).await;
    // The caller's deadline is its own choice: a client error, not the
    // upstream's timeout.
    assert_eq!(
        series(&gw, "tollgate_client_errors_total", deadline).await,
        before + 1.0
    );
    let kind = "kind=\"timeout\"";
    assert_eq!(
        series(&gw, "tollgate_upstream_errors_total", kind).await,
        0.0
    );
}

/// A slow call with a 200 ms `grpc-timeout` and no timer of the
/// caller's own: the gateway answers it DEADLINE_EXCEEDED, saying why.
async fn slow_call_past_its_deadline(gw: SocketAddr) {
    let res = raw_call(gw, "/demo.Echo/Slow", b'5', &[("grpc-timeout", "200m")]).await;
    assert_eq!(res.status, StatusCode::OK);
    assert_eq!(res.header("grpc-status"), Some("4"));
    assert_eq!(
        res.header("grpc-message"),
        Some("The upstream server did not answer within the call's deadline of 200 ms")
    );
}

/// A pool of `h2c://` targets keeps the caller's deadline as one URL
/// does: the call ends DEADLINE_EXCEEDED at its `grpc-timeout`, not at the
/// route's timeout.
#[tokio::test]
async fn a_pool_keeps_the_callers_deadline() {
    let server = GrpcServer::start(None);
    let yaml = format!(
        r#"
listen: 127.0.0.1:0
admin: 127.0.0.1:0
upstreams:
  echo:
    targets: [ "h2c://127.0.0.1:{}" ]
routes:
  - name: grpc
    match: {{ path_prefix: /demo.Echo/ }}
    upstream: echo
    timeout: 30s
"#,
        server.port
    );
    let gw = AdminGateway::start(&yaml, Arc::new(tollgate::clock::SystemClock)).await;
    slow_call_past_its_deadline(gw.addr).await;
}

#[tokio::test]
async fn the_callers_deadline_never_extends_the_routes_timeout() {
    let server = GrpcServer::start(None);
    let gw = gateway(
        &format!("h2c://127.0.0.1:{}", server.port),
        "    timeout: 200ms",
    )
    .await;
    let res = raw_call(gw.addr, "/demo.Echo/Slow", b'5', &[("grpc-timeout", "10S")]).await;
    assert_eq!(res.status, StatusCode::OK);
    // The route's own timeout is the upstream's fault: 504, UNAVAILABLE.
    assert_eq!(res.header("grpc-status"), Some("14"));
    let kind = "kind=\"timeout\"";
    assert_eq!(
        series(&gw, "tollgate_upstream_errors_total", kind).await,
        1.0
    );
}

#[tokio::test]
async fn grpc_web_passes_unchanged_and_is_refused_in_kind() {
    let up = Upstream::start().await;
    let yaml = format!(
        r#"
listen: 127.0.0.1:0
routes:
  - name: web
    match: {{ path_prefix: /echo }}
    upstream: {}
"#,
        up.url()
    );
    let gw = AdminGateway::start(&yaml, Arc::new(tollgate::clock::SystemClock)).await;
    let frame = Bytes::from_static(&[0, 0, 0, 0, 2, b'h', b'i']);
    let req = |path: &str| {
        Request::post(path)
            .header("host", "gateway.test")
            .header("content-type", "application/grpc-web+proto")
            .header("x-grpc-web", "1")
            .header("x-user-agent", "grpc-web-javascript/0.1")
            .body(Full::new(frame.clone()))
            .expect("request")
    };
    let r = send(gw.addr, req("/echo")).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body, frame);
    let seen = up.last();
    assert_eq!(seen.headers["content-type"], "application/grpc-web+proto");
    assert_eq!(seen.headers["x-grpc-web"], "1");
    assert_eq!(seen.headers["x-user-agent"], "grpc-web-javascript/0.1");

    let r = send(gw.addr, req("/elsewhere")).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.header("content-type"), Some("application/grpc-web"));
    assert_eq!(r.header("grpc-status"), Some("12"));
    assert!(r.body.is_empty());
}
