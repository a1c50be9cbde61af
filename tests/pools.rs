//! Upstream pools end to end: a real gateway in front of real targets on
//! loopback ports — balancing by weight, round robin and hash; a killed
//! target, a silent one, one back from a hang used again once its check
//! passes, a failing fleet and the retry budget; a POST that
//! must not be sent twice; a name that resolves to two addresses.

#[path = "support/mod.rs"]
mod support;

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::Request;
use http_body_util::Full;
use support::gateway::{Captured, Gateway, get, send};
use support::targets::{Mode, Target};
use support::wait;
use tollgate::proxy::upstreams::resolve::Resolve;

async fn targets(n: usize) -> Vec<Target> {
    let mut out = Vec::new();
    for i in 0..n {
        out.push(Target::start(&format!("t{i}")).await);
    }
    out
}

/// A gateway with one route `/` to the pool `api` written as `pool`
/// (indented under `api:`).
async fn gateway(pool: &str) -> Gateway {
    let yaml = format!(
        "listen: 127.0.0.1:0
upstreams:
  api:
{pool}
routes:
  - name: api
    upstream: api
    timeout: 2s
"
    );
    Gateway::start(&yaml).await
}

fn target_list(ts: &[Target], weights: &[u32]) -> String {
    let mut s = String::from("    targets:\n");
    for (t, w) in ts.iter().zip(weights) {
        s.push_str(&format!("      - {{ url: {}, weight: {w} }}\n", t.url()));
    }
    s
}

/// Sends `n` GETs one after the other; returns how many answered 200, by
/// the answering target's name.
async fn spread(gw: &Gateway, n: usize, headers: &[(&str, &str)]) -> HashMap<String, usize> {
    let mut by = HashMap::new();
    for _ in 0..n {
        let r = send(gw.addr, get("/x", headers)).await;
        if r.status == 200 {
            *by.entry(r.text()).or_insert(0) += 1;
        } else {
            *by.entry(format!("status {}", r.status.as_u16()))
                .or_insert(0) += 1;
        }
    }
    by
}

fn within_ten_percent(got: usize, want: usize) -> bool {
    got.abs_diff(want) * 10 <= want
}

#[tokio::test]
async fn round_robin_follows_the_weights() {
    let ts = targets(3).await;
    let gw = gateway(&format!(
        "{}    balance: round_robin\n",
        target_list(&ts, &[1, 2, 3])
    ))
    .await;
    let by = spread(&gw, 300, &[]).await;
    for (name, want) in [("t0", 50), ("t1", 100), ("t2", 150)] {
        let got = by.get(name).copied().unwrap_or(0);
        assert!(
            within_ten_percent(got, want),
            "{name}: {got} of 300, want {want}: {by:?}"
        );
    }
}

#[tokio::test]
async fn least_request_follows_the_weights() {
    let ts = targets(3).await;
    let gw = gateway(&target_list(&ts, &[1, 1, 2])).await;
    let by = spread(&gw, 400, &[]).await;
    for (name, want) in [("t0", 100), ("t1", 100), ("t2", 200)] {
        let got = by.get(name).copied().unwrap_or(0);
        assert!(
            within_ten_percent(got, want),
            "{name}: {got} of 400, want {want}: {by:?}"
        );
    }
}

#[tokio::test]
async fn least_request_prefers_the_target_with_fewer_in_flight() {
    let ts = targets(2).await;
    let gw = gateway(&target_list(&ts, &[1, 1])).await;
    // t0 holds requests that never end; new ones go to t1.
    ts[0].set(Mode::Silent);
    let mut held = Vec::new();
    for _ in 0..2 {
        held.push(tokio::spawn(send(gw.addr, get("/held", &[]))));
    }
    wait::until("t0 holds a request", Duration::from_secs(2), || async {
        ts[0].requests() + ts[1].requests() >= 2 && ts[0].requests() >= 1
    })
    .await;
    let before = ts[1].requests();
    let by = spread(&gw, 20, &[]).await;
    assert_eq!(by.get("t1"), Some(&20), "{by:?}");
    assert_eq!(ts[1].requests() - before, 20);
    for h in held {
        h.abort();
    }
}

#[tokio::test]
async fn hash_keeps_each_caller_on_one_target() {
    let ts = targets(3).await;
    let gw = gateway(&format!(
        "{}    balance: hash\n    hash_key: \"header:x-user\"\n",
        target_list(&ts, &[1, 1, 1])
    ))
    .await;
    // The ring's points come from the targets' addresses, free ports
    // picked per run: sixteen callers all on one of three targets is a
    // chance of 3 in 3^16, where five were 1 in 81.
    let mut used = std::collections::HashSet::new();
    for n in 0..16 {
        let user = format!("user{n}");
        let by = spread(&gw, 10, &[("x-user", &user)]).await;
        assert_eq!(by.len(), 1, "{user} went to {by:?}");
        assert_eq!(by.values().sum::<usize>(), 10);
        used.extend(by.into_keys());
    }
    assert!(used.len() > 1, "sixteen callers on one target: {used:?}");
    // A caller without the key is not one "absent" caller on one target.
    let by = spread(&gw, 30, &[]).await;
    assert_eq!(by.len(), 3, "callers without the key: {by:?}");
}

#[tokio::test]
async fn a_killed_target_costs_no_request() {
    let ts = targets(3).await;
    let gw = gateway(&target_list(&ts, &[1, 1, 1])).await;
    let by = spread(&gw, 30, &[]).await;
    assert_eq!(by.len(), 3, "{by:?}");
    ts[1].kill();
    let by = spread(&gw, 100, &[]).await;
    assert_eq!(
        by.get("t0").copied().unwrap_or(0) + by.get("t2").copied().unwrap_or(0),
        100,
        "{by:?}"
    );
}

#[tokio::test]
async fn a_killed_target_costs_no_post_either() {
    let ts = targets(2).await;
    let gw = gateway(&target_list(&ts, &[1, 1])).await;
    ts[0].kill();
    for _ in 0..20 {
        let req = Request::post("/x")
            .header("host", "pool.test")
            .body(Full::new(Bytes::from_static(b"payload")))
            .unwrap();
        let r = send(gw.addr, req).await;
        assert_eq!(r.status, 200);
        assert_eq!(r.text(), "t1");
    }
}

#[tokio::test]
async fn a_silent_target_fails_few_requests_and_comes_back_after_its_check_passes() {
    let ts = targets(3).await;
    let yaml = format!(
        "listen: 127.0.0.1:0
upstreams:
  api:
{}    health: {{ path: /healthz, interval: 100ms, timeout: 100ms, unhealthy_after: 2, healthy_after: 1 }}
    eject: {{ after: 5, for: 1s }}
routes:
  - name: api
    upstream: api
    timeout: 500ms
",
        target_list(&ts, &[1, 1, 1])
    );
    let gw = Gateway::start(&yaml).await;
    ts[2].set(Mode::Silent);
    let by = spread(&gw, 60, &[]).await;
    let failed: usize = by
        .iter()
        .filter(|(k, _)| k.starts_with("status"))
        .map(|(_, v)| v)
        .sum();
    assert!(failed <= 6, "{failed} of 60 failed: {by:?}");
    // It answers again; its next check passes and it takes traffic.
    ts[2].set(Mode::Answer);
    let balancer = gw.inner.balancers()[0].clone();
    wait::until("t2 is healthy again", Duration::from_secs(5), || {
        let b = balancer.clone();
        async move {
            b.endpoints()
                .list
                .iter()
                .all(|e| e.state.healthy() && !e.state.is_ejected())
        }
    })
    .await;
    let by = spread(&gw, 30, &[]).await;
    assert!(by.get("t2").copied().unwrap_or(0) >= 5, "{by:?}");
}

#[tokio::test]
async fn a_post_with_a_body_is_not_sent_twice() {
    let ts = targets(2).await;
    let gw = gateway(&format!(
        "{}    retries: 2\n    eject: {{ after: 1000 }}\n",
        target_list(&ts, &[1, 1])
    ))
    .await;
    for t in &ts {
        t.set(Mode::Break);
    }
    let req = Request::post("/x")
        .header("host", "pool.test")
        .body(Full::new(Bytes::from_static(b"charge the card")))
        .unwrap();
    let r = send(gw.addr, req).await;
    assert_eq!(r.status, 502);
    assert_eq!(
        ts[0].requests() + ts[1].requests(),
        1,
        "a POST with a body was sent again"
    );
    // A GET that broke the same way is retried on the other target.
    let r = send(gw.addr, get("/x", &[])).await;
    assert_eq!(r.status, 502);
    assert_eq!(
        ts[0].requests() + ts[1].requests(),
        1 + 2,
        "a GET is tried on both targets"
    );
}

#[tokio::test]
async fn the_retry_budget_caps_retries_when_every_target_fails() {
    let ts = targets(3).await;
    let gw = gateway(&format!(
        "{}    retries: 2\n    eject: {{ after: 100000 }}\n",
        target_list(&ts, &[1, 1, 1])
    ))
    .await;
    for t in &ts {
        t.set(Mode::Break);
    }
    let n = 300;
    let by = spread(&gw, n, &[]).await;
    assert_eq!(by.get("status 502"), Some(&n), "{by:?}");
    let sent: usize = ts.iter().map(Target::requests).sum();
    // Without a budget: 3 tries each, 900. With it: the 10-a-second floor
    // over 10 s (100) and 20 % of the requests.
    let cap = n + 100 + n / 5;
    assert!(
        sent <= cap,
        "{sent} tries for {n} requests; the budget allows {cap}"
    );
    assert!(
        sent >= n + 100,
        "{sent} tries: the floor of retries was not used"
    );
}

/// A resolver whose names a test sets, and changes while the gateway runs.
#[derive(Debug, Clone)]
struct Names(Arc<std::sync::Mutex<HashMap<String, Vec<std::net::IpAddr>>>>);

impl Names {
    fn new(name: &str, ips: Vec<std::net::IpAddr>) -> Self {
        Self(Arc::new(std::sync::Mutex::new(HashMap::from([(
            name.to_owned(),
            ips,
        )]))))
    }

    fn set(&self, name: &str, ips: Vec<std::net::IpAddr>) {
        self.0.lock().unwrap().insert(name.to_owned(), ips);
    }
}

impl Resolve for Names {
    fn resolve(&self, host: &str, port: u16) -> BoxFuture<'static, io::Result<Vec<SocketAddr>>> {
        let found = self.0.lock().unwrap().get(host).map(|ips| {
            ips.iter()
                .map(|ip| SocketAddr::new(*ip, port))
                .collect::<Vec<_>>()
        });
        Box::pin(async move {
            found.ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no such name"))
        })
    }
}

#[tokio::test]
async fn a_name_resolving_to_two_addresses_spreads_over_both() {
    let (a, b) = Target::pair_on_one_port("a", "b").await;
    let names = Names::new("api.test", vec![a.addr.ip(), b.addr.ip()]);
    let yaml = format!(
        "listen: 127.0.0.1:0
upstreams:
  api:
    targets: [http://api.test:{}]
    balance: round_robin
routes:
  - name: api
    upstream: api
",
        a.addr.port()
    );
    let gw = Gateway::start_resolving(&yaml, Arc::new(names)).await;
    let by = spread(&gw, 100, &[]).await;
    assert_eq!((by.get("a"), by.get("b")), (Some(&50), Some(&50)), "{by:?}");
}

/// `/admin/upstreams`' entry for the endpoint at `addr`.
async fn endpoint(gw: &support::admin::AdminGateway, addr: SocketAddr) -> serde_json::Value {
    let r = gw.admin_get("/admin/upstreams").await;
    assert_eq!(r.status, 200);
    let v: serde_json::Value = serde_json::from_slice(&r.body).expect("JSON");
    v["pools"][0]["targets"]
        .as_array()
        .expect("targets")
        .iter()
        .find(|t| t["address"] == addr.to_string())
        .cloned()
        .unwrap_or_else(|| panic!("{addr} not listed: {v}"))
}

#[tokio::test]
async fn a_503_ejects_a_500_does_not_and_a_reload_keeps_the_ejection() {
    let ts = targets(2).await;
    let yaml = format!(
        "listen: 127.0.0.1:0
admin: 127.0.0.1:0
upstreams:
  api:
{}    balance: round_robin
    eject: {{ after: 3, for: 1m }}
routes:
  - name: api
    upstream: api
",
        target_list(&ts, &[1, 1])
    );
    let gw =
        support::admin::AdminGateway::start(&yaml, Arc::new(tollgate::clock::SystemClock)).await;
    ts[0].set(Mode::Status(500));
    for _ in 0..10 {
        send(gw.addr, get("/x", &[])).await;
    }
    let e = endpoint(&gw, ts[0].addr).await;
    assert_eq!(
        (e["ejected"].as_bool(), e["ejections"].as_u64()),
        (Some(false), Some(0)),
        "{e}"
    );

    ts[0].set(Mode::Status(503));
    for _ in 0..6 {
        send(gw.addr, get("/x", &[])).await;
    }
    let e = endpoint(&gw, ts[0].addr).await;
    assert_eq!(
        (e["ejected"].as_bool(), e["ejections"].as_u64()),
        (Some(true), Some(1)),
        "{e}"
    );
    assert_eq!(e["healthy"].as_bool(), Some(true));
    assert_eq!(e["weight"].as_u64(), Some(1));
    let by = spread_through(gw.addr, 10).await;
    assert_eq!(
        by.get("t1"),
        Some(&10),
        "an ejected target took requests: {by:?}"
    );

    let text = gw.scrape().await;
    let t0 = ts[0].url();
    let series = |name: &str, extra: &str| format!("{name}{{pool=\"api\",target=\"{t0}\"{extra}}}");
    use support::admin::value;
    assert_eq!(
        value(
            &text,
            &series("tollgate_upstream_target_ejections_total", "")
        ),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        value(
            &text,
            &series(
                "tollgate_upstream_target_tries_total",
                ",outcome=\"unavailable\""
            )
        ),
        Some(3.0)
    );
    assert_eq!(
        value(
            &text,
            &series(
                "tollgate_upstream_target_tries_total",
                ",outcome=\"answered\""
            )
        ),
        Some(5.0)
    );
    assert_eq!(
        value(&text, "tollgate_upstream_healthy_targets{pool=\"api\"}"),
        Some(1.0),
        "{text}"
    );

    // A reload keeps the target's state: still ejected.
    let config = tollgate::config::load::parse_str(&yaml).expect("valid");
    gw.gateway.reload(config);
    let e = endpoint(&gw, ts[0].addr).await;
    assert_eq!(
        (e["ejected"].as_bool(), e["ejections"].as_u64()),
        (Some(true), Some(1)),
        "{e}"
    );
    let by = spread_through(gw.addr, 10).await;
    assert_eq!(by.get("t1"), Some(&10), "{by:?}");
}

/// A pool of three whose `t2` hangs until it is ejected (checks that
/// would take it out on their own are set aside with `unhealthy_after`),
/// then answers again. Returns the gateway, the targets and `t2`'s checks
/// seen when it started answering.
async fn hang_then_answer(
    ended_by_checks: bool,
) -> (support::admin::AdminGateway, Vec<Target>, usize) {
    let ts = targets(3).await;
    let yaml = format!(
        "listen: 127.0.0.1:0
admin: 127.0.0.1:0
upstreams:
  api:
{}    balance: round_robin
    health: {{ path: /healthz, interval: 200ms, timeout: 100ms, unhealthy_after: 100, healthy_after: 1 }}
    eject: {{ after: 2, for: 1m, ended_by_checks: {ended_by_checks} }}
routes:
  - name: api
    upstream: api
    timeout: 300ms
",
        target_list(&ts, &[1, 1, 1])
    );
    let gw =
        support::admin::AdminGateway::start(&yaml, Arc::new(tollgate::clock::SystemClock)).await;
    ts[2].set(Mode::Silent);
    for _ in 0..9 {
        send(gw.addr, get("/x", &[])).await;
    }
    let e = endpoint(&gw, ts[2].addr).await;
    assert_eq!(e["ejected"].as_bool(), Some(true), "{e}");
    ts[2].set(Mode::Answer);
    let checks = ts[2].checks();
    (gw, ts, checks)
}

#[tokio::test]
async fn a_target_back_from_a_hang_is_used_again_once_its_check_passes() {
    let (gw, ts, checks) = hang_then_answer(true).await;
    // Ejected for a minute; its first passing check (one interval, 200 ms,
    // at most two checks) ends the ejection.
    let addr = ts[2].addr;
    wait::until("t2 is back", Duration::from_secs(2), || {
        let gw = &gw;
        async move { endpoint(gw, addr).await["ejected"] == false }
    })
    .await;
    let passes = ts[2].checks() - checks;
    assert!(passes <= 2, "{passes} checks before it was used again");
    let by = spread_through(gw.addr, 9).await;
    assert_eq!(by.get("t2"), Some(&3), "{by:?}");
    let text = gw.scrape().await;
    let t2 = ts[2].url();
    let series = |name: &str| format!("{name}{{pool=\"api\",target=\"{t2}\"}}");
    use support::admin::value;
    let ended = value(
        &text,
        &series("tollgate_upstream_target_ejections_ended_total"),
    );
    assert_eq!(ended, Some(1.0), "{text}");
    let ejections = value(&text, &series("tollgate_upstream_target_ejections_total"));
    assert_eq!(ejections, Some(1.0));
}

#[tokio::test]
async fn with_ended_by_checks_false_an_ejection_runs_its_time() {
    let (gw, ts, checks) = hang_then_answer(false).await;
    wait::until("t2 passes three checks", Duration::from_secs(3), || async {
        ts[2].checks() >= checks + 3
    })
    .await;
    let e = endpoint(&gw, ts[2].addr).await;
    assert_eq!(e["ejected"].as_bool(), Some(true), "{e}");
    let by = spread_through(gw.addr, 6).await;
    assert_eq!(by.get("t2"), None, "{by:?}");
}

async fn spread_through(addr: SocketAddr, n: usize) -> HashMap<String, usize> {
    let mut by = HashMap::new();
    for _ in 0..n {
        let r = send(addr, get("/x", &[])).await;
        *by.entry(r.text()).or_insert(0) += 1;
    }
    by
}

#[tokio::test]
async fn a_pool_whose_only_target_is_down_answers_502() {
    let t = Target::start("t0").await;
    let gw = gateway(&target_list(std::slice::from_ref(&t), &[1])).await;
    t.kill();
    let r = send(gw.addr, get("/x", &[])).await;
    assert_eq!(r.status, 502);
}

#[tokio::test]
async fn a_retried_request_is_counted_once_and_logged_once_with_its_tries() {
    let ts = targets(2).await;
    let yaml = format!(
        "listen: 127.0.0.1:0
upstreams:
  api:
{}    balance: round_robin
    eject: {{ after: 1000 }}
routes:
  - name: api
    upstream: api
    limits: [ {{ name: per_ip, key: ip, limit: 100, window: 1m }} ]
",
        target_list(&ts, &[1, 1])
    );
    // The first try goes to t0, which breaks the connection; the retry
    // to t1 answers.
    ts[0].set(Mode::Break);
    let captured = Captured::default();
    let (writer, flushed) = tollgate::logs::queue(captured.clone());
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter("tollgate::access=info")
        .finish();
    let reply = {
        let _guard = tracing::subscriber::set_default(subscriber);
        let gw = Gateway::start_logging(
            &yaml,
            Arc::new(tollgate::clock::SystemClock),
            Some(tollgate::logs::AccessWriter::new(writer, true)),
        )
        .await;
        let r = send(gw.addr, get("/x", &[])).await;
        gw.stop().await;
        r
    };
    drop(flushed);
    assert_eq!((reply.status.as_u16(), reply.text().as_str()), (200, "t1"));
    assert_eq!((ts[0].requests(), ts[1].requests()), (1, 1));
    // One unit of the limit taken, for two tries.
    let remaining = reply.header("ratelimit").unwrap_or_default();
    assert!(remaining.starts_with("\"per_ip\";r=99;"), "{remaining}");
    let log = captured.text();
    let lines: Vec<serde_json::Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    assert_eq!(lines.len(), 1, "{log}");
    let line = &lines[0]["fields"];
    assert_eq!(line["tries"], 2, "{line}");
    assert_eq!(line["upstream"], ts[1].url(), "{line}");
    assert_eq!(line["upstream_addr"], ts[1].addr.to_string(), "{line}");
}

#[tokio::test]
async fn a_connect_failure_resolves_the_name_again() {
    // The name's only address goes away and another takes its place, as a
    // pod replaced behind a headless Service.
    let (a, b) = Target::pair_on_one_port("a", "b").await;
    let names = Names::new("api.test", vec![a.addr.ip()]);
    let yaml = format!(
        "listen: 127.0.0.1:0
upstreams:
  api:
    targets: [http://api.test:{}]
routes:
  - name: api
    upstream: api
",
        a.addr.port()
    );
    let gw = Gateway::start_resolving(&yaml, Arc::new(names.clone())).await;
    assert_eq!(send(gw.addr, get("/x", &[])).await.text(), "a");
    names.set("api.test", vec![b.addr.ip()]);
    a.kill();
    // The next connect fails and asks for a lookup; within a few seconds
    // (not the 30 s period) the new address serves.
    wait::until(
        "the new address answers",
        Duration::from_secs(5),
        || async { send(gw.addr, get("/x", &[])).await.text() == "b" },
    )
    .await;
}

/// An upstream that answers its first request, reads the second on the
/// same connection, then stops listening and closes that connection
/// unanswered: the keep-alive race, with no new connection to be had after
/// it.
async fn answer_once_then_gone() -> SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let Ok((mut s, _)) = listener.accept().await else {
            return;
        };
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        for i in 0..2 {
            let end = loop {
                if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                    break at + 4;
                }
                match s.read(&mut chunk).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            };
            buf.drain(..end);
            if i == 0 {
                let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nt0";
                if s.write_all(answer).await.is_err() {
                    return;
                }
            }
        }
        drop(listener);
    });
    addr
}

#[tokio::test]
async fn a_resend_after_the_keep_alive_race_that_cannot_connect_counts_as_a_connect_error() {
    let gone = answer_once_then_gone().await;
    let t1 = Target::start("t1").await;
    let yaml = format!(
        "listen: 127.0.0.1:0
upstreams:
  api:
    targets:
      - {{ url: http://{gone}, weight: 1000 }}
      - {{ url: {}, weight: 1 }}
    balance: round_robin
    retries: 0
    eject: {{ after: 1000 }}
routes:
  - name: api
    upstream: api
    timeout: 2s
",
        t1.url()
    );
    let gw =
        support::admin::AdminGateway::start(&yaml, Arc::new(tollgate::clock::SystemClock)).await;
    let r = send(gw.addr, get("/one", &[])).await;
    assert_eq!(r.text(), "t0");
    // The pooled connection is closed under the second GET, whose second
    // send finds nothing listening: nothing reached a target, so the
    // request goes to the other one, retry budget or not.
    let r = send(gw.addr, get("/two", &[])).await;
    assert_eq!((r.status.as_u16(), r.text().as_str()), (200, "t1"));
    let text = gw.scrape().await;
    let tries = |outcome: &str| {
        support::admin::value(
            &text,
            &format!(
                "tollgate_upstream_target_tries_total{{pool=\"api\",target=\"http://{gone}\",outcome=\"{outcome}\"}}"
            ),
        )
    };
    assert_eq!(tries("connect_error"), Some(1.0), "{text}");
    assert_eq!(tries("failed"), Some(0.0), "{text}");
    assert_eq!(tries("answered"), Some(1.0), "{text}");
}
