use super::*;
use crate::config::Eject;

fn pool(balance: Balance, weights: &[u32], eject: Eject) -> Balancer {
    let targets = weights
        .iter()
        .enumerate()
        .map(|(i, &weight)| {
            let authority: http::uri::Authority = format!("127.0.0.{}:80", i + 1).parse().unwrap();
            PoolTarget {
                url: Arc::from(format!("http://{authority}")),
                scheme: TargetScheme::Http,
                host: authority.host().to_owned(),
                port: 80,
                authority,
                weight,
            }
        })
        .collect();
    let config = UpstreamPool {
        name: Arc::from("p"),
        targets,
        balance,
        hash_key: None,
        health: None,
        eject,
        retries: 1,
        per_try_timeout: None,
        tls: None,
    };
    Balancer::new(Arc::new(config), None, settings(), None)
}

fn counts(b: &Balancer, n: usize, key: impl Fn(usize) -> Option<u64>) -> Vec<usize> {
    let mut by = vec![0; b.endpoints().list.len()];
    for i in 0..n {
        let e = b.pick(key(i), &Tried::new()).unwrap();
        by[e.target] += 1;
    }
    by
}

#[test]
fn smooth_round_robin_interleaves_by_weight() {
    let b = pool(Balance::RoundRobin, &[5, 1, 1], Eject::default());
    let order: Vec<usize> = (0..7)
        .map(|_| b.pick(None, &Tried::new()).unwrap().target)
        .collect();
    // nginx's example: a a b a c a a, never five in a row.
    assert_eq!(order, [0, 0, 1, 0, 2, 0, 0]);
}

#[test]
fn a_leaving_target_moves_only_its_own_callers() {
    let b = pool(Balance::Hash, &[1, 1, 1, 1], Eject::default());
    let keys: Vec<u64> = (0..1000)
        .map(|i| hash64(format!("caller{i}").as_bytes()))
        .collect();
    let before: Vec<usize> = keys
        .iter()
        .map(|&k| b.pick(Some(k), &Tried::new()).unwrap().target)
        .collect();
    let share = counts(&b, 1000, |i| Some(keys[i]));
    assert!(share.iter().all(|&n| n > 150), "uneven ring: {share:?}");
    // Target 2 is ejected: its callers move, nobody else does.
    let eps = b.endpoints();
    eps.list[2]
        .state
        .ejected_until
        .store(u64::MAX, Ordering::Relaxed);
    for (i, &k) in keys.iter().enumerate() {
        let now = b.pick(Some(k), &Tried::new()).unwrap().target;
        if before[i] == 2 {
            assert_ne!(now, 2);
        } else {
            assert_eq!(now, before[i], "caller {i} moved");
        }
    }
}

#[test]
fn ejection_stops_at_max_percent_and_panic_uses_every_target() {
    let eject = Eject {
        after: 2,
        duration: Duration::from_secs(60),
        max_percent: 50,
        ended_by_checks: true,
    };
    let b = pool(Balance::RoundRobin, &[1, 1, 1, 1], eject);
    let eps = b.endpoints();
    for e in &eps.list {
        b.failed(e);
        b.failed(e);
    }
    let ejected = eps.list.iter().filter(|e| e.state.is_ejected()).count();
    assert_eq!(ejected, 2, "at most half of four");
    // Two of four usable: not below half, so only those two are used.
    let by = counts(&b, 40, |_| None);
    assert_eq!(by.iter().filter(|&&n| n > 0).count(), 2, "{by:?}");
    // One of four usable (a check fails): panic, every target is used.
    let usable: Vec<&Endpoint> = eps.list.iter().filter(|e| !e.state.is_ejected()).collect();
    usable[0].state.healthy.store(false, Ordering::Relaxed);
    let by = counts(&b, 40, |_| None);
    assert_eq!(by, [10, 10, 10, 10]);
}

#[test]
fn a_repeated_ejection_doubles_up_to_ten_times() {
    let eject = Eject {
        after: 1,
        duration: Duration::from_millis(100),
        max_percent: 100,
        ended_by_checks: true,
    };
    let b = pool(Balance::RoundRobin, &[1, 1], eject);
    let e = b.endpoints().list[0].clone();
    let mut lasted = Vec::new();
    for _ in 0..6 {
        // End the running ejection, as if it had run its time just now.
        e.state.ejected_until.store(0, Ordering::Relaxed);
        e.state.last_end_ms.store(now_ms(), Ordering::Relaxed);
        assert!(b.failed(&e));
        lasted.push(e.state.last_ejection_ms.load(Ordering::Relaxed));
    }
    assert_eq!(lasted, [100, 200, 400, 800, 1000, 1000]);
    // Back for longer than the last ejection lasted: it starts over.
    // (The clock starts with the test, so the past is written as a
    // last ejection that lasted no time.)
    e.state.ejected_until.store(0, Ordering::Relaxed);
    e.state.last_ejection_ms.store(0, Ordering::Relaxed);
    assert!(b.failed(&e));
    assert_eq!(e.state.last_ejection_ms.load(Ordering::Relaxed), 100);
}

/// A pool of two with active checks (`healthy_after: 2`) and ejections
/// of 60 s that passing checks end or not.
fn checked_pool(ended_by_checks: bool) -> Balancer {
    let eject = Eject {
        after: 1,
        duration: Duration::from_secs(60),
        max_percent: 100,
        ended_by_checks,
    };
    let mut config = (*pool(Balance::RoundRobin, &[1, 1], eject).config).clone();
    config.health = Some(crate::config::HealthCheck {
        path: http::uri::PathAndQuery::from_static("/healthz"),
        interval: Duration::from_secs(1),
        timeout: Duration::from_secs(1),
        unhealthy_after: 2,
        healthy_after: 2,
    });
    Balancer::new(Arc::new(config), None, settings(), None)
}

#[test]
fn passing_checks_end_an_ejection_and_keep_its_doubling() {
    let b = checked_pool(true);
    let e = b.endpoints().list[0].clone();
    // Checks passed before the ejection do not count towards its end.
    b.checked(&e, true);
    b.checked(&e, true);
    assert!(b.failed(&e));
    b.checked(&e, true);
    assert!(e.state.is_ejected(), "one pass of two");
    b.checked(&e, true);
    assert!(!e.state.is_ejected(), "two passes end it");
    assert_eq!(e.state.failures.load(Ordering::Relaxed), 0);
    // Failing again at once: the ejection lasts twice as long.
    assert!(b.failed(&e));
    assert_eq!(e.state.last_ejection_ms.load(Ordering::Relaxed), 120_000);
}

#[test]
fn an_ejection_runs_its_time_when_checks_do_not_end_it() {
    let b = checked_pool(false);
    let e = b.endpoints().list[0].clone();
    assert!(b.failed(&e));
    for _ in 0..5 {
        b.checked(&e, true);
    }
    assert!(e.state.is_ejected());
}

#[test]
fn a_lone_target_is_tried_once() {
    let b = pool(Balance::LeastRequest, &[1], Eject::default());
    let mut tried = Tried::new();
    let e = b.pick(None, &tried).unwrap();
    mark_tried(&mut tried, &e);
    assert!(b.pick(None, &tried).is_none());
}

#[test]
fn a_try_goes_to_a_target_not_tried_yet() {
    let b = pool(Balance::LeastRequest, &[1, 1, 1], Eject::default());
    let mut tried = Tried::new();
    let mut seen = Vec::new();
    while let Some(e) = b.pick(None, &tried) {
        mark_tried(&mut tried, &e);
        seen.push(e.target);
    }
    seen.sort_unstable();
    assert_eq!(seen, [0, 1, 2]);
}

fn settings() -> crate::proxy::ConnSettings {
    crate::proxy::ConnSettings {
        connect_timeout: Duration::from_secs(1),
        idle_timeout: Duration::from_secs(1),
        http1: crate::config::Http1::Hyper,
    }
}
