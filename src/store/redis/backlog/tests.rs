use super::*;

fn req(key: &str, algorithm: Algorithm, cost: u64) -> LimitRequest {
    LimitRequest {
        key: key.into(),
        limit: 10,
        window_ms: 1_000,
        cost,
        algorithm,
        mode: Default::default(),
    }
}

#[test]
fn records_in_each_algorithms_shape() {
    let b = Backlog::new();
    let t = 10_000_500;
    for alg in [
        Algorithm::SlidingWindow,
        Algorithm::FixedWindow,
        Algorithm::SlidingLog,
        Algorithm::Gcra { burst: 10 },
        Algorithm::SlidingBuckets { precision_ms: 250 },
    ] {
        let key = alg.key_tag().unwrap_or_else(|| alg.name().to_owned());
        let key = key.as_str();
        b.record(t - 1_000, &req(key, alg, 2)); // the window before
        b.record(t, &req(key, alg, 3));
        b.record(t, &req(key, alg, 0)); // cost 0: nothing
    }
    let mut taken = b.take(t);
    taken.sort_by(|a, c| a.0.cmp(&c.0));
    let args: Vec<(&str, Vec<u64>)> = taken
        .iter()
        .map(|(k, e)| (k.as_str(), e.push_args(t).unwrap().1))
        .collect();
    assert_eq!(
        args,
        [
            // Precision, then bucket and units: t−1000's bucket (39998)
            // counts until t + 250.
            ("buckets_250ms", vec![250, 39_998, 2, 40_002, 3]),
            ("fixed_window", vec![3]), // the earlier window ended
            // 2 at t−1000 put the TAT at t−800; 3 more from t: t+300.
            // L, B, TAT, rem, and 5 units of 1000 (w) in 1/L ms.
            ("gcra", vec![10, 10, t + 300, 0, 5_000]),
            ("sliding_log", vec![t, 3]), // t−1000 stopped counting at t
            ("sliding_window", vec![2, 3]),
        ]
    );
    assert!(b.is_empty());
    // A second later the fixed window and the log have ended; the
    // sliding window's count is the previous one; GCRA's step still
    // matters while Redis's TAT may be up to a burst beyond its own.
    let later = |dt: u64| {
        taken
            .iter()
            .filter_map(|(k, e)| e.push_args(t + dt).map(|a| (k.as_str(), a.1)))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        later(1_000),
        [
            ("buckets_250ms", vec![250, 40_002, 3]),
            ("gcra", vec![10, 10, t + 300, 0, 5_000]),
            ("sliding_window", vec![3, 0])
        ]
    );
    assert_eq!(later(1_300), [("sliding_window", vec![3, 0])]);
}

#[test]
fn stays_within_its_capacity() {
    let b = Backlog::with_capacity(4);
    let counter = Counter::default();
    b.export(counter.clone());
    let t = 5_000_000;
    for i in 0..6 {
        b.record(t, &req(&format!("k{i}"), Algorithm::FixedWindow, 1));
    }
    assert_eq!(b.items.load(Ordering::SeqCst), 4);
    assert_eq!(counter.get(), 2, "two admissions found no room");
    // Once their window has ended, the next second sweeps them out.
    b.record(t + 1_000, &req("late", Algorithm::FixedWindow, 1));
    let taken = b.take(t + 1_000);
    assert!(taken.iter().any(|(k, _)| k == "late"), "{taken:?}");
    assert_eq!(b.items.load(Ordering::SeqCst), 0);
}

#[test]
fn restore_folds_into_what_came_since() {
    let b = Backlog::new();
    let t = 7_000_000;
    let r = req("k", Algorithm::SlidingWindow, 2);
    b.record(t, &r);
    let taken = b.take(t);
    b.record(t + 1, &r);
    b.restore(taken);
    let again = b.take(t + 1);
    assert_eq!(again[0].1.push_args(t + 1).unwrap().1, [0, 4]);

    let g = req("g", Algorithm::Gcra { burst: 10 }, 1);
    b.record(t, &g); // TAT t + 100
    let taken = b.take(t);
    b.record(t, &g); // TAT t + 100 again, from empty
    b.restore(taken);
    let again = b.take(t);
    // One after the other: t + 200, two units.
    assert_eq!(
        again[0].1.delta,
        Admitted::Gcra {
            tat: gcra::Tat {
                tat: t + 200,
                rem: 0
            },
            cost: 2_000
        }
    );
}
