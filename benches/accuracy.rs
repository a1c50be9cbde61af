//! Accuracy of the sliding-window counter against the exact sliding log.
//!
//! Run with `cargo bench --bench accuracy` (add `-- --quick` for a smaller
//! trace). One synthetic trace — 10,000 identities, Poisson arrivals with
//! bursts, more than a million requests — is decided three times on the
//! in-process store: by `sliding_window` (the default), by the exact
//! `sliding_log`, and by `fixed_window` for contrast. It prints the share of
//! requests each decides differently from the sliding log (once two
//! limiters disagree their histories differ, so later disagreements
//! cascade); the share it decides wrongly on its own history (admitted
//! although the trailing window already held `L`, or denied although it held
//! fewer — the definition of exact applied to what this limiter admitted);
//! and the worst over-admission of any identity: the most requests it
//! admitted in any interval of one window length, minus the limit.
//! Under `cargo test` it runs on a short trace as a smoke test.
//!
//! The traces: identity i sends at a base rate drawn from a heavy-tailed
//! (Pareto, α = 1.5) distribution, so most identities stay far below the
//! limit; every identity also switches, at Poisson instants (every 2 min on
//! average), into bursts of 5 s at 20× its base rate. Arrivals are Poisson
//! (exponential gaps). Two mixes are run:
//! - `abusive`: base rates capped at 20/s, so ~1% of identities live far
//!   above the limit and send most of the traffic;
//! - `near-limit`: base rates capped at 0.5/s (30 per minute), so nobody is
//!   above the limit for long and the bursts are what gets limited.
//!
//! The random generator is SplitMix64 with a fixed seed, so every run
//! decides the same traces.

use std::collections::VecDeque;
use std::time::Instant;

use tollgate::limit::key::StoreKey;
use tollgate::limit::{Algorithm, LimitRequest};
use tollgate::store::MemoryStore;

const IDENTITIES: usize = 10_000;
/// 60 per minute per identity.
const LIMIT: u64 = 60;
const WINDOW_MS: u64 = 60_000;
const T0: u64 = 1_800_000_000_000;

/// SplitMix64: small, fast, and good enough for a synthetic trace.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in (0, 1].
    fn unit(&mut self) -> f64 {
        ((self.next() >> 11) as f64 + 1.0) / (1u64 << 53) as f64
    }
    /// Exponential with mean `mean`.
    fn exp(&mut self, mean: f64) -> f64 {
        -mean * self.unit().ln()
    }
}

/// (time ms, identity), sorted by time.
fn trace(duration_ms: u64, cap_per_sec: f64, rng: &mut Rng) -> Vec<(u64, u32)> {
    let mut events = Vec::new();
    for id in 0..IDENTITIES as u32 {
        // Pareto(α = 1.5, x_m = 0.05/s): mean 0.15 requests per second.
        let base = 0.05 / rng.unit().powf(1.0 / 1.5);
        let base = base.min(cap_per_sec);
        let burst_rate = base * 20.0;
        // A burst starts on average every 2 minutes and lasts 5 s.
        let mut next_burst = rng.exp(120_000.0);
        let mut t = 0.0f64;
        let end = duration_ms as f64;
        while t < end {
            let in_burst = t >= next_burst && t < next_burst + 5_000.0;
            if t >= next_burst + 5_000.0 {
                next_burst = t + rng.exp(120_000.0);
            }
            let rate = if in_burst { burst_rate } else { base };
            t += rng.exp(1_000.0 / rate);
            if t < end {
                events.push((t as u64, id));
            }
        }
    }
    events.sort_unstable();
    events
}

/// Decides the whole trace with `algorithm`: one admitted flag per event.
fn decide(events: &[(u64, u32)], algorithm: Algorithm) -> Vec<bool> {
    let store = MemoryStore::new();
    let keys: Vec<StoreKey> = (0..IDENTITIES)
        .map(|i| format!("acc:{{id={i}}}").into())
        .collect();
    let mut req = [LimitRequest {
        key: String::new().into(),
        limit: LIMIT,
        window_ms: WINDOW_MS,
        cost: 1,
        algorithm,
        mode: Default::default(),
    }];
    events
        .iter()
        .map(|&(t, id)| {
            req[0].key.clone_from(&keys[id as usize]);
            store.decide_now(T0 + t, &req).allowed
        })
        .collect()
}

/// Judges `admitted` against the definition, on its own history: per
/// identity, the requests admitted in the trailing window `(t − w, t]`.
struct Judged {
    /// Admitted although the trailing window already held `L`.
    over: usize,
    /// Denied although the trailing window held fewer than `L`.
    under: usize,
    /// The most admitted for one identity in any span of one window, minus `L`.
    worst: u64,
}

fn judge(events: &[(u64, u32)], admitted: &[bool]) -> Judged {
    let mut recent: Vec<VecDeque<u64>> = vec![VecDeque::new(); IDENTITIES];
    let mut j = Judged {
        over: 0,
        under: 0,
        worst: 0,
    };
    for (&(t, id), &ok) in events.iter().zip(admitted) {
        let q = &mut recent[id as usize];
        while q.front().is_some_and(|&s| s + WINDOW_MS <= t) {
            q.pop_front();
        }
        let held = q.len() as u64;
        match (ok, held < LIMIT) {
            (true, false) => j.over += 1,
            (false, true) => j.under += 1,
            _ => {}
        }
        if ok {
            q.push_back(t);
            j.worst = j.worst.max((q.len() as u64).saturating_sub(LIMIT));
        }
    }
    j
}

fn main() {
    // `cargo bench` passes --bench; under `cargo test` (no flag) this runs
    // as a quick smoke test on a short trace.
    let full =
        std::env::args().any(|a| a == "--bench") && !std::env::args().any(|a| a == "--quick");
    let duration_ms = if full { 900_000 } else { 30_000 };
    for (mix, cap) in [("abusive", 20.0), ("near-limit", 0.5)] {
        let mut rng = Rng(0x70_11_6a_7e);
        let started = Instant::now();
        let events = trace(duration_ms, cap, &mut rng);
        report(mix, &events, started);
    }
}

fn report(mix: &str, events: &[(u64, u32)], started: Instant) {
    let n = events.len();
    println!(
        "{mix} trace: {IDENTITIES} identities, {n} requests, limit {LIMIT} per {} s (generated in {:.1?})",
        WINDOW_MS / 1000,
        started.elapsed()
    );
    let exact = decide(events, Algorithm::SlidingLog);
    let exact_admitted = exact.iter().filter(|&&a| a).count();
    let exact_judged = judge(events, &exact);
    assert_eq!(
        (exact_judged.over, exact_judged.under),
        (0, 0),
        "the log is the definition"
    );
    println!(
        "  sliding_log (exact): admitted {exact_admitted} ({:.3}%), worst over-admission {}",
        100.0 * exact_admitted as f64 / n as f64,
        exact_judged.worst
    );
    for alg in [Algorithm::SlidingWindow, Algorithm::FixedWindow] {
        let got = decide(events, alg);
        let wrongly_admitted = got.iter().zip(&exact).filter(|(g, e)| **g && !**e).count();
        let wrongly_denied = got.iter().zip(&exact).filter(|(g, e)| !**g && **e).count();
        let differ = wrongly_admitted + wrongly_denied;
        let mut ids = std::collections::HashSet::new();
        for ((&(_, id), g), e) in events.iter().zip(&got).zip(&exact) {
            if g != e {
                ids.insert(id);
            }
        }
        let j = judge(events, &got);
        println!(
            "  {}: decided differently from the log {differ} of {n} ({:.4}%: {wrongly_admitted} admitted that it denied, {wrongly_denied} denied that it admitted; {} identities)",
            alg.name(),
            100.0 * differ as f64 / n as f64,
            ids.len(),
        );
        println!(
            "  {}: wrong on its own history {} ({:.4}%: {} admitted over L, {} denied under L), worst over-admission {} requests in one window",
            alg.name(),
            j.over + j.under,
            100.0 * (j.over + j.under) as f64 / n as f64,
            j.over,
            j.under,
            j.worst
        );
    }
}
