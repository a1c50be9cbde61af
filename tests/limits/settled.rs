//! Costs settled by the response and byte quotas (docs/limits.md#costs-settled-by-the-response), end to end:
//! in-process gateways over a real `redis-server` (and in process), the
//! support upstream reporting what each request cost (`/tokens`) or
//! answering N bytes (`/big`).

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::Full;
use proptest::prelude::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tollgate::limit::settle::Settlement;
use tollgate::limit::{Algorithm, LimitRequest};
use tollgate::store::MemoryStore;

use super::held::Held;
use super::support::gateway::{Gateway, Upstream, get, send};
use super::support::redis::RedisServer;
use super::support::wait::until;
use super::{T0, clock, redis_store};

const LIMIT: u64 = 100_000_000;

fn yaml(store: &str, upstream: SocketAddr, limit: &str) -> String {
    format!(
        r#"
listen: 127.0.0.1:0
{store}
routes:
  - name: r
    match: {{ path_prefix: / }}
    upstream: http://{upstream}
    limits: [ {limit} ]
"#
    )
}

const TOKENS: &str = "{ name: tokens, key: ip, limit: 100000000, window: 1h, algorithm: fixed_window, cost: { reserve: 100, from_header: x-tokens-used } }";

/// A small deterministic generator (xorshift), seeded per test.
struct Rng(u64);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// The sum of every fixed-window counter "<window>:<count>" in Redis.
pub(super) async fn redis_total(redis: &RedisServer) -> u64 {
    let mut conn = redis.connection().await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut conn)
        .await
        .unwrap();
    let mut total = 0;
    for k in keys {
        let kind: String = redis::cmd("TYPE")
            .arg(&k)
            .query_async(&mut conn)
            .await
            .unwrap();
        if kind != "string" {
            continue;
        }
        let v: String = redis::cmd("GET")
            .arg(&k)
            .query_async(&mut conn)
            .await
            .unwrap();
        if let Some((_, count)) = v.split_once(':')
            && !count.contains(':')
            && let Ok(n) = count.parse::<u64>()
        {
            total += n;
        }
    }
    total
}

/// Waits until `total()` is `want` (settlements made at a body's end run
/// in a task of the gateway's own); then its value.
pub(super) async fn settles_to<F, Fut>(want: u64, mut total: F) -> u64
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = u64>,
{
    let what = format!("the count settles to {want}");
    until(&what, Duration::from_secs(5), || {
        let got = total();
        async move { got.await == want }
    })
    .await;
    total().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_gateways_charge_redis_exactly_the_tokens_used() {
    let redis = RedisServer::start().await;
    let up = Upstream::start().await;
    let clock = clock();
    let cfg = yaml(&redis_store(&redis.url(), "deny"), up.addr, TOKENS);
    let mut gws = Vec::new();
    for _ in 0..3 {
        gws.push(Gateway::start_with_clock(&cfg, clock.clone()).await);
    }
    let mut rng = Rng(0x5eed_1234_abcd);
    let mut expected = 0;
    let mut tasks = Vec::new();
    for i in 0..90u64 {
        let addr = gws[(i % 3) as usize].addr;
        // One in ten reports garbage, one in ten nothing: 100 reserved stays.
        let path = match i % 10 {
            3 => "/tokens?used=lots".to_owned(),
            7 => "/tokens".to_owned(),
            _ => {
                let n = rng.below(5_000);
                expected += n;
                format!("/tokens?used={n}")
            }
        };
        if matches!(i % 10, 3 | 7) {
            expected += 100;
        }
        tasks.push(tokio::spawn(async move {
            send(addr, get(&path, &[])).await.status
        }));
    }
    for t in tasks {
        assert_eq!(t.await.unwrap(), StatusCode::OK);
    }
    // A header amount is settled before the response leaves: no wait.
    assert_eq!(redis_total(&redis).await, expected);
}

#[tokio::test]
async fn in_process_the_ratelimit_header_shows_the_settled_tokens() {
    let up = Upstream::start().await;
    let gw = Gateway::start_with_clock(&yaml("", up.addr, TOKENS), clock()).await;
    let mut used = 0;
    for n in [7u64, 0, 1234, 99] {
        let r = send(gw.addr, get(&format!("/tokens?used={n}"), &[])).await;
        assert_eq!(r.status, StatusCode::OK);
        used += n;
    }
    // Garbage keeps the 100 reserved.
    send(gw.addr, get("/tokens?used=-5", &[])).await;
    used += 100;
    // The next response shows the quota as its own reservation left it.
    let r = send(gw.addr, get("/tokens?used=0", &[])).await;
    let want = format!("\"tokens\";r={}", LIMIT - used - 100);
    assert!(
        r.header("ratelimit").unwrap().starts_with(&want),
        "{:?}",
        r.header("ratelimit")
    );
}

#[tokio::test]
async fn a_byte_quota_counts_response_and_request_bytes() {
    let redis = RedisServer::start().await;
    let up = Upstream::start().await;
    let limits = "{ name: down, key: ip, limit: 100000000, window: 1h, algorithm: fixed_window, bytes: response }";
    let gw = Gateway::start_with_clock(
        &yaml(&redis_store(&redis.url(), "deny"), up.addr, limits),
        clock(),
    )
    .await;
    let mut rng = Rng(42);
    let mut sent = 0;
    for _ in 0..20 {
        let n = rng.below(100_000);
        let r = send(gw.addr, get(&format!("/big?bytes={n}"), &[])).await;
        assert_eq!(r.body.len() as u64, n);
        sent += n;
    }
    assert_eq!(settles_to(sent, || redis_total(&redis)).await, sent);
    let policy = send(gw.addr, get("/big?bytes=0", &[])).await;
    assert!(
        policy
            .header("ratelimit-policy")
            .unwrap()
            .contains("qu=\"content-bytes\""),
        "{:?}",
        policy.header("ratelimit-policy")
    );
}

#[tokio::test]
async fn a_request_byte_quota_counts_what_was_forwarded() {
    let up = Upstream::start().await;
    let limits = "{ name: up, key: ip, limit: 100000000, window: 1h, algorithm: fixed_window, bytes: request }";
    let gw = Gateway::start_with_clock(&yaml("", up.addr, limits), clock()).await;
    let mut total = 0;
    for n in [0usize, 1, 5_000, 70_000] {
        let req = Request::post("/big?bytes=0")
            .header("host", "gateway.test")
            .body(Full::new(Bytes::from(vec![b'y'; n])))
            .unwrap();
        let r = send(gw.addr, req).await;
        assert_eq!(r.status, StatusCode::OK, "{n}: {}", r.text());
        total += n as u64;
    }
    let remaining = || async {
        let r = send(gw.addr, get("/big?bytes=0", &[])).await;
        // The probe reserves 1 and is refunded once its body ends.
        let h = r.header("ratelimit").unwrap().to_owned();
        LIMIT
            - 1
            - h.split(";r=")
                .nth(1)
                .unwrap()
                .split(';')
                .next()
                .unwrap()
                .parse::<u64>()
                .unwrap()
    };
    assert_eq!(settles_to(total, remaining).await, total);
}

/// An upstream speaking HTTP/1.1 by hand: a chunked body with an
/// `x-tokens-used` trailer.
async fn trailer_upstream(n: u64) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 8192];
                let mut seen = Vec::new();
                loop {
                    let Ok(k) = s.read(&mut buf).await else {
                        return;
                    };
                    if k == 0 {
                        return;
                    }
                    seen.extend_from_slice(&buf[..k]);
                    while let Some(end) = seen.windows(4).position(|w| w == b"\r\n\r\n") {
                        seen.drain(..end + 4);
                        let res = format!(
                            "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ntrailer: x-tokens-used\r\n\r\n2\r\nok\r\n0\r\nx-tokens-used: {n}\r\n\r\n"
                        );
                        if s.write_all(res.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    addr
}

#[tokio::test]
async fn a_trailer_settles_when_the_body_ends() {
    let redis = RedisServer::start().await;
    let up = trailer_upstream(321).await;
    let limits = "{ name: tokens, key: ip, limit: 100000000, window: 1h, algorithm: fixed_window, cost: { reserve: 50, from_trailer: x-tokens-used } }";
    let gw = Gateway::start_with_clock(
        &yaml(&redis_store(&redis.url(), "deny"), up, limits),
        clock(),
    )
    .await;
    for _ in 0..3 {
        let r = send(gw.addr, get("/x", &[("te", "trailers")])).await;
        assert_eq!(r.status, StatusCode::OK);
    }
    assert_eq!(settles_to(3 * 321, || redis_total(&redis)).await, 3 * 321);
}

proptest! {
    /// Any sequence of reservations and settlements on the memory store
    /// keeps its count at least 0 and equal to the sum of the amounts
    /// (while the limit is not reached).
    #[test]
    fn memory_counts_are_the_sum_of_the_amounts(
        alg in prop_oneof![
            Just(Algorithm::SlidingWindow),
            Just(Algorithm::FixedWindow),
            Just(Algorithm::Gcra { burst: 1_000_000 }),
        ],
        steps in proptest::collection::vec((1u64..500, 0u64..2_000, any::<bool>()), 1..40),
    ) {
        let store = MemoryStore::new();
        let req = |cost| LimitRequest {
            key: "k".into(),
            limit: 1_000_000,
            window_ms: 3_600_000,
            cost,
            algorithm: alg,
            mode: Default::default(),
        };
        let mut sum = 0u64;
        let mut open: Vec<(u64, u64)> = Vec::new();
        for (reserve, actual, now) in steps {
            prop_assert!(store.decide_now(T0, &[req(reserve)]).allowed);
            open.push((reserve, actual));
            // Settle every other step, in any order: the rest stay open.
            if now && let Some((reserve, actual)) = open.pop() {
                store.settle_now(T0, &[Settlement { request: req(reserve), reserved_at_ms: T0, actual }]);
                sum += actual;
            }
            let held: u64 = open.iter().map(|(r, _)| r).sum();
            let probe = store.decide_now(T0, &[req(0)]);
            prop_assert_eq!(1_000_000 - probe.outcomes[0].remaining, sum + held);
        }
    }
}

/// Redis gone between the reservation and the upstream's answer: the
/// response still goes out at once (the settlement is bounded by the
/// store's timeout and fails fast on a refused connection), the
/// reservation stands, and the kept settlement is counted.
#[tokio::test]
async fn redis_gone_at_settle_time_keeps_the_reservation_and_answers() {
    let mut redis = RedisServer::start().await;
    let up = Held::start().await;
    let gw = Gateway::start(&yaml(&redis_store(&redis.url(), "deny"), up.addr, TOKENS)).await;
    let addr = gw.addr;
    let sent = tokio::spawn(async move { send(addr, get("/hold", &[])).await });
    tokio::time::timeout(Duration::from_secs(5), up.arrived.acquire())
        .await
        .expect("the request reached the upstream")
        .unwrap()
        .forget();
    // Reserved in Redis before it went down.
    assert_eq!(redis_total(&redis).await, 100);
    redis.stop();
    up.release.add_permits(1);
    let answered = tokio::time::timeout(Duration::from_secs(2), sent)
        .await
        .expect("answered within the store's timeout, not hung")
        .unwrap();
    assert_eq!(answered.status, StatusCode::OK);
    let metrics = gw.inner.metrics().render();
    assert!(
        metrics.contains("tollgate_settle_kept_total{reason=\"store\"} 1"),
        "{metrics}"
    );
}

/// A client that goes away mid-response pays for the bytes passed on to
/// it, not for the whole body and not for the reservation: the body's
/// watch settles at the drop, with what it counted.
#[tokio::test]
async fn a_client_gone_mid_response_pays_for_what_was_passed_on() {
    const BODY: u64 = 64 << 20;
    let redis = RedisServer::start().await;
    let up = Upstream::start().await;
    let limits = "{ name: down, key: ip, limit: 1000000000, window: 10m, algorithm: fixed_window, bytes: response }";
    let gw = Gateway::start_with_clock(
        &yaml(&redis_store(&redis.url(), "deny"), up.addr, limits),
        clock(),
    )
    .await;
    let mut s = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
    s.write_all(format!("GET /big?bytes={BODY} HTTP/1.1\r\nhost: t\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut read = 0u64;
    let mut buf = vec![0u8; 64 * 1024];
    while read < 256 * 1024 {
        let n = s.read(&mut buf).await.unwrap();
        assert!(n > 0, "the body stopped after {read} bytes");
        read += n as u64;
    }
    drop(s);
    // The reservation (1) is replaced by the bytes counted when the body
    // was dropped.
    until(
        "the settlement at the drop",
        Duration::from_secs(5),
        || async { redis_total(&redis).await != 1 },
    )
    .await;
    let charged = redis_total(&redis).await;
    assert!(
        charged + 1024 >= read && charged < BODY,
        "charged {charged} for a client that read {read} of {BODY} bytes"
    );
}
