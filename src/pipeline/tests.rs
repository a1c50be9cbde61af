//! The pipeline called directly — no listener, no client socket: each
//! phase's refusals and the one exit that renders them.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;

use super::gateway::Gateway;
use crate::clock::ManualClock;
use crate::proxy::Body;

const PEER: &str = "192.0.2.7:5000";

/// A port nothing listens on: bound, read, released.
fn closed_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

async fn gateway() -> Gateway {
    let yaml = format!(
        r#"
listen: 127.0.0.1:0
api_keys: {{ keys: {{ k1: gold }}, unknown: reject }}
plans:
  gold: [ {{ name: per_minute, limit: 5, window: 1m }} ]
routes:
  - name: one
    match: {{ path: /one }}
    respond: {{ body: "hello\n" }}
    limits: [ {{ name: one, key: ip, limit: 1, window: 10s }} ]
  - name: plans
    match: {{ path_prefix: /plan/ }}
    respond: {{}}
    limits: [ {{ name: caller, key: api_key, plan: true }} ]
  - name: gone
    match: {{ path: /gone }}
    upstream: http://127.0.0.1:{port}
"#,
        port = closed_port()
    );
    let config = crate::config::load::parse_str(&yaml).expect("test config");
    Gateway::with_clock(config, Arc::new(ManualClock::new(1_800_000_000_000)))
        .await
        .expect("gateway")
}

fn get(path: &str) -> http::request::Builder {
    Request::builder().uri(path).header("host", "gw.test")
}

async fn call(gw: &Gateway, req: http::request::Builder) -> Response<Body> {
    let peer: SocketAddr = PEER.parse().expect("peer");
    gw.handle(req.body(Bytes::new()).expect("request"), peer)
        .await
}

async fn problem(res: Response<Body>, status: StatusCode) -> String {
    assert_eq!(res.status(), status);
    assert_eq!(res.headers()["content-type"], "application/problem+json");
    let body = res.into_body().collect().await.expect("body").to_bytes();
    String::from_utf8_lossy(&body).into_owned()
}

#[tokio::test]
async fn the_guard_refuses_doubtful_framing_and_closes() {
    let gw = gateway().await;
    let res = call(&gw, get("/one").header("host", "other.test")).await;
    assert_eq!(res.headers()["connection"], "close");
    let body = problem(res, StatusCode::BAD_REQUEST).await;
    assert!(body.contains("more than one Host"), "{body}");
}

#[tokio::test]
async fn a_target_without_canonical_form_is_refused_and_the_connection_kept() {
    let gw = gateway().await;
    let res = call(&gw, get("/one%zz")).await;
    assert!(!res.headers().contains_key("connection"));
    let body = problem(res, StatusCode::BAD_REQUEST).await;
    assert!(body.contains("percent-encoding"), "{body}");
}

#[tokio::test]
async fn no_route_is_a_404_counted_as_unmatched() {
    let gw = gateway().await;
    let body = problem(
        call(&gw, get("/nowhere/../else")).await,
        StatusCode::NOT_FOUND,
    )
    .await;
    assert!(body.contains("No route"), "{body}");
    assert!(
        gw.metrics()
            .render()
            .contains("tollgate_unmatched_requests_total 1"),
        "{}",
        gw.metrics().render()
    );
}

#[tokio::test]
async fn a_caller_without_a_plan_gets_a_401_naming_the_scheme() {
    let gw = gateway().await;
    let res = call(&gw, get("/plan/x")).await;
    assert_eq!(res.headers()["www-authenticate"], "Bearer");
    problem(res, StatusCode::UNAUTHORIZED).await;
    let res = call(&gw, get("/plan/x").header("x-api-key", "k1")).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.headers()["ratelimit-policy"], "\"per_minute\";q=5;w=60");
}

#[tokio::test]
async fn a_denied_request_gets_429_with_retry_after_and_rate_limit_headers_once() {
    let gw = gateway().await;
    let res = call(&gw, get("/one")).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.headers()["ratelimit"], "\"one\";r=0;t=20");
    let res = call(&gw, get("/one/")).await;
    assert_eq!(res.headers()["retry-after"], "20");
    assert_eq!(res.headers().get_all("ratelimit").iter().count(), 1);
    assert_eq!(res.headers().get_all("ratelimit-policy").iter().count(), 1);
    let body = problem(res, StatusCode::TOO_MANY_REQUESTS).await;
    assert!(body.contains("\"violated-policies\":[\"one\"]"), "{body}");
    let text = gw.metrics().render();
    assert!(
        text.contains(r#"tollgate_requests_total{route="one",outcome="limited"} 1"#),
        "{text}"
    );
}

#[tokio::test]
async fn an_unreachable_upstream_is_a_502_blamed_on_the_upstream() {
    let gw = gateway().await;
    let body = problem(call(&gw, get("/gone")).await, StatusCode::BAD_GATEWAY).await;
    assert!(body.contains("could not be reached"), "{body}");
    let text = gw.metrics().render();
    assert!(
        text.contains(r#"tollgate_upstream_errors_total{route="gone",kind="connect"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(r#"tollgate_requests_total{route="gone",outcome="error"} 1"#),
        "{text}"
    );
}
