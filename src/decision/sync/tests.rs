//! `sync` mode's table: decisions against the fleet's totals, and what an
//! exchange sends and takes in.

use std::collections::HashMap;

use proptest::prelude::*;

use super::*;
use crate::store::MemoryStore;
use crate::store::redis::sync::Counter;
use crate::store::redis::sync::Totals;

const T0: u64 = 1_700_000_000_000;

fn req(key: &str, limit: u64, window_ms: u64) -> LimitRequest {
    LimitRequest {
        key: key.into(),
        limit,
        window_ms,
        cost: 1,
        algorithm: Algorithm::SlidingWindow,
        mode: synced_every(100),
    }
}

fn synced_every(every: u64) -> crate::limit::Mode {
    crate::limit::Mode {
        kind: crate::limit::LimitKind::Synced(every),
        ..crate::limit::Mode::default()
    }
}

/// One limit decided at `now`, synced every `every` ms.
fn one(table: &SyncTable, now: u64, r: &LimitRequest, every: u64) -> Option<Answer> {
    let r = LimitRequest {
        mode: synced_every(every),
        ..r.clone()
    };
    table.decide(now, std::slice::from_ref(&r), Intent::Consume)
}

fn allowed(table: &SyncTable, now: u64, r: &LimitRequest) -> bool {
    one(table, now, r, 100).expect("decided").allowed
}

/// Redis as sync.lua keeps it: each key rolled to the caller's window
/// (kept when written by a clock ahead), the deltas added, the totals
/// answered.
#[derive(Default)]
struct FakeRedis {
    keys: HashMap<String, Counts>,
}

impl FakeRedis {
    fn exchange(&mut self, now: u64, deltas: &[Delta]) -> Vec<SyncAnswer> {
        deltas
            .iter()
            .map(|d| {
                let stored = self.keys.entry(d.key.clone()).or_default();
                let (kind, idx) = match d.counter {
                    Counter::Sliding { window_ms } => (Kind::Sliding, now / window_ms),
                    Counter::Fixed { index, .. } => (Kind::Fixed, index),
                };
                let mut c = kind.roll(*stored, idx);
                c.prev += d.prev;
                c.cur += d.cur;
                *stored = c;
                Ok(Some(Totals {
                    window: c.window,
                    prev: c.prev,
                    cur: c.cur,
                }))
            })
            .collect()
    }
}

#[test]
fn an_exchange_moves_counts_from_unsent_to_the_fleet() {
    let table = SyncTable::new();
    let r = req("k", 10, 60_000);
    for _ in 0..3 {
        assert!(allowed(&table, T0, &r));
    }
    let deltas = table.take(T0 + 100, Due::Ready);
    assert_eq!(deltas.len(), 1);
    assert_eq!((deltas[0].prev, deltas[0].cur), (0, 3));
    // Meanwhile one more here; the fleet (other gateways) added 5.
    assert!(allowed(&table, T0 + 101, &r));
    let i = (T0 + 100) / 60_000;
    let totals = |cur| {
        vec![Ok(Some(Totals {
            window: i,
            prev: 0,
            cur,
        }))]
    };
    table.apply(deltas, totals(8));
    // 8 (fleet, with our 3) + 1 unsent = 9: one left.
    let d = one(&table, T0 + 102, &r, 100).unwrap();
    assert!(d.allowed);
    assert_eq!(d.outcomes[0].remaining, 0);
    assert!(!allowed(&table, T0 + 103, &r));
    // The two admitted since the exchange are owed.
    let deltas = table.take(T0 + 200, Due::Ready);
    assert_eq!((deltas[0].prev, deltas[0].cur), (0, 2));
    table.apply(deltas, totals(10));
    // A key only denied is queued too, to read the fleet's totals.
    assert!(!allowed(&table, T0 + 201, &r));
    let deltas = table.take(T0 + 300, Due::Ready);
    assert_eq!((deltas.len(), deltas[0].cur), (1, 0));
}

#[test]
fn a_failed_exchange_keeps_what_it_owed() {
    let table = SyncTable::new();
    let r = req("k", 10, 60_000);
    assert!(allowed(&table, T0, &r));
    let deltas = table.take(T0 + 100, Due::Ready);
    assert!(allowed(&table, T0 + 150, &r));
    table.apply(deltas, vec![Err(crate::store::StoreError::Timeout)]);
    let deltas = table.take(T0 + 200, Due::Ready);
    assert_eq!(deltas[0].cur, 2, "both admissions owed");
    table.apply(deltas, vec![Ok(None)]);
    assert!(one(&table, T0 + 300, &r, 100).is_none(), "garbage fails");
    // Read again at the next exchange, and counted again.
    let deltas = table.take(T0 + 400, Due::Ready);
    assert_eq!(deltas[0].cur, 0, "nothing was added to garbage");
    table.apply(deltas, vec![Ok(Some(Totals::default()))]);
    assert!(allowed(&table, T0 + 500, &r));
}

#[test]
fn a_key_is_not_exchanged_before_its_interval() {
    let table = SyncTable::new();
    let fast = req("fast", 10, 60_000);
    let slow = req("slow", 10, 60_000);
    let decide = |now: u64| {
        one(&table, now, &fast, 100).unwrap();
        one(&table, now, &slow, 1_000).unwrap();
    };
    decide(T0);
    assert_eq!(table.tick(), Some(Duration::from_millis(100)));
    let first = table.take(T0 + 1_000, Due::Ready);
    assert_eq!(first.len(), 2);
    let none = Totals::default();
    table.apply(first, vec![Ok(Some(none)), Ok(Some(none))]);
    decide(T0 + 1_050);
    let keys = |all| -> Vec<String> {
        table
            .take(T0 + 1_100, all)
            .into_iter()
            .map(|d| d.key)
            .collect()
    };
    assert_eq!(keys(Due::Ready), ["fast"]);
    // While the counts are stale every touched key goes.
    assert_eq!(keys(Due::All), ["slow"]);
}

#[test]
fn a_key_far_from_its_limit_waits_and_one_near_it_does_not() {
    let table = SyncTable::new();
    table.set_instances(2);
    let far = req("far", 1_000, 60_000);
    let near = req("near", 20, 60_000);
    let i = T0 / 60_000;
    let read = |cur| {
        Ok(Some(Totals {
            window: i,
            prev: 0,
            cur,
        }))
    };
    // Never read: both go at the next tick.
    one(&table, T0, &far, 100).unwrap();
    one(&table, T0, &near, 100).unwrap();
    let deltas = table.take(T0 + 100, Due::Ready);
    assert_eq!(deltas.len(), 2);
    table.apply(deltas, vec![read(1), read(1)]);
    // 3 of 1,000 owed here: far below a tenth of the room left
    // shared by two instances (49); 1 of 20 is not (0.9).
    for _ in 0..3 {
        one(&table, T0 + 150, &far, 100).unwrap();
    }
    one(&table, T0 + 150, &near, 100).unwrap();
    let keys = |now, all| -> Vec<String> {
        let deltas = table.take(now, all);
        let keys = deltas.iter().map(|d| d.key.clone()).collect();
        let answers = deltas.iter().map(|_| read(0)).collect();
        table.apply(deltas, answers);
        keys
    };
    assert_eq!(keys(T0 + 200, Due::Ready), ["near"]);
    // The far one waits its longest: a hundred intervals.
    assert!(keys(T0 + 150 + 9_999, Due::Ready).is_empty());
    assert_eq!(keys(T0 + 150 + 10_000, Due::Ready), ["far"]);
    // While the counts are stale, everything queued goes at once.
    one(&table, T0 + 16_000, &far, 100).unwrap();
    assert_eq!(keys(T0 + 16_001, Due::All), ["far"]);
}

#[test]
fn a_denied_request_consumes_nothing_and_shows_every_limit_without_it() {
    let table = SyncTable::new();
    let both = [req("a", 10, 60_000), req("b", 1, 60_000)];
    assert!(table.decide(T0, &both, Intent::Consume).unwrap().allowed);
    let d = table.decide(T0, &both, Intent::Consume).unwrap();
    assert!(!d.allowed);
    assert_eq!(d.outcomes[0].remaining, 9, "a without the refused request");
    assert!(!d.outcomes[1].admits);
}

/// One step of a gateway's life: a request, or an exchange that
/// succeeds or fails.
#[derive(Debug, Clone)]
enum Step {
    Request {
        key: usize,
        algorithm: usize,
        cost: u64,
        after_ms: u64,
    },
    Exchange {
        fails: bool,
    },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (0..3usize, 0..3usize, 1..4u64, 0..1_500u64).prop_map(|(key, algorithm, cost, after_ms)| {
            Step::Request { key, algorithm, cost, after_ms }
        }),
        1 => any::<bool>().prop_map(|fails| Step::Exchange { fails }),
    ]
}

proptest! {
    /// Alone, a gateway in sync mode decides exactly as the in-process
    /// store, whenever its exchanges run and whether they succeed: its
    /// view is the fleet (itself) plus what it has not sent.
    #[test]
    fn alone_it_decides_like_the_in_process_store(steps in prop::collection::vec(step(), 1..120)) {
        let table = SyncTable::new();
        let memory = MemoryStore::new();
        let mut redis = FakeRedis::default();
        let mut now = T0;
        let algorithms = [Algorithm::SlidingWindow, Algorithm::FixedWindow, Algorithm::CalendarMonth];
        for s in steps {
            match s {
                Step::Request { key, algorithm, cost, after_ms } => {
                    now += after_ms;
                    let r = LimitRequest {
                        key: format!("k{key}:{algorithm}").into(),
                        cost,
                        algorithm: algorithms[algorithm],
                        ..req("", 5, 4_000)
                    };
                    let ours = one(&table, now, &r, 100).expect("decided");
                    prop_assert_eq!(ours, memory.decide_now(now, std::slice::from_ref(&r)));
                }
                Step::Exchange { fails } => {
                    let deltas = table.take(now, Due::All);
                    let answers = if fails {
                        deltas.iter().map(|_| Err(crate::store::StoreError::Timeout)).collect()
                    } else {
                        redis.exchange(now, &deltas)
                    };
                    table.apply(deltas, answers);
                }
            }
        }
    }
}

proptest! {
    // Each case decides up to 40,000 requests.
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// N gateways over one Redis, exchanging every `interval` ms each at
    /// its own phase (answers arrive at once), a caller spread round
    /// robin over them at `r` per gateway: in every fixed window at most
    /// `L + L/10 + (N − 1)·(r·2·interval + 1)` are admitted (the
    /// module's bound with no round trip), and at least `L`.
    #[test]
    fn the_fleet_stays_within_the_bound(
        n in 2..5u64,
        limit in 5..200u64,
        interval in 10..200u64,
        gap in 1..20u64,
        phases in prop::collection::vec(0..200u64, 5),
    ) {
        const W: u64 = 10_000;
        let tables: Vec<SyncTable> = (0..n).map(|_| SyncTable::new()).collect();
        for t in &tables {
            t.set_instances(n);
        }
        let mut redis = FakeRedis::default();
        let r = LimitRequest { algorithm: Algorithm::FixedWindow, ..req("caller", limit, W) };
        // One request every `gap` ms, to the gateways in turn.
        let per_gateway = 1.0 / (gap * n) as f64;
        let bound = limit as f64 / ROOM_SHARE as f64
            + (n - 1) as f64 * (per_gateway * (2 * interval) as f64 + 1.0);
        let start = T0 - T0 % W;
        let mut admitted = [0u64; 4];
        let mut next_exchange: Vec<u64> = phases.iter().take(n as usize).map(|p| start + p % interval).collect();
        for (k, t) in (start..start + 4 * W).step_by(gap as usize).enumerate() {
            for (g, at) in next_exchange.iter_mut().enumerate() {
                while *at <= t {
                    let deltas = tables[g].take(*at, Due::Ready);
                    let answers = redis.exchange(*at, &deltas);
                    tables[g].apply(deltas, answers);
                    *at += interval;
                }
            }
            let g = k % n as usize;
            if one(&tables[g], t, &r, interval).expect("decided").allowed {
                admitted[((t - start) / W) as usize] += 1;
            }
        }
        for (i, &a) in admitted.iter().enumerate() {
            prop_assert!(a >= limit.min(W / gap), "window {}: {} admitted of {}", i, a, limit);
            prop_assert!(a as f64 <= limit as f64 + bound,
                "window {}: {} admitted, limit {}, bound {:.1}", i, a, limit, bound);
        }
    }
}
