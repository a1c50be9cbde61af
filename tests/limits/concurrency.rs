//! Concurrency limits (docs/limits.md#concurrency-limits): requests in flight capped per caller,
//! across gateways over one Redis, freed on every way a response ends —
//! a client gone mid-body, a tunnel closed, a gateway killed.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use http::StatusCode;
use proptest::prelude::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::held::Held;
use super::support::gateway::{Gateway, get, send};
use super::support::redis::RedisServer;
use super::support::wait::until;
use tollgate::store::memory::leases::{MemoryLeases, Taken};

/// A route `/` to `up` with one concurrency limit of `cap` per IP.
fn yaml(store: &str, up: SocketAddr, cap: u64) -> String {
    format!(
        r#"
listen: 127.0.0.1:0
{store}
routes:
  - name: r
    match: {{ path_prefix: / }}
    upstream: http://{up}
    upgrade: true
    limits: [ {{ name: conc, key: ip, concurrency: {cap} }} ]
"#
    )
}

fn redis_store(url: &str, lease: &str) -> String {
    format!(
        "store:\n  redis: {{ url: \"{url}\", timeout: 500ms, lease: {lease} }}\n  on_error: deny\n  readable_keys: true\n"
    )
}

/// The leases in the one concurrency set, read with ZCARD.
async fn leases(conn: &mut redis::aio::MultiplexedConnection) -> u64 {
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*:concurrency")
        .query_async(conn)
        .await
        .expect("KEYS");
    let mut n = 0;
    for k in keys {
        let c: u64 = redis::cmd("ZCARD")
            .arg(&k)
            .query_async(conn)
            .await
            .expect("ZCARD");
        n += c;
    }
    n
}

#[tokio::test]
async fn three_of_ten_reach_the_upstream_across_two_gateways() {
    let redis = RedisServer::start().await;
    let up = Held::start().await;
    let cfg = yaml(&redis_store(&redis.url(), "10s"), up.addr, 3);
    let gws = [Gateway::start(&cfg).await, Gateway::start(&cfg).await];
    let mut sent = Vec::new();
    for i in 0..10 {
        let addr = gws[i % 2].addr;
        sent.push(tokio::spawn(
            async move { send(addr, get("/hold", &[])).await },
        ));
    }
    // The refused come back at once; the admitted wait in the upstream.
    until("three in the upstream", Duration::from_secs(10), || async {
        up.in_flight.load(Ordering::SeqCst) == 3
            && sent.iter().filter(|t| t.is_finished()).count() == 7
    })
    .await;
    let mut conn = redis.connection().await;
    assert_eq!(leases(&mut conn).await, 3);
    up.release.add_permits(10);
    let mut by_status = std::collections::BTreeMap::new();
    for t in sent {
        let r = t.await.expect("request task");
        if r.status == StatusCode::TOO_MANY_REQUESTS {
            assert_eq!(
                r.header("ratelimit-policy"),
                Some(r#""conc";q=3;qu="concurrent-requests""#)
            );
            assert_eq!(r.header("ratelimit"), Some(r#""conc";r=0"#));
            assert_eq!(
                r.header("retry-after"),
                None,
                "nothing tells when a slot frees"
            );
            assert!(r.text().contains("in flight"), "{}", r.text());
        }
        *by_status.entry(r.status.as_u16()).or_insert(0) += 1;
    }
    assert_eq!(by_status, [(200, 3), (429, 7)].into());
    assert_eq!(up.most.load(Ordering::SeqCst), 3, "at most three at once");
    // Every slot given back once the bodies ended.
    until("the leases removed", Duration::from_secs(5), || async {
        leases(&mut redis.connection().await).await == 0
    })
    .await;
    let r = send(gws[0].addr, get("/hold", &[]));
    up.release.add_permits(1);
    assert_eq!(r.await.status, StatusCode::OK);
}

#[tokio::test]
async fn a_killed_gateway_frees_its_slots_within_the_lease() {
    let redis = RedisServer::start().await;
    let up = Held::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("gateway.yaml");
    // `/ok` answers 200 once the binary takes slots in Redis (503 before:
    // on_error: deny), which is when it is ready for this test.
    let with_ok = yaml(&redis_store(&redis.url(), "1s"), up.addr, 5).replace(
        "routes:\n",
        "routes:\n  - name: ok\n    match: { path: /ok }\n    respond: { status: 200 }\n    limits: [ { name: conc, key: ip, concurrency: 5 } ]\n",
    );
    std::fs::write(&config, with_ok).expect("write config");
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"));
    cmd.arg("--config").arg(&config);
    let mut gw = super::support::binary::spawn_listening(cmd, 1, None);
    let addr = gw.proxy[0];
    until(
        "the binary connected to Redis",
        Duration::from_secs(10),
        || async { send(addr, get("/ok", &[])).await.status == StatusCode::OK },
    )
    .await;
    let mut held = Vec::new();
    for _ in 0..2 {
        held.push(tokio::spawn(
            async move { send(addr, get("/hold", &[])).await },
        ));
    }
    let mut conn = redis.connection().await;
    until("two leases", Duration::from_secs(10), || async {
        up.in_flight.load(Ordering::SeqCst) == 2
    })
    .await;
    assert_eq!(leases(&mut conn).await, 2);
    // Renewed while the requests live: still held three lease times on.
    // The sleep is the time under test, not a wait for readiness.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(leases(&mut conn).await, 2, "live leases are renewed");
    gw.child.kill().expect("kill -9");
    let killed = Instant::now();
    let _ = gw.child.wait();
    until(
        "the dead gateway's leases gone",
        Duration::from_secs(3),
        || async { leases(&mut redis.connection().await).await == 0 },
    )
    .await;
    let freed = killed.elapsed();
    assert!(
        freed <= Duration::from_millis(1_500),
        "freed {freed:?} after the kill; the lease is 1 s"
    );
    up.release.add_permits(2);
}

#[tokio::test]
async fn a_client_gone_mid_response_frees_its_slot() {
    let up = Held::start().await;
    let gw = Gateway::start(&yaml("", up.addr, 1)).await;
    let held = |gw: &Gateway| gw.inner.limiter().concurrency().held_here().0;
    let mut s = TcpStream::connect(gw.addr).await.expect("connect");
    s.write_all(b"GET /stream HTTP/1.1\r\nHost: gateway.test\r\n\r\n")
        .await
        .expect("write");
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while !got.windows(6).any(|w| w == b"first\n") {
        let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
            .await
            .expect("first chunk in time")
            .expect("read");
        assert!(n > 0, "closed early: {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    assert_eq!(held(&gw), 1, "the slot is held while the body flows");
    let refused = send(gw.addr, get("/stream", &[])).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    drop(s);
    until("the slot given back", Duration::from_secs(5), || async {
        held(&gw) == 0
    })
    .await;
}

#[tokio::test]
async fn an_upgrade_holds_its_slot_until_the_tunnel_closes() {
    let up = Held::start().await;
    let gw = Gateway::start(&yaml("", up.addr, 1)).await;
    let held = |gw: &Gateway| gw.inner.limiter().concurrency().held_here().0;
    let mut s = TcpStream::connect(gw.addr).await.expect("connect");
    s.write_all(b"GET /ws HTTP/1.1\r\nHost: gateway.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
        .await
        .expect("write");
    let mut head = Vec::new();
    let mut buf = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        let n = s.read(&mut buf).await.expect("read head");
        assert!(n > 0, "closed early");
        head.push(buf[0]);
    }
    assert!(
        head.starts_with(b"HTTP/1.1 101"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    s.write_all(b"ping").await.expect("write through");
    let mut back = [0u8; 4];
    s.read_exact(&mut back).await.expect("echo");
    assert_eq!(&back, b"ping");
    assert_eq!(held(&gw), 1, "the tunnel holds the slot");
    let refused = send(gw.addr, get("/hold", &[])).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    drop(s);
    until("the slot given back", Duration::from_secs(5), || async {
        held(&gw) == 0
    })
    .await;
}

proptest! {
    /// Any sequence of takes and gives never holds more than the cap, and
    /// giving back everything taken leaves nothing held.
    #[test]
    fn memory_slots_stay_within_the_cap(
        cap in 1u64..5,
        ops in proptest::collection::vec((0usize..3, any::<bool>()), 0..200),
    ) {
        let table = MemoryLeases::new();
        let keys = ["a", "b", "c"];
        let mut model = [0u64; 3];
        for (k, take) in ops {
            if take {
                let got = table.acquire(keys[k], cap);
                if model[k] < cap {
                    model[k] += 1;
                    prop_assert_eq!(got, Taken::Held { free: cap - model[k] });
                } else {
                    prop_assert_eq!(got, Taken::Full);
                }
            } else if model[k] > 0 {
                table.release(keys[k]);
                model[k] -= 1;
            }
            prop_assert!(table.held(keys[k]) <= cap);
            prop_assert_eq!(table.held(keys[k]), model[k]);
        }
        for (k, n) in model.iter().enumerate() {
            for _ in 0..*n {
                table.release(keys[k]);
            }
        }
        prop_assert_eq!(table.keys(), 0);
    }
}

/// A request its rate limit refuses gives its slot back before the 429.
/// With two slots and one held by a request in the upstream, each later
/// request takes the second slot and is refused by the rate: if a refused
/// request kept its slot, the next would find none and be refused as "in
/// flight" instead.
#[tokio::test]
async fn a_request_a_rate_limit_refuses_holds_no_slot() {
    let up = Held::start().await;
    let cfg = format!(
        r#"
listen: 127.0.0.1:0
routes:
  - name: r
    match: {{ path_prefix: / }}
    upstream: http://{}
    limits:
      - {{ name: conc, key: ip, concurrency: 2 }}
      - {{ name: rate, key: ip, limit: 1, window: 1m }}
"#,
        up.addr
    );
    let gw = Gateway::start(&cfg).await;
    let addr = gw.addr;
    let first = tokio::spawn(async move { send(addr, get("/hold", &[])).await });
    until(
        "the first in the upstream",
        Duration::from_secs(5),
        || async { up.in_flight.load(Ordering::SeqCst) == 1 },
    )
    .await;
    for _ in 0..3 {
        let refused = send(gw.addr, get("/hold", &[])).await;
        assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
        assert!(
            refused.header("retry-after").is_some() && !refused.text().contains("in flight"),
            "refused by the rate, with a slot free: {}",
            refused.text()
        );
        assert_eq!(
            refused
                .header("ratelimit")
                .map(|v| v.starts_with(r#""conc";r=1, "rate";r=0"#)),
            Some(true),
            "{:?}",
            refused.header("ratelimit")
        );
    }
    up.release.add_permits(1);
    assert_eq!(first.await.unwrap().status, StatusCode::OK);
    until("the slot given back", Duration::from_secs(5), || async {
        gw.inner.limiter().concurrency().held_here().0 == 0
    })
    .await;
}
