//! `on_limit: delay`: requests a limit denies wait and then go through,
//! counted when admitted, bounded by `max_delay` and `max_queue`.

use std::time::{Duration, Instant};

use http::StatusCode;
use tokio::io::AsyncWriteExt;

use crate::redis_store;
use crate::support::gateway::{Gateway, Upstream, get, send};
use crate::support::redis::RedisServer;
use crate::support::wait::until;

/// One upstream route at `/d` with one limit of `limit`/`window` counted
/// by `algorithm`, `on_limit: delay` with `max_delay`, and the route's
/// `max_queue` (omitted when `None`).
fn delaying(
    store: &str,
    upstream: &str,
    algorithm: &str,
    limit: &str,
    max_delay: &str,
    max_queue: Option<u32>,
) -> String {
    let queue = max_queue.map_or(String::new(), |q| format!("    max_queue: {q}\n"));
    format!(
        r#"
listen: 127.0.0.1:0
{store}
routes:
  - name: d
    match: {{ path_prefix: /d }}
    upstream: {upstream}
{queue}    limits:
      - {{ name: paced, key: ip, {limit}, algorithm: {algorithm}, on_limit: delay, max_delay: {max_delay} }}
"#
    )
}

/// Sends `n` requests at once; returns each one's status and when it was
/// answered, counted from just before the first was sent.
async fn burst(gw: &Gateway, n: usize) -> Vec<(StatusCode, Duration)> {
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..n {
        let addr = gw.addr;
        tasks.spawn(async move {
            let r = send(addr, get("/d", &[])).await;
            (r.status, start.elapsed())
        });
    }
    let mut out = tasks.join_all().await;
    out.sort_by_key(|&(_, at)| at);
    out
}

/// A burst of 20 against 10/s with `max_delay: 2s`: all succeed, the
/// first ten at once and the other ten a second after the first were
/// admitted (± 50 ms), and no second holds more than ten.
async fn burst_of_twenty_waits_its_turn(store: &str) {
    let up = Upstream::start().await;
    let yaml = delaying(
        store,
        &up.url(),
        "sliding_log",
        "limit: 10, window: 1s",
        "2s",
        None,
    );
    let gw = Gateway::start(&yaml).await;
    let answers = burst(&gw, 20).await;
    assert!(
        answers.iter().all(|&(s, _)| s == StatusCode::OK),
        "every request of the burst is admitted: {answers:?}"
    );
    let first = answers[0].1;
    let (quick, waited) = answers.split_at(10);
    assert!(
        quick
            .iter()
            .all(|&(_, at)| at < first + Duration::from_millis(500)),
        "ten go through at once: {answers:?}"
    );
    for &(_, at) in waited {
        let delay = at.saturating_sub(first).as_millis();
        assert!(
            (950..=1_050).contains(&delay),
            "the other ten after the first ten's second (±50 ms): {delay} ms in {answers:?}"
        );
    }
    // Never more than ten answered within any second (less the 50 ms the
    // answers may lag their admissions by).
    for (i, &(_, at)) in answers.iter().enumerate() {
        let within = answers[i..]
            .iter()
            .take_while(|&&(_, b)| b < at + Duration::from_millis(950))
            .count();
        assert!(within <= 10, "{within} answered within a second of {at:?}");
    }
    assert_eq!(up.count(), 20);
}

#[tokio::test]
async fn a_burst_past_the_limit_waits_and_goes_through_in_process() {
    burst_of_twenty_waits_its_turn("").await;
}

#[tokio::test]
async fn a_burst_past_the_limit_waits_and_goes_through_over_redis() {
    let redis = RedisServer::start().await;
    burst_of_twenty_waits_its_turn(&redis_store(&redis.url(), "deny")).await;
}

/// Forty at once against 10/s with `max_delay: 2500ms`: thirty are
/// admitted, ten at once and ten each a second and two seconds later
/// (± 50 ms); the last ten, whose place in line is past `max_delay` (two
/// seconds' worth of requests wait ahead of each), are refused at once
/// instead of after waiting for it.
async fn a_place_past_max_delay_is_refused_at_arrival(store: &str) {
    let up = Upstream::start().await;
    let yaml = delaying(
        store,
        &up.url(),
        "sliding_log",
        "limit: 10, window: 1s",
        "2500ms",
        None,
    );
    let gw = Gateway::start(&yaml).await;
    let answers = burst(&gw, 40).await;
    let (ok, refused): (Vec<_>, Vec<_>) = answers.iter().partition(|&&(s, _)| s == StatusCode::OK);
    assert_eq!((ok.len(), refused.len()), (30, 10), "{answers:?}");
    assert!(
        refused
            .iter()
            .all(|&&(s, at)| s == StatusCode::TOO_MANY_REQUESTS && at < Duration::from_millis(500)),
        "the last ten hear at once: {answers:?}"
    );
    let first = ok[0].1;
    for (second, group) in ok.chunks(10).enumerate() {
        for &&(_, at) in group {
            let after = at.saturating_sub(first).as_millis();
            let expected = 1_000 * second as u128;
            assert!(
                after + 50 >= expected && after <= expected + if second == 0 { 500 } else { 50 },
                "admission {second}: {after} ms in {answers:?}"
            );
        }
    }
    assert_eq!(up.count(), 30);
}

#[tokio::test]
async fn a_place_past_max_delay_is_refused_at_arrival_in_process() {
    a_place_past_max_delay_is_refused_at_arrival("").await;
}

#[tokio::test]
async fn a_place_past_max_delay_is_refused_at_arrival_over_redis() {
    let redis = RedisServer::start().await;
    a_place_past_max_delay_is_refused_at_arrival(&redis_store(&redis.url(), "deny")).await;
}

#[tokio::test]
async fn beyond_max_queue_the_rest_are_refused_at_once() {
    let up = Upstream::start().await;
    let yaml = delaying(
        "",
        &up.url(),
        "sliding_log",
        "limit: 10, window: 1s",
        "2s",
        Some(3),
    );
    let gw = Gateway::start(&yaml).await;
    let answers = burst(&gw, 20).await;
    let ok = answers
        .iter()
        .filter(|&&(s, _)| s == StatusCode::OK)
        .count();
    let refused: Vec<_> = answers
        .iter()
        .filter(|&&(s, _)| s == StatusCode::TOO_MANY_REQUESTS)
        .collect();
    assert_eq!(ok, 13, "ten admitted and three waited: {answers:?}");
    assert_eq!(refused.len(), 7, "{answers:?}");
    assert!(
        refused
            .iter()
            .all(|&&(_, at)| at < Duration::from_millis(500)),
        "the queue's overflow is refused at once, not after a wait: {answers:?}"
    );
}

#[tokio::test]
async fn a_wait_longer_than_max_delay_is_refused_at_once() {
    let up = Upstream::start().await;
    // GCRA, not a fixed window: a window aligned to the clock can end
    // between the two requests and admit the second.
    let yaml = delaying("", &up.url(), "gcra", "limit: 1, window: 1m", "1s", None);
    let gw = Gateway::start(&yaml).await;
    assert_eq!(send(gw.addr, get("/d", &[])).await.status, StatusCode::OK);
    let started = Instant::now();
    let second = send(gw.addr, get("/d", &[])).await;
    assert_eq!(second.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(second.header("retry-after").is_some());
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "refused without waiting: {:?}",
        started.elapsed()
    );
    assert_eq!(up.count(), 1);
}

/// A client that goes away while its request waits leaves nothing behind:
/// its place is given back and it is never counted or forwarded — the
/// request after it goes through as soon as the limit allows, and the
/// upstream sees exactly the two requests whose clients stayed.
#[tokio::test]
async fn a_client_gone_while_waiting_is_forgotten() {
    let up = Upstream::start().await;
    let yaml = delaying(
        "",
        &up.url(),
        "sliding_log",
        "limit: 1, window: 1s",
        "3s",
        None,
    );
    let gw = Gateway::start(&yaml).await;
    assert_eq!(send(gw.addr, get("/d", &[])).await.status, StatusCode::OK);

    let mut gone = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
    gone.write_all(b"GET /d HTTP/1.1\r\nhost: t\r\n\r\n")
        .await
        .unwrap();
    let waiting = || waiting_now(&gw);
    until("one request waiting", Duration::from_secs(2), || async {
        waiting() == 1
    })
    .await;
    drop(gone);
    until("nothing waiting", Duration::from_secs(2), || async {
        waiting() == 0
    })
    .await;

    let third = send(gw.addr, get("/d", &[])).await;
    assert_eq!(third.status, StatusCode::OK);
    assert_eq!(
        up.count(),
        2,
        "the request whose client left was neither forwarded nor counted"
    );
    let metrics = gw.inner.metrics().render();
    assert!(
        metrics.contains("tollgate_delayed_requests_total{route=\"d\"} 1"),
        "{metrics}"
    );
}

/// `tollgate_delay_waiting` of route `d`.
fn waiting_now(gw: &Gateway) -> i64 {
    let text = gw.inner.metrics().render();
    text.lines()
        .find_map(|l| l.strip_prefix("tollgate_delay_waiting{route=\"d\"} "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

#[test]
fn the_loader_reads_on_limit_and_refuses_what_would_do_nothing() {
    let route = |limit: &str| {
        format!(
            "listen: 127.0.0.1:0\nroutes:\n  - name: r\n    respond: {{}}\n    max_queue: 5\n    limits:\n      - {{ name: l, key: ip, limit: 1, window: 1s, {limit} }}\n"
        )
    };
    let c = tollgate::config::load::parse_str(&route("on_limit: delay, max_delay: 2s")).unwrap();
    assert_eq!(c.routes[0].limits[0].delay, Some(Duration::from_secs(2)));
    assert_eq!(c.routes[0].max_queue, 5);
    let c = tollgate::config::load::parse_str(&route("on_limit: delay")).unwrap();
    assert_eq!(c.routes[0].limits[0].delay, Some(Duration::from_secs(1)));
    let c = tollgate::config::load::parse_str(&route("on_limit: reject")).unwrap();
    assert_eq!(c.routes[0].limits[0].delay, None);
    for (bad, says) in [
        ("max_delay: 2s", "routes[0].limits[0].max_delay"),
        ("on_limit: wait", "routes[0].limits[0].on_limit"),
        ("on_limit: delay, max_delay: 2m", "out of range"),
    ] {
        let e = tollgate::config::load::parse_str(&route(bad))
            .expect_err(bad)
            .to_string();
        assert!(e.contains(says) && e.contains("line 7"), "{bad}: {e}");
    }
}

/// The gateway's clock on tokio's time, which the property test pauses:
/// the store's instants and the waits' timers then run on one clock that
/// jumps straight to the next timer.
struct TokioClock {
    base: tokio::time::Instant,
}

/// The start of a second, of two and of three (all windows tried below).
const T0: u64 = 1_800_000_000_000;

impl tollgate::clock::Clock for TokioClock {
    fn now_ms(&self) -> u64 {
        T0 + u64::try_from(self.base.elapsed().as_millis()).unwrap()
    }
}

/// Requests arriving at `arrivals` (ms) against one delaying limit, through
/// the in-process pipeline on paused time; each one's status and the
/// instant (ms) it was answered.
fn replay(yaml: &str, arrivals: &[u64]) -> Vec<(u64, StatusCode, u64)> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    rt.block_on(async {
        let base = tokio::time::Instant::now();
        let config = tollgate::config::load::parse_str(yaml).unwrap();
        let gw = std::sync::Arc::new(
            tollgate::Gateway::with_clock(config, std::sync::Arc::new(TokioClock { base }))
                .await
                .unwrap(),
        );
        let peer: std::net::SocketAddr = "192.0.2.7:40000".parse().unwrap();
        let mut tasks = tokio::task::JoinSet::new();
        for &at in arrivals {
            let gw = gw.clone();
            tasks.spawn(async move {
                tokio::time::sleep_until(base + Duration::from_millis(at)).await;
                let req = http::Request::get("http://t/d")
                    .body(http_body_util::Full::new(bytes::Bytes::new()))
                    .unwrap();
                let res = gw.handle(req, peer).await;
                let done = u64::try_from(base.elapsed().as_millis()).unwrap();
                (at, res.status(), done)
            });
        }
        tasks.join_all().await
    })
}

/// The earliest instant a request arriving at `at` could be admitted, as
/// known at its arrival: the limit's state from the admissions before `at`
/// (`admitted`, sorted), then one window's worth of the requests waiting
/// ahead of it (arrived before `at`, answered after) per window. Requests
/// arriving at the same millisecond are left out, whichever way they were
/// ordered, so this never exceeds what the gateway knew.
fn known_at_arrival(
    answers: &[(u64, StatusCode, u64)],
    admitted: &[u64],
    at: u64,
    limit: u64,
    window: u64,
    exact: bool,
) -> u64 {
    let ahead = answers.iter().filter(|a| a.0 < at && a.2 > at).count() as u64;
    let before = admitted.iter().copied().filter(|&t| t < at);
    let windows = (ahead + 1).div_ceil(limit) - 1;
    if exact {
        // A unit admitted at `s` counts until `s + window`.
        let counted: Vec<u64> = before.filter(|&t| t + window > at).collect();
        let n = counted.len() as u64;
        let room_at = if n < limit {
            at
        } else {
            counted[usize::try_from(n - limit).unwrap()] + window
        };
        room_at + windows * window
    } else {
        let n = before.filter(|&t| t / window == at / window).count() as u64;
        let room_at = if n < limit {
            at
        } else {
            (at / window + 1) * window
        };
        ((room_at / window + windows) * window).max(room_at)
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

    /// Whatever the arrivals: no window admits more than the limit, no
    /// request waits longer than `max_delay`, a queue of 0 never waits, and
    /// no request waits and is then refused when its refusal was known at
    /// arrival.
    #[test]
    fn delayed_requests_never_pass_the_limit_nor_their_max_delay(
        mut arrivals in proptest::collection::vec(0u64..3_000, 1..40),
        limit in 1u64..6,
        window_s in 1u64..4,
        exact in proptest::bool::ANY,
        max_delay in 50u64..3_000,
        max_queue in 0usize..8,
    ) {
        arrivals.sort_unstable();
        let algorithm = if exact { "sliding_log" } else { "fixed_window" };
        let yaml = format!(
            "listen: 127.0.0.1:0\nroutes:\n  - name: d\n    respond: {{}}\n    max_queue: {max_queue}\n    limits:\n      - {{ name: p, key: ip, limit: {limit}, window: {window_s}s, algorithm: {algorithm}, on_limit: delay, max_delay: {max_delay}ms }}\n"
        );
        let answers = replay(&yaml, &arrivals);
        let window = window_s * 1_000;
        let admitted: Vec<u64> = {
            let mut a: Vec<u64> = answers.iter().filter(|a| a.1 == StatusCode::OK).map(|a| a.2).collect();
            a.sort_unstable();
            a
        };
        for (i, &t) in admitted.iter().enumerate() {
            let in_window = if exact {
                admitted[i..].iter().take_while(|&&u| u < t + window).count()
            } else {
                admitted.iter().filter(|&&u| u / window == t / window).count()
            };
            proptest::prop_assert!(in_window as u64 <= limit, "{in_window} admitted in the window of {t}: {answers:?}");
        }
        for &(at, status, done) in &answers {
            proptest::prop_assert!(done - at <= max_delay, "answered {done} after arriving {at}: {answers:?}");
            if max_queue == 0 {
                proptest::prop_assert_eq!(done, at, "nothing waits with max_queue: 0");
            }
            proptest::prop_assert!(status == StatusCode::OK || status == StatusCode::TOO_MANY_REQUESTS);
        }
        // No request waits and is then refused when its refusal was known
        // at arrival: from what was admitted before it and the requests
        // waiting ahead of it (all admitted first, at the limit's rate),
        // the earliest it could be admitted was within `max_delay`.
        for &(at, status, done) in &answers {
            if status != StatusCode::TOO_MANY_REQUESTS || done == at {
                continue;
            }
            let earliest = known_at_arrival(&answers, &admitted, at, limit, window, exact);
            proptest::prop_assert!(
                earliest - at <= max_delay,
                "arrived {at}, could not be admitted before {earliest}, yet waited until {done}: {answers:?}"
            );
        }
        // The first request is always admitted at once.
        proptest::prop_assert_eq!(answers.iter().filter(|a| a.0 == a.2 && a.1 == StatusCode::OK).count() >= 1, true);
    }
}
