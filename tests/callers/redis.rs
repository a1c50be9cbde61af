//! Two gateways on one real Redis.

use std::time::{Duration, Instant};

use http::Method;

use super::support::redis::RedisServer;
use super::support::wait::until;
use super::{AdminGateway, call, entry, hit, start, with_token, yaml};

async fn pair(server: &RedisServer, quota: u64) -> (AdminGateway, AdminGateway) {
    let store = format!(
        "store: {{ redis: {{ url: '{}' }}, deny_cache: 1000 }}",
        server.url()
    );
    let text = yaml(&store, &with_token(), quota);
    (start(&text).await, start(&text).await)
}

#[tokio::test]
async fn one_gateway_reads_what_the_other_counted() {
    let server = RedisServer::start().await;
    let (a, b) = pair(&server, 3).await;
    assert_eq!(hit(&a, "/api/x", "k1").await, 200);
    assert_eq!(hit(&a, "/api/x", "k1").await, 200);
    let (status, v) = call(&b, Method::GET, "/admin/callers?api_key=k1", None).await;
    assert_eq!(status, 200, "{v}");
    let e = entry(&v, "api", "per_key");
    assert_eq!(
        (e["used"].as_u64(), e["remaining"].as_u64()),
        (Some(2), Some(1)),
        "{v}"
    );
    assert!(!v.to_string().contains("\"k1"), "the API key is shown: {v}");
    // The read did not count.
    assert_eq!(hit(&b, "/api/x", "k1").await, 200);
    assert_eq!(hit(&b, "/api/x", "k1").await, 429);
}

#[tokio::test]
async fn a_reset_on_one_gateway_frees_the_caller_on_both() {
    let server = RedisServer::start().await;
    let (a, b) = pair(&server, 2).await;
    for gw in [&a, &b] {
        hit(gw, "/api/x", "k1").await;
    }
    // Both refuse now; the second refusal of each comes from its deny cache.
    for gw in [&a, &b, &a, &b] {
        assert_eq!(hit(gw, "/api/x", "k1").await, 429);
    }
    let (status, v) = call(&a, Method::DELETE, "/admin/callers?api_key=k1", None).await;
    assert_eq!(status, 200, "{v}");
    let reset_at = Instant::now();
    assert_eq!(hit(&a, "/api/x", "k1").await, 200);
    // The other gateway's deny cache forgets the caller within a poll
    // (50 ms); the bound here leaves room for a loaded test machine.
    until(
        "the other gateway admits the reset caller",
        Duration::from_secs(1),
        || async { hit(&b, "/api/x", "k1").await == 200 },
    )
    .await;
    assert!(reset_at.elapsed() < Duration::from_secs(1));
}

#[tokio::test]
async fn an_override_set_on_one_gateway_is_used_on_the_other_within_a_second() {
    let server = RedisServer::start().await;
    let (a, b) = pair(&server, 2).await;
    assert_eq!(hit(&b, "/api/x", "k2").await, 200);
    assert_eq!(hit(&b, "/api/x", "k2").await, 200);
    assert_eq!(hit(&b, "/api/x", "k2").await, 429);
    let body = r#"{"api_key":"k2","limit":"per_key","quota":6}"#;
    let (status, v) = call(&a, Method::PUT, "/admin/overrides", Some(body)).await;
    assert_eq!(status, 200, "{v}");
    until(
        "the other gateway applies the override",
        Duration::from_secs(1),
        || async { hit(&b, "/api/x", "k2").await == 200 },
    )
    .await;
    let (_, v) = call(&b, Method::GET, "/admin/overrides", None).await;
    assert_eq!(v["overrides"].as_array().unwrap().len(), 1, "{v}");
    let (_, v) = call(&b, Method::GET, "/admin/callers?api_key=k2", None).await;
    assert_eq!(entry(&v, "api", "per_key")["used"], 3, "{v}");
    for _ in 0..3 {
        assert_eq!(hit(&b, "/api/x", "k2").await, 200);
    }
    assert_eq!(hit(&a, "/api/x", "k2").await, 429);

    // A runtime exemption, set on one and honoured on the other.
    let (status, v) = call(
        &a,
        Method::PUT,
        "/admin/overrides",
        Some(r#"{"api_key":"k2","limit":"per_key","exempt":true}"#),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    until(
        "the other gateway exempts the caller",
        Duration::from_secs(1),
        || async { hit(&b, "/api/x", "k2").await == 200 },
    )
    .await;
    for _ in 0..10 {
        assert_eq!(hit(&b, "/api/x", "k2").await, 200);
    }
    assert!(b.scrape().await.contains(r#"outcome="exempt""#));
    // Overrides survive a Redis outage on the gateway that read them.
    drop(server);
    for _ in 0..3 {
        assert_eq!(hit(&b, "/api/x", "k2").await, 200);
    }
}
