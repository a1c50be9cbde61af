//! Redis faults that are not crashes: a Sentinel master frozen with
//! `kill -STOP` (its port stays open, nothing answers) is left for the
//! master the sentinels promote, what `on_error: local` admitted meanwhile
//! reaches that master, and the old master is sent nothing once the switch
//! is known, even after it wakes (`kill -CONT`). Also: a fault that waiting
//! cannot mend ends the start-up wait at once.
//!
//! One master, one replica and three sentinels (`down-after-milliseconds
//! 1000`, `failover-timeout 3000`) on free loopback ports; one gateway (or
//! two) at 200 requests a second. The freeze lasts a fixed time because "a
//! freeze of that length" is what is tested; every wait for a state is a
//! poll against a deadline.

use super::*;

use support::redis_topologies::SERVICE;

/// The route `/t`: one fixed-window limit far above what the test sends, so
/// every request Redis (or `local`) decides is admitted and counted.
fn sentinel_yaml(nodes: &str, on_error: &str, timeout: &str) -> String {
    format!(
        "listen: 127.0.0.1:0
store:
  redis: {{ sentinel: {{ service_name: {SERVICE}, nodes: [{nodes}] }}, timeout: {timeout} }}
  on_error: {on_error}
routes:
  - name: t
    match: {{ path: /t }}
    respond: {{ status: 200 }}
    limits: [ {{ name: l, key: ip, limit: 1000000, window: 1d, algorithm: fixed_window }} ]
"
    )
}

/// Calls of the scripts (`EVALSHA`, `EVAL`) `port` has run, from
/// `INFO commandstats`.
pub(super) async fn script_calls(port: u16) -> u64 {
    let info = query_string(port, &["INFO", "commandstats"])
        .await
        .unwrap_or_default();
    info.lines()
        .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
        .filter_map(|l| {
            l.split_once("calls=")
                .and_then(|(_, rest)| rest.split(',').next())
                .and_then(|n| n.parse::<u64>().ok())
        })
        .sum()
}

/// The count the route's fixed-window key holds on `port` (`<window>:<count>`).
pub(super) async fn counted(port: u16) -> u64 {
    let keys = match query(port, &["KEYS", "tg:{*}?*"]).await {
        Ok(redis::Value::Array(keys)) => keys,
        _ => return 0,
    };
    let mut total = 0;
    for key in keys {
        let redis::Value::BulkString(key) = key else {
            continue;
        };
        let key = String::from_utf8_lossy(&key).into_owned();
        let value = query_string(port, &["GET", &key]).await.unwrap_or_default();
        total += value
            .split_once(':')
            .and_then(|(_, c)| c.parse::<u64>().ok())
            .unwrap_or(0);
    }
    total
}

/// When the first of the sentinels names `port` as the master, within 20 s.
async fn switched_to(setup: &SentinelSetup, port: u16) -> Instant {
    let sentinels: Vec<u16> = std::iter::once(&setup.sentinel)
        .chain(&setup.others)
        .map(|s| s.port)
        .collect();
    let names = |s: u16| async move {
        let named = query(s, &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE]).await;
        matches!(
            named,
            Ok(redis::Value::Array(parts))
                if matches!(parts.get(1), Some(redis::Value::BulkString(p))
                    if String::from_utf8_lossy(p) == port.to_string())
        )
    };
    wait::until("the sentinels switched", Duration::from_secs(20), || {
        let sentinels = sentinels.clone();
        async move {
            for s in sentinels {
                if names(s).await {
                    return true;
                }
            }
            false
        }
    })
    .await;
    Instant::now()
}

/// One request's send time and status.
type Sent = Arc<Mutex<Vec<(Instant, StatusCode)>>>;

/// Sends `/t` at 200 requests a second until `stop` is set, to each of
/// `addrs` in turn, each request in its own task, recording when it was
/// sent and its status.
fn load(
    addrs: Vec<std::net::SocketAddr>,
    stop: Arc<AtomicBool>,
    sent: Sent,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(5));
        let mut tasks = Vec::new();
        let mut n = 0;
        while !stop.load(Ordering::Relaxed) {
            tick.tick().await;
            let addr = addrs[n % addrs.len()];
            n += 1;
            let sent = Arc::clone(&sent);
            tasks.push(tokio::spawn(async move {
                let at = Instant::now();
                let status = send(addr, get("/t", &[])).await.status;
                sent.lock().expect("lock").push((at, status));
            }));
        }
        for t in tasks {
            let _ = t.await;
        }
    })
}

/// What one freeze under load measured.
struct Freeze {
    /// From the freeze to the first sentinel naming the replica.
    switch_after: Duration,
    /// From that switch to the last request answered otherwise than 200,
    /// if any came after it.
    last_failure_after_switch: Option<Duration>,
    /// From that switch to the first request answered 200 sent after it.
    first_ok_after_switch: Option<Duration>,
    /// Requests answered otherwise than 200 sent more than a second after
    /// the switch.
    late_failures: usize,
    /// Requests answered otherwise than 200 sent more than 250 ms before
    /// the freeze.
    failures_before: usize,
    /// Requests answered 200.
    admitted: u64,
    /// The count on the new master at the end.
    counted: u64,
    /// Scripts the old master ran after it woke that were written to its
    /// socket before the switch was known.
    queued_ran: u64,
    /// Scripts sent to the old master after it woke (should be none).
    sent_after: u64,
    requests: usize,
    /// `tollgate_store_failovers_total`'s lines.
    failovers: Vec<String>,
}

/// The gateways of a run: how many, and their call timeout. The tests
/// use 100 ms: on a shared 2-core test machine a 25 ms one times out now
/// and then with nothing frozen, which would blur what the freeze costs;
/// the long run also measures the default (25 ms) with two gateways.
#[derive(Clone, Copy)]
struct Fleet {
    gateways: usize,
    timeout: &'static str,
}

const ONE: Fleet = Fleet {
    gateways: 1,
    timeout: "100ms",
};

/// Freezes the Sentinel master for `freeze` under 200 requests a second
/// through one gateway deciding by `on_error`, wakes it, keeps the load
/// for three more seconds, and measures. `signal` is `STOP` (a freeze,
/// `CONT` after `freeze`) or `KILL` (a crash, never woken).
async fn freeze_under_load(on_error: &str, signal: &str, freeze: Duration) -> Freeze {
    freeze_fleet(ONE, on_error, signal, freeze).await
}

/// [`freeze_under_load`] through `fleet`'s gateways, the requests spread
/// over them in turn.
async fn freeze_fleet(fleet: Fleet, on_error: &str, signal: &str, freeze: Duration) -> Freeze {
    let setup = SentinelSetup::start_with(3, 1000, 3000).await;
    let yaml = sentinel_yaml(&setup.node_list(), on_error, fleet.timeout);
    let mut gws = Vec::new();
    for _ in 0..fleet.gateways {
        let gw = Gateway::start(&yaml).await;
        until_ok(gw.addr, Duration::from_secs(10)).await;
        gws.push(gw);
    }
    let old = setup.master.port;
    let new = setup.replica.port;

    let stop = Arc::new(AtomicBool::new(false));
    let sent: Sent = Arc::default();
    let addrs = gws.iter().map(|g| g.addr).collect();
    let load = load(addrs, Arc::clone(&stop), Arc::clone(&sent));
    tokio::time::sleep(Duration::from_secs(1)).await;

    let before = script_calls(old).await;
    setup.master.signal(signal);
    let frozen = Instant::now();
    let switched = switched_to(&setup, new).await;
    setup.wait_promoted().await;
    tokio::time::sleep(freeze.saturating_sub(frozen.elapsed())).await;
    let killed = signal == "KILL";
    if !killed {
        setup.master.signal("CONT");
    }
    // What was written to its socket before the switch runs as it wakes.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let woke = if killed {
        before
    } else {
        script_calls(old).await
    };
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, Ordering::Relaxed);
    load.await.expect("load");
    let after = if killed {
        before
    } else {
        script_calls(old).await
    };
    let failovers: Vec<String> = gws
        .iter()
        .flat_map(|gw| {
            gw.inner
                .metrics()
                .render()
                .lines()
                .filter(|l| l.starts_with("tollgate_store_failovers_total{"))
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .collect();

    // What `local` admitted reaches the new master with the next decision
    // that finds Redis usable; one more request to each gateway makes sure
    // there is one.
    for gw in &gws {
        until_ok(gw.addr, Duration::from_secs(5)).await;
    }
    let sent = sent.lock().expect("lock").clone();
    if std::env::var_os("FAILOVER_TRACE").is_some() {
        let mut buckets = std::collections::BTreeMap::<u128, usize>::new();
        for (at, s) in &sent {
            if *s != StatusCode::OK {
                *buckets
                    .entry(at.saturating_duration_since(frozen).as_millis() / 250 * 250)
                    .or_default() += 1;
            }
        }
        eprintln!(
            "non-200 by 250 ms after the freeze: {buckets:?}; switch at {:?}",
            switched.duration_since(frozen)
        );
    }
    let admitted =
        sent.iter().filter(|(_, s)| *s == StatusCode::OK).count() as u64 + gws.len() as u64;
    let counted = counted(new).await;
    Freeze {
        switch_after: switched.duration_since(frozen),
        last_failure_after_switch: sent
            .iter()
            .filter(|(at, s)| *s != StatusCode::OK && *at > switched)
            .map(|(at, _)| at.duration_since(switched))
            .max(),
        first_ok_after_switch: sent
            .iter()
            .filter(|(at, s)| *s == StatusCode::OK && *at > switched)
            .map(|(at, _)| at.duration_since(switched))
            .min(),
        late_failures: sent
            .iter()
            .filter(|(at, s)| *s != StatusCode::OK && *at > switched + Duration::from_secs(1))
            .count(),
        // A request sent just before the freeze may be waiting on the
        // master when it freezes.
        failures_before: sent
            .iter()
            .filter(|(at, s)| *s != StatusCode::OK && *at + Duration::from_millis(250) < frozen)
            .count(),
        admitted,
        counted,
        queued_ran: woke.saturating_sub(before),
        sent_after: after.saturating_sub(woke),
        requests: sent.len(),
        failovers,
    }
}

fn report(on_error: &str, f: &Freeze) {
    eprintln!(
        "{on_error}: {} requests; sentinels switched {:?} after the freeze; first 200 {:?} and last non-200 {:?} after the switch ({} non-200 later than 1 s); admitted {}, counted on the new master {} ({:.1} %); old master ran {} queued scripts on waking and was sent {} after; {:?}",
        f.requests,
        f.switch_after,
        f.first_ok_after_switch,
        f.last_failure_after_switch,
        f.late_failures,
        f.admitted,
        f.counted,
        100.0 * f.counted as f64 / f.admitted.max(1) as f64,
        f.queued_ran,
        f.sent_after,
        f.failovers,
    );
}

/// Holds that no request failed later than a second after the switch.
fn followed_within_a_second(what: &str, f: &Freeze) {
    if let Some(late) = f.last_failure_after_switch {
        assert!(
            late <= Duration::from_secs(1),
            "{what}: non-200 {late:?} after the switch"
        );
    }
}

/// Holds that the current master counted at least 97 % of what was
/// admitted.
fn counted_what_was_admitted(what: &str, f: &Freeze) {
    assert!(
        f.counted * 100 >= f.admitted * 97,
        "{what}: counted {} of {} admitted",
        f.counted,
        f.admitted
    );
}

/// `deny`: 503s only between the freeze and one second after the switch;
/// nothing is sent to the old master after it wakes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_sentinel_master_costs_deny_no_more_than_a_crash() {
    if std::env::var_os("FAILOVER_TRACE").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter("tollgate=info")
            .try_init();
    }
    let f = freeze_under_load("deny", "STOP", Duration::from_secs(6)).await;
    report("deny", &f);
    assert_eq!(f.failures_before, 0, "failures before the freeze");
    followed_within_a_second("deny", &f);
    assert_eq!(
        f.sent_after, 0,
        "scripts sent to the old master after it woke"
    );
}

/// `local`: every request is served, and the new master ends with at least
/// 97 % of what was admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_local_admitted_during_a_freeze_reaches_the_new_master() {
    let f = freeze_under_load("local", "STOP", Duration::from_secs(6)).await;
    report("local", &f);
    assert_eq!(f.admitted as usize, f.requests + 1, "every request served");
    counted_what_was_admitted("local", &f);
    assert_eq!(
        f.sent_after, 0,
        "scripts sent to the old master after it woke"
    );
}

/// A master killed (-9) under load: `deny` answers 503 only until a second
/// after the switch, `local` loses nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_sentinel_master_is_followed_under_both_policies() {
    for on_error in ["deny", "local"] {
        let f = freeze_under_load(on_error, "KILL", Duration::from_secs(4)).await;
        report(&format!("{on_error}, kill -9"), &f);
        followed_within_a_second(on_error, &f);
        if on_error == "local" {
            counted_what_was_admitted(on_error, &f);
        }
    }
}

/// Nothing went to the old master after it woke, and under `local` the
/// new master counted what was admitted.
fn nothing_sent_after_and_nothing_lost(on_error: &str, f: &Freeze) {
    assert_eq!(
        f.sent_after, 0,
        "{on_error}: sent to the old master after it woke"
    );
    if on_error == "local" {
        counted_what_was_admitted(on_error, f);
    }
}

/// The 15-second freezes, for both policies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "long: run by scripts/failover.sh"]
async fn fifteen_second_freezes_under_both_policies() {
    for on_error in ["deny", "local"] {
        let f = freeze_under_load(on_error, "STOP", Duration::from_secs(15)).await;
        report(on_error, &f);
        followed_within_a_second(on_error, &f);
        nothing_sent_after_and_nothing_lost(on_error, &f);
    }
}

/// The 15-second freeze at the default call timeout (25 ms) with two
/// gateways, for both policies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "long: run by scripts/failover.sh"]
async fn fifteen_second_freezes_at_the_default_timeout_with_two_gateways() {
    if std::env::var_os("FAILOVER_TRACE").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter("tollgate=info")
            .try_init();
    }
    let fleet = Fleet {
        gateways: 2,
        timeout: "25ms",
    };
    for on_error in ["deny", "local"] {
        let f = freeze_fleet(fleet, on_error, "STOP", Duration::from_secs(15)).await;
        report(&format!("{on_error}, 25 ms, two gateways"), &f);
        // At 25 ms a busy shared machine times out a call now and then
        // with nothing frozen (three in a row open the breaker for a probe
        // interval), so what is held here is that decisions are back on
        // the new master within a second; the late non-200s are reported.
        let back = f
            .first_ok_after_switch
            .expect("a request decided after the switch");
        assert!(
            back <= Duration::from_secs(1),
            "{on_error}: first 200 {back:?} after the switch"
        );
        nothing_sent_after_and_nothing_lost(on_error, &f);
    }
}

/// A wrong password ends the start-up wait at once: the first request is
/// decided by `on_error` within 100 ms of the start, and `/readyz` names
/// the fault.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_at_start_is_decided_at_once() {
    let server = RedisServer::start_with_password("right").await;
    let src = format!(
        "listen: 127.0.0.1:0
store:
  redis: {{ url: 'redis://:wrong@127.0.0.1:{}', startup_wait: 2s }}
  on_error: deny
routes:
  - {{ name: t, respond: {{}}, limits: [ {{ name: l, key: ip, limit: 3, window: 1m }} ] }}
",
        server.port()
    );
    let begun = Instant::now();
    let (addr, _stop) = started_at_once(&src).await;
    let reply = send(addr, get("/t", &[])).await;
    let took = begun.elapsed();
    eprintln!(
        "wrong password: first request answered {} after {took:?}",
        reply.status
    );
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        took <= Duration::from_millis(100),
        "answered after {took:?}"
    );
}

/// An unknown Sentinel service name is a fault: the start-up wait ends at
/// once and the store names it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_sentinel_service_name_is_a_fault() {
    let setup = SentinelSetup::start().await;
    let cfg = RedisConfig {
        topology: RedisTopology::Sentinel {
            service_name: "nosuchmaster".into(),
            nodes: vec![("127.0.0.1".into(), setup.sentinel.port)],
        },
        ..RedisConfig::default()
    };
    let store = RedisStore::connect(&cfg).await.expect("store");
    let begun = Instant::now();
    assert!(!store.wait_ready(Duration::from_secs(5)).await);
    let took = begun.elapsed();
    let fault = store.fault().expect("a fault").to_string();
    eprintln!("unknown service name: {fault} after {took:?}");
    assert!(took < Duration::from_secs(1), "waited {took:?}");
    assert!(fault.contains("nosuchmaster"), "{fault}");
}
