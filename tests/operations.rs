//! Operating tollgate: the admin listener (`/metrics`, `/healthz`,
//! `/readyz`, `/admin/top`), shadow limits, hot reload on SIGHUP, the access
//! log and the configuration's JSON Schema. Real gateways, upstreams and
//! `redis-server` on free loopback ports; the reload and log tests run the
//! built binary as the README does. OpenTelemetry traces go to a
//! collector inside the test.

#[path = "support/mod.rs"]
mod support;

#[path = "operations/deploy.rs"]
mod deploy;

#[path = "operations/traces.rs"]
mod traces;

use std::io::Read as _;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use http::StatusCode;
use tollgate::clock::ManualClock;

use support::admin::{AdminGateway, value};
use support::gateway::{Reply, Upstream, free_port, get, send};
use support::redis::RedisServer;
use support::wait::until;

/// A fixed instant well inside a window, so no test straddles a boundary.
const T0: u64 = 1_800_000_000_000;

fn clock() -> Arc<ManualClock> {
    Arc::new(ManualClock::new(T0))
}

/// Asserts that every `(series, value)` is in the exposition, exactly.
fn assert_series(text: &str, expected: &[(&str, f64)]) {
    let mut wrong = Vec::new();
    for (series, want) in expected {
        let got = value(text, series);
        if got != Some(*want) {
            wrong.push(format!("{series}: want {want}, got {got:?}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "{}\n--- scraped:\n{text}",
        wrong.join("\n")
    );
}

#[tokio::test]
async fn metrics_count_a_mix_of_outcomes_exactly() {
    let up = Upstream::start().await;
    let dead = free_port(); // nothing listens there: connect errors
    let yaml = format!(
        r#"
listen: 127.0.0.1:0
routes:
  - name: api
    match: {{ path_prefix: /api }}
    upstream: {up}
    limits: [ {{ name: per_ip, key: ip, limit: 3, window: 1h }} ]
  - name: trial
    match: {{ path_prefix: /trial }}
    upstream: {up}
    limits: [ {{ name: new_limit, key: ip, limit: 1, window: 1h, shadow: true }} ]
  - name: down
    match: {{ path_prefix: /down }}
    upstream: http://127.0.0.1:{dead}
  - name: sluggish
    match: {{ path_prefix: /slow }}
    upstream: {up}
    timeout: 100ms
"#,
        up = up.url()
    );
    let gw = AdminGateway::start(&yaml, clock()).await;
    let mut statuses = Vec::new();
    for path in [
        "/api",
        "/api",
        "/api",
        "/api",
        "/api", // 3 allowed, 2 limited
        "/trial",
        "/trial",
        "/trial", // 1 allowed, 2 shadow-limited (forwarded)
        "/down",
        "/down",         // 2 upstream errors
        "/slow?ms=2000", // 1 upstream timeout
        "/nowhere",      // no route
    ] {
        statuses.push(send(gw.addr, get(path, &[])).await.status.as_u16());
    }
    assert_eq!(
        statuses,
        [200, 200, 200, 429, 429, 200, 200, 200, 502, 502, 504, 404]
    );
    assert_eq!(up.count(), 7);

    let text = gw.scrape().await;
    assert_series(
        &text,
        &[
            (
                r#"tollgate_requests_total{route="api",outcome="allowed"}"#,
                3.0,
            ),
            (
                r#"tollgate_requests_total{route="api",outcome="limited"}"#,
                2.0,
            ),
            (
                r#"tollgate_requests_total{route="api",outcome="shadow_limited"}"#,
                0.0,
            ),
            (
                r#"tollgate_requests_total{route="api",outcome="error"}"#,
                0.0,
            ),
            (
                r#"tollgate_requests_total{route="trial",outcome="allowed"}"#,
                1.0,
            ),
            (
                r#"tollgate_requests_total{route="trial",outcome="shadow_limited"}"#,
                2.0,
            ),
            (
                r#"tollgate_requests_total{route="trial",outcome="limited"}"#,
                0.0,
            ),
            (
                r#"tollgate_requests_total{route="down",outcome="error"}"#,
                2.0,
            ),
            (
                r#"tollgate_requests_total{route="down",outcome="allowed"}"#,
                0.0,
            ),
            ("tollgate_unmatched_requests_total", 1.0),
            (
                r#"tollgate_decisions_total{route="api",limit="per_ip",outcome="allowed"}"#,
                3.0,
            ),
            (
                r#"tollgate_decisions_total{route="api",limit="per_ip",outcome="limited"}"#,
                2.0,
            ),
            (
                r#"tollgate_decisions_total{route="trial",limit="new_limit",outcome="allowed"}"#,
                1.0,
            ),
            (
                r#"tollgate_decisions_total{route="trial",limit="new_limit",outcome="shadow_limited"}"#,
                2.0,
            ),
            (
                r#"tollgate_upstream_responses_total{route="api",class="2xx"}"#,
                3.0,
            ),
            (
                r#"tollgate_upstream_responses_total{route="trial",class="2xx"}"#,
                3.0,
            ),
            (
                r#"tollgate_upstream_responses_total{route="down",class="2xx"}"#,
                0.0,
            ),
            (
                r#"tollgate_upstream_errors_total{route="down",kind="connect"}"#,
                2.0,
            ),
            (
                r#"tollgate_upstream_errors_total{route="api",kind="connect"}"#,
                0.0,
            ),
            (
                r#"tollgate_upstream_errors_total{route="sluggish",kind="timeout"}"#,
                1.0,
            ),
            (
                r#"tollgate_requests_total{route="sluggish",outcome="error"}"#,
                1.0,
            ),
            (
                r#"tollgate_upstream_duration_seconds_count{route="sluggish"}"#,
                0.0,
            ),
            (
                r#"tollgate_upstream_duration_seconds_count{route="api"}"#,
                3.0,
            ),
            (
                r#"tollgate_upstream_duration_seconds_count{route="trial"}"#,
                3.0,
            ),
            (
                r#"tollgate_store_call_duration_seconds_count{store="memory"}"#,
                8.0,
            ),
            (
                r#"tollgate_store_call_duration_seconds_count{store="redis"}"#,
                0.0,
            ),
            ("tollgate_store_errors_total", 0.0),
            ("tollgate_store_fallback", 0.0),
        ],
    );
    // No identity ever becomes a label.
    assert!(!text.contains("127.0.0.1"), "{text}");
}

#[tokio::test]
async fn health_readiness_and_admin_errors() {
    let gw = AdminGateway::start(
        "listen: 127.0.0.1:0\nroutes: [ { name: a, respond: {} } ]\n",
        clock(),
    )
    .await;
    let h = gw.admin_get("/healthz").await;
    assert_eq!((h.status, h.text().as_str()), (StatusCode::OK, "ok\n"));
    let r = gw.admin_get("/readyz").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.text(), "ready\nstore: memory\n");
    let m = gw.admin_get("/metrics").await;
    assert!(
        m.header("content-type")
            .is_some_and(|c| c.starts_with("application/openmetrics-text")),
        "{:?}",
        m.headers
    );
    assert!(m.text().ends_with("# EOF\n"));
    assert_eq!(gw.admin_get("/nope").await.status, StatusCode::NOT_FOUND);
    let post = http::Request::builder()
        .method("POST")
        .uri("/metrics")
        .header("host", "admin")
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    assert_eq!(
        send(gw.admin, post).await.status,
        StatusCode::METHOD_NOT_ALLOWED
    );
    // The admin paths are not served on the proxy listener.
    assert_eq!(
        send(gw.addr, get("/metrics", &[])).await.status,
        StatusCode::OK, // the catch-all route answers it, not the admin handler
    );
    assert!(
        !send(gw.addr, get("/metrics", &[]))
            .await
            .text()
            .contains("tollgate_")
    );
}

#[tokio::test]
async fn readyz_fails_while_draining_and_in_flight_requests_finish() {
    let up = Upstream::start().await;
    let mut gw = AdminGateway::start(
        &format!(
            "listen: 127.0.0.1:0\nroutes: [ {{ name: a, upstream: {} }} ]\n",
            up.url()
        ),
        clock(),
    )
    .await;
    let addr = gw.addr;
    let slow = tokio::spawn(async move { send(addr, get("/slow?ms=1500", &[])).await });
    up.wait_for(1, Duration::from_secs(10)).await;
    gw.shut_down();
    let r = wait_ready_body(&gw, "draining").await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    let done = slow.await.expect("slow request task");
    assert_eq!(
        (done.status, done.text().as_str()),
        (StatusCode::OK, "slow ok")
    );
}

/// Polls `/readyz` until its body contains `want`; that answer.
async fn wait_ready_body(gw: &AdminGateway, want: &str) -> Reply {
    let last = std::sync::Mutex::new(None);
    until(
        &format!("/readyz saying {want:?}"),
        Duration::from_secs(10),
        || async {
            let r = gw.admin_get("/readyz").await;
            let said = r.text().contains(want);
            *last.lock().unwrap() = Some(r);
            said
        },
    )
    .await;
    last.into_inner().unwrap().expect("polled at least once")
}

#[tokio::test]
async fn store_errors_and_fallback_state_follow_redis() {
    let mut redis = RedisServer::start().await;
    let yaml = format!(
        r#"
listen: 127.0.0.1:0
store: {{ redis: {{ url: "{}", timeout: 200ms }}, on_error: local }}
routes:
  - name: demo
    respond: {{ body: "hi" }}
    limits: [ {{ name: demo, key: ip, limit: 100, window: 1h }} ]
"#,
        redis.url()
    );
    let gw = AdminGateway::start(&yaml, clock()).await;
    wait_ready_body(&gw, "store: redis connected").await;
    assert_eq!(send(gw.addr, get("/", &[])).await.status, StatusCode::OK);
    assert_series(
        &gw.scrape().await,
        &[
            (
                r#"tollgate_store_call_duration_seconds_count{store="redis"}"#,
                1.0,
            ),
            ("tollgate_store_errors_total", 0.0),
            ("tollgate_store_fallback", 0.0),
        ],
    );

    redis.stop();
    for _ in 0..2 {
        // Decided in process (on_error: local): still answered.
        assert_eq!(send(gw.addr, get("/", &[])).await.status, StatusCode::OK);
    }
    let r = wait_ready_body(&gw, "unreachable").await;
    assert_eq!(
        r.status,
        StatusCode::OK,
        "the fallback is active: still ready"
    );
    assert_series(
        &gw.scrape().await,
        &[
            (
                r#"tollgate_store_call_duration_seconds_count{store="redis"}"#,
                3.0,
            ),
            (
                r#"tollgate_store_call_duration_seconds_count{store="memory"}"#,
                2.0,
            ),
            ("tollgate_store_errors_total", 2.0),
            ("tollgate_store_fallback", 1.0),
        ],
    );

    redis.restart().await;
    wait_ready_body(&gw, "store: redis connected").await;
    assert_eq!(send(gw.addr, get("/", &[])).await.status, StatusCode::OK);
    let text = gw.scrape().await;
    assert_series(
        &text,
        &[
            ("tollgate_store_errors_total", 2.0),
            ("tollgate_store_fallback", 0.0),
        ],
    );
}

#[tokio::test]
async fn failing_open_counts_unchecked_decisions() {
    // Nothing listens on this port: Redis is down from the start.
    let yaml = format!(
        r#"
listen: 127.0.0.1:0
store: {{ redis: {{ url: "redis://127.0.0.1:{}", timeout: 100ms }}, on_error: allow }}
routes:
  - name: demo
    respond: {{ body: "hi" }}
    limits: [ {{ name: demo, key: ip, limit: 1, window: 1h }} ]
"#,
        free_port()
    );
    let gw = AdminGateway::start(&yaml, clock()).await;
    for _ in 0..3 {
        let r = send(gw.addr, get("/", &[])).await;
        assert_eq!(r.status, StatusCode::OK, "on_error: allow admits");
        assert_eq!(r.header("ratelimit"), None, "no count is known");
    }
    let r = gw.admin_get("/readyz").await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(r.text().contains("redis unreachable"), "{}", r.text());
    assert_series(
        &gw.scrape().await,
        &[
            (
                r#"tollgate_requests_total{route="demo",outcome="allowed"}"#,
                3.0,
            ),
            (
                r#"tollgate_decisions_total{route="demo",limit="demo",outcome="error"}"#,
                3.0,
            ),
            (
                r#"tollgate_decisions_total{route="demo",limit="demo",outcome="allowed"}"#,
                0.0,
            ),
            ("tollgate_store_errors_total", 3.0),
            ("tollgate_store_fallback", 1.0),
        ],
    );
}

#[tokio::test]
async fn shadow_limit_forwards_shows_r0_counts_and_tops_the_hashed_identity() {
    let up = Upstream::start().await;
    let yaml = format!(
        r#"
listen: 127.0.0.1:0
routes:
  - name: api
    match: {{ path_prefix: / }}
    upstream: {up}
    limits:
      - {{ name: per_caller, key: api_key | ip, limit: 2, window: 1h, shadow: true }}
"#,
        up = up.url()
    );
    let gw = AdminGateway::start(&yaml, clock()).await;
    let heavy = [("x-api-key", "heavy-key-123")];
    let mut remaining = Vec::new();
    for _ in 0..6 {
        let r = send(gw.addr, get("/x", &heavy)).await;
        assert_eq!(r.status, StatusCode::OK, "shadow mode never denies");
        assert_eq!(r.text(), "upstream ok");
        assert_eq!(
            r.header("ratelimit-policy"),
            Some(r#""per_caller";q=2;w=3600"#)
        );
        let v = r.header("ratelimit").expect("RateLimit header").to_owned();
        remaining.push(
            v.split(";r=")
                .nth(1)
                .and_then(|s| s.split(';').next())
                .map(str::to_owned),
        );
    }
    let r: Vec<&str> = remaining
        .iter()
        .map(|s| s.as_deref().unwrap_or("?"))
        .collect();
    assert_eq!(r, ["1", "0", "0", "0", "0", "0"]);
    // Two other callers, one request each: never over.
    send(gw.addr, get("/x", &[("x-api-key", "light")])).await;
    send(gw.addr, get("/x", &[])).await;
    assert_eq!(up.count(), 8, "every request was forwarded");

    let text = gw.scrape().await;
    assert_series(
        &text,
        &[
            (
                r#"tollgate_requests_total{route="api",outcome="shadow_limited"}"#,
                4.0,
            ),
            (
                r#"tollgate_requests_total{route="api",outcome="allowed"}"#,
                4.0,
            ),
            (
                r#"tollgate_requests_total{route="api",outcome="limited"}"#,
                0.0,
            ),
            (
                r#"tollgate_decisions_total{route="api",limit="per_caller",outcome="shadow_limited"}"#,
                4.0,
            ),
        ],
    );
    assert!(!text.contains("heavy-key-123"));

    let top = gw.admin_get("/admin/top").await;
    assert_eq!(top.status, StatusCode::OK);
    assert!(!top.text().contains("heavy-key-123"), "{}", top.text());
    let v: serde_json::Value = serde_json::from_slice(&top.body).expect("top is JSON");
    let limit = &v["limits"][0];
    assert_eq!(limit["route"], "api");
    assert_eq!(limit["limit"], "per_caller");
    assert_eq!(limit["shadow"], true);
    assert_eq!(limit["denied"], 4);
    // printf %s heavy-key-123 | sha256sum | cut -c1-16
    assert_eq!(limit["top"][0]["identity"], "key=sha256:77867646b0bf96d7");
    assert_eq!(limit["top"][0]["count"], 4);
    assert_eq!(limit["top"].as_array().map(Vec::len), Some(1));
}

#[tokio::test]
async fn shadow_limit_beside_an_enforced_one_leaves_enforcement_alone() {
    let up = Upstream::start().await;
    let yaml = format!(
        r#"
listen: 127.0.0.1:0
routes:
  - name: api
    match: {{ path_prefix: / }}
    upstream: {up}
    limits:
      - {{ name: old, key: ip, limit: 4, window: 1h }}
      - {{ name: new, key: ip, limit: 2, window: 1h, shadow: true }}
"#,
        up = up.url()
    );
    let gw = AdminGateway::start(&yaml, clock()).await;
    let mut seen = Vec::new();
    for _ in 0..6 {
        let r = send(gw.addr, get("/x", &[])).await;
        seen.push((
            r.status.as_u16(),
            r.header("ratelimit").unwrap_or("").to_owned(),
        ));
    }
    assert_eq!(
        seen,
        [
            (200, r#""old";r=3;t=7200, "new";r=1;t=7200"#.to_owned()),
            (200, r#""old";r=2;t=7200, "new";r=0;t=7200"#.to_owned()),
            // The new limit would deny (t is its Retry-After); the old one
            // still counts the request.
            (200, r#""old";r=1;t=7200, "new";r=0;t=5400"#.to_owned()),
            (200, r#""old";r=0;t=7200, "new";r=0;t=5400"#.to_owned()),
            // Enforced denial: the shadow limit is only read, not counted.
            (429, r#""old";r=0;t=4500, "new";r=0;t=7200"#.to_owned()),
            (429, r#""old";r=0;t=4500, "new";r=0;t=7200"#.to_owned()),
        ]
    );
    let text = gw.scrape().await;
    assert_series(
        &text,
        &[
            (
                r#"tollgate_requests_total{route="api",outcome="allowed"}"#,
                2.0,
            ),
            (
                r#"tollgate_requests_total{route="api",outcome="shadow_limited"}"#,
                2.0,
            ),
            (
                r#"tollgate_requests_total{route="api",outcome="limited"}"#,
                2.0,
            ),
            (
                r#"tollgate_decisions_total{route="api",limit="old",outcome="allowed"}"#,
                4.0,
            ),
            (
                r#"tollgate_decisions_total{route="api",limit="old",outcome="limited"}"#,
                2.0,
            ),
            (
                r#"tollgate_decisions_total{route="api",limit="new",outcome="allowed"}"#,
                2.0,
            ),
            (
                r#"tollgate_decisions_total{route="api",limit="new",outcome="shadow_limited"}"#,
                2.0,
            ),
        ],
    );
    let r = send(gw.addr, get("/x", &[])).await;
    assert!(
        r.text().contains(r#""violated-policies":["old"]"#),
        "{}",
        r.text()
    );
}

#[tokio::test]
async fn library_reload_keeps_counters_and_switches_new_requests() {
    let yaml = |limit: u64| {
        format!(
            "listen: 127.0.0.1:0\nroutes:\n  - name: demo\n    respond: {{ body: hi }}\n    limits: [ {{ name: demo, key: ip, limit: {limit}, window: 1h }} ]\n"
        )
    };
    let gw = AdminGateway::start(&yaml(3), clock()).await;
    for _ in 0..2 {
        assert_eq!(send(gw.addr, get("/", &[])).await.status, StatusCode::OK);
    }
    gw.gateway
        .reload(tollgate::config::load::parse_str(&yaml(5)).expect("valid"));
    let r = send(gw.addr, get("/", &[])).await;
    assert_eq!(r.header("ratelimit-policy"), Some(r#""demo";q=5;w=3600"#));
    assert_eq!(
        r.header("ratelimit"),
        Some(r#""demo";r=2;t=7200"#),
        "3 counted of 5"
    );
}

// ---- the built binary ----

/// A log reader that stalls must not stall the gateway: with its stderr a
/// pipe nobody reads (it fills after a few hundred lines), every request
/// is still answered, and the lines that did not fit are dropped and
/// counted instead of waited for.
#[tokio::test]
async fn a_gateway_whose_stderr_nobody_reads_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.yaml");
    std::fs::write(
        &path,
        "listen: 127.0.0.1:0\nadmin: 127.0.0.1:0\nroutes:\n  - name: demo\n    respond: { body: hi }\n",
    )
    .unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tollgate"));
    cmd.arg("--config").arg(&path);
    let started = support::binary::spawn_unread(cmd, 2);
    let proxy = started.proxy[0];
    let admin = started.admin.expect("an admin listener");
    // More access-log lines than the pipe and the log queue hold together
    // (64 KiB of pipe, `logs::QUEUE_BYTES` of queue; a line is longer than
    // 64 bytes), over a few keep-alive connections.
    let per_conn = (tollgate::logs::QUEUE_BYTES / 64 + 2000) / 4;
    let answered = AtomicU64::new(0);
    let work = futures_util::future::join_all((0..4).map(|_| async {
        let stream = tokio::net::TcpStream::connect(proxy).await.unwrap();
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .unwrap();
        tokio::spawn(conn);
        for _ in 0..per_conn {
            let res = sender.send_request(get("/demo", &[])).await.unwrap();
            assert_eq!(res.status(), StatusCode::OK);
            answered.fetch_add(1, Ordering::Relaxed);
        }
    }));
    // A generous bound that only a stalled gateway misses.
    if tokio::time::timeout(Duration::from_secs(120), work)
        .await
        .is_err()
    {
        panic!(
            "the gateway stopped answering after {} requests",
            answered.load(Ordering::Relaxed)
        );
    }
    let metrics = send(admin, get("/metrics", &[])).await.text();
    let dropped = value(&metrics, "tollgate_log_lines_dropped_total").unwrap_or(0.0);
    assert!(
        dropped > 0.0,
        "no log line was dropped, so the test did not fill the queue:\n{metrics}"
    );
    let mut child = started.child;
    let _ = child.kill();
    let _ = child.wait();
}

/// The binary, with its stderr written to a file the test reads.
struct Binary {
    /// The process and every line it writes after the listening ones, as
    /// it writes them.
    started: support::binary::Started,
    port: u16,
    admin: u16,
    log: std::path::PathBuf,
}

impl Binary {
    /// `config` has `admin: 127.0.0.1:0`; both ports are read from the
    /// binary's "listening" lines.
    async fn start(config: &Path, args: &[&str], log: std::path::PathBuf) -> Binary {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_tollgate"));
        cmd.arg("--config")
            .arg(config)
            .arg("--listen")
            .arg("127.0.0.1:0")
            .args(args);
        // The proxy listener and the admin listener each report when bound.
        let started = support::binary::spawn_listening(cmd, 2, Some(&log));
        Binary {
            port: started.proxy[0].port(),
            admin: started.admin.expect("an admin listener").port(),
            started,
            log,
        }
    }

    async fn get(&self, path: &str, headers: &[(&str, &str)]) -> Reply {
        send(([127, 0, 0, 1], self.port).into(), get(path, headers)).await
    }

    async fn scrape(&self) -> String {
        send(([127, 0, 0, 1], self.admin).into(), get("/metrics", &[]))
            .await
            .text()
    }

    fn log(&self) -> String {
        let mut s = String::new();
        if let Ok(mut f) = std::fs::File::open(&self.log) {
            let _ = f.read_to_string(&mut s);
        }
        s
    }

    fn sighup(&self) {
        let status = Command::new("kill")
            .args(["-HUP", &self.started.child.id().to_string()])
            .status()
            .expect("kill -HUP");
        assert!(status.success());
    }

    /// Waits for a line holding `words` on the binary's line stream; the
    /// log up to that line.
    async fn until_logged(&mut self, words: &str) -> String {
        if !self
            .started
            .wait_for_line(words, Duration::from_secs(10))
            .await
        {
            panic!(
                "no line holding {words:?} within 10s\n--- log:\n{}",
                self.log()
            );
        }
        self.log()
    }

    /// Waits until `/metrics` shows `series` at `want`.
    async fn wait_metric(&self, series: &str, want: f64) {
        support::wait::value(
            &format!("{series} at {want}"),
            Duration::from_secs(10),
            || async move {
                let text = self.scrape().await;
                if value(&text, series) == Some(want) {
                    return Ok(());
                }
                Err(format!("{text}\n--- log:\n{}", self.log()))
            },
        )
        .await;
    }
}

impl Drop for Binary {
    fn drop(&mut self) {
        let _ = self.started.child.kill();
        let _ = self.started.child.wait();
    }
}

fn reload_yaml(up: &Upstream, limit: u64) -> String {
    format!(
        r#"
listen: 127.0.0.1:0
admin: 127.0.0.1:0
routes:
  - name: demo
    match: {{ path_prefix: /demo }}
    respond: {{ body: "hi\n" }}
    limits: [ {{ name: demo, key: ip, limit: {limit}, window: 1d }} ]
  - name: slow
    match: {{ path_prefix: /slow }}
    upstream: {up}
"#,
        up = up.url()
    )
}

/// Every secret-bearing field holds a secret ending `SECRETTAIL`, some
/// with a `${` that is no reference and a mistake beside it: no line of
/// `check`, of a start, or of a reload quotes any of them, and each error
/// names its field and line.
/// `--listen localhost:0` is bound on every address the name resolves to,
/// as nginx binds a name.
#[tokio::test]
async fn listen_on_a_name_binds_every_address_it_resolves_to() {
    use std::net::ToSocketAddrs;
    let mut want: Vec<std::net::IpAddr> = ("localhost", 0)
        .to_socket_addrs()
        .expect("localhost resolves")
        .map(|a| a.ip())
        .collect();
    want.sort_unstable();
    want.dedup();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.yaml");
    std::fs::write(
        &path,
        "listen: 127.0.0.1:0\nroutes: [ { name: a, respond: { body: hi } } ]\n",
    )
    .unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tollgate"));
    cmd.arg("--config")
        .arg(&path)
        .args(["--listen", "localhost:0"]);
    let mut started = support::binary::spawn_listening(cmd, want.len(), None);
    let mut bound: Vec<std::net::IpAddr> = started.proxy.iter().map(|a| a.ip()).collect();
    bound.sort_unstable();
    assert_eq!(bound, want);
    for addr in &started.proxy {
        assert_eq!(
            send(*addr, get("/", &[])).await.status,
            StatusCode::OK,
            "{addr}"
        );
    }
    let _ = started.child.kill();
    let _ = started.child.wait();
}

#[tokio::test]
async fn no_line_of_check_a_start_or_a_reload_quotes_a_secret() {
    let dir = tempfile::tempdir().unwrap();
    let secret = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, format!("{text}\n")).unwrap();
        path.display().to_string()
    };
    let jwt = secret("jwt", "file-jwt-secret-of-more-than-32-bytes-SECRETTAIL");
    let token = secret("token", "file-admin-token-SECRETTAIL");
    let user = secret("user", "file-user-SECRETTAIL");
    // Nothing listens there: the start logs what it makes of the Redis URL.
    let redis = format!("127.0.0.1:{}", free_port());
    let good = format!(
        "listen: 127.0.0.1:0
admin: {{ addr: 127.0.0.1:0, token_file: {token} }}
store:
  redis: {{ url: \"redis://usr-SECRETTAIL:pw-SECRETTAIL@{redis}\", timeout: 50ms, startup_wait: 0s }}
  on_error: allow
users: {{ jwt: {{ secret_file: {jwt} }} }}
routes: [ {{ name: a, respond: {{}}, limits: [ {{ name: x, key: ip, limit: 5, window: 1m }} ] }} ]
"
    );
    let bad = format!(
        "listen: 127.0.0.1:0
admin: {{ addr: 127.0.0.1:0, token: \"Tok${{9x!Lq-SECRETTAIL\" }}
store:
  redis:
    url: \"redis://usr-SECRETTAIL:Pw${{9x!Lq-SECRETTAIL@{redis}\"
    username_file: {user}
    password: \"Tr0ub4dor${{9x!Lq-SECRETTAIL\"
    timeout: nope
  on_error: allow
users: {{ jwt: {{ secret: \"J${{9x!Lq-SECRETTAIL-and-more-than-32-bytes\", claim: 5 }} }}
routes: [ {{ name: a, respond: {{}}, limits: [ {{ name: x, key: ip, limit: 5, window: 1 minute }} ] }} ]
"
    );
    let good_path = dir.path().join("good.yaml");
    let bad_path = dir.path().join("bad.yaml");
    std::fs::write(&good_path, &good).unwrap();
    std::fs::write(&bad_path, &bad).unwrap();
    let run = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .args(args)
            .env_remove("TOLLGATE_CONFIG")
            .output()
            .expect("run tollgate");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.code(), text)
    };
    let named = [
        "admin.token: ",
        "store.redis.url: ",
        "store.redis.password: ",
        "store.redis.timeout: ",
        "users.jwt.secret: ",
        "routes[0].limits[0].window: ",
    ];
    let bad_arg = bad_path.to_str().unwrap();
    let good_arg = good_path.to_str().unwrap();
    for args in [&["check", bad_arg][..], &["--config", bad_arg]] {
        let (code, text) = run(args);
        assert_eq!(code, Some(2), "{args:?}: {text}");
        for field in named {
            assert!(
                text.contains(field),
                "{args:?} does not name {field}: {text}"
            );
        }
        assert!(text.contains("(line 7, col"), "{text}");
        assert!(!text.contains("SECRETTAIL"), "{args:?}: {text}");
    }
    let (code, text) = run(&["check", good_arg]);
    assert_eq!(code, Some(0), "{text}");
    assert!(!text.contains("SECRETTAIL"), "{text}");

    // A start on the good file, then a reload refused for the bad one.
    let mut bin = Binary::start(&good_path, &[], dir.path().join("stderr.log")).await;
    std::fs::write(&good_path, &bad).unwrap();
    bin.sighup();
    bin.until_logged("configuration reload refused").await;
    let log = bin.until_logged("routes[0].limits[0].window").await;
    for field in named {
        assert!(
            log.contains(field),
            "the reload does not name {field}: {log}"
        );
    }
    assert!(!log.contains("SECRETTAIL"), "{log}");
}

#[tokio::test]
async fn sighup_reloads_a_good_file_and_refuses_a_broken_one_without_failing_a_request() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.yaml");
    std::fs::write(&path, reload_yaml(&up, 10)).unwrap();
    let mut bin = Binary::start(&path, &[], dir.path().join("stderr.log")).await;

    // A client streams requests, each in flight for 30 ms upstream, across
    // both reloads. Every one must succeed.
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    // The streamer publishes each completed request, so the test waits on
    // its progress instead of polling the counter.
    let (progress_tx, mut progress) = tokio::sync::watch::channel(0u64);
    let streamer = {
        let (stop, done) = (stop.clone(), done.clone());
        let port = bin.port;
        tokio::spawn(async move {
            let mut failures = Vec::new();
            // Bounded: at most 2000 requests, stopped by the test long before.
            for _ in 0..2000 {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let r = send(([127, 0, 0, 1], port).into(), get("/slow?ms=30", &[])).await;
                if r.status != StatusCode::OK {
                    failures.push(r.status);
                }
                let n = done.fetch_add(1, Ordering::Relaxed) + 1;
                let _ = progress_tx.send(n);
            }
            failures
        })
    };

    for i in 0..4u64 {
        let r = bin.get("/demo", &[]).await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.header("ratelimit-policy"), Some(r#""demo";q=10;w=86400"#));
        let want = format!(r#""demo";r={};"#, 9 - i);
        assert!(
            r.header("ratelimit").is_some_and(|v| v.starts_with(&want)),
            "{:?}",
            r.header("ratelimit")
        );
    }

    // 1. A changed limit: 10 → 6.
    std::fs::write(&path, reload_yaml(&up, 6)).unwrap();
    bin.sighup();
    bin.wait_metric(r#"tollgate_config_reloads_total{result="success"}"#, 1.0)
        .await;
    let r = bin.get("/demo", &[]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.header("ratelimit-policy"), Some(r#""demo";q=6;w=86400"#));
    // Four counted before the reload and this one: 6 − 5 = 1 left. A reset
    // counter would say 5.
    assert!(
        r.header("ratelimit")
            .is_some_and(|v| v.starts_with(r#""demo";r=1;"#)),
        "{:?}",
        r.header("ratelimit")
    );
    assert_eq!(bin.get("/demo", &[]).await.status, StatusCode::OK);
    assert_eq!(
        bin.get("/demo", &[]).await.status,
        StatusCode::TOO_MANY_REQUESTS,
        "the new, lower limit is enforced"
    );

    // 2. A broken file: refused, logged with every error, old config serves.
    std::fs::write(
        &path,
        reload_yaml(&up, 6)
            .replace("window: 1d", "window: 1 day")
            .replace("respond:", "respnd:"),
    )
    .unwrap();
    bin.sighup();
    bin.wait_metric(r#"tollgate_config_reloads_total{result="failure"}"#, 1.0)
        .await;
    bin.until_logged("configuration reload refused").await;
    // Each error follows on a line of its own, in file order (line 7's
    // unknown field, then line 8's window), so the log holds both once
    // the window's has come.
    let log = bin.until_logged("is not a duration").await;
    assert!(
        log.contains(r#"routes[0].limits[0].window: "1 day" is not a duration"#),
        "{log}"
    );
    assert!(
        log.contains(r#"unknown field \"respnd\""#) || log.contains(r#"unknown field "respnd""#),
        "{log}"
    );
    let r = bin.get("/demo", &[]).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.header("ratelimit-policy"), Some(r#""demo";q=6;w=86400"#));

    // Let the streamer overlap both reloads, then stop it.
    let before = done.load(Ordering::Relaxed);
    tokio::time::timeout(
        Duration::from_secs(10),
        progress.wait_for(|&n| n >= before + 3),
    )
    .await
    .expect("the streaming client stalled")
    .expect("the streaming client is running");
    stop.store(true, Ordering::Relaxed);
    let failures = streamer.await.expect("streamer");
    assert!(failures.is_empty(), "failed requests: {failures:?}");
    assert!(done.load(Ordering::Relaxed) >= 3);
    assert_series(
        &bin.scrape().await,
        &[(
            r#"tollgate_requests_total{route="slow",outcome="error"}"#,
            0.0,
        )],
    );
}

#[tokio::test]
async fn json_access_log_names_the_identity_kind_never_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.yaml");
    std::fs::write(
        &path,
        "listen: 127.0.0.1:0\nadmin: 127.0.0.1:0\nroutes:\n  - name: demo\n    respond: { body: hi }\n    limits: [ { name: demo, key: api_key | ip, limit: 1, window: 1h } ]\n",
    )
    .unwrap();
    let mut bin = Binary::start(
        &path,
        &["--log-format", "json"],
        dir.path().join("stderr.log"),
    )
    .await;
    let key = [("x-api-key", "secret-key-42")];
    assert_eq!(bin.get("/demo", &key).await.status, StatusCode::OK);
    assert_eq!(
        bin.get("/demo", &key).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    // Logs are written as requests end, by the log thread: take every line
    // as the binary writes it (each must be JSON) until both access lines
    // have come.
    let mut lines: Vec<serde_json::Value> = Vec::new();
    while lines.len() < 2 {
        let line = bin
            .started
            .next_line_with("", Duration::from_secs(10))
            .await
            .unwrap_or_else(|| panic!("no access log lines:\n{}", bin.log()));
        let v: serde_json::Value =
            serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        if v["target"] == "tollgate::access" {
            lines.push(v);
        }
    }
    let fields: Vec<_> = lines
        .iter()
        .map(|v| {
            let f = &v["fields"];
            (
                f["route"].clone(),
                f["identity"].clone(),
                f["decision"].clone(),
                f["status"].clone(),
                f["latency_ms"].is_number(),
            )
        })
        .collect();
    assert_eq!(
        fields,
        [
            (
                "demo".into(),
                "api_key".into(),
                "allowed".into(),
                200.into(),
                true
            ),
            (
                "demo".into(),
                "api_key".into(),
                "limited".into(),
                429.into(),
                true
            ),
        ]
    );
    assert!(!bin.log().contains("secret-key-42"), "{}", bin.log());
}

#[test]
fn schema_validates_the_shipped_gateway_yaml_and_rejects_mistakes() {
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .arg("schema")
        .output()
        .expect("run tollgate schema");
    assert!(out.status.success());
    let schema: serde_json::Value = serde_json::from_slice(&out.stdout).expect("schema is JSON");
    let validator = jsonschema::validator_for(&schema).expect("schema is a valid JSON Schema");

    let yaml = |src: &str| -> serde_json::Value { yaml_serde::from_str(src).expect("YAML parses") };
    let shipped =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("gateway.yaml"))
            .unwrap();
    let errors: Vec<String> = validator
        .iter_errors(&yaml(&shipped))
        .map(|e| format!("{e} at {}", e.instance_path()))
        .collect();
    assert!(
        errors.is_empty(),
        "gateway.yaml does not validate: {errors:#?}"
    );

    let good = "listen: [127.0.0.1:0]\nadmin: 127.0.0.1:0\nstore: { on_error: allow }\nroutes:\n  - name: a\n    match: { path_prefix: / }\n    respond: { status: 200 }\n    shadow: true\n    limits: [ { name: l, key: [ip, 'header:x-a'], limit: 1, window: 10s, shadow: false } ]\n";
    assert!(validator.is_valid(&yaml(good)));
    for bad in [
        // unknown field
        "listen: 127.0.0.1:0\nroutes: [ { name: a, respond: {}, timout: 1s } ]\n",
        // a limit as a string
        "listen: 127.0.0.1:0\nroutes: [ { name: a, respond: {}, limits: [ { name: l, key: ip, limit: many, window: 1s } ] } ]\n",
        // shadow: yes
        "listen: 127.0.0.1:0\nroutes: [ { name: a, respond: {}, shadow: yes } ]\n",
        // a header mode that does not exist
        "listen: 127.0.0.1:0\nheaders: github2\nroutes: [ { name: a, respond: {} } ]\n",
        // a window without a unit
        "listen: 127.0.0.1:0\nroutes: [ { name: a, respond: {}, limits: [ { name: l, key: ip, limit: 1, window: 5 minutes } ] } ]\n",
    ] {
        assert!(!validator.is_valid(&yaml(bad)), "accepted:\n{bad}");
    }
}

/// A pipe whose reading end is already closed, as `tollgate schema | head -1`
/// leaves it once `head` has its line; closed before the binary starts, so
/// its first write meets `EPIPE` however fast it runs.
#[cfg(unix)]
fn closed_pipe() -> std::process::Stdio {
    let (writer, reader) = tokio::net::unix::pipe::pipe().expect("pipe");
    drop(reader);
    std::process::Stdio::from(writer.into_blocking_fd().expect("pipe fd"))
}

#[cfg(unix)]
#[tokio::test]
async fn printing_into_a_closed_pipe_exits_quietly_with_the_commands_status() {
    use std::process::Stdio;

    let dir = tempfile::tempdir().expect("temp dir");
    let good = dir.path().join("good.yaml");
    std::fs::write(
        &good,
        "listen: 127.0.0.1:0\nroutes: [ { name: a, respond: {} } ]\n",
    )
    .expect("write");
    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        "listen: nowhere\nroutes: [ { name: a, respond: {} } ]\n",
    )
    .expect("write");
    let run = |args: &[&std::ffi::OsStr], stdout: Stdio, stderr: Stdio| {
        Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .args(args)
            .stdout(stdout)
            .stderr(stderr)
            .spawn()
            .expect("start tollgate")
            .wait_with_output()
            .expect("wait")
    };

    // stdout gone: the command's own status, and nothing on stderr (no
    // panic message, no complaint about the reader).
    for args in [
        vec!["schema".as_ref()],
        vec!["check".as_ref(), good.as_os_str()],
    ] {
        let out = run(&args, closed_pipe(), Stdio::piped());
        assert_eq!(out.status.code(), Some(0), "{args:?}: {out:?}");
        assert!(
            out.stderr.is_empty(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // stderr gone: a bad file is still exit status 2.
    let out = run(
        &["check".as_ref(), bad.as_os_str()],
        Stdio::piped(),
        closed_pipe(),
    );
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(out.stdout.is_empty());
    // With a reader, the same commands print their output.
    let out = run(&["schema".as_ref()], Stdio::piped(), Stdio::piped());
    assert_eq!(out.status.code(), Some(0));
    assert!(out.stdout.starts_with(b"{"), "{out:?}");
}

/// A reload reads its files on the blocking pool, not on the runtime: the
/// configuration is a FIFO whose writer is a task on the same one-thread
/// runtime, so a load that blocked the runtime's thread would wait for a
/// writer that could never run.
#[cfg(unix)]
#[test]
fn a_reload_reads_its_files_off_the_runtime() {
    let dir = tempfile::tempdir().expect("temp dir");
    let fifo = dir.path().join("gateway.yaml");
    let made = Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("run mkfifo");
    assert!(made.success(), "mkfifo failed");
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let routes = runtime.block_on(async {
            let first = "listen: 127.0.0.1:0\nroutes: [ { name: first, respond: {} } ]\n";
            let config = tollgate::config::load::parse_str(first).expect("valid");
            let gw = tollgate::Gateway::new(config).await.expect("gateway");
            let writer = tokio::spawn(tokio::fs::write(
                fifo.clone(),
                "listen: 127.0.0.1:0\nroutes: [ { name: from_fifo, respond: {} } ]\n",
            ));
            tollgate::reload::reload_file(&gw, &fifo, &Default::default())
                .await
                .expect("reload");
            writer.await.expect("writer task").expect("write the FIFO");
            let names: Vec<String> = gw
                .config()
                .routes
                .iter()
                .map(|r| r.name.to_string())
                .collect();
            names
        });
        let _ = done.send(routes);
    });
    let routes = finished
        .recv_timeout(Duration::from_secs(60))
        .expect("the reload finishes: it must not block the thread its file's writer runs on");
    assert_eq!(routes, ["from_fifo"]);
}

/// `tollgate health [--ready] --admin ADDR`: its exit status and what it
/// printed on stdout and stderr.
async fn health(admin: std::net::SocketAddr, ready: bool) -> (Option<i32>, String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tollgate"));
    cmd.arg("health")
        .arg("--admin")
        .arg(format!("http://{admin}"));
    if ready {
        cmd.arg("--ready");
    }
    let out = tokio::task::spawn_blocking(move || cmd.output().expect("run tollgate health"))
        .await
        .expect("health task");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The container health check: 0 while the gateway is up and ready; 1
/// with the reason while it drains (still live) and once it has stopped.
#[tokio::test]
async fn tollgate_health_follows_a_gateway_from_live_to_draining_to_stopped() {
    // An upstream that holds its one answer until the test releases it,
    // so the drain lasts exactly as long as the checks in it take.
    let held = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = held.local_addr().unwrap();
    let (release, released) = tokio::sync::oneshot::channel::<()>();
    let (arrived, has_arrived) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let (mut stream, _) = held.accept().await.expect("accept");
        let mut head = [0u8; 4096];
        let _ = stream.read(&mut head).await;
        let _ = arrived.send(());
        let _ = released.await;
        let _ = stream
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok")
            .await;
    });
    let mut gw = AdminGateway::start(
        &format!("listen: 127.0.0.1:0\nroutes: [ {{ name: a, upstream: http://{upstream} }} ]\n"),
        clock(),
    )
    .await;
    let admin = gw.admin;
    let (code, out, err) = health(admin, false).await;
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(out, format!("http://{admin}/healthz: ok\n"));
    let (code, out, err) = health(admin, true).await;
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(
        out,
        format!("http://{admin}/readyz: ready; store: memory\n")
    );

    let addr = gw.addr;
    let in_flight = tokio::spawn(async move { send(addr, get("/held", &[])).await });
    has_arrived.await.expect("the request reaches the upstream");
    gw.shut_down();
    wait_ready_body(&gw, "draining").await;
    let (code, out, err) = health(admin, true).await;
    assert_eq!(code, Some(1), "{out}");
    assert_eq!(
        err,
        format!(
            "tollgate health: http://{admin}/readyz answered 503 Service Unavailable: not ready: draining; store: memory\n"
        )
    );
    assert!(out.is_empty(), "{out}");
    let (code, _, err) = health(admin, false).await;
    assert_eq!(code, Some(0), "a draining gateway is still live: {err}");

    // Once the drain is over the admin listener closes too.
    let _ = release.send(());
    assert_eq!(
        in_flight.await.expect("in-flight request").status,
        StatusCode::OK
    );
    until(
        "the admin listener closed",
        Duration::from_secs(10),
        || async { tokio::net::TcpStream::connect(admin).await.is_err() },
    )
    .await;
    for ready in [false, true] {
        let (code, out, err) = health(admin, ready).await;
        assert_eq!(code, Some(1), "{out}");
        assert!(
            err.starts_with(&format!("tollgate health: cannot connect to {admin}: ")),
            "{err}"
        );
    }
}

/// A listener that accepts and never answers is a failed check within
/// `--timeout`, not a hung health check; an address that is not plain
/// http is refused before anything is asked. Both exit 1, never 2, which
/// container runtimes reserve.
#[tokio::test]
async fn tollgate_health_times_out_on_a_silent_listener_and_refuses_other_schemes() {
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = silent.local_addr().unwrap();
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((stream, _)) = silent.accept().await {
            open.push(stream);
        }
    });
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tollgate"));
    cmd.args(["health", "--timeout", "0.3", "--admin"])
        .arg(addr.to_string());
    let out = tokio::task::spawn_blocking(move || cmd.output().expect("run tollgate health"))
        .await
        .expect("health task");
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        format!("tollgate health: http://{addr}/healthz: no answer within 300ms\n")
    );
    held.abort();

    let out = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["health", "--admin", "https://127.0.0.1:9090"])
        .output()
        .expect("run tollgate health");
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("speaks plain http"),
        "{out:?}"
    );
}
