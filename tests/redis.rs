//! Redis in production: outages, slow servers and garbage under the failure
//! policy and the breaker; the instance heartbeat behind `on_error: local`;
//! standalone with TLS and ACL users, a real 3-master Cluster, a real
//! Sentinel failover; `clock: redis`.
//!
//! Every test starts its own `redis-server` processes on free loopback
//! ports and its gateways through the library API. Load is bounded (a few
//! workers, one request every few milliseconds, a few seconds); waits are
//! polls against deadlines (`support::wait`). The phases of an outage
//! (healthy, down, back) last a fixed time because "keep sending for
//! several seconds" is what is being tested, not a stand-in for
//! synchronisation.

mod support;

#[path = "redis/failover.rs"]
mod failover;

#[path = "redis/cluster_failover.rs"]
mod cluster_failover;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::StatusCode;
use tollgate::config::{RedisConfig, RedisTls, RedisTopology};
use tollgate::limit::{Algorithm, LimitRequest};
use tollgate::store::{BreakerState, RedisStore, Store, StoreError};

use support::gateway::{Gateway, get, send};
use support::redis::RedisServer;
use support::redis_topologies::{RedisCluster, SentinelSetup, TlsRedis, query, query_string};
use support::wait;

/// The default command timeout (`store.redis.timeout`).
const TIMEOUT: Duration = Duration::from_millis(25);
/// What a response may take beyond the command timeout: loopback HTTP on a
/// small, shared test machine. Waiting for Redis would take seconds.
const SLACK: Duration = Duration::from_millis(300);
/// Decisions must be back in Redis this soon after it returns.
const BACK_WITHIN: Duration = Duration::from_secs(2);

/// A gateway file with one route `/t` answering 200 under one per-IP limit.
fn yaml(url: &str, on_error: &str, limit: u64, route_extra: &str) -> String {
    format!(
        "listen: 127.0.0.1:0
store:
  redis: {{ url: '{url}' }}
  on_error: {on_error}
routes:
  - name: t
    match: {{ path: /t }}
    respond: {{ status: 200, body: ok }}
    limits: [ {{ name: per_ip, key: ip, limit: {limit}, window: 1m }} ]
    {route_extra}
"
    )
}

/// The counter keys in `server` (the heartbeat key excluded): with the
/// default digested names, `tg:{<identity>}<limit>` (the heartbeat set is
/// `tg:{instances}`, with nothing after the brace).
async fn limit_keys(server: &RedisServer) -> Vec<String> {
    let mut conn = server.connection().await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("tg:{*}?*")
        .query_async(&mut conn)
        .await
        .unwrap_or_default();
    // A share's fingerprint (`tg:{@share}definition`) is no counter.
    keys.into_iter()
        .filter(|k| !k.starts_with("tg:{@"))
        .collect()
}

/// One response: when it was sent, its status, how long it took.
#[derive(Debug, Clone, Copy)]
struct Sample {
    at: Instant,
    status: StatusCode,
    took: Duration,
}

/// Steady load on `/t`: `workers` tasks each sending one request every
/// `every` until stopped.
struct Load {
    stop: Arc<AtomicBool>,
    samples: Arc<Mutex<Vec<Sample>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    fn start(addr: std::net::SocketAddr, workers: usize, every: Duration) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let samples = Arc::new(Mutex::new(Vec::new()));
        let tasks = (0..workers)
            .map(|_| {
                let stop = Arc::clone(&stop);
                let samples = Arc::clone(&samples);
                tokio::spawn(async move {
                    // One keep-alive connection per worker: a new connection
                    // per request would sweep the ephemeral port range and
                    // leave TIME_WAIT sockets on the port Redis restarts on.
                    let mut conn = None;
                    let mut tick = tokio::time::interval(every);
                    while !stop.load(Ordering::Relaxed) {
                        tick.tick().await;
                        let at = Instant::now();
                        let status = send_kept(&mut conn, addr).await;
                        let s = Sample {
                            at,
                            status,
                            took: at.elapsed(),
                        };
                        samples.lock().expect("samples").push(s);
                    }
                })
            })
            .collect();
        Load {
            stop,
            samples,
            tasks,
        }
    }

    async fn finish(self) -> Vec<Sample> {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.tasks {
            t.await.expect("a load worker panicked");
        }
        self.samples.lock().expect("samples").clone()
    }
}

/// `GET /t` on the kept connection `conn`, opened (again) when needed.
async fn send_kept(
    conn: &mut Option<hyper::client::conn::http1::SendRequest<http_body_util::Full<bytes::Bytes>>>,
    addr: std::net::SocketAddr,
) -> StatusCode {
    use http_body_util::BodyExt;
    for _ in 0..2 {
        let sender = match conn {
            Some(s) if !s.is_closed() => s,
            _ => {
                let stream = tokio::net::TcpStream::connect(addr)
                    .await
                    .expect("connect to the gateway");
                let (sender, connection) =
                    hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                        .await
                        .expect("handshake");
                tokio::spawn(connection);
                conn.insert(sender)
            }
        };
        if sender.ready().await.is_err() {
            *conn = None;
            continue;
        }
        match sender.send_request(get("/t", &[])).await {
            Ok(res) => {
                let status = res.status();
                res.into_body().collect().await.expect("body");
                return status;
            }
            Err(_) => *conn = None,
        }
    }
    panic!("the gateway closed two connections in a row");
}

/// Polls until `server` holds a limit key; how long that took.
async fn until_keys_appear(server: &RedisServer, within: Duration) -> Duration {
    wait::took("a decision reaching Redis", within, || async move {
        !limit_keys(server).await.is_empty()
    })
    .await
}

/// Kills Redis under steady load, keeps sending, restarts it; checks
/// latency, statuses, and that decisions go back to Redis.
async fn outage_under_load(on_error: &str) {
    let mut server = RedisServer::start().await;
    let gw = Gateway::start(&yaml(&server.url(), on_error, 1_000_000, "")).await;
    // Healthy: decisions are in Redis.
    assert_eq!(send(gw.addr, get("/t", &[])).await.status, StatusCode::OK);
    until_keys_appear(&server, Duration::from_secs(5)).await;

    let load = Load::start(gw.addr, 4, Duration::from_millis(5));
    // The phases under load last fixed times: healthy, 3 s down, and back;
    // sending throughout them is what is tested.
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.stop();
    let killed = Instant::now();
    tokio::time::sleep(Duration::from_secs(3)).await;
    server.restart().await;
    let back = until_keys_appear(&server, BACK_WITHIN + Duration::from_secs(3)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let samples = load.finish().await;

    let during = samples
        .iter()
        .filter(|s| s.at > killed && s.at < killed + Duration::from_secs(3))
        .count();
    assert!(during >= 100, "only {during} requests during the outage");
    let worst = samples.iter().map(|s| s.took).max().unwrap_or_default();
    eprintln!(
        "on_error {on_error}: {} requests, {during} during the outage, slowest {worst:?}, back in Redis {back:?} after restart",
        samples.len()
    );
    for s in &samples {
        assert_eq!(s.status, StatusCode::OK, "{s:?}");
    }
    assert!(worst <= TIMEOUT + SLACK, "a response took {worst:?}");
    assert!(
        back <= BACK_WITHIN,
        "decisions back in Redis after {back:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outage_under_load_with_allow_costs_nothing() {
    outage_under_load("allow").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outage_under_load_with_local_costs_nothing() {
    outage_under_load("local").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outage_with_a_deny_route_answers_503_then_recovers() {
    let mut server = RedisServer::start().await;
    // The store fails open; the route's own policy fails closed. A call
    // bound of 250 ms rather than 25: on a crowded machine the first calls
    // after the restart (the script loaded again) can outlast 25 ms, and
    // each would be a correct 503 that this test would read as a relapse.
    let gw = Gateway::start(
        &yaml(&server.url(), "allow", 1_000_000, "on_error: deny")
            .replace("redis: {", "redis: { timeout: 250ms, "),
    )
    .await;
    assert_eq!(send(gw.addr, get("/t", &[])).await.status, StatusCode::OK);

    let load = Load::start(gw.addr, 2, Duration::from_millis(5));
    // The phases under load last fixed times (healthy, 2 s down at least,
    // and back); sending throughout them is what is tested.
    tokio::time::sleep(Duration::from_millis(200)).await;
    server.stop();
    let killed = Instant::now();
    // A request during the outage: 503 problem+json.
    let reply = wait::value(
        "a refusal once Redis is down",
        Duration::from_secs(2),
        || async {
            let reply = send(gw.addr, get("/t", &[])).await;
            match reply.status {
                StatusCode::OK => Err("200"),
                _ => Ok(reply),
            }
        },
    )
    .await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        reply.header("content-type"),
        Some("application/problem+json")
    );
    assert!(reply.text().contains("\"status\":503"), "{}", reply.text());
    tokio::time::sleep(Duration::from_secs(2)).await;
    server.restart().await;
    let restarted = Instant::now();
    let back = until_keys_appear(&server, BACK_WITHIN + Duration::from_secs(3)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let samples = load.finish().await;

    // Once the link was seen down (well within 100 ms), every answer until
    // the restart is a 503; nothing else but 200 and 503 ever.
    let outage: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.at > killed + Duration::from_millis(100) && s.at + s.took < restarted)
        .collect();
    assert!(outage.len() >= 50, "only {} outage samples", outage.len());
    assert!(
        outage
            .iter()
            .all(|s| s.status == StatusCode::SERVICE_UNAVAILABLE),
        "{outage:?}"
    );
    assert!(
        samples
            .iter()
            .all(|s| s.status == StatusCode::OK || s.status == StatusCode::SERVICE_UNAVAILABLE)
    );
    // Recovered: once the first 200 past the restart was answered, only
    // 200s (a request sent while that one was in flight may still have
    // found the link down).
    let first_ok = samples
        .iter()
        .filter(|s| s.at > restarted && s.status == StatusCode::OK)
        .map(|s| s.at + s.took)
        .min()
        .expect("a 200 after the restart");
    let relapses: Vec<(Duration, u16)> = samples
        .iter()
        .filter(|s| s.at > first_ok && s.status != StatusCode::OK)
        .map(|s| (s.at - restarted, s.status.as_u16()))
        .collect();
    assert!(
        relapses.is_empty(),
        "first 200 {:?} after the restart, then {relapses:?}",
        first_ok - restarted
    );
    let worst = samples.iter().map(|s| s.took).max().unwrap_or_default();
    eprintln!("on_error deny: slowest {worst:?}, back in Redis {back:?} after restart");
    assert!(worst <= TIMEOUT + SLACK, "a response took {worst:?}");
    assert!(back <= BACK_WITHIN);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_redis_is_bounded_by_the_timeout_and_opens_the_breaker() {
    let server = RedisServer::start().await;
    let gw = Gateway::start(&yaml(&server.url(), "allow", 1_000_000, "")).await;
    assert_eq!(send(gw.addr, get("/t", &[])).await.status, StatusCode::OK);
    until_keys_appear(&server, Duration::from_secs(5)).await;
    assert_eq!(gw.inner.breaker_state(), BreakerState::Closed);

    let mut conn = server.connection().await;
    let _: () = redis::cmd("DEL")
        .arg(limit_keys(&server).await)
        .query_async(&mut conn)
        .await
        .expect("DEL");
    let _: () = redis::cmd("CLIENT")
        .arg(&["PAUSE", "2500", "ALL"][..])
        .query_async(&mut conn)
        .await
        .expect("CLIENT PAUSE");
    let paused = Instant::now();
    let mut worst = Duration::ZERO;
    let mut opened = false;
    // Sending through the pause, one request every 5 ms, is what is tested.
    while paused.elapsed() < Duration::from_millis(2000) {
        let started = Instant::now();
        let reply = send(gw.addr, get("/t", &[])).await;
        worst = worst.max(started.elapsed());
        assert_eq!(reply.status, StatusCode::OK);
        if gw.inner.breaker_state() == BreakerState::Open {
            opened = true;
            let text = gw.inner.metrics().render();
            assert!(
                text.lines().any(|l| l == "tollgate_store_breaker_open 1"),
                "{text}"
            );
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(opened, "the breaker never opened while Redis was paused");
    // The pause ends; decisions return to Redis.
    let _: String = redis::cmd("PING")
        .query_async(&mut conn)
        .await
        .expect("PING after the pause");
    let resumed = Instant::now();
    let load = Load::start(gw.addr, 1, Duration::from_millis(5));
    let back = until_keys_appear(&server, BACK_WITHIN + Duration::from_secs(3)).await;
    load.finish().await;
    let since = resumed.elapsed().min(back);
    eprintln!("paused Redis: slowest response {worst:?}, back in Redis {back:?} after the pause");
    assert!(worst <= TIMEOUT + SLACK, "a response took {worst:?}");
    assert!(since <= BACK_WITHIN);
    assert_eq!(gw.inner.breaker_state(), BreakerState::Closed);
    let text = gw.inner.metrics().render();
    assert!(
        text.lines().any(|l| l == "tollgate_store_breaker_open 0"),
        "{text}"
    );
}

#[tokio::test]
async fn gateway_starts_while_redis_is_down_and_serves_by_policy() {
    let mut server = RedisServer::start().await;
    server.stop();
    let started = Instant::now();
    let local = Gateway::start(&yaml(&server.url(), "local", 3, "")).await;
    let allow = Gateway::start(&yaml(&server.url(), "allow", 3, "")).await;
    let deny = Gateway::start(&yaml(&server.url(), "deny", 3, "")).await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "startup waited for Redis"
    );
    let statuses = |gw: std::net::SocketAddr| async move {
        let mut all = Vec::new();
        for _ in 0..5 {
            all.push(send(gw, get("/t", &[])).await.status.as_u16());
        }
        all
    };
    assert_eq!(statuses(local.addr).await, [200, 200, 200, 429, 429]);
    let allowed = send(allow.addr, get("/t", &[])).await;
    assert_eq!(allowed.status, StatusCode::OK);
    assert_eq!(allowed.header("ratelimit"), None, "no count is known");
    assert_eq!(statuses(allow.addr).await, [200; 5]);
    assert_eq!(statuses(deny.addr).await, [503; 5]);

    server.restart().await;
    let load = Load::start(deny.addr, 1, Duration::from_millis(5));
    let back = until_keys_appear(&server, BACK_WITHIN + Duration::from_secs(3)).await;
    load.finish().await;
    assert!(back <= BACK_WITHIN, "back after {back:?}");
    // Decided in Redis now: at most 3 admitted there, then 429 with headers.
    let statuses = statuses(deny.addr).await;
    assert_eq!(statuses[4], 429, "{statuses:?}");
    let limited = send(deny.addr, get("/t", &[])).await;
    assert!(limited.header("ratelimit").is_some());
}

/// Cold start: a request that arrives while the first Redis
/// connection is still coming up is decided by `on_error` after at most
/// the store's `timeout`; it does not queue behind the connect, and
/// `/readyz` says 503 under `on_error: deny` until Redis is connected.
#[tokio::test]
async fn a_cold_start_decides_by_policy_within_the_timeout_instead_of_queueing() {
    let mut server = RedisServer::start().await;
    server.stop();
    // The listeners wait `startup_wait` for Redis before they accept.
    let src = yaml(&server.url(), "deny", 3, "")
        .replace("redis: {", "redis: { timeout: 100ms, startup_wait: 300ms, ");
    let config = tollgate::config::load::parse_str(&src).expect("valid");
    let proxy = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (addr, admin_addr) = (proxy.local_addr().unwrap(), admin.local_addr().unwrap());
    let serve = tollgate::server::Serve {
        admin: Some(admin),
        ..tollgate::server::Serve::on(vec![proxy])
    };
    // The listeners are bound: a request sent now waits in the backlog
    // until the gateway serves.
    let sent = Instant::now();
    let first = tokio::spawn(send(addr, get("/t", &[])));
    let started = tollgate::server::start(config, serve)
        .await
        .expect("starts");
    let gw = Arc::clone(started.gateway());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(started.until(async {
        let _ = stopped.await;
    }));
    let first = first.await.unwrap();
    let waited = sent.elapsed();
    assert_eq!(first.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        waited < Duration::from_millis(700),
        "the first request waited {waited:?} for a connection that was not coming"
    );
    assert_eq!(
        send(admin_addr, get("/readyz", &[])).await.status,
        StatusCode::SERVICE_UNAVAILABLE
    );
    server.restart().await;
    assert!(
        gw.limiter()
            .health()
            .wait_connected(Duration::from_secs(10))
            .await,
        "never connected"
    );
    let ready = send(admin_addr, get("/readyz", &[])).await;
    assert_eq!(ready.status, StatusCode::OK, "{}", ready.text());
    assert_eq!(send(addr, get("/t", &[])).await.status, StatusCode::OK);
    assert_eq!(limit_keys(&server).await.len(), 1, "decided in Redis");
    let _ = stop.send(());
}

#[tokio::test]
async fn local_fallback_divides_limits_by_live_instances() {
    let mut server = RedisServer::start().await;
    let src = yaml(&server.url(), "local", 10, "");
    let a = Gateway::start(&src).await;
    let b = Gateway::start(&src).await;
    wait::value("both instances live", Duration::from_secs(10), || async {
        match (a.inner.live_instances(), b.inner.live_instances()) {
            (2, 2) => Ok(()),
            (x, y) => Err(format!("instances: {x} and {y}")),
        }
    })
    .await;
    server.stop();
    // 10 per minute for the fleet: 5 each while they cannot share counts.
    for gw in [&a, &b] {
        let mut statuses = Vec::new();
        for _ in 0..7 {
            statuses.push(send(gw.addr, get("/t", &[])).await.status.as_u16());
        }
        assert_eq!(statuses, [200, 200, 200, 200, 200, 429, 429]);
    }
    assert_eq!(a.inner.live_instances(), 2, "the last known count is kept");
}

#[tokio::test]
async fn garbage_in_redis_goes_through_the_failure_policy() {
    let server = RedisServer::start().await;
    let src = format!(
        "{}  - name: d
    match: {{ path: /d }}
    respond: {{ status: 200 }}
    on_error: deny
    limits: [ {{ name: per_ip, key: ip, limit: 100, window: 1m }} ]
",
        yaml(&server.url(), "local", 100, "")
    );
    let gw = Gateway::start(&src).await;
    assert_eq!(send(gw.addr, get("/t", &[])).await.status, StatusCode::OK);
    assert_eq!(send(gw.addr, get("/d", &[])).await.status, StatusCode::OK);
    let mut conn = server.connection().await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("tg:{*}?*")
        .query_async(&mut conn)
        .await
        .expect("KEYS");
    assert_eq!(keys.len(), 2, "{keys:?}");
    for (i, key) in keys.iter().enumerate() {
        let _: () = redis::cmd("DEL")
            .arg(key)
            .query_async(&mut conn)
            .await
            .expect("DEL");
        // One key of the wrong type, one string that is not a counter.
        let _: () = if i == 0 {
            redis::cmd("RPUSH")
                .arg(key)
                .arg("x")
                .query_async(&mut conn)
                .await
        } else {
            redis::cmd("SET")
                .arg(key)
                .arg("1:2")
                .query_async(&mut conn)
                .await
        }
        .expect("write garbage");
    }
    for _ in 0..6 {
        assert_eq!(send(gw.addr, get("/t", &[])).await.status, StatusCode::OK);
        let reply = send(gw.addr, get("/d", &[])).await;
        assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    }
    assert_eq!(
        gw.inner.breaker_state(),
        BreakerState::Closed,
        "garbage in one key does not cut Redis off for everyone"
    );
}

// --- Topologies, through the store --------------------------------------------

const T0: u64 = 1_700_000_000_000;

/// Counter keys are `tg:{<identity digest>}<limit digest>` by default:
/// 12 and 4 characters of base64url SHA-256 of the readable parts, which
/// `readable_keys: true` writes instead.
#[tokio::test]
async fn counter_keys_are_short_digests_unless_readable_keys() {
    use sha2::{Digest, Sha256};
    fn b64(text: &str, chars: usize) -> String {
        const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
        let d = Sha256::digest(text.as_bytes());
        let bits: String = d.iter().map(|b| format!("{b:08b}")).collect();
        (0..chars)
            .map(|i| A[usize::from_str_radix(&bits[6 * i..6 * i + 6], 2).unwrap()] as char)
            .collect()
    }
    let server = RedisServer::start().await;
    let gw = Gateway::start(&yaml(&server.url(), "local", 10, "")).await;
    assert_eq!(send(gw.addr, get("/t", &[])).await.status, StatusCode::OK);
    let want = format!(
        "tg:{{{}}}{}",
        b64("ip=127.0.0.1/32", 12),
        b64(":t:per_ip", 4)
    );
    assert_eq!(limit_keys(&server).await, std::slice::from_ref(&want));
    assert_eq!(want.len(), 21);
    drop(gw);

    let server = RedisServer::start().await;
    let src = yaml(&server.url(), "local", 10, "").replace(
        "  on_error: local\n",
        "  on_error: local\n  readable_keys: true\n",
    );
    assert!(src.contains("readable_keys"), "{src}");
    let gw = Gateway::start(&src).await;
    assert_eq!(send(gw.addr, get("/t", &[])).await.status, StatusCode::OK);
    assert_eq!(limit_keys(&server).await, ["tg:{ip=127.0.0.1/32}:t:per_ip"]);
    drop(gw);
}

fn one(key: &str, limit: u64) -> LimitRequest {
    LimitRequest {
        key: key.into(),
        limit,
        window_ms: 60_000,
        cost: 1,
        algorithm: Algorithm::SlidingWindow,
        mode: Default::default(),
    }
}

/// Debug builds on a busy machine: generous, the timeout is not under test.
fn config(topology: RedisTopology, url: &str) -> RedisConfig {
    RedisConfig {
        url: url.into(),
        topology,
        timeout: Duration::from_secs(2),
        ..RedisConfig::default()
    }
}

async fn connected(cfg: &RedisConfig) -> RedisStore {
    let store = RedisStore::connect(cfg).await.expect("connect");
    assert!(
        store.wait_connected(Duration::from_secs(15)).await,
        "store did not connect"
    );
    store
}

/// Decides until the store answers (a fresh cluster or failover may need a
/// moment), then returns that answer.
async fn decide_eventually(store: &RedisStore, now: u64, reqs: &[LimitRequest]) -> bool {
    wait::value("an answer from the store", Duration::from_secs(20), || {
        store.decide(now, reqs)
    })
    .await
    .allowed
}

#[tokio::test]
async fn cluster_decides_many_keys_and_limits_across_slots() {
    let cluster = RedisCluster::start(3).await;
    let store = connected(&config(
        RedisTopology::Cluster {
            seeds: cluster.seeds()[..1].to_vec(),
        },
        "",
    ))
    .await;
    decide_eventually(&store, T0, &[one("tg:{warmup}:r:l", 100)]).await;

    // Many identities, spread over every node: each admits 2, then denies.
    let mut nodes = std::collections::BTreeSet::new();
    for i in 0..60 {
        let key = format!("tg:{{id{i}}}:r:l");
        let reqs = [one(&key, 2)];
        let first = store.decide(T0, &reqs).await;
        assert!(
            first.as_ref().is_ok_and(|d| d.allowed),
            "{key}: {first:?} {:?}",
            cluster.get(&key).await
        );
        assert!(store.decide(T0, &reqs).await.expect("decide").allowed);
        assert!(
            !store.decide(T0, &reqs).await.expect("decide").allowed,
            "{key}"
        );
        let (port, value) = cluster.get(&key).await;
        assert_eq!(value.as_deref(), Some("28333333:0:2"), "{key}");
        nodes.insert(port);
    }
    assert_eq!(nodes.len(), 3, "keys on every master");

    // One request, two limits in two slots on two different nodes.
    let (a, b) = ("tg:{alpha}:r:a", "tg:{beta}:r:b");
    let p0 = cluster.nodes[0].port;
    let slot = |k: &'static str| async move {
        match query(p0, &["CLUSTER", "KEYSLOT", k]).await {
            Ok(redis::Value::Int(s)) => s,
            other => panic!("CLUSTER KEYSLOT: {other:?}"),
        }
    };
    assert_ne!(slot(a).await, slot(b).await);
    assert_ne!(cluster.get(a).await.0, cluster.get(b).await.0);
    let both = [one(a, 5), one(b, 3)];
    for _ in 0..3 {
        assert!(store.decide(T0, &both).await.expect("decide").allowed);
    }
    let denied = store.decide(T0, &both).await.expect("decide");
    assert!(!denied.allowed);
    assert!(denied.outcomes[0].admits && !denied.outcomes[1].admits);
    assert_eq!(
        denied.outcomes[0].remaining, 2,
        "reported as before the reservation"
    );
    // `a` was reserved in its slot, then given back when `b` denied.
    assert_eq!(cluster.get(a).await.1.as_deref(), Some("28333333:0:3"));
    assert_eq!(cluster.get(b).await.1.as_deref(), Some("28333333:0:3"));
    assert!(
        store
            .decide(T0, &[one(a, 5)])
            .await
            .expect("decide")
            .allowed
    );
    assert!(
        store
            .decide(T0, &[one(a, 5)])
            .await
            .expect("decide")
            .allowed
    );
    assert!(
        !store
            .decide(T0, &[one(a, 5)])
            .await
            .expect("decide")
            .allowed
    );
}

#[tokio::test]
async fn sentinel_failover_is_followed_without_a_restart() {
    let mut setup = SentinelSetup::start().await;
    let store = connected(&config(
        RedisTopology::Sentinel {
            service_name: support::redis_topologies::SERVICE.into(),
            nodes: vec![("127.0.0.1".into(), setup.sentinel.port)],
        },
        "",
    ))
    .await;
    assert!(decide_eventually(&store, T0, &[one("tg:{before}:r:l", 5)]).await);
    assert_eq!(
        query_string(setup.master.port, &["GET", "tg:{before}:r:l"])
            .await
            .as_deref(),
        Some("28333333:0:1")
    );

    setup.fail_over().await;
    let failed_over = Instant::now();
    assert!(decide_eventually(&store, T0, &[one("tg:{after}:r:l", 5)]).await);
    eprintln!(
        "sentinel: decisions through the new master {:?} after the promotion",
        failed_over.elapsed()
    );
    assert_eq!(
        query_string(setup.replica.port, &["GET", "tg:{after}:r:l"])
            .await
            .as_deref(),
        Some("28333333:0:1"),
        "written through the promoted replica"
    );
}

#[tokio::test]
async fn tls_with_a_test_ca() {
    let tls = TlsRedis::start().await;
    let url = format!("rediss://127.0.0.1:{}", tls.proc.port);
    let mut cfg = config(RedisTopology::Standalone, &url);
    cfg.tls = Some(RedisTls {
        ca_file: Some(tls.ca_file.clone()),
    });
    let store = connected(&cfg).await;
    let reqs = [one("tg:{tls}:r:l", 2)];
    assert!(store.decide(T0, &reqs).await.expect("decide").allowed);
    assert!(store.decide(T0, &reqs).await.expect("decide").allowed);
    assert!(!store.decide(T0, &reqs).await.expect("decide").allowed);
    drop(store);
    // The counts live in Redis: a new client sees them.
    let again = connected(&cfg).await;
    assert!(!again.decide(T0, &reqs).await.expect("decide").allowed);

    // Without the test CA the server's certificate is not trusted.
    let untrusted = RedisStore::connect(&config(RedisTopology::Standalone, &url))
        .await
        .expect("connect returns at once");
    // Given the time a good connection takes, it does not come up.
    assert!(!untrusted.wait_connected(Duration::from_millis(500)).await);
    assert!(matches!(
        untrusted.decide(T0, &reqs).await,
        Err(StoreError::Unavailable(_))
    ));
}

#[tokio::test]
async fn acl_user_and_database_number() {
    let server = RedisServer::start().await;
    let mut conn = server.connection().await;
    let _: () = redis::cmd("ACL")
        .arg(&["SETUSER", "tollgate", "on", ">s3cret", "~tg:*", "+@all"][..])
        .query_async(&mut conn)
        .await
        .expect("ACL SETUSER");
    let port = server.port();
    let reqs = [one("tg:{acl}:r:l", 2)];

    // Credentials and database in the URL.
    let store = connected(&config(
        RedisTopology::Standalone,
        &format!("redis://tollgate:s3cret@127.0.0.1:{port}/3"),
    ))
    .await;
    assert!(store.decide(T0, &reqs).await.expect("decide").allowed);
    let db3 = redis::Client::open(format!("redis://127.0.0.1:{port}/3"))
        .expect("url")
        .get_multiplexed_async_connection()
        .await;
    let value: Option<String> = redis::cmd("GET")
        .arg("tg:{acl}:r:l")
        .query_async(&mut db3.expect("db 3"))
        .await
        .expect("GET");
    assert_eq!(
        value.as_deref(),
        Some("28333333:0:1"),
        "written in database 3"
    );
    // The user's key pattern is in force: other keys are refused, and that
    // is an error for the failure policy, not a decision: a refusal in
    // Redis's words, reported as a fault until a call succeeds.
    let refused = store.decide(T0, &[one("other:{acl}:r:l", 2)]).await;
    assert!(
        matches!(&refused, Err(StoreError::Refused(m)) if m.starts_with("NOPERM")),
        "{refused:?}"
    );
    assert!(store.fault().is_some());
    let allowed_key = [one("tg:{acl}:r:cleared", 2)];
    assert!(
        store
            .decide(T0, &allowed_key)
            .await
            .expect("decide")
            .allowed
    );
    assert_eq!(store.fault(), None, "a call answered clears it");

    // Credentials as fields.
    let mut cfg = config(
        RedisTopology::Standalone,
        &format!("redis://127.0.0.1:{port}/3"),
    );
    cfg.username = Some("tollgate".into());
    cfg.password = Some("s3cret".into());
    let fields = connected(&cfg).await;
    assert!(fields.decide(T0, &reqs).await.expect("decide").allowed);
    assert!(!fields.decide(T0, &reqs).await.expect("decide").allowed);

    // A wrong password never connects.
    cfg.password = Some("wrong".into());
    let wrong = RedisStore::connect(&cfg)
        .await
        .expect("connect returns at once");
    assert!(!wrong.wait_connected(Duration::from_millis(300)).await);
    assert!(wrong.decide(T0, &reqs).await.is_err());
}

#[tokio::test]
async fn redis_clock_makes_skewed_gateways_agree() {
    let server = RedisServer::start().await;
    let cfg = config(RedisTopology::Standalone, &server.url());
    let a = connected(&cfg).await;
    let b = connected(&cfg).await;
    let skew = 10 * 60_000; // b's clock runs ten windows ahead
    let now = T0;

    // Six requests on `key`, alternating a (at now) and b (ten windows on).
    let alternate = async |key: &str| {
        let reqs = [one(key, 3)];
        let mut admitted = 0;
        for i in 0..6 {
            let (store, t) = if i % 2 == 0 {
                (&a, now)
            } else {
                (&b, now + skew)
            };
            admitted += u32::from(store.decide(t, &reqs).await.expect("decide").allowed);
        }
        admitted
    };

    // Gateway clocks: b lives in a later window and resets a's counts.
    let admitted = alternate("tg:{skew}:r:gw").await;
    assert!(admitted > 3, "skewed clocks admitted only {admitted}");

    // Redis clock: both count in the server's window, `now` is ignored.
    a.use_server_clock(true);
    b.use_server_clock(true);
    assert_eq!(alternate("tg:{skew}:r:redis").await, 3);
}

#[tokio::test]
async fn cluster_gateway_refunds_a_limit_denied_in_another_slot() {
    let cluster = RedisCluster::start(3).await;
    let gw = Gateway::start(&format!(
        "listen: 127.0.0.1:0
store:
  redis: {{ cluster: [{}], timeout: 2s }}
  on_error: deny
routes:
  - name: t
    match: {{ path: /t }}
    respond: {{ status: 200 }}
    limits:
      - {{ name: per_ip, key: ip, limit: 5, window: 1m }}
      - {{ name: per_user, key: 'header:x-user', limit: 3, window: 1m }}
",
        cluster.seed_list()
    ))
    .await;
    let as_user = |user: &'static str| get("/t", &[("x-user", user)]);
    // The cluster may need a moment after startup; deny answers 503 then.
    wait::until(
        "the gateway deciding in the cluster",
        Duration::from_secs(20),
        || async { send(gw.addr, as_user("alice")).await.status == StatusCode::OK },
    )
    .await;
    for _ in 0..2 {
        assert_eq!(send(gw.addr, as_user("alice")).await.status, StatusCode::OK);
    }
    let limited = send(gw.addr, as_user("alice")).await;
    assert_eq!(limited.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(
        limited.text().contains("[\"per_user\"]"),
        "{}",
        limited.text()
    );

    // The two keys sit in different slots (and so were decided apart).
    let mut keys = Vec::new();
    for node in &cluster.nodes {
        if let Ok(redis::Value::Array(found)) = query(node.port, &["KEYS", "tg:{*}?*"]).await {
            for k in found {
                if let redis::Value::BulkString(k) = k {
                    keys.push(String::from_utf8_lossy(&k).into_owned());
                }
            }
        }
    }
    assert_eq!(keys.len(), 2, "{keys:?}");
    let p0 = cluster.nodes[0].port;
    let mut slots = Vec::new();
    for k in &keys {
        slots.push(format!("{:?}", query(p0, &["CLUSTER", "KEYSLOT", k]).await));
    }
    assert_ne!(slots[0], slots[1], "{keys:?}");

    // alice's 4th request reserved per_ip, then was refunded: 3 of 5 used,
    // so bob (same IP) gets exactly 2 more.
    let mut statuses = Vec::new();
    for _ in 0..3 {
        statuses.push(send(gw.addr, as_user("bob")).await.status.as_u16());
    }
    assert_eq!(statuses, [200, 200, 429]);

    // carol's first request: per_ip (full) denies, per_user admits and is
    // reserved, then refunded: the 429 shows it as the refund left it,
    // nothing counted and so nothing to restore.
    let limited = send(gw.addr, as_user("carol")).await;
    assert_eq!(limited.status, StatusCode::TOO_MANY_REQUESTS);
    let shown = limited.header("ratelimit").unwrap_or_default();
    assert!(
        shown.starts_with(r#""per_ip";r=0;"#) && shown.ends_with(r#""per_user";r=3;t=0"#),
        "{shown}"
    );
}

#[tokio::test]
async fn refund_script_gives_back_to_the_right_count() {
    use tollgate::store::redis::REFUND;
    let server = RedisServer::start().await;
    let mut conn = server.connection().await;
    // Window 1000 ms; the reservation was made at now = 100_500 (window 100).
    // The key holds `after` once refunded; the reply is now and that
    // counter (0:0:0 for no key).
    let cases: &[(Option<&str>, u64, Option<&str>)] = &[
        (Some("100:4:7"), 2, Some("100:4:5")), // still window 100: cur
        (Some("101:7:1"), 2, Some("101:5:1")), // rolled to 101: prev
        (Some("102:7:1"), 2, Some("102:7:1")), // two windows on: nothing
        (Some("100:0:1"), 3, Some("100:0:0")), // never below zero
        (None, 1, None),                       // expired: nothing
    ];
    for (before, cost, after) in cases {
        let key = "tg:{refund}:r:l";
        let _: () = redis::cmd("DEL")
            .arg(key)
            .query_async(&mut conn)
            .await
            .expect("DEL");
        if let Some(v) = before {
            let _: () = redis::cmd("SET")
                .arg(key)
                .arg(*v)
                .arg("PX")
                .arg(60_000)
                .query_async(&mut conn)
                .await
                .expect("SET");
        }
        let reply: Vec<i64> = redis::Script::new(REFUND)
            .key(key)
            .arg(100_500)
            .arg(1_000)
            .arg(*cost)
            .invoke_async(&mut conn)
            .await
            .expect("refund");
        let left = after
            .unwrap_or("0:0:0")
            .split(':')
            .map(|n| n.parse().unwrap());
        let want: Vec<i64> = std::iter::once(100_500).chain(left).collect();
        assert_eq!(reply, want, "{before:?}");
        let value: Option<String> = redis::cmd("GET")
            .arg(key)
            .query_async(&mut conn)
            .await
            .expect("GET");
        assert_eq!(value.as_deref(), *after, "{before:?}");
        if before.is_some() {
            let ttl: i64 = redis::cmd("PTTL")
                .arg(key)
                .query_async(&mut conn)
                .await
                .expect("PTTL");
            assert!(ttl > 0, "the expiry is kept");
        }
    }
    let key = "tg:{refund}:r:l";
    let _: () = redis::cmd("SET")
        .arg(key)
        .arg("garbage")
        .query_async(&mut conn)
        .await
        .expect("SET");
    let r: redis::RedisResult<Vec<i64>> = redis::Script::new(REFUND)
        .key(key)
        .arg(100_500)
        .arg(1_000)
        .arg(1)
        .invoke_async(&mut conn)
        .await;
    assert!(r.is_err(), "garbage is an error, not a guess");
}

#[tokio::test]
async fn pool_spreads_decisions_over_its_connections() {
    let server = RedisServer::start().await;
    let mut cfg = config(RedisTopology::Standalone, &server.url());
    cfg.pool_size = 3;
    let store = connected(&cfg).await;
    let reqs = [one("tg:{pool}:r:l", 10)];
    let mut admitted = 0;
    for _ in 0..15 {
        admitted += u32::from(store.decide(T0, &reqs).await.expect("decide").allowed);
    }
    assert_eq!(admitted, 10, "one count, whichever connection decides");
    // Three clients of the store, each connected (plus this test's own).
    wait::value(
        "the pool's three clients",
        Duration::from_secs(10),
        || async {
            let clients = query_string(server.port(), &["INFO", "clients"])
                .await
                .unwrap_or_default();
            let n: u32 = clients
                .lines()
                .find_map(|l| l.strip_prefix("connected_clients:"))
                .and_then(|n| n.trim().parse().ok())
                .unwrap_or(0);
            if n > 3 { Ok(()) } else { Err(clients) }
        },
    )
    .await;
}

/// `/t` through a gateway whose store is `redis_yaml`, failing closed, so a
/// 200 proves Redis decided.
fn closed_gateway_yaml(redis_yaml: &str) -> String {
    format!(
        "listen: 127.0.0.1:0
store:
  redis: {redis_yaml}
  on_error: deny
routes:
  - name: t
    match: {{ path: /t }}
    respond: {{ status: 200 }}
    limits: [ {{ name: per_ip, key: ip, limit: 1000, window: 1m }} ]
"
    )
}

/// Sends `/t` until it is answered 200 (Redis decided), within `within`.
async fn until_ok(addr: std::net::SocketAddr, within: Duration) -> Duration {
    wait::took("Redis deciding", within, || async move {
        send(addr, get("/t", &[])).await.status == StatusCode::OK
    })
    .await
}

#[tokio::test]
async fn gateway_follows_a_sentinel_failover() {
    let mut setup = SentinelSetup::start().await;
    let gw = Gateway::start(&closed_gateway_yaml(&format!(
        "{{ sentinel: {{ service_name: {}, nodes: [127.0.0.1:{}] }}, timeout: 1s }}",
        support::redis_topologies::SERVICE,
        setup.sentinel.port
    )))
    .await;
    until_ok(gw.addr, Duration::from_secs(20)).await;
    let on = |port: u16| async move {
        match query(port, &["KEYS", "tg:{*}?*"]).await {
            Ok(redis::Value::Array(keys)) => keys.len(),
            _ => 0,
        }
    };
    assert_eq!(on(setup.master.port).await, 1);

    setup.fail_over().await;
    // Forget what replication copied, so a key proves a write after the
    // failover.
    let _: redis::Value = query(setup.replica.port, &["FLUSHALL"])
        .await
        .expect("FLUSHALL on the new master");
    let took = until_ok(gw.addr, Duration::from_secs(20)).await;
    eprintln!("gateway: deciding through the new master {took:?} after the promotion");
    assert_eq!(
        on(setup.replica.port).await,
        1,
        "written through the new master"
    );
}

#[tokio::test]
async fn gateway_speaks_tls_with_an_acl_user() {
    use support::redis_topologies::{TLS_PASSWORD, TLS_USER};
    let tls = TlsRedis::start().await;
    let port = tls.proc.port;
    let yaml = |password: &str| {
        closed_gateway_yaml(&format!(
            "{{ url: 'rediss://127.0.0.1:{port}', username: {TLS_USER}, password: {password}, tls: {{ ca_file: '{}' }}, timeout: 1s }}",
            tls.ca_file.display()
        ))
    };
    let gw = Gateway::start(&yaml(TLS_PASSWORD)).await;
    until_ok(gw.addr, Duration::from_secs(10)).await;

    // The same server with a wrong password: never decided, 503.
    let wrong = Gateway::start(&yaml("wrong")).await;
    for _ in 0..3 {
        let reply = send(wrong.addr, get("/t", &[])).await;
        assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    }
}

// --- Redis refusing the gateway is not an outage ------------------------------

/// The built binary serving `/t` (one per-IP limit, `on_error: local`)
/// against `redis_yaml`, with its admin listener and its log in a file.
struct RefusedBinary {
    started: support::binary::Started,
    log: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

/// How long a refusal may take to be found: a connection attempt (the
/// connect timeout is 1 s), one reconnect delay and a probe.
const FOUND_WITHIN: Duration = Duration::from_secs(15);

impl RefusedBinary {
    fn start(redis_yaml: &str) -> RefusedBinary {
        let dir = tempfile::tempdir().expect("temp dir");
        let config = dir.path().join("gateway.yaml");
        std::fs::write(
            &config,
            format!(
                "listen: 127.0.0.1:0
admin: 127.0.0.1:0
store:
  redis: {redis_yaml}
  on_error: local
routes:
  - name: t
    match: {{ path: /t }}
    respond: {{ status: 200 }}
    limits: [ {{ name: per_ip, key: ip, limit: 1000, window: 1m }} ]
"
            ),
        )
        .expect("write gateway.yaml");
        let log = dir.path().join("tollgate.log");
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"));
        cmd.arg("--config").arg(&config);
        let started = support::binary::spawn_listening(cmd, 2, Some(&log));
        RefusedBinary {
            started,
            log,
            _dir: dir,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits for a line holding `words` on the binary's line stream.
    async fn until_logged(&mut self, words: &str) {
        if !self.started.wait_for_line(words, FOUND_WITHIN).await {
            panic!(
                "no line holding {words:?} within {FOUND_WITHIN:?}\n--- log:\n{}",
                self.log()
            );
        }
    }

    /// The log's ERROR lines holding `words`.
    fn errors_with(&self, words: &str) -> Vec<String> {
        self.log()
            .lines()
            .filter(|l| l.contains("ERROR") && l.contains(words))
            .map(str::to_owned)
            .collect()
    }

    async fn readyz(&self) -> support::gateway::Reply {
        send(
            self.started.admin.expect("admin listener"),
            get("/readyz", &[]),
        )
        .await
    }

    async fn t(&self) -> StatusCode {
        send(self.started.proxy[0], get("/t", &[])).await.status
    }

    /// Waits until the refusal is reported: `/readyz` answers 503 with
    /// `body` in its body, and an ERROR line of the log holds `logged`.
    /// Requests are sent meanwhile (decided by `on_error: local`), since
    /// some refusals only show on a decision. Returns the `/readyz` body.
    async fn until_reported(&self, body: &str, logged: &str) -> String {
        wait::value("the refusal reported", FOUND_WITHIN, || async move {
            assert_eq!(self.t().await, StatusCode::OK, "on_error: local decides");
            let ready = self.readyz().await;
            if ready.status == StatusCode::SERVICE_UNAVAILABLE
                && ready.text().contains(body)
                && !self.errors_with(logged).is_empty()
            {
                return Ok(ready.text());
            }
            Err(format!(
                "/readyz {} {:?}\n--- log:\n{}",
                ready.status,
                ready.text(),
                self.log()
            ))
        })
        .await
    }

    /// Waits until `/readyz` answers 200 again.
    async fn until_ready(&self) {
        wait::value("ready again", FOUND_WITHIN, || async move {
            let ready = self.readyz().await;
            if ready.status == StatusCode::OK {
                return Ok(());
            }
            Err(format!("{:?}\n--- log:\n{}", ready.text(), self.log()))
        })
        .await;
    }
}

impl Drop for RefusedBinary {
    fn drop(&mut self) {
        let _ = self.started.child.kill();
        let _ = self.started.child.wait();
    }
}

/// `total_connections_received` as seen on `conn`: grows with every
/// connection attempt anyone makes (the test's own polls reuse `conn`).
async fn connections_received(conn: &mut redis::aio::MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("stats")
        .query_async(conn)
        .await
        .expect("INFO stats");
    info.lines()
        .find_map(|l| l.strip_prefix("total_connections_received:"))
        .and_then(|n| n.trim().parse().ok())
        .expect("total_connections_received")
}

/// Waits until the gateway has tried to connect `n` more times.
async fn until_more_connections(server: &RedisServer, n: u64) {
    let mut conn = server.connection().await;
    let from = connections_received(&mut conn).await;
    wait::until("the gateway reconnecting", FOUND_WITHIN, || {
        let mut conn = conn.clone();
        async move { connections_received(&mut conn).await >= from + n }
    })
    .await;
}

#[tokio::test]
async fn wrong_or_missing_password_is_logged_once_and_named_by_readyz() {
    let server = RedisServer::start_with_password("right");
    let server = server.await;
    let port = server.port();
    for (url, words) in [
        (
            format!("redis://:wrong@127.0.0.1:{port}"),
            "WRONGPASS invalid username-password pair or user is disabled.",
        ),
        (
            format!("redis://127.0.0.1:{port}"),
            "NOAUTH Authentication required.",
        ),
    ] {
        let gw = RefusedBinary::start(&format!("{{ url: '{url}' }}"));
        let body = gw
            .until_reported(&format!("redis: authentication failed: {words}"), words)
            .await;
        assert!(body.starts_with("not ready\n"), "{body}");
        let metrics = send(gw.started.admin.unwrap(), get("/metrics", &[]))
            .await
            .text();
        assert!(
            metrics
                .lines()
                .any(|l| l == "tollgate_store_fault{kind=\"auth\"} 1"),
            "{metrics}"
        );
        // Logged once, not per reconnect attempt nor per request.
        until_more_connections(&server, 2).await;
        for _ in 0..5 {
            assert_eq!(gw.t().await, StatusCode::OK);
        }
        assert_eq!(gw.errors_with(words).len(), 1, "{}", gw.log());
    }

    // The server is given the password the gateway sends: accepted, logged
    // once, ready again.
    let mut gw = RefusedBinary::start(&format!("{{ url: 'redis://:wrong@127.0.0.1:{port}' }}"));
    gw.until_reported("WRONGPASS", "WRONGPASS").await;
    let mut conn = server.connection().await;
    let _: () = redis::cmd("CONFIG")
        .arg(&["SET", "requirepass", "wrong"][..])
        .query_async(&mut conn)
        .await
        .expect("CONFIG SET requirepass");
    gw.until_ready().await;
    gw.until_logged("redis accepts this gateway again").await;
    assert_eq!(gw.errors_with("WRONGPASS").len(), 1, "{}", gw.log());
}

#[tokio::test]
async fn missing_acl_permission_is_reported_as_noperm() {
    let server = RedisServer::start().await;
    let mut conn = server.connection().await;
    let _: () = redis::cmd("ACL")
        .arg(
            &[
                "SETUSER", "tollgate", "on", ">s3cret", "~*", "+@all", "-evalsha", "-eval",
            ][..],
        )
        .query_async(&mut conn)
        .await
        .expect("ACL SETUSER");
    let gw = RefusedBinary::start(&format!(
        "{{ url: 'redis://tollgate:s3cret@127.0.0.1:{}' }}",
        server.port()
    ));
    let body = gw
        .until_reported("redis: permission denied: NOPERM", "NOPERM")
        .await;
    assert!(body.contains("'evalsha'"), "decisions are refused: {body}");

    // Given the commands, it decides in Redis again and is ready.
    let _: () = redis::cmd("ACL")
        .arg(&["SETUSER", "tollgate", "+evalsha", "+eval"][..])
        .query_async(&mut conn)
        .await
        .expect("ACL SETUSER");
    wait::until("a decision in Redis", FOUND_WITHIN, || async {
        if !limit_keys(&server).await.is_empty() {
            return true;
        }
        assert_eq!(gw.t().await, StatusCode::OK);
        false
    })
    .await;
    gw.until_ready().await;
}

#[tokio::test]
async fn tls_mismatch_is_reported_as_tls() {
    // rediss:// against a plain-text server: the handshake just times out;
    // a plain PING finds the server speaking RESP.
    let plain = RedisServer::start().await;
    let gw = RefusedBinary::start(&format!("{{ url: 'rediss://127.0.0.1:{}' }}", plain.port()));
    let words = format!(
        "the URL is rediss:// but 127.0.0.1:{} answered a plain-text PING with \"+PONG\"",
        plain.port()
    );
    gw.until_reported(&format!("redis: TLS failed: {words}"), &words)
        .await;
    drop(gw);

    // redis:// against a TLS server: the server resets the connection; a
    // TLS handshake finds it speaking TLS.
    let tls = TlsRedis::start().await;
    let port = tls.proc.port;
    let gw = RefusedBinary::start(&format!("{{ url: 'redis://127.0.0.1:{port}' }}"));
    let words = format!("the URL is redis:// but 127.0.0.1:{port} answered a TLS handshake");
    gw.until_reported(&format!("redis: TLS failed: {words}"), &words)
        .await;
    drop(gw);

    // rediss:// with a certificate nothing trusts: rustls's words.
    let gw = RefusedBinary::start(&format!("{{ url: 'rediss://127.0.0.1:{port}' }}"));
    gw.until_reported(
        "redis: TLS failed: InvalidCertificate(UnknownIssuer)",
        "InvalidCertificate(UnknownIssuer)",
    )
    .await;
}

// --- what the fallback admitted reaches Redis --------------------------------

/// The value and the time to live of `key` in `server`.
async fn value_and_pttl(server: &RedisServer, key: &str) -> (Option<String>, i64) {
    let mut conn = server.connection().await;
    let value: Option<String> = redis::cmd("GET")
        .arg(key)
        .query_async(&mut conn)
        .await
        .expect("GET");
    let pttl: i64 = redis::cmd("PTTL")
        .arg(key)
        .query_async(&mut conn)
        .await
        .expect("PTTL");
    (value, pttl)
}

/// Limit 10 a minute, `on_error: local`, one gateway on a manual clock:
/// 10 admitted in process while Redis is down; when it is back (restarted
/// empty), those 10 are in Redis before it decides, so the rest of the
/// window is denied — 10 across the outage, not 20.
#[tokio::test]
async fn local_admissions_during_an_outage_are_added_to_redis_when_it_returns() {
    let mut server = RedisServer::start().await;
    let clock = Arc::new(tollgate::clock::ManualClock::new(T0));
    let gw = Gateway::start_with_clock(&yaml(&server.url(), "local", 10, ""), clock.clone()).await;
    wait::until("connected to Redis", Duration::from_secs(10), || async {
        gw.inner.limiter().health().redis_connected() == Some(true)
    })
    .await;

    server.stop();
    let mut during = Vec::new();
    for _ in 0..11 {
        clock.advance(100);
        during.push(send(gw.addr, get("/t", &[])).await.status.as_u16());
    }
    assert_eq!(during, [[200; 10].as_slice(), &[429]].concat());
    assert!(gw.inner.limiter().health().behind_redis());

    server.restart().await;
    // Connected, and the breaker (if the outage opened it) closed again.
    wait::until(
        "reconnected with the breaker closed",
        BACK_WITHIN + Duration::from_secs(3),
        || async {
            gw.inner.limiter().health().redis_connected() == Some(true)
                && gw.inner.breaker_state() == BreakerState::Closed
        },
    )
    .await;
    // Still the same window (T0 is 20 s into a minute; 3 s have passed).
    clock.advance(2_000);
    let mut conn = server.connection().await;
    let evalsha_before = support::redis::command_calls(&mut conn, "evalsha").await;
    let mut admitted = 0;
    for _ in 0..10 {
        let reply = send(gw.addr, get("/t", &[])).await;
        if reply.status == StatusCode::OK {
            admitted += 1;
        }
    }
    assert_eq!(
        admitted, 0,
        "the window spanning the outage was granted again"
    );
    assert!(!gw.inner.limiter().health().behind_redis());
    // Redis decided them, from the 10 the push added (with the expiry a
    // write gets: the rest of this window and the next).
    assert!(support::redis::command_calls(&mut conn, "evalsha").await > evalsha_before);
    let keys = limit_keys(&server).await;
    assert_eq!(keys.len(), 1, "{keys:?}");
    let (value, pttl) = value_and_pttl(&server, &keys[0]).await;
    let window = (T0 + 3_100) / 60_000;
    assert_eq!(value, Some(format!("{window}:0:10")));
    assert!((60_000..=120_000).contains(&pttl), "PTTL {pttl}");
    let text = gw.inner.metrics().render();
    assert!(
        text.lines()
            .any(|l| l == "tollgate_store_backlog_pushed_total 1"),
        "{text}"
    );

    // Two windows on, Redis admits again.
    clock.advance(120_000);
    assert_eq!(send(gw.addr, get("/t", &[])).await.status, StatusCode::OK);
}

/// The push adds to each algorithm's key what a single store would hold:
/// Redis decides 3 before the outage, the fallback admits 4 during it, and
/// from the push on Redis answers exactly as one store that saw all 7.
#[tokio::test]
async fn a_pushed_backlog_counts_as_if_redis_had_decided() {
    use tollgate::store::MemoryStore;
    use tollgate::store::redis::backlog::Backlog;
    let server = RedisServer::start().await;
    let store = connected(&config(RedisTopology::Standalone, &server.url())).await;
    let algorithms = [
        Algorithm::SlidingWindow,
        Algorithm::FixedWindow,
        Algorithm::SlidingLog,
        Algorithm::Gcra { burst: 10 },
        Algorithm::CalendarMonth,
        Algorithm::SlidingBuckets {
            precision_ms: 5_000,
        },
    ];
    for (i, algorithm) in algorithms.into_iter().enumerate() {
        let req = LimitRequest {
            key: format!("tg:{{push}}{i}").into(),
            limit: 10,
            window_ms: 60_000,
            cost: 1,
            algorithm,
            mode: Default::default(),
        };
        let reqs = std::slice::from_ref(&req);
        let one_store = MemoryStore::new();
        for _ in 0..3 {
            assert!(store.decide(T0, reqs).await.expect("decide").allowed);
            assert!(one_store.decide_now(T0, reqs).allowed);
        }
        let backlog = Backlog::new();
        for k in 0..4 {
            let t = T0 + 10_000 + 100 * k;
            assert!(one_store.decide_now(t, reqs).allowed);
            backlog.record(t, &req);
        }
        let at = T0 + 15_000;
        let pushed = store.push(at, backlog.take(at)).await;
        assert!(pushed.error.is_none(), "{:?}", pushed.error);
        assert_eq!((pushed.added, pushed.skipped), (1, 0));
        // Past the window's end (T0 + 40 s) too.
        for step in 0..6 {
            let t = at + 7_000 * step;
            let redis = store.decide(t, reqs).await.expect("decide");
            assert_eq!(
                redis,
                one_store.decide_now(t, reqs),
                "{algorithm:?} at +{}",
                t - T0
            );
        }
    }

    // A key holding something else is left alone; the rest still go.
    let mut conn = server.connection().await;
    let _: () = redis::cmd("RPUSH")
        .arg(&["tg:{push}garbage", "x"][..])
        .query_async(&mut conn)
        .await
        .expect("RPUSH");
    let backlog = Backlog::new();
    for key in ["tg:{push}garbage", "tg:{push}fine"] {
        backlog.record(T0, &one(key, 10));
    }
    let pushed = store.push(T0, backlog.take(T0)).await;
    assert_eq!((pushed.added, pushed.skipped), (1, 1));
    assert_eq!(
        value_and_pttl(&server, "tg:{push}fine").await.0.as_deref(),
        Some("28333333:0:1")
    );
}

/// In a Cluster the push makes one call per slot, each on the slot's node.
#[tokio::test]
async fn a_pushed_backlog_reaches_every_cluster_slot() {
    use tollgate::store::redis::backlog::Backlog;
    let cluster = RedisCluster::start(3).await;
    let store = connected(&config(
        RedisTopology::Cluster {
            seeds: cluster.seeds(),
        },
        "",
    ))
    .await;
    // Wait for the slot map before pushing: a decision that answers.
    decide_eventually(&store, T0, &[one("tg:{warm}l", 10)]).await;
    let backlog = Backlog::new();
    let keys: Vec<String> = (0..30).map(|i| format!("tg:{{id{i}}}l")).collect();
    for key in &keys {
        backlog.record(T0, &one(key, 10));
        backlog.record(T0, &one(key, 10));
    }
    let mut conns = Vec::new();
    for node in &cluster.nodes {
        conns.push(
            redis::Client::open(format!("redis://127.0.0.1:{}", node.port))
                .expect("url")
                .get_multiplexed_async_connection()
                .await
                .expect("node"),
        );
    }
    let mut evals_before = 0;
    for c in &mut conns {
        evals_before += support::redis::command_calls(c, "eval").await;
    }
    let pushed = store.push(T0, backlog.take(T0)).await;
    assert!(pushed.error.is_none(), "{:?}", pushed.error);
    assert_eq!(pushed.added, keys.len());
    let mut evals = 0;
    for c in &mut conns {
        evals += support::redis::command_calls(c, "eval").await;
    }
    let slots: std::collections::BTreeSet<u16> = keys
        .iter()
        .map(|k| fred::util::redis_keyslot(k.as_bytes()))
        .collect();
    assert_eq!(
        evals - evals_before,
        slots.len() as u64,
        "one call per slot"
    );
    for key in &keys {
        let (_, value) = cluster.get(key).await;
        assert_eq!(value.as_deref(), Some("28333333:0:2"), "{key}");
    }
}

// --- sync mode (docs/design.md#sync-mode) --------------------------------------

/// A gateway file with one route `/t` under one per-IP limit in `sync`
/// mode: `limit` is the limit's mapping after its name and key.
fn sync_yaml(url: &str, on_error: &str, limit: &str) -> String {
    format!(
        "listen: 127.0.0.1:0
store:
  redis: {{ url: '{url}', sync: 100ms }}
  on_error: {on_error}
routes:
  - name: t
    match: {{ path: /t }}
    respond: {{ status: 200, body: ok }}
    limits: [ {{ name: per_ip, key: ip, {limit} }} ]
"
    )
}

/// The gateway's clock (the system's), in ms since the epoch.
fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_millis() as u64
}

/// What one abusive client got through three gateways in sync mode.
struct Abuse {
    /// Admitted per full window, in order.
    admitted: Vec<u64>,
    /// Requests that reached each gateway per ms.
    rate_per_instance: f64,
    /// Requests whose answer arrived in the window after the one they
    /// were sent in (counted in neither for certain).
    straddling: u64,
}

/// Sends from one IP (one key), round robin over `gateways`, three
/// workers each a request every 6 ms, for `windows` full windows of
/// `window_ms` after the current one; counts the 200s per window.
async fn abusive_client(gateways: &[std::net::SocketAddr], window_ms: u64, windows: u64) -> Abuse {
    let first = wall_ms() / window_ms + 1;
    let end = (first + windows) * window_ms;
    let sent = Arc::new(Mutex::new(Vec::new()));
    let tasks: Vec<_> = (0..3)
        .map(|worker| {
            let gateways = gateways.to_vec();
            let sent = Arc::clone(&sent);
            tokio::spawn(async move {
                let mut conns: Vec<_> = gateways.iter().map(|_| None).collect();
                let mut tick = tokio::time::interval(Duration::from_millis(6));
                let mut k = worker;
                while wall_ms() < end {
                    tick.tick().await;
                    let g = k % gateways.len();
                    k += 1;
                    let at = wall_ms();
                    let status = send_kept(&mut conns[g], gateways[g]).await;
                    sent.lock().expect("sent").push((at, wall_ms(), status));
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("a client worker panicked");
    }
    let sent = sent.lock().expect("sent").clone();
    let mut admitted = vec![0; windows as usize];
    let (mut straddling, mut requests) = (0, 0);
    for (at, back, status) in sent {
        let i = at / window_ms;
        if i < first || i >= first + windows {
            continue;
        }
        requests += 1;
        if back / window_ms != i {
            straddling += 1;
        }
        if status == StatusCode::OK {
            admitted[(i - first) as usize] += 1;
        }
    }
    Abuse {
        admitted,
        rate_per_instance: requests as f64 / (windows * window_ms) as f64 / gateways.len() as f64,
        straddling,
    }
}

/// Over-admission a caller can get per window in sync mode (docs/redis.md,
/// `decision::sync`): `L/10 + (N − 1) · (r · (2·interval + RTT) + 1)`,
/// `r` the rate at each instance. RTT is bounded by the store's timeout
/// here: an exchange that takes longer fails.
fn sync_bound(
    limit: u64,
    instances: u64,
    rate_per_instance: f64,
    interval_ms: u64,
    timeout_ms: u64,
) -> f64 {
    limit as f64 / 10.0
        + (instances - 1) as f64 * (rate_per_instance * (2 * interval_ms + timeout_ms) as f64 + 1.0)
}

/// An abusive client spread round robin over three gateways in
/// sync mode (100 ms) gets at most the limit plus the stated bound per
/// window, and no less than the limit.
async fn sync_over_admission(algorithm: &str) {
    const LIMIT: u64 = 100;
    const WINDOW_MS: u64 = 2_000;
    let server = RedisServer::start().await;
    // A generous timeout: an exchange that takes longer on this shared
    // machine fails, and on_error would decide; the bound counts it.
    let src = sync_yaml(
        &server.url(),
        "local",
        &format!("limit: {LIMIT}, window: 2s, algorithm: {algorithm}"),
    )
    .replace("sync: 100ms", "sync: 100ms, timeout: 100ms");
    let a = Gateway::start(&src).await;
    let b = Gateway::start(&src).await;
    let c = Gateway::start(&src).await;
    let abuse = abusive_client(&[a.addr, b.addr, c.addr], WINDOW_MS, 4).await;
    let bound = sync_bound(LIMIT, 3, abuse.rate_per_instance, 100, 100);
    let errors: Vec<f64> = [&a, &b, &c]
        .iter()
        .map(|g| {
            support::admin::value(&g.inner.metrics().render(), "tollgate_store_errors_total")
                .unwrap_or(0.0)
        })
        .collect();
    let over: Vec<i64> = abuse
        .admitted
        .iter()
        .map(|&n| n as i64 - LIMIT as i64)
        .collect();
    eprintln!(
        "sync mode, {algorithm}, limit {LIMIT} per {WINDOW_MS} ms, 3 gateways at {:.0} req/s each: admitted per window {:?}, over the limit {:?}, stated bound {bound:.0} ({} requests straddled a boundary; store errors {errors:?})",
        abuse.rate_per_instance * 1000.0,
        abuse.admitted,
        over,
        abuse.straddling
    );
    let slack = abuse.straddling as f64;
    for (i, &n) in abuse.admitted.iter().enumerate() {
        assert!(
            n as f64 <= LIMIT as f64 + bound + slack,
            "window {i}: {n} admitted, limit {LIMIT}, bound {bound:.0}"
        );
        // A sliding window's estimate rounds: allow two below.
        assert!(
            n as f64 + 2.0 + slack >= LIMIT as f64,
            "window {i}: only {n} admitted of {LIMIT}"
        );
    }
    // All three wrote the one key exact mode would write.
    assert_eq!(limit_keys(&server).await.len(), 1);
}

#[tokio::test]
async fn sync_mode_bounds_over_admission_of_a_fixed_window_across_three_gateways() {
    sync_over_admission("fixed_window").await;
}

#[tokio::test]
async fn sync_mode_bounds_over_admission_of_a_sliding_window_across_three_gateways() {
    sync_over_admission("sliding_window").await;
}

/// `r` of the `RateLimit` header (one policy).
fn remaining(reply: &support::gateway::Reply) -> Option<u64> {
    let h = reply.header("ratelimit")?;
    let r = h.split(';').find_map(|p| p.trim().strip_prefix("r="))?;
    r.parse().ok()
}

/// Exchanges `gw` has completed in sync mode.
fn exchanges(gw: &Gateway) -> u64 {
    let text = gw.inner.metrics().render();
    support::admin::value(&text, "tollgate_store_sync_exchanges_total").unwrap_or(0.0) as u64
}

/// Waits until `gw` has completed more than `before` exchanges.
async fn exchanged_after(gw: &Gateway, before: u64) {
    wait::until(
        &format!("an exchange after {before}"),
        Duration::from_secs(5),
        || async { exchanges(gw) > before },
    )
    .await;
}

/// The count of the only limit key (sliding window: prev + cur).
async fn fleet_total(server: &RedisServer) -> u64 {
    let keys = limit_keys(server).await;
    let Some(key) = keys.first() else {
        return 0;
    };
    let (value, _) = value_and_pttl(server, key).await;
    value.map_or(0, |v| {
        v.split(':')
            .skip(1)
            .map(|n| n.parse::<u64>().unwrap_or(0))
            .sum()
    })
}

/// Sends to `gw`, first noting its exchanges; returns the reply and that
/// count.
async fn sync_send(gw: &Gateway) -> (support::gateway::Reply, u64) {
    let before = exchanges(gw);
    (send(gw.addr, get("/t", &[])).await, before)
}

/// In sync mode `RateLimit` shows the limit less what the
/// gateway knows — the fleet's total at its last exchange plus what it
/// admitted since — never less than 0. Alone it is exact; beside another
/// gateway it lags that one's admissions until its next exchange.
#[tokio::test]
async fn sync_mode_headers_show_the_last_fleet_total_plus_the_unsent() {
    let server = RedisServer::start().await;
    let src = sync_yaml(&server.url(), "local", "limit: 10, window: 1d");
    let a = Gateway::start(&src).await;
    let b = Gateway::start(&src).await;
    let ok = |reply: &support::gateway::Reply, r: u64| {
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(remaining(reply), Some(r), "{:?}", reply.header("ratelimit"));
    };
    // A alone counts as one store would.
    for r in (4..=9).rev() {
        ok(&sync_send(&a).await.0, r);
    }
    wait::until("A's 6 in Redis", Duration::from_secs(5), || async {
        fleet_total(&server).await == 6
    })
    .await;
    // B has not read the key: it knows only its own request.
    let (reply, before) = sync_send(&b).await;
    ok(&reply, 9);
    exchanged_after(&b, before).await;
    // B's exchange added its 1 and read 7: 7 + this one.
    let (reply, before) = sync_send(&b).await;
    ok(&reply, 2);
    exchanged_after(&b, before).await;
    assert_eq!(fleet_total(&server).await, 8);
    // A last read 6: it lags B's two until its next exchange.
    let (reply, before) = sync_send(&a).await;
    ok(&reply, 3);
    exchanged_after(&a, before).await;
    // Now A knows 9: the tenth is its last.
    ok(&sync_send(&a).await.0, 0);
    let (refused, before) = sync_send(&a).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(remaining(&refused), Some(0));
    assert!(refused.header("retry-after").is_some());
    // A's tenth reaches Redis (the denial made the key urgent).
    exchanged_after(&a, before).await;
    assert_eq!(fleet_total(&server).await, 10);
    // B last read 8 and admits one more: 11 in all, one over the limit
    // (the approximation the bound covers). Then it reads 11 and shows 0,
    // not less.
    let (reply, before) = sync_send(&b).await;
    ok(&reply, 1);
    exchanged_after(&b, before).await;
    assert_eq!(fleet_total(&server).await, 11);
    let (refused, _) = sync_send(&b).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(remaining(&refused), Some(0));
}

/// When Redis goes away, synced limits fall back exactly as
/// exact ones do (`local`: the limit divided by the live instances;
/// `deny`: 503; `allow`: admitted without a `RateLimit` header), every
/// answer within the timeout; when it is back (restarted empty), what
/// `local` admitted is in the fleet's totals before sync mode decides
/// again, so the window is not granted again. Two callers, one per
/// gateway (`key: header:x-client`), so each gateway's part is its own.
async fn sync_outage(on_error: &str) {
    let mut server = RedisServer::start().await;
    let src = sync_yaml(&server.url(), on_error, "limit: 10, window: 1d")
        .replace("key: ip", "key: header:x-client");
    let a = Gateway::start(&src).await;
    let b = Gateway::start(&src).await;
    wait::until(
        "the instances seeing each other",
        Duration::from_secs(10),
        || async { a.inner.live_instances() == 2 && b.inner.live_instances() == 2 },
    )
    .await;
    let client = |gw: &Gateway| {
        let (addr, name) = (gw.addr, if gw.addr == a.addr { "a" } else { "b" });
        async move { send(addr, get("/t", &[("x-client", name)])).await }
    };
    for gw in [&a, &b] {
        let before = exchanges(gw);
        assert_eq!(client(gw).await.status, StatusCode::OK);
        exchanged_after(gw, before).await;
    }

    server.stop();
    wait::until("the link down", Duration::from_secs(5), || async {
        a.inner.limiter().health().redis_connected() == Some(false)
            && b.inner.limiter().health().redis_connected() == Some(false)
    })
    .await;
    for gw in [&a, &b] {
        let mut statuses = Vec::new();
        for _ in 0..7 {
            let started = Instant::now();
            let reply = client(gw).await;
            assert!(
                started.elapsed() <= TIMEOUT + SLACK,
                "took {:?}",
                started.elapsed()
            );
            if on_error == "allow" {
                assert_eq!(reply.header("ratelimit"), None, "no count is known");
            }
            statuses.push(reply.status.as_u16());
        }
        let expected: &[u16] = match on_error {
            // 10 for the fleet: 5 on each while they cannot share counts,
            // as in exact mode (`local_fallback_divides_limits_by_live_instances`).
            "local" => &[200, 200, 200, 200, 200, 429, 429],
            "deny" => &[503; 7],
            _ => &[200; 7],
        };
        assert_eq!(statuses, expected, "on_error: {on_error}");
    }

    server.restart().await;
    let back = Instant::now();
    if on_error == "local" {
        // Each gateway's exchange pushes its 5 without waiting for traffic.
        wait::until(
            "the backlogs in Redis",
            BACK_WITHIN + Duration::from_secs(3),
            || async { limit_keys(&server).await.len() >= 2 },
        )
        .await;
        eprintln!(
            "sync mode, on_error: local: both backlogs in Redis {:?} after it restarted",
            back.elapsed()
        );
    }
    for gw in [&a, &b] {
        // Until sync mode decides again, the fallback does: the callers'
        // shares are used up (429) under local, 503 under deny.
        let within = (BACK_WITHIN + Duration::from_secs(3)).saturating_sub(back.elapsed());
        let first = wait::value("sync mode deciding again", within, || async {
            let reply = client(gw).await;
            if !gw.inner.limiter().health().fallback_active() {
                return Ok(reply);
            }
            let expected = match on_error {
                "local" => StatusCode::TOO_MANY_REQUESTS,
                "deny" => StatusCode::SERVICE_UNAVAILABLE,
                _ => StatusCode::OK,
            };
            assert_eq!(reply.status, expected);
            Err("the fallback still decides")
        })
        .await;
        eprintln!(
            "sync mode, on_error: {on_error}: deciding in sync mode again {:?} after Redis restarted",
            back.elapsed()
        );
        assert!(first.header("ratelimit").is_some());
        assert_eq!(first.status, StatusCode::OK);
        if on_error == "local" {
            // 5 admitted during the outage are in the total: 5 more, not 10.
            let mut admitted = 1;
            while client(gw).await.status == StatusCode::OK {
                admitted += 1;
                assert!(admitted <= 10, "the window is granted again");
            }
            assert_eq!(admitted, 5, "on the gateway at {}", gw.addr);
        }
    }
}

#[tokio::test]
async fn sync_mode_outage_with_local_divides_and_pushes_back() {
    sync_outage("local").await;
}

#[tokio::test]
async fn sync_mode_outage_with_deny_answers_503() {
    sync_outage("deny").await;
}

#[tokio::test]
async fn sync_mode_outage_with_allow_admits_without_headers() {
    sync_outage("allow").await;
}

/// The `r` of each policy in a `RateLimit` header, in order.
fn remainings(reply: &support::gateway::Reply) -> Vec<u64> {
    reply
        .header("ratelimit")
        .unwrap_or_default()
        .split(',')
        .filter_map(|p| p.split(';').find_map(|f| f.trim().strip_prefix("r=")))
        .filter_map(|r| r.parse().ok())
        .collect()
}

/// A route mixing a synced limit and an exact one admits only
/// when both do and consumes from both only then: whichever denies, the
/// other shows what it has without the refused request.
#[tokio::test]
async fn a_route_mixing_synced_and_exact_limits_consumes_only_what_both_admit() {
    let server = RedisServer::start().await;
    let src = |synced: u64, exact: u64| {
        format!(
            "listen: 127.0.0.1:0
store:
  redis: {{ url: '{}' }}
routes:
  - name: t
    match: {{ path: /t }}
    respond: {{ status: 200, body: ok }}
    limits:
      - {{ name: synced, key: ip, limit: {synced}, window: 1d, sync: 100ms }}
      - {{ name: exact, key: ip, limit: {exact}, window: 1d }}
",
            server.url()
        )
    };
    // The exact limit denies first.
    let gw = Gateway::start(&src(5, 3)).await;
    for r in [[4, 2], [3, 1], [2, 0]] {
        let reply = send(gw.addr, get("/t", &[])).await;
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(remainings(&reply), r);
    }
    let refused = send(gw.addr, get("/t", &[])).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        remainings(&refused),
        [2, 0],
        "the synced limit is not consumed"
    );
    assert!(
        refused.text().contains(r#""violated-policies":["exact"]"#),
        "{}",
        refused.text()
    );
    gw.stop().await;

    // The synced limit denies first (other keys: other limit numbers give
    // other routes' keys the same names, so start on a clean server).
    let mut conn = server.connection().await;
    let _: () = redis::cmd("FLUSHALL")
        .query_async(&mut conn)
        .await
        .expect("FLUSHALL");
    let gw = Gateway::start(&src(2, 5)).await;
    for r in [[1, 4], [0, 3]] {
        let reply = send(gw.addr, get("/t", &[])).await;
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(remainings(&reply), r);
    }
    let refused = send(gw.addr, get("/t", &[])).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        remainings(&refused),
        [0, 3],
        "the exact limit is read, not consumed"
    );
    assert!(
        refused.text().contains(r#""violated-policies":["synced"]"#),
        "{}",
        refused.text()
    );
}

/// In sync mode, `key: route` and `share:` are one counter too: two
/// routes sharing a route-wide limit, on two gateways, with callers from
/// five addresses, add up in one Redis key; and a gateway that took in the
/// fleet's total refuses the next caller.
#[tokio::test]
async fn sync_mode_counts_a_shared_route_wide_limit_on_one_key() {
    let server = RedisServer::start().await;
    let src = format!(
        "listen: 127.0.0.1:0
store:
  redis: {{ url: '{}', sync: 100ms }}
routes:
  - name: a
    match: {{ path: /a }}
    respond: {{ status: 200 }}
    limits: [ {{ name: all, key: route, limit: 5, window: 1d, algorithm: fixed_window, share: ab }} ]
  - name: b
    match: {{ path: /b }}
    respond: {{ status: 200 }}
    limits: [ {{ name: all, key: route, limit: 5, window: 1d, algorithm: fixed_window, share: ab }} ]
",
        server.url()
    );
    let one = Gateway::start(&src).await;
    let two = Gateway::start(&src).await;
    for (i, (gw, path)) in [
        (&one, "/a"),
        (&one, "/b"),
        (&two, "/a"),
        (&two, "/b"),
        (&one, "/a"),
    ]
    .into_iter()
    .enumerate()
    {
        let from: std::net::IpAddr = format!("127.0.0.{}", i + 2).parse().unwrap();
        let reply = support::gateway::send_from(from, gw.addr, get(path, &[])).await;
        assert_eq!(reply.status, StatusCode::OK, "request {i}");
    }
    support::wait::until(
        "one key holding all five",
        Duration::from_secs(5),
        || async {
            let keys = limit_keys(&server).await;
            let mut conn = server.connection().await;
            let values: Vec<Option<String>> = redis::cmd("MGET")
                .arg(&keys)
                .query_async(&mut conn)
                .await
                .unwrap_or_default();
            keys.len() == 1 && values[0].as_deref().is_some_and(|v| v.ends_with(":5"))
        },
    )
    .await;
    // Each gateway's next exchange brings the fleet's five in.
    support::wait::until("both gateways refuse", Duration::from_secs(5), || async {
        let a = send(one.addr, get("/b", &[])).await.status;
        let b = send(two.addr, get("/a", &[])).await.status;
        a == StatusCode::TOO_MANY_REQUESTS && b == StatusCode::TOO_MANY_REQUESTS
    })
    .await;
}

/// In a Redis Cluster, sync mode's exchange reaches every slot —
/// one call per slot — and each key holds what its caller was admitted.
#[tokio::test]
async fn sync_mode_exchanges_with_every_cluster_slot() {
    let cluster = RedisCluster::start(3).await;
    let gw = Gateway::start(&format!(
        "listen: 127.0.0.1:0
store:
  redis: {{ cluster: [{}], timeout: 2s, sync: 100ms }}
  on_error: deny
routes:
  - name: t
    match: {{ path: /t }}
    respond: {{ status: 200 }}
    limits: [ {{ name: per_user, key: 'header:x-user', limit: 3, window: 1d }} ]
",
        cluster.seed_list()
    ))
    .await;
    let as_user = |user: String| get("/t", &[("x-user", user.as_str())]);
    // The cluster may need a moment after startup; deny answers 503 then.
    support::wait::until("the gateway decides", Duration::from_secs(20), || async {
        send(gw.addr, as_user("warm".into())).await.status == StatusCode::OK
    })
    .await;
    for u in 0..20 {
        let mut statuses = Vec::new();
        for _ in 0..4 {
            statuses.push(
                send(gw.addr, as_user(format!("u{u}")))
                    .await
                    .status
                    .as_u16(),
            );
        }
        assert_eq!(statuses, [200, 200, 200, 429], "user u{u}");
    }
    // Every key reaches its node: 21 keys, 61 admitted in all.
    let last = std::sync::Mutex::new(Vec::new());
    let reached = support::wait::holds_within(Duration::from_secs(10), || async {
        let mut counts = Vec::new();
        for node in &cluster.nodes {
            if let Ok(redis::Value::Array(found)) = query(node.port, &["KEYS", "tg:{*}?*"]).await {
                for k in found {
                    if let redis::Value::BulkString(k) = k {
                        let key = String::from_utf8_lossy(&k).into_owned();
                        let value = query_string(node.port, &["GET", &key])
                            .await
                            .unwrap_or_default();
                        let cur: u64 = value
                            .rsplit(':')
                            .next()
                            .and_then(|c| c.parse().ok())
                            .unwrap_or(0);
                        counts.push(cur);
                    }
                }
            }
        }
        let all = counts.len() == 21 && counts.iter().sum::<u64>() == 61;
        *last.lock().unwrap() = counts;
        all
    })
    .await;
    assert!(reached, "counts in the cluster: {:?}", last.lock().unwrap());
    let text = gw.inner.metrics().render();
    let keys = support::admin::value(&text, "tollgate_store_sync_keys_total").unwrap_or(0.0);
    assert!(keys >= 21.0, "{text}");
}

/// A gateway started through the library API whose first requests are
/// sent the moment its port is open: the listener is bound before the
/// gateway is built, and nothing waits for Redis on the test's side.
async fn started_at_once(yaml: &str) -> (std::net::SocketAddr, tokio::sync::oneshot::Sender<()>) {
    let config = tollgate::config::load::parse_str(yaml).expect("valid");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("address");
    let started = tollgate::server::start(config, tollgate::server::Serve::on(vec![listener]))
        .await
        .expect("gateway starts");
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(started.until(async {
        let _ = rx.await;
    }));
    (addr, tx)
}

/// Every request after a start is counted, from the first: the listener
/// accepts once Redis has answered, not before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_requests_after_a_start_are_counted() {
    let server = RedisServer::start().await;
    let (addr, _stop) = started_at_once(&yaml(&server.url(), "allow", 3, "")).await;
    let mut statuses = Vec::new();
    for _ in 0..4 {
        statuses.push(send(addr, get("/t", &[])).await.status);
    }
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
}

/// With Redis down, the gateway waits `startup_wait` for it, then answers
/// by `on_error`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_with_redis_down_answers_by_on_error_after_startup_wait() {
    let port = support::gateway::free_port();
    let wait = Duration::from_millis(400);
    let src = format!(
        "listen: 127.0.0.1:0
store:
  redis: {{ url: 'redis://127.0.0.1:{port}', startup_wait: {}ms }}
  on_error: deny
routes:
  - {{ name: t, respond: {{}}, limits: [ {{ name: l, key: ip, limit: 3, window: 1m }} ] }}
",
        wait.as_millis()
    );
    let begun = Instant::now();
    let (addr, _stop) = started_at_once(&src).await;
    let reply = send(addr, get("/t", &[])).await;
    let took = begun.elapsed();
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(took >= wait, "answered after {took:?}, before startup_wait");
    assert!(
        took <= wait + Duration::from_millis(100),
        "answered after {took:?}"
    );
}

/// On loopback the first connection takes what the network takes: no
/// reconnect delay before the first attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_connection_is_not_delayed() {
    let server = RedisServer::start().await;
    let cfg = RedisConfig {
        url: server.url(),
        ..RedisConfig::default()
    };
    let begun = Instant::now();
    let store = RedisStore::connect(&cfg).await.expect("store");
    assert!(store.wait_ready(Duration::from_secs(2)).await);
    let took = begun.elapsed();
    eprintln!("connected and script loaded after {took:?}");
    // The reconnect policy's first delay alone is `reconnect.min`.
    assert!(took < cfg.reconnect_min, "took {took:?}");
}
