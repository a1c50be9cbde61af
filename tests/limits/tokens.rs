//! Limits in tokens for AI APIs (docs/limits.md#ai-apis), end to end: a
//! fake OpenAI-compatible and Anthropic-style upstream (`tokens/upstream.py`),
//! the official `openai` Python package as the client (`tokens/client.py`,
//! `base_url` at the gateway), in-process gateways on a real `redis-server`
//! and on the memory store.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};

use super::settled::{redis_total, settles_to};
use super::support::gateway::{Gateway, Reply, send};
use super::support::redis::RedisServer;
use super::support::skip::skipped;

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/limits/tokens")
        .join(name)
}

/// `upstream.py` on a free port; killed on drop.
struct ModelApi {
    child: Child,
    port: u16,
}

impl ModelApi {
    fn start() -> ModelApi {
        let mut child = Command::new("python3")
            .arg(script("upstream.py"))
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("python3 runs");
        // Ready once it prints its port: it has bound and serves.
        let mut line = String::new();
        let stdout = child.stdout.take().expect("piped stdout");
        let _ = BufReader::new(stdout).read_line(&mut line);
        let Ok(port) = line.trim().parse() else {
            let _ = child.kill();
            panic!("upstream.py printed {line:?} instead of its port");
        };
        ModelApi { child, port }
    }
}

impl Drop for ModelApi {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The calls `calls` made by `client.py` through `gateway` as `key`: one
/// result each; `None` when the `openai` package is not installed.
async fn openai(gateway: SocketAddr, key: &str, calls: Value) -> Option<Vec<Value>> {
    let (key, calls) = (key.to_owned(), calls.to_string());
    let out = tokio::task::spawn_blocking(move || {
        Command::new("python3")
            .arg(script("client.py"))
            .arg(format!("http://{gateway}/v1"))
            .arg(&key)
            .arg(&calls)
            .stderr(Stdio::inherit())
            .output()
            .expect("python3 runs")
    })
    .await
    .expect("client task");
    if out.status.code() == Some(3) {
        skipped("the openai Python package is not installed (scripts/test.sh installs it)");
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let v: Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("client.py printed {text:?} ({e}); status {}", out.status));
    Some(v.as_array().expect("a list").clone())
}

/// A gateway file: route `chat` for `/v1/` to `api`, a requests-per-minute
/// limit and the token limit `tokens` (a YAML flow mapping's fields).
fn chat(store: &str, api: &ModelApi, tokens: &str) -> String {
    format!(
        r#"
listen: 127.0.0.1:0
{store}
routes:
  - name: chat
    match: {{ path_prefix: /v1/ }}
    upstream: http://127.0.0.1:{port}
    limits:
      - {{ name: rpm, key: api_key, limit: 1000, window: 1m }}
      - {{ name: tpm, key: [ api_key, "json:model" ], {tokens} }}
"#,
        port = api.port
    )
}

// Windows of 30 days: a reservation settled after its window ended is
// (by the rules) not refunded, so a test that straddled a boundary would
// count more than was reported; one of 30 days makes that a chance of a
// few in a million.
const OPENAI: &str = "limit: 100000, window: 30d, algorithm: fixed_window, cost: { reserve: { json: max_tokens, default: 1000 }, from_body: openai }";
const ANTHROPIC: &str = "limit: 100000, window: 30d, algorithm: fixed_window, cost: { reserve: { json: max_tokens, default: 1000 }, from_body: anthropic }";

fn redis_yaml(redis: &RedisServer) -> String {
    format!(
        "store:\n  redis: {{ url: \"{}\", timeout: 500ms }}\n",
        redis.url()
    )
}

/// A POST of `body` (JSON) to `path` with API key `key`.
fn post(path: &str, key: &str, body: &Value) -> Request<Full<Bytes>> {
    Request::post(path)
        .header("host", "gateway.test")
        .header("authorization", format!("Bearer {key}"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap()
}

/// The usage `upstream.py` reports for `prompt` and `max_tokens`.
fn usage(prompt: &str, max_tokens: u64) -> u64 {
    prompt.split_whitespace().count().max(1) as u64 + max_tokens / 2 + 1
}

const PROMPT: &str = "say hello to me";

#[tokio::test]
async fn openai_tokens_are_counted_exactly_across_two_gateways() {
    let redis = RedisServer::start().await;
    let api = ModelApi::start();
    let yaml = chat(&redis_yaml(&redis), &api, OPENAI);
    let (a, b) = (Gateway::start(&yaml).await, Gateway::start(&yaml).await);
    let calls = |stream: bool, include: bool| {
        json!([
            { "model": "m1", "max_tokens": 40, "stream": stream, "include_usage": include },
            { "model": "m2", "max_tokens": 90, "stream": stream, "include_usage": include },
        ])
    };
    let mut reported = 0;
    for (gw, stream) in [(&a, false), (&b, true), (&a, true), (&b, false)] {
        let Some(results) = openai(gw.addr, "k1", calls(stream, true)).await else {
            return;
        };
        for r in results {
            assert_eq!(r["status"], 200, "{r}");
            reported += r["usage"].as_u64().expect("usage reported");
        }
    }
    assert_eq!(
        reported,
        2 * (2 * usage(PROMPT, 40) + 2 * usage(PROMPT, 90))
    );
    assert_eq!(settles_to(reported, || redis_total(&redis)).await, reported);

    // A stream the client did not ask usage of keeps its reservation.
    let results = openai(a.addr, "k1", calls(true, false)).await.expect("ran");
    assert!(
        results
            .iter()
            .all(|r| r["status"] == 200 && r["usage"].is_null())
    );
    let kept = reported + 40 + 90;
    assert_eq!(settles_to(kept, || redis_total(&redis)).await, kept);
}

#[tokio::test]
async fn the_request_that_does_not_fit_is_a_429_on_the_memory_store() {
    let api = ModelApi::start();
    let tokens = "limit: 100, window: 30d, algorithm: fixed_window, cost: { reserve: { json: max_tokens, default: 1000 }, from_body: openai }";
    let gw = Gateway::start(&chat("", &api, tokens)).await;
    let call = |max_tokens: u64| json!([{ "model": "m", "max_tokens": max_tokens }]);
    // 35 tokens each: 0 + 60 fits, 35 + 60 fits, 70 + 60 does not.
    for _ in 0..2 {
        let Some(r) = openai(gw.addr, "k", call(60)).await else {
            return;
        };
        assert_eq!(r[0]["status"], 200, "{r:?}");
        assert_eq!(r[0]["usage"], usage(PROMPT, 60));
    }
    let r = openai(gw.addr, "k", call(60)).await.expect("ran");
    assert_eq!(r[0]["status"], 429, "{r:?}");
    assert!(r[0]["retry_after"].is_string(), "{r:?}");
    // 30 still fits (70 + 30 = 100).
    let r = openai(gw.addr, "k", call(30)).await.expect("ran");
    assert_eq!(r[0]["status"], 200, "{r:?}");
    // A reservation above the limit itself is refused for good: no Retry-After.
    let r = openai(gw.addr, "other", call(101)).await.expect("ran");
    assert_eq!(r[0]["status"], 429, "{r:?}");
    assert!(r[0]["retry_after"].is_null(), "{r:?}");
    // Another model is another key: its tokens count apart.
    let r = openai(
        gw.addr,
        "k",
        json!([{ "model": "other", "max_tokens": 60 }]),
    )
    .await
    .expect("ran");
    assert_eq!(r[0]["status"], 200, "{r:?}");
}

#[tokio::test]
async fn anthropic_streams_settle_and_an_abort_settles_what_was_reported() {
    let redis = RedisServer::start().await;
    let api = ModelApi::start();
    let gw = Gateway::start(&chat(&redis_yaml(&redis), &api, ANTHROPIC)).await;
    let body = |model: &str, stream: bool| {
        json!({ "model": model, "max_tokens": 100, "stream": stream,
                "messages": [{ "role": "user", "content": PROMPT }] })
    };
    let whole = send(gw.addr, post("/v1/messages", "k", &body("m", false))).await;
    assert_eq!(whole.status, StatusCode::OK);
    // Both policies are named.
    let policy = whole.header("ratelimit-policy").expect("RateLimit-Policy");
    assert!(
        policy.contains("\"rpm\"") && policy.contains("\"tpm\""),
        "{policy}"
    );
    let streamed = send(gw.addr, post("/v1/messages", "k", &body("m", true))).await;
    assert_eq!(streamed.status, StatusCode::OK);
    assert!(streamed.text().contains("message_stop"));
    let each = usage(PROMPT, 100);
    assert_eq!(settles_to(2 * each, || redis_total(&redis)).await, 2 * each);

    // The client goes away mid-stream, after message_start (input tokens
    // and 1 output token) and the first message_delta: what was reported
    // by then is charged.
    let stream = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    let conn = tokio::spawn(conn);
    let res = sender
        .send_request(post("/v1/messages", "k", &body("hang", true)))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let mut body_in = res.into_body();
    let mut seen = String::new();
    while !seen.contains("content_block_delta") {
        let frame = body_in.frame().await.expect("a frame").expect("no error");
        if let Some(d) = frame.data_ref() {
            seen.push_str(&String::from_utf8_lossy(d));
        }
    }
    drop(body_in);
    drop(sender);
    conn.abort();
    let prompt = PROMPT.split_whitespace().count() as u64;
    let want = 2 * each + prompt + 1;
    assert_eq!(settles_to(want, || redis_total(&redis)).await, want);
}

#[tokio::test]
async fn a_burst_of_streams_never_admits_past_the_limit() {
    let redis = RedisServer::start().await;
    let api = ModelApi::start();
    let tokens = "limit: 1000, window: 30d, algorithm: fixed_window, cost: { reserve: { json: max_tokens, default: 1000 }, from_body: openai }";
    let (a, b) = (
        Gateway::start(&chat(&redis_yaml(&redis), &api, tokens)).await,
        Gateway::start(&chat(&redis_yaml(&redis), &api, tokens)).await,
    );
    let body = json!({ "model": "slow", "max_tokens": 100, "stream": true,
                       "stream_options": { "include_usage": true },
                       "messages": [{ "role": "user", "content": PROMPT }] });
    let tasks: Vec<_> = (0..20)
        .map(|i| {
            let to = if i % 2 == 0 { a.addr } else { b.addr };
            let req = post("/v1/chat/completions", "k", &body);
            tokio::spawn(async move { send(to, req).await })
        })
        .collect();
    let mut admitted = 0;
    for t in tasks {
        let r: Reply = t.await.unwrap();
        if r.status == StatusCode::OK {
            assert!(r.text().contains("\"total_tokens\""));
            admitted += 1;
        } else {
            assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
        }
    }
    // The streams last 300 ms, so the burst is decided before any settles:
    // at most limit / reservation are in flight at once.
    assert!((1..=10).contains(&admitted), "{admitted} admitted");
    let want = admitted * usage(PROMPT, 100);
    assert_eq!(settles_to(want, || redis_total(&redis)).await, want);
}

#[tokio::test]
async fn bad_usage_and_upstream_errors_keep_the_reservation() {
    let redis = RedisServer::start().await;
    let api = ModelApi::start();
    let gw = Gateway::start(&chat(&redis_yaml(&redis), &api, OPENAI)).await;
    let body = |model: &str, stream: bool| {
        json!({ "model": model, "max_tokens": 70, "stream": stream,
                "stream_options": { "include_usage": true },
                "messages": [{ "role": "user", "content": PROMPT }] })
    };
    for (model, stream, status) in [
        ("bad-usage", false, StatusCode::OK),
        ("bad-usage", true, StatusCode::OK),
        ("error", false, StatusCode::INTERNAL_SERVER_ERROR),
    ] {
        let r = send(
            gw.addr,
            post("/v1/chat/completions", "k", &body(model, stream)),
        )
        .await;
        assert_eq!(r.status, status, "{model}");
        // The client sees the upstream's body as it was sent.
        if stream {
            assert!(r.text().ends_with("data: [DONE]\n\n"), "{}", r.text());
        }
    }
    // Not JSON at all: no reservation read from it, the default reserved.
    let raw = Request::post("/v1/chat/completions")
        .header("host", "gateway.test")
        .header("authorization", "Bearer k")
        .body(Full::new(Bytes::from_static(b"{not json")))
        .unwrap();
    let r = send(gw.addr, raw).await;
    // The fake upstream cannot read it either: a 400 without usage.
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    let want = 3 * 70 + 1000;
    assert_eq!(settles_to(want, || redis_total(&redis)).await, want);
}
