//! One gateway on the in-process store.

use http::Method;

use super::{call, entry, hit, start, with_token, yaml};

#[tokio::test]
async fn read_reset_override_and_exempt_on_the_memory_store() {
    let gw = start(&yaml("", &with_token(), 3)).await;
    for _ in 0..3 {
        assert_eq!(hit(&gw, "/api/x", "k1").await, 200);
    }
    assert_eq!(hit(&gw, "/api/x", "k1").await, 429);

    // Read, without counting: twice gives the same numbers.
    for _ in 0..2 {
        let (status, v) = call(&gw, Method::GET, "/admin/callers?api_key=k1", None).await;
        assert_eq!(status, 200, "{v}");
        let e = entry(&v, "api", "per_key");
        assert_eq!(e["used"], 3, "{v}");
        assert_eq!(e["remaining"], 0, "{v}");
        assert_eq!(e["quota"], 3);
        assert_eq!(e["window_s"], 3600.0);
        assert_eq!(e["algorithm"], "sliding_window");
        assert_eq!(e["waiting"], 0, "{v}");
        assert!(!v.to_string().contains("k1"), "the API key is shown: {v}");
        let slots = &v["concurrency"][0];
        assert_eq!(
            (&slots["limit"], &slots["slots"], &slots["in_use"]),
            (&"at_once".into(), &2.into(), &0.into()),
            "{v}"
        );
    }

    // Reset: admitted again.
    let (status, v) = call(
        &gw,
        Method::DELETE,
        "/admin/callers?api_key=k1&route=api",
        None,
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["reset"][0]["limit"], "per_key", "{v}");
    assert_eq!(v["reset"].as_array().unwrap().len(), 1, "{v}");
    assert_eq!(hit(&gw, "/api/x", "k1").await, 200);

    // Other numbers for one caller.
    let body = r#"{"api_key":"k1","limit":"per_key","quota":6,"window":"1h","ttl":"24h"}"#;
    let (status, v) = call(&gw, Method::PUT, "/admin/overrides", Some(body)).await;
    assert_eq!(status, 200, "{v}");
    for _ in 0..5 {
        assert_eq!(hit(&gw, "/api/x", "k1").await, 200);
    }
    assert_eq!(hit(&gw, "/api/x", "k1").await, 429);
    // A reload keeps the overrides.
    let again = tollgate::config::load::parse_str(&yaml("", &with_token(), 3)).unwrap();
    gw.gateway.reload(again);
    let (_, v) = call(
        &gw,
        Method::GET,
        "/admin/callers?api_key=k1&limit=per_key",
        None,
    )
    .await;
    let e = entry(&v, "api", "per_key");
    assert_eq!(e["quota"], 6, "{v}");
    assert_eq!(e["override"]["quota"], 6, "{v}");
    let (_, v) = call(&gw, Method::GET, "/admin/overrides", None).await;
    assert_eq!(v["overrides"][0]["orphaned"], false, "{v}");
    assert_eq!(v["overrides"][0]["expires_in_s"], 86_400, "{v}");

    // A plan for a caller the file gives another one.
    assert_eq!(hit(&gw, "/planned", "pk").await, 200);
    assert_eq!(hit(&gw, "/planned", "pk").await, 200);
    assert_eq!(hit(&gw, "/planned", "pk").await, 429);
    let (status, v) = call(
        &gw,
        Method::PUT,
        "/admin/overrides",
        Some(r#"{"api_key":"pk","plan":"pro"}"#),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(hit(&gw, "/planned", "pk").await, 200);

    // Exempt: not counted at all.
    let (status, v) = call(
        &gw,
        Method::PUT,
        "/admin/overrides",
        Some(r#"{"api_key":"k2","exempt":true}"#),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    for _ in 0..10 {
        assert_eq!(hit(&gw, "/api/x", "k2").await, 200);
    }
    let (_, v) = call(&gw, Method::GET, "/admin/callers?api_key=k2", None).await;
    assert!(
        v["exempt_routes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r == "api"),
        "{v}"
    );
    assert!(gw.scrape().await.contains(r#"outcome="exempt""#));

    // Removing the override puts the file's numbers back.
    let (status, v) = call(&gw, Method::DELETE, "/admin/overrides?api_key=k2", None).await;
    assert_eq!(status, 200, "{v}");
    for _ in 0..3 {
        assert_eq!(hit(&gw, "/api/x", "k2").await, 200);
    }
    assert_eq!(hit(&gw, "/api/x", "k2").await, 429);
    let (status, _) = call(&gw, Method::DELETE, "/admin/overrides?api_key=k2", None).await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn an_override_named_by_its_share_covers_the_shared_counter() {
    let yaml = format!(
        "listen: 127.0.0.1:0
admin: {}
routes:
  - name: a
    match: {{ path_prefix: /a }}
    respond: {{ status: 200, body: ok }}
    limits: [ {{ name: ab, key: api_key, limit: 2, window: 1h, share: ab }} ]
  - name: b
    match: {{ path_prefix: /b }}
    respond: {{ status: 200, body: ok }}
    limits: [ {{ name: ab, key: api_key, limit: 2, window: 1h, share: ab }} ]
",
        with_token()
    );
    let gw = start(&yaml).await;
    // The limits' name is the share's too: it names the shared counter,
    // not one route's limit (which alone would be ambiguous).
    let body = r#"{"api_key":"k1","limit":"ab","quota":4}"#;
    let (status, v) = call(&gw, Method::PUT, "/admin/overrides", Some(body)).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["override"]["share"], true, "{v}");
    let mut admitted = 0;
    for path in ["/a/x", "/b/x", "/a/x", "/b/x", "/a/x", "/b/x"] {
        if hit(&gw, path, "k1").await == 200 {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 4, "the override's quota, over both routes");
    // Another caller keeps the file's 2.
    assert_eq!(hit(&gw, "/a/x", "k2").await, 200);
    assert_eq!(hit(&gw, "/b/x", "k2").await, 200);
    assert_eq!(hit(&gw, "/a/x", "k2").await, 429);
    let (_, v) = call(&gw, Method::GET, "/admin/overrides", None).await;
    assert_eq!(v["overrides"][0]["orphaned"], false, "{v}");
}

#[tokio::test]
async fn a_caller_keyed_by_a_json_field_of_its_bodies_is_named_by_it() {
    let gw = start(&chat_yaml(5)).await;
    for model in ["gpt-x", "gpt-x", "other"] {
        assert_eq!(chat(&gw, model).await, 200);
    }
    let (status, v) = call(
        &gw,
        Method::GET,
        "/admin/callers?api_key=k1&json.model=gpt-x",
        None,
    )
    .await;
    assert_eq!(status, 200, "{v}");
    let e = entry(&v, "chat", "per_model");
    assert_eq!(e["used"], 2, "{v}");
    assert!(
        e["identity"].as_str().unwrap().contains("json.model=gpt-x"),
        "{v}"
    );
    let (_, v) = call(
        &gw,
        Method::GET,
        "/admin/callers?api_key=k1&json.model=other",
        None,
    )
    .await;
    assert_eq!(entry(&v, "chat", "per_model")["used"], 1, "{v}");
}

/// A gateway with a chat route limiting each API key and model to `limit`
/// an hour.
fn chat_yaml(limit: u64) -> String {
    format!(
        "listen: 127.0.0.1:0
admin: {}
routes:
  - name: chat
    match: {{ path_prefix: /v1 }}
    respond: {{ status: 200, body: ok }}
    limits: [ {{ name: per_model, key: [ api_key, \"json:model\" ], limit: {limit}, window: 1h }} ]
",
        with_token()
    )
}

/// A request of `k1` to the chat route with a body naming `model`: its
/// status.
async fn chat(gw: &super::AdminGateway, model: &str) -> u16 {
    let req = http::Request::post("/v1/chat")
        .header("host", "gateway.test")
        .header("x-api-key", "k1")
        .body(http_body_util::Full::new(bytes::Bytes::from(format!(
            "{{\"model\":\"{model}\"}}"
        ))))
        .unwrap();
    super::send(gw.addr, req).await.status.as_u16()
}

#[tokio::test]
async fn an_override_narrowed_by_a_json_field_holds_for_that_value_only() {
    let gw = start(&chat_yaml(2)).await;
    let body = r#"{"api_key":"k1","json.model":"big","limit":"per_model","quota":4}"#;
    let (status, v) = call(&gw, Method::PUT, "/admin/overrides", Some(body)).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["override"]["caller"]["json.model"], "big", "{v}");
    for _ in 0..4 {
        assert_eq!(chat(&gw, "big").await, 200);
    }
    assert_eq!(chat(&gw, "big").await, 429);
    for _ in 0..2 {
        assert_eq!(chat(&gw, "small").await, 200);
    }
    assert_eq!(chat(&gw, "small").await, 429);

    // The lookup names the override for that value only.
    let (_, v) = call(
        &gw,
        Method::GET,
        "/admin/callers?api_key=k1&json.model=big",
        None,
    )
    .await;
    assert_eq!(entry(&v, "chat", "per_model")["quota"], 4, "{v}");
    let (_, v) = call(
        &gw,
        Method::GET,
        "/admin/callers?api_key=k1&json.model=small",
        None,
    )
    .await;
    let e = entry(&v, "chat", "per_model");
    assert_eq!(
        (&e["quota"], &e["override"]),
        (&2.into(), &serde_json::Value::Null),
        "{v}"
    );

    // The key alone is another override, beside the narrowed one, which
    // `big` still meets first.
    let body = r#"{"api_key":"k1","limit":"per_model","quota":6}"#;
    let (status, v) = call(&gw, Method::PUT, "/admin/overrides", Some(body)).await;
    assert_eq!(
        (status, &v["replaced"]),
        (200, &serde_json::Value::Null),
        "{v}"
    );
    assert_eq!(chat(&gw, "big").await, 429);
    for _ in 0..4 {
        assert_eq!(chat(&gw, "small").await, 200);
    }
    assert_eq!(chat(&gw, "small").await, 429);

    // Removing by the field removes the narrowed one only: the key's own
    // numbers hold for `big` now (4 used of 6).
    let (status, v) = call(
        &gw,
        Method::DELETE,
        "/admin/overrides?api_key=k1&json.model=big",
        None,
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["removed"].as_array().map(Vec::len), Some(1), "{v}");
    assert_eq!(v["removed"][0]["caller"]["json.model"], "big", "{v}");
    assert_eq!(chat(&gw, "big").await, 200);
    let (_, v) = call(&gw, Method::GET, "/admin/overrides", None).await;
    assert_eq!(v["overrides"].as_array().map(Vec::len), Some(1), "{v}");
}
