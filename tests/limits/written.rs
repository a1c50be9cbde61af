//! Limits that read as written, over two gateways on one real Redis:
//! `key: route` counts every caller of a route together, `share:` makes
//! the limits of two routes one counter, `exempt:` lets named callers
//! through uncounted, and `plans_from` picks plans by claim or header.

use std::net::IpAddr;
use std::sync::Arc;

use http::StatusCode;

use crate::support::gateway::{Gateway, get, send_from};
use crate::support::redis::RedisServer;
use crate::{clock, redis_store};

fn ip(s: &str) -> IpAddr {
    s.parse().expect("test address")
}

/// Two gateways on the Redis at `url`, one clock, the routes of `routes`
/// (YAML, indented as list items under `routes:`), after `head`.
async fn two_gateways(url: &str, head: &str, routes: &str) -> (Gateway, Gateway) {
    let yaml = format!(
        "listen: 127.0.0.1:0\n{}{head}routes:\n{routes}",
        redis_store(url, "deny")
    );
    let clock = clock();
    let one = Gateway::start_with_clock(&yaml, clock.clone()).await;
    let two = Gateway::start_with_clock(&yaml, clock as Arc<_>).await;
    (one, two)
}

/// The status of a GET of `path` from `from` through `gw`.
async fn status(gw: &Gateway, from: &str, path: &str, headers: &[(&str, &str)]) -> StatusCode {
    send_from(ip(from), gw.addr, get(path, headers))
        .await
        .status
}

#[tokio::test]
async fn key_route_counts_every_caller_on_every_gateway_together() {
    let redis = RedisServer::start().await;
    let routes = r#"
  - name: search
    match: { path_prefix: /search }
    respond: { status: 200 }
    limits: [ { name: search_total, key: route, limit: 5, window: 10s } ]
  - name: other
    match: { path_prefix: /other }
    respond: { status: 200 }
    limits: [ { name: other_total, key: route, limit: 1, window: 10s } ]
"#;
    let (one, two) = two_gateways(&redis.url(), "", routes).await;
    let callers = [
        "127.0.0.2",
        "127.0.0.3",
        "127.0.0.4",
        "127.0.0.5",
        "127.0.0.6",
    ];
    for (i, from) in callers.iter().enumerate() {
        let gw = if i % 2 == 0 { &one } else { &two };
        assert_eq!(status(gw, from, "/search", &[]).await, StatusCode::OK);
    }
    // A sixth caller, new to both gateways, finds the route's quota spent.
    let refused = send_from(ip("127.0.0.7"), two.addr, get("/search", &[])).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        refused.header("ratelimit"),
        Some(r#""search_total";r=0;t=12"#)
    );
    assert_eq!(
        status(&one, "127.0.0.2", "/search", &[]).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    // Another route's route-wide limit is a counter of its own.
    assert_eq!(
        status(&one, "127.0.0.2", "/other", &[]).await,
        StatusCode::OK
    );
    assert_eq!(
        status(&two, "127.0.0.3", "/other", &[]).await,
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test]
async fn a_share_is_one_counter_per_caller_across_routes_and_gateways() {
    let redis = RedisServer::start().await;
    let routes = r#"
  - name: a
    match: { path_prefix: /a }
    respond: { status: 200 }
    limits: [ { name: ab, key: ip, limit: 4, window: 10s, share: ab } ]
  - name: b
    match: { path_prefix: /b }
    respond: { status: 200 }
    limits: [ { name: ab, key: ip, limit: 4, window: 10s, share: ab } ]
  - name: c
    match: { path_prefix: /c }
    respond: { status: 200 }
    limits: [ { name: ab, key: ip, limit: 4, window: 10s } ]
"#;
    let (one, two) = two_gateways(&redis.url(), "", routes).await;
    for (gw, path) in [(&one, "/a"), (&two, "/b"), (&two, "/a"), (&one, "/b")] {
        assert_eq!(status(gw, "127.0.0.2", path, &[]).await, StatusCode::OK);
    }
    for (gw, path) in [(&one, "/a"), (&two, "/b")] {
        let r = send_from(ip("127.0.0.2"), gw.addr, get(path, &[])).await;
        assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{path}");
        assert_eq!(r.header("ratelimit"), Some(r#""ab";r=0;t=13"#));
    }
    // Per caller: another caller has the share's whole quota.
    assert_eq!(status(&two, "127.0.0.3", "/b", &[]).await, StatusCode::OK);
    // A limit of the same name without the share counts on its own.
    assert_eq!(status(&one, "127.0.0.2", "/c", &[]).await, StatusCode::OK);
}

#[tokio::test]
async fn exempt_callers_pass_uncounted_by_resolved_address_and_api_key() {
    let redis = RedisServer::start().await;
    // 127.0.0.2 is a trusted proxy; its own address is listed too, so a
    // request it forwards for someone else shows that the client, not the
    // proxy, is matched.
    let head = "client_ip: { trusted_proxies: [127.0.0.2/32] }
exempt: { ips: [10.0.0.0/8, 127.0.0.2/32], api_keys: [internal-batch] }
";
    let routes = r#"
  - name: api
    match: { path_prefix: /api }
    respond: { status: 200 }
    limits: [ { name: per_ip, key: ip, limit: 1, window: 10s } ]
  - name: strict
    match: { path_prefix: /strict }
    respond: { status: 200 }
    exempt: {}
    limits: [ { name: per_ip, key: ip, limit: 1, window: 10s } ]
"#;
    let (one, two) = two_gateways(&redis.url(), head, routes).await;
    let batch = [("x-forwarded-for", "10.1.2.3")];
    for gw in [&one, &two, &one] {
        let r = send_from(ip("127.0.0.2"), gw.addr, get("/api", &batch)).await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(
            r.header("ratelimit"),
            None,
            "an exempt request is not counted"
        );
    }
    // A client behind the exempt proxy address is counted as itself.
    let outside = [("x-forwarded-for", "192.0.2.9")];
    assert_eq!(
        status(&one, "127.0.0.2", "/api", &outside).await,
        StatusCode::OK
    );
    assert_eq!(
        status(&two, "127.0.0.2", "/api", &outside).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    // From an untrusted peer the forwarding header is not believed.
    assert_eq!(
        status(&one, "127.0.0.3", "/api", &batch).await,
        StatusCode::OK
    );
    assert_eq!(
        status(&two, "127.0.0.3", "/api", &batch).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    // The API key exempts whoever sends it; here from the counted client.
    let key = [("x-api-key", "internal-batch")];
    for gw in [&one, &two] {
        assert_eq!(status(gw, "127.0.0.3", "/api", &key).await, StatusCode::OK);
    }
    let other_key = [("x-api-key", "someone-else")];
    assert_eq!(
        status(&one, "127.0.0.3", "/api", &other_key).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    // A route's own `exempt: {}` exempts nobody there.
    assert_eq!(
        status(&one, "127.0.0.4", "/strict", &key).await,
        StatusCode::OK
    );
    assert_eq!(
        status(&two, "127.0.0.4", "/strict", &key).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    let exempt = |gw: &Gateway| {
        let text = gw.inner.metrics().render();
        text.lines()
            .find(|l| {
                l.starts_with("tollgate_requests_total{")
                    && l.contains("route=\"api\"")
                    && l.contains("outcome=\"exempt\"")
            })
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|n| n.parse::<u64>().ok())
    };
    assert_eq!((exempt(&one), exempt(&two)), (Some(3), Some(2)));
}

#[tokio::test]
async fn the_access_log_marks_an_exempt_request() {
    let captured = crate::support::gateway::Captured::default();
    let (writer, flushed) = tollgate::logs::queue(captured.clone());
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter("tollgate::access=info")
        .finish();
    let yaml = "listen: 127.0.0.1:0
exempt: { api_keys: [internal-batch] }
routes:
  - name: api
    respond: { status: 200 }
    limits: [ { name: per_ip, key: ip, limit: 1, window: 10s } ]
";
    {
        let _guard = tracing::subscriber::set_default(subscriber);
        let gw = Gateway::start_logging(
            yaml,
            clock(),
            Some(tollgate::logs::AccessWriter::new(writer, true)),
        )
        .await;
        let key = [("x-api-key", "internal-batch")];
        assert_eq!(status(&gw, "127.0.0.2", "/", &key).await, StatusCode::OK);
        assert_eq!(status(&gw, "127.0.0.2", "/", &[]).await, StatusCode::OK);
        gw.stop().await;
    }
    drop(flushed);
    let log = captured.text();
    let decisions: Vec<String> = log
        .lines()
        .map(|l| {
            let line: serde_json::Value = serde_json::from_str(l).expect("a JSON line");
            line["fields"]["decision"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
        .collect();
    assert_eq!(decisions, ["exempt", "allowed"], "{log}");
}

/// Plans free (1 per 10 s) and pro (3 per 10 s) chosen by `plans_from`, on
/// a route whose per-caller limit comes from the plan.
const PLANS: &str = "plans:
  free: [ { name: per_caller, limit: 1, window: 10s } ]
  pro: [ { name: per_caller, limit: 3, window: 10s } ]
api_keys: { unknown: free }
";

const PLAN_ROUTE: &str = r#"
  - name: api
    match: { path_prefix: /api }
    respond: { status: 200 }
    limits: [ { name: caller, key: user | ip, plan: true } ]
"#;

/// How many of `n` GETs of `/api` from `from` with `headers`, spread over
/// both gateways, are admitted.
async fn admitted_of(
    (one, two): (&Gateway, &Gateway),
    from: &str,
    headers: &[(&str, &str)],
    n: usize,
) -> usize {
    let mut ok = 0;
    for i in 0..n {
        let gw = if i % 2 == 0 { one } else { two };
        ok += usize::from(status(gw, from, "/api", headers).await == StatusCode::OK);
    }
    ok
}

#[tokio::test]
async fn a_verified_claim_picks_the_plan_and_an_unknown_one_falls_back() {
    let redis = RedisServer::start().await;
    let head = format!(
        "{PLANS}plans_from: \"claim:tier\"\nusers: {{ jwt: {{ secret: \"{}\" }} }}\n",
        crate::SECRET
    );
    let (one, two) = two_gateways(&redis.url(), &head, PLAN_ROUTE).await;
    let exp = crate::now_secs() + 600;
    let token = |sub: &str, tier: Option<&str>| {
        let mut c = crate::claims(sub, exp);
        if let Some(t) = tier {
            c["tier"] = serde_json::json!(t);
        }
        format!("Bearer {}", crate::hs256(crate::SECRET.as_bytes(), &c))
    };
    let gws = (&one, &two);
    let pro = token("alice", Some("pro"));
    assert_eq!(
        admitted_of(gws, "127.0.0.2", &[("authorization", &pro)], 5).await,
        3
    );
    // A plan this file does not define, or none: `api_keys.unknown`.
    let gold = token("bob", Some("gold"));
    assert_eq!(
        admitted_of(gws, "127.0.0.2", &[("authorization", &gold)], 3).await,
        1
    );
    let none = token("carol", None);
    assert_eq!(
        admitted_of(gws, "127.0.0.2", &[("authorization", &none)], 3).await,
        1
    );
    // A forged token names no plan (and no user: counted by IP).
    let forged = format!(
        "Bearer {}",
        crate::hs256(b"another-secret-that-is-32-bytes-long", &{
            let mut c = crate::claims("mallory", exp);
            c["tier"] = serde_json::json!("pro");
            c
        })
    );
    assert_eq!(
        admitted_of(gws, "127.0.0.3", &[("authorization", &forged)], 3).await,
        1
    );
}

#[tokio::test]
async fn a_plan_header_counts_only_from_a_trusted_proxy() {
    let redis = RedisServer::start().await;
    let head = format!(
        "{PLANS}plans_from: \"header:x-plan\"\nclient_ip: {{ trusted_proxies: [127.0.0.2/32] }}\n"
    );
    let (one, two) = two_gateways(&redis.url(), &head, PLAN_ROUTE).await;
    let gws = (&one, &two);
    let via_proxy = [("x-forwarded-for", "192.0.2.1"), ("x-plan", "pro")];
    assert_eq!(admitted_of(gws, "127.0.0.2", &via_proxy, 5).await, 3);
    let unknown = [("x-forwarded-for", "192.0.2.2"), ("x-plan", "gold")];
    assert_eq!(admitted_of(gws, "127.0.0.2", &unknown, 3).await, 1);
    // From anyone else the header is ignored: the plan of unknown callers.
    assert_eq!(
        admitted_of(gws, "127.0.0.3", &[("x-plan", "pro")], 3).await,
        1
    );
}

#[tokio::test]
async fn a_plan_header_reaches_the_upstream_only_from_a_trusted_proxy() {
    let up = crate::support::gateway::Upstream::start().await;
    let yaml = format!(
        "listen: 127.0.0.1:0
{PLANS}plans_from: \"header:x-plan\"
client_ip: {{ trusted_proxies: [127.0.0.2/32] }}
routes:
  - name: api
    upstream: {}
    limits: [ {{ name: caller, key: ip, plan: true }} ]
",
        up.url()
    );
    let gw = Gateway::start(&yaml).await;
    let plan = [("x-plan", "pro")];
    assert_eq!(status(&gw, "127.0.0.2", "/", &plan).await, StatusCode::OK);
    let trusted = up.last().headers.get("x-plan").cloned();
    assert_eq!(status(&gw, "127.0.0.3", "/", &plan).await, StatusCode::OK);
    let untrusted = up.last().headers.get("x-plan").cloned();
    assert_eq!(
        (trusted.as_ref().map(|v| v.as_bytes()), untrusted),
        (Some(&b"pro"[..]), None)
    );
}
