//! `tollgate simulate`: the replay decides every request exactly as a live
//! gateway does, reads every input form, and reports in every format.
//!
//! The exactness tests send one request sequence, with its recorded times,
//! to a gateway served on the in-process store with a manual clock, and
//! replay the same sequence through `simulate` with `--decisions`: each
//! request's status, `Retry-After` and every limit's remaining quota (the
//! `RateLimit` header's `r`) must be the same.

mod support;

use std::collections::BTreeMap;
use std::io::Write;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;

use bytes::Bytes;
use http::Request;
use http_body_util::Full;
use tollgate::clock::ManualClock;
use tollgate::logs::AccessWriter;
use tollgate::simulate::{self, InputFormat, Options, OutputFormat};

use support::gateway::{Captured, Gateway, send_from};

/// Every algorithm, a route with several limits (one of them shadow), and a
/// route whose limits come from plans.
const CONFIG: &str = r#"
listen: 127.0.0.1:0
api_keys: { header: x-api-key, keys: { gold-key: gold }, unknown: free }
plans:
  free: [ { name: plan_minute, limit: 4, window: 10s } ]
  gold: [ { name: plan_minute, limit: 9, window: 10s, algorithm: gcra, burst: 4 } ]
routes:
  - name: sw
    match: { path_prefix: /sw }
    respond: {}
    limits: [ { name: sw, key: ip, limit: 5, window: 10s } ]
  - name: fw
    match: { path_prefix: /fw }
    respond: {}
    limits: [ { name: fw, key: ip, limit: 5, window: 10s, algorithm: fixed_window } ]
  - name: log
    match: { path_prefix: /log }
    respond: {}
    limits: [ { name: log, key: ip, limit: 5, window: 10s, algorithm: sliding_log } ]
  - name: gcra
    match: { path_prefix: /gcra }
    respond: {}
    limits: [ { name: gcra, key: ip, limit: 5, window: 10s, algorithm: gcra, burst: 3 } ]
  - name: buckets
    match: { path_prefix: /buckets }
    respond: {}
    limits: [ { name: buckets, key: ip, limit: 5, window: 10s, precision: 2s } ]
  - name: multi
    match: { path_prefix: /multi }
    respond: {}
    cost: 2
    limits:
      - { name: per_caller, key: api_key | ip, limit: 12, window: 10s }
      - { name: per_ip, key: ip, limit: 20, window: 30s, algorithm: sliding_log }
      - { name: watch, key: ip, limit: 6, window: 10s, shadow: true }
  - name: plan
    match: { path_prefix: /plan }
    respond: {}
    limits: [ { name: caller, key: api_key | ip, plan: true } ]
"#;

const START_MS: u64 = 1_714_521_600_000;

/// One recorded request.
#[derive(Debug, Clone)]
struct Recorded {
    ts: u64,
    peer: IpAddr,
    path: String,
    key: Option<&'static str>,
}

/// A deterministic sequence: bursts and pauses, four peers, three keys
/// (one of them a plan's) or none, every route.
fn sequence(n: usize, seed: u64) -> Vec<Recorded> {
    let mut x = seed;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let paths = [
        "/sw", "/fw", "/log", "/gcra", "/multi", "/multi", "/plan", "/buckets",
    ];
    let keys = [None, Some("k1"), Some("k2"), Some("gold-key")];
    let mut ts = START_MS;
    let mut out: Vec<Recorded> = Vec::with_capacity(n);
    for _ in 0..n {
        // Mostly close together, sometimes a pause past a window.
        ts += match next() % 50 {
            0 => 11_000,
            1..=3 => 1_000 + next() % 3_000,
            _ => next() % 80,
        };
        // Bursts: most requests repeat the one before (caller and route).
        let r = match out.last() {
            Some(prev) if next() % 10 < 7 => Recorded { ts, ..prev.clone() },
            _ => Recorded {
                ts,
                peer: format!("127.0.0.{}", 1 + next() % 4).parse().unwrap(),
                path: format!("{}/{}", paths[(next() % 8) as usize], next() % 10),
                key: keys[(next() % 4) as usize],
            },
        };
        out.push(r);
    }
    out
}

/// What a client saw of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    status: u16,
    retry_after: Option<u64>,
    /// Per policy of the `RateLimit` header: its `r`.
    remaining: BTreeMap<String, u64>,
}

/// `"a";r=4;t=10, "b";r=0;t=3` → {a: 4, b: 0}
fn remaining(header: Option<&str>) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for item in header
        .unwrap_or("")
        .split(',')
        .filter(|s| !s.trim().is_empty())
    {
        let mut parts = item.trim().split(';');
        let name = parts.next().unwrap().trim_matches('"').to_owned();
        let r = parts
            .find_map(|p| p.strip_prefix("r="))
            .and_then(|r| r.parse().ok())
            .expect("r in RateLimit");
        out.insert(name, r);
    }
    out
}

async fn live(config: &str, seq: &[Recorded]) -> Vec<Seen> {
    live_logging(config, seq, None).await
}

/// As [`live`], with the gateway's own access log, as `--log-format json`
/// writes it, captured in memory: what it decided, and the log.
async fn live_with_own_log(config: &str, seq: &[Recorded]) -> (Vec<Seen>, String) {
    let captured = Captured::default();
    let (writer, flushed) = tollgate::logs::queue(captured.clone());
    // The filter only has to let `tollgate::access` through.
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter("tollgate::access=info")
        .finish();
    // The test runtime has one thread: the gateway's tasks run on it.
    let live = {
        let _guard = tracing::subscriber::set_default(subscriber);
        live_logging(config, seq, Some(AccessWriter::new(writer, true))).await
    };
    // Dropping the guard writes out every queued line.
    drop(flushed);
    (live, captured.text())
}

/// As [`live`], the gateway writing its access log to `access_log`.
async fn live_logging(
    config: &str,
    seq: &[Recorded],
    access_log: Option<AccessWriter>,
) -> Vec<Seen> {
    let clock = ManualClock::new(START_MS);
    let gw = Gateway::start_logging(config, Arc::new(clock.clone()), access_log).await;
    let mut seen = Vec::new();
    for r in seq {
        clock.set(r.ts);
        let mut b = Request::builder()
            .uri(&r.path)
            .header("host", "gateway.test");
        if let Some(k) = r.key {
            b = b.header("x-api-key", k);
        }
        let reply = send_from(r.peer, gw.addr, b.body(Full::new(Bytes::new())).unwrap()).await;
        seen.push(Seen {
            status: reply.status.as_u16(),
            retry_after: reply.header("retry-after").map(|v| v.parse().unwrap()),
            remaining: remaining(reply.header("ratelimit")),
        });
    }
    gw.stop().await;
    seen
}

/// Runs `simulate` on `config` over a log file `name` holding `log`; its
/// report and every decision as a client would have seen it.
async fn replay(config: &str, name: &str, log: &str) -> (simulate::Report, Vec<Seen>) {
    let dir = tempfile::tempdir().unwrap();
    let config = write(dir.path(), "gateway.yaml", config);
    let log = write(dir.path(), name, log);
    let decisions = dir.path().join("decisions.jsonl");
    let opts = Options {
        decisions: Some(decisions.clone()),
        ..Options::new(&config, vec![log])
    };
    let report = tokio::task::spawn_blocking(move || simulate::simulate(&opts))
        .await
        .unwrap()
        .expect("simulate runs");
    (report, replayed(&decisions))
}

/// The decisions file read back as what a client would have seen.
fn replayed(decisions: &Path) -> Vec<Seen> {
    std::fs::read_to_string(decisions)
        .unwrap()
        .lines()
        .map(|l| {
            let d: serde_json::Value = serde_json::from_str(l).unwrap();
            let status = match d["decision"].as_str().unwrap() {
                "allowed" | "shadow_limited" | "exempt" => 200,
                "limited" => 429,
                "rejected" => 401,
                "unrouted" => 404,
                other => panic!("decision {other}"),
            };
            let remaining = d["limits"]
                .as_array()
                .unwrap()
                .iter()
                .map(|l| {
                    (
                        l["name"].as_str().unwrap().to_owned(),
                        l["remaining"].as_u64().unwrap(),
                    )
                })
                .collect();
            Seen {
                status,
                retry_after: d["retry_after"].as_u64(),
                remaining,
            }
        })
        .collect()
}

fn jsonl(seq: &[Recorded]) -> String {
    seq.iter()
        .map(|r| {
            let mut headers = serde_json::Map::new();
            if let Some(k) = r.key {
                headers.insert("x-api-key".into(), k.into());
            }
            serde_json::json!({
                "ts": r.ts, "method": "GET", "host": "gateway.test",
                "path": r.path, "peer": r.peer.to_string(), "headers": headers,
            })
            .to_string()
                + "\n"
        })
        .collect()
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn compare(live: &[Seen], sim: &[Seen]) {
    assert_eq!(live.len(), sim.len(), "one decision per request");
    for (i, (l, s)) in live.iter().zip(sim).enumerate() {
        assert_eq!(l, s, "request {i}: live gateway against simulate");
    }
    // The sequence exercises what it is meant to: denials and admissions.
    for status in [200, 429] {
        assert!(
            live.iter().filter(|s| s.status == status).count() > 20,
            "too few {status}s"
        );
    }
}

#[tokio::test]
async fn every_decision_is_the_live_gateways_for_every_algorithm_and_a_multi_limit_route() {
    let seq = sequence(900, 0x2545_f491_4f6c_dd1d);
    let live = live(CONFIG, &seq).await;

    let (report, sim) = replay(CONFIG, "traffic.jsonl", &jsonl(&seq)).await;
    compare(&live, &sim);

    // The report counts what the decisions say.
    let limited_live = live.iter().filter(|s| s.status == 429).count() as u64;
    let limited_report: u64 = report.routes.iter().map(|r| r.limited).sum();
    assert_eq!(limited_live, limited_report);
    let multi = report.routes.iter().find(|r| r.name == "multi").unwrap();
    let watch = multi.limits.iter().find(|l| l.name == "watch").unwrap();
    assert!(watch.shadow && watch.limited > 0, "{watch:?}");
    assert!(multi.shadow_limited > 0);
    let buckets = report.routes.iter().find(|r| r.name == "buckets").unwrap();
    assert!(
        buckets.limited > 0,
        "precision buckets limited some: {buckets:?}"
    );
}

#[tokio::test]
async fn a_replayable_access_log_replays_to_the_same_decisions() {
    // The gateway writes its own log with the replay fields; API keys
    // appear in it only as digests, and plans are found by them.
    let config = format!("{CONFIG}access_log: {{ replay: true }}\n");
    let seq = sequence(700, 0x9e37_79b9_7f4a_7c15);
    let (live, log) = live_with_own_log(&config, &seq).await;
    assert_eq!(
        log.lines().count(),
        seq.len(),
        "one access line per request"
    );
    assert!(
        !log.contains("gold-key") && !log.contains("\"k1\""),
        "no raw API key in the log"
    );

    let (report, sim) = replay(&config, "access.json", &log).await;
    assert_eq!(report.input.format, "tollgate");
    compare(&live, &sim);
}

/// Limits that read as written: one counter for a whole route, a share of
/// two routes, exempt callers (an address and a key, and a route that
/// exempts nobody), on the paths [`sequence`] sends.
const WRITTEN: &str = r#"
listen: 127.0.0.1:0
api_keys: { header: x-api-key }
exempt: { ips: [127.0.0.4/32], api_keys: [k2] }
routes:
  - name: sw
    match: { path_prefix: /sw }
    respond: {}
    limits: [ { name: all, key: route, limit: 8, window: 10s } ]
  - name: fw
    match: { path_prefix: /fw }
    respond: {}
    limits: [ { name: ab, key: api_key | ip, limit: 6, window: 10s, algorithm: sliding_log, share: ab } ]
  - name: log
    match: { path_prefix: /log }
    respond: {}
    limits: [ { name: ab, key: api_key | ip, limit: 6, window: 10s, algorithm: sliding_log, share: ab } ]
  - name: gcra
    match: { path_prefix: /gcra }
    respond: {}
    exempt: {}
    limits: [ { name: strict, key: ip, limit: 5, window: 10s } ]
  - name: rest
    respond: {}
    limits: [ { name: rest_total, key: route, limit: 10, window: 10s, algorithm: gcra, burst: 3, share: rest } ]
"#;

#[tokio::test]
async fn route_wide_shared_and_exempt_limits_replay_as_the_gateway_decided() {
    let seq = sequence(900, 0x5851_f42d_4c95_7f2d);
    let live = live(WRITTEN, &seq).await;
    let (report, sim) = replay(WRITTEN, "traffic.jsonl", &jsonl(&seq)).await;
    compare(&live, &sim);
    let exempt: u64 = report.routes.iter().map(|r| r.exempt).sum();
    assert!(exempt > 20, "{exempt} exempt");
    let strict = report.routes.iter().find(|r| r.name == "gcra").unwrap();
    assert_eq!(
        strict.exempt, 0,
        "a route's own exempt: {{}} exempts nobody"
    );

    // The gateway's own log, where API keys are digests, replays the same.
    let config = format!("{WRITTEN}access_log: {{ replay: true }}\n");
    let (live, log) = live_with_own_log(&config, &seq).await;
    let (_, sim) = replay(&config, "access.json", &log).await;
    compare(&live, &sim);
}

/// Plans named by a header only trusted peers may set: here the header the
/// sequence sends its keys in, so [`sequence`]'s callers name plans
/// `k1` and `gold-key` (and `k2`, which no plan has), from trusted and
/// untrusted peers.
const PLANS_FROM: &str = r#"
listen: 127.0.0.1:0
client_ip: { trusted_proxies: [127.0.0.1/32, 127.0.0.2/32] }
plans_from: "header:x-api-key"
api_keys: { unknown: free }
plans:
  free: [ { name: per_caller, limit: 3, window: 10s } ]
  k1: [ { name: per_caller, limit: 6, window: 10s } ]
  gold-key: [ { name: per_caller, limit: 12, window: 10s, algorithm: sliding_log } ]
routes:
  - name: plan
    respond: {}
    limits: [ { name: caller, key: ip, plan: true } ]
"#;

#[tokio::test]
async fn plans_from_a_trusted_header_replay_as_the_gateway_decided() {
    let seq = sequence(600, 0x1405_7b7e_f767_814f);
    let live = live(PLANS_FROM, &seq).await;
    let (_, sim) = replay(PLANS_FROM, "traffic.jsonl", &jsonl(&seq)).await;
    compare(&live, &sim);
    // Each plan's quota shows in some answer's `RateLimit`.
    for quota in [3, 6, 12] {
        assert!(
            live.iter()
                .any(|s| s.status == 200 && s.remaining.get("per_caller") == Some(&(quota - 1))),
            "no first request under a quota of {quota}"
        );
    }
}

fn combined_line(ts_s: u64, peer: &str, path: &str, key: &str) -> String {
    // 2024-05-01T00:00:00Z + ts_s
    let t = ts_s;
    format!(
        "{peer} - - [01/May/2024:00:{:02}:{:02} +0000] \"GET {path} HTTP/1.1\" 200 5 \"-\" \"test\" \"{key}\"\n",
        t / 60,
        t % 60
    )
}

const SMALL: &str = r#"
listen: 127.0.0.1:0
routes:
  - name: api
    match: { path_prefix: /api/ }
    respond: {}
    limits:
      - { name: per_key, key: header:x-api-key | ip, limit: 3, window: 1m }
      - { name: per_ip, key: ip, limit: 100, window: 1m }
"#;

fn small_log() -> String {
    let mut log = String::new();
    for i in 0..10 {
        // a: 10 requests in one minute (7 over 3), b: 2, c (no key): 5.
        log += &combined_line(i, "192.0.2.1", "/api/x", "a");
        if i < 2 {
            log += &combined_line(i, "192.0.2.2", "/api/y", "b");
        }
        if i < 5 {
            log += &combined_line(i, "192.0.2.3", "/api/z", "-");
        }
    }
    log
}

fn small_opts(dir: &Path, config: &str, logs: Vec<PathBuf>) -> Options {
    let config = write(dir, "gateway.yaml", config);
    Options {
        fields: vec![http::HeaderName::from_static("x-api-key")],
        ..Options::new(config, logs)
    }
}

#[test]
fn bad_lines_are_counted_shown_with_their_line_numbers_and_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = small_log();
    log.insert_str(0, "this is not a log line\n");
    log +=
        "192.0.2.9 - - [01/May/2024:00:00:09 +0000] \"GET /api/x HTTP/1.1\" 200 5 \"-\" \"test\"\n";
    log += "\n";
    log += "192.0.2.9 - - [32/May/2024:00:00:09 +0000] \"GET /api/x HTTP/1.1\" 200 5 \"-\" \"t\" \"k\"\n";
    let path = write(dir.path(), "access.log", &log);
    let r = simulate::simulate(&small_opts(dir.path(), SMALL, vec![path.clone()])).unwrap();
    assert_eq!(r.input.bad_lines, 3);
    assert_eq!(r.input.skipped, 1, "the blank line");
    assert_eq!(r.input.requests, 17);
    let shown: Vec<(u64, &str)> = r
        .input
        .bad_examples
        .iter()
        .map(|b| (b.line, b.error.as_str()))
        .collect();
    assert_eq!(shown.len(), 3);
    assert_eq!(shown[0].0, 1);
    assert!(shown[1].1.contains("extra quoted field"), "{shown:?}");
    assert!(shown[2].1.contains("time"), "{shown:?}");
    assert!(
        r.input
            .bad_examples
            .iter()
            .all(|b| b.file == path.display().to_string())
    );
    // The rest is replayed as if they were not there.
    let api = &r.routes[0];
    assert_eq!((api.requests, api.limited), (17, 9));

    // The table shows them with file:line.
    let table = simulate::render(&r, OutputFormat::Table);
    assert!(
        table.contains(&format!("{}:1: ", path.display())),
        "{table}"
    );

    // Numbers count from 1 in each file, also past a few thousand lines.
    let first = write(dir.path(), "first.log", &small_log().repeat(300));
    let second = write(dir.path(), "second.log", &format!("{}oops\n", small_log()));
    let r =
        simulate::simulate(&small_opts(dir.path(), SMALL, vec![first, second.clone()])).unwrap();
    assert_eq!((r.input.lines, r.input.bad_lines), (17 * 301 + 1, 1));
    let bad = &r.input.bad_examples[0];
    assert_eq!(
        (bad.file.as_str(), bad.line),
        (second.to_str().unwrap(), 18)
    );
}

#[test]
fn gzip_logs_read_like_plain_ones() {
    let dir = tempfile::tempdir().unwrap();
    let plain = write(dir.path(), "a.log", &small_log());
    let gz = dir.path().join("a.log.gz");
    let mut enc = flate2::write::GzEncoder::new(
        std::fs::File::create(&gz).unwrap(),
        flate2::Compression::default(),
    );
    enc.write_all(small_log().as_bytes()).unwrap();
    enc.finish().unwrap();
    let a = simulate::simulate(&small_opts(dir.path(), SMALL, vec![plain])).unwrap();
    let b = simulate::simulate(&small_opts(dir.path(), SMALL, vec![gz])).unwrap();
    assert_eq!(b.input.requests, 17);
    assert_eq!(b.input.format, "combined");
    let routes = |r: &simulate::Report| serde_json::to_value(&r.routes).unwrap();
    assert_eq!(routes(&a), routes(&b));
    let api = &b.routes[0];
    assert_eq!(
        (
            api.requests,
            api.limited,
            api.identities,
            api.identities_limited
        ),
        (17, 9, 3, 2)
    );
    let per_key = &api.limits[0];
    assert_eq!(per_key.name, "per_key");
    assert_eq!(per_key.top_offenders[0].kind, "header:x-api-key");
    assert_eq!(per_key.top_offenders[0].limited, 7);
    assert_eq!(per_key.top_offenders[1].kind, "ip");
    assert_eq!(per_key.top_offenders[1].limited, 2);
}

#[test]
fn against_names_who_is_newly_limited_and_who_no_longer_is() {
    let dir = tempfile::tempdir().unwrap();
    let log = write(dir.path(), "a.log", &small_log());
    // The old file limited every key to 6 a minute and keyed on the header
    // only: a (10 requests) was limited, c (no key) shared the absent
    // bucket with nobody. The new one allows 3: a is still limited, and
    // the keyless IP c (5) is newly limited.
    let old = SMALL.replace("limit: 3, window: 1m", "limit: 6, window: 1m");
    let old_path = write(dir.path(), "old.yaml", &old);
    let opts = Options {
        against: Some(old_path),
        ..small_opts(dir.path(), SMALL, vec![log])
    };
    let r = simulate::simulate(&opts).unwrap();
    let d = r
        .diff
        .iter()
        .find(|d| d.route == "api" && d.limit == "per_key")
        .unwrap();
    assert_eq!(d.newly_limited.count, 1);
    assert_eq!(d.newly_limited.identities[0].kind, "ip");
    assert_eq!(
        d.newly_limited.identities[0].identity,
        // printf %s 192.0.2.3/32 | sha256sum | cut -c1-16
        "ip=sha256:1a66d478ad212d54"
    );
    assert_eq!(d.no_longer_limited.count, 0);
    // And the other way round.
    let opts = Options {
        config: opts.against.clone().unwrap(),
        against: Some(opts.config.clone()),
        ..opts
    };
    let r = simulate::simulate(&opts).unwrap();
    let d = r.diff.iter().find(|d| d.limit == "per_key").unwrap();
    assert_eq!((d.newly_limited.count, d.no_longer_limited.count), (0, 1));
    let table = simulate::render(&r, OutputFormat::Table);
    assert!(
        table.contains("api/per_key: 0 newly limited, 1 no longer limited"),
        "{table}"
    );
}

fn tollgate() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tollgate"))
}

/// `tollgate simulate -c CONFIG LOG ARGS…`, run to its end.
fn run_cli(config: &Path, log: &Path, args: &[&str]) -> Output {
    tollgate()
        .args(["simulate", "-c"])
        .arg(config)
        .arg(log)
        .args(args)
        .output()
        .unwrap()
}

/// `out`, once it is known to have succeeded (else its stderr says why).
fn ok(out: Output) -> Output {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

#[test]
fn the_command_line_end_to_end_json_shape_html_and_exit_status() {
    let dir = tempfile::tempdir().unwrap();
    let config = write(dir.path(), "gateway.yaml", SMALL);
    let log = write(dir.path(), "access.log", &small_log());

    // JSON on stdout: the stable shape (and the long spelling of -c).
    let out = ok(tollgate()
        .args(["simulate", "--config"])
        .arg(&config)
        .arg(&log)
        .args(["--field", "x-api-key", "--format", "json"])
        .output()
        .unwrap());
    assert!(out.stderr.is_empty(), "quiet when stderr is not a terminal");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let keys = |v: &serde_json::Value| -> Vec<String> {
        let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
        k.sort();
        k
    };
    assert_eq!(v["version"], 1);
    assert_eq!(
        keys(&v),
        [
            "against",
            "config",
            "diff",
            "input",
            "refused",
            "refused_examples",
            "routes",
            "unrouted",
            "version"
        ]
    );
    assert_eq!(
        keys(&v["input"]),
        [
            "bad_examples",
            "bad_lines",
            "files",
            "first",
            "format",
            "last",
            "lines",
            "lines_per_second",
            "out_of_order",
            "requests",
            "seconds",
            "skipped"
        ]
    );
    let route = &v["routes"][0];
    assert_eq!(
        keys(route),
        [
            "exempt",
            "identities",
            "identities_limited",
            "limited",
            "limited_share",
            "limits",
            "name",
            "peak_limited_minute",
            "peak_minute",
            "rejected",
            "requests",
            "shadow_limited",
            "timeline",
            "top_offenders"
        ]
    );
    assert_eq!(
        keys(&route["limits"][0]),
        [
            "identities",
            "identities_limited",
            "limited",
            "limited_share",
            "name",
            "peak_limited_minute",
            "peak_minute",
            "quota",
            "requests",
            "shadow",
            "timeline",
            "top_offenders"
        ]
    );
    assert_eq!(
        keys(&route["top_offenders"][0]),
        ["identity", "kind", "limited", "requests"]
    );
    assert_eq!(
        keys(&route["timeline"][0]),
        ["limited", "minute", "requests", "shadow_limited", "ts_ms"]
    );
    assert_eq!(route["limits"][0]["quota"], "3 per 1m (sliding_window)");
    assert_eq!(route["timeline"][0]["minute"], "2024-05-01T00:00Z");
    assert_eq!(route["limited"], 9);

    // HTML into a file: self-contained, with a chart.
    let html = dir.path().join("report.html");
    let out = ok(run_cli(
        &config,
        &log,
        &[
            "--field",
            "x-api-key",
            "--format",
            "html",
            "--out",
            html.to_str().unwrap(),
        ],
    ));
    assert!(out.stdout.is_empty());
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(
        page.starts_with("<!doctype html>") && page.contains("<svg"),
        "{page}"
    );
    assert!(
        !page.contains("http://") || !page.contains("<script"),
        "nothing fetched"
    );
    assert!(
        !page.contains("src=") && !page.contains("<link"),
        "nothing fetched"
    );

    // The table by default.
    let out = run_cli(&config, &log, &["--field", "x-api-key"]);
    let table = String::from_utf8(out.stdout).unwrap();
    assert!(
        table.contains("per_key") && table.contains("3 per 1m"),
        "{table}"
    );

    // A bad configuration: 2, with the error. A missing log: 1.
    let bad = write(dir.path(), "bad.yaml", "listen: 127.0.0.1:0\nroutes: 3\n");
    let out = run_cli(&bad, &log, &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("routes"));
    let out = run_cli(&config, &dir.path().join("missing.log"), &[]);
    assert_eq!(out.status.code(), Some(1));
}

#[test]
fn the_input_format_is_detected_or_chosen() {
    let dir = tempfile::tempdir().unwrap();
    let seq = sequence(50, 7);
    let log = write(dir.path(), "t.jsonl", &jsonl(&seq));
    let mut opts = small_opts(dir.path(), CONFIG, vec![log]);
    let r = simulate::simulate(&opts).unwrap();
    assert_eq!(
        (r.input.format, r.input.requests, r.input.bad_lines),
        ("jsonl", 50, 0)
    );
    // Read as combined, every line is bad, and the run still ends.
    opts.input = Some(InputFormat::Combined);
    let r = simulate::simulate(&opts).unwrap();
    assert_eq!(
        (r.input.format, r.input.requests, r.input.bad_lines),
        ("combined", 0, 50)
    );
    assert_eq!(r.input.bad_examples.len(), 5, "the first few are shown");
}

#[tokio::test]
async fn token_costs_and_json_keys_replay_from_the_gateways_own_log() {
    let upstream = support::gateway::Upstream::start().await;
    let config = format!(
        r#"
listen: 127.0.0.1:0
access_log: {{ replay: true }}
api_keys: {{ header: x-api-key }}
routes:
  - name: chat
    match: {{ path_prefix: /usage }}
    upstream: {}
    limits:
      - {{ name: tpm, key: [ api_key, "json:model" ], limit: 300, window: 1h, algorithm: fixed_window,
          cost: {{ reserve: {{ json: max_tokens, default: 100 }}, from_body: openai }} }}
"#,
        upstream.url()
    );
    let captured = Captured::default();
    let (writer, flushed) = tollgate::logs::queue(captured.clone());
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter("tollgate::access=info")
        .finish();
    let mut live = Vec::new();
    {
        let _guard = tracing::subscriber::set_default(subscriber);
        let clock = ManualClock::new(START_MS);
        let gw = Gateway::start_logging(
            &config,
            Arc::new(clock.clone()),
            Some(AccessWriter::new(writer, true)),
        )
        .await;
        for i in 0..40u64 {
            clock.set(START_MS + i * 1000);
            let model = ["small", "large"][(i % 2) as usize];
            let body = format!(
                "{{\"model\":\"{model}\",\"max_tokens\":{}}}",
                40 + i % 3 * 20
            );
            let req = Request::post(format!("/usage?used={}", 5 + i * 7 % 31))
                .header("host", "gateway.test")
                .header("x-api-key", "k1")
                .header("content-type", "application/json")
                .body(Full::new(Bytes::from(body)))
                .unwrap();
            let reply = send_from("127.0.0.1".parse().unwrap(), gw.addr, req).await;
            live.push(reply.status.as_u16());
        }
        gw.stop().await;
    }
    drop(flushed);
    let log = captured.text();
    assert_eq!(
        log.lines().count(),
        40,
        "one line per request, written at the body's end"
    );
    assert!(log.contains("\"settled\":\"tpm:5\""), "{log}");
    assert!(log.contains("\"json\":\"model=sha256:"), "{log}");
    assert!(!log.contains("large"), "json keys are digests in the log");
    assert!(live.contains(&429) && live.contains(&200), "{live:?}");

    let (_, sim) = replay(&config, "access.json", &log).await;
    let sim: Vec<u16> = sim.iter().map(|s| s.status).collect();
    assert_eq!(live, sim);
}
