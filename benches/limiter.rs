//! Micro-benchmarks of the per-request phases: one limiter decision on the
//! memory store (one hot key; many keys), identity key building and header
//! rendering. Run with `cargo bench --bench limiter`.

use std::hint::black_box;
use std::num::NonZeroU64;

use criterion::{Criterion, criterion_group, criterion_main};
use http::HeaderMap;
use tollgate::config::{KeySource, KeySpec, Limit};
use tollgate::identity::{self, Caller};
use tollgate::limit::LimitRequest;
use tollgate::store::MemoryStore;

fn memory_store(c: &mut Criterion) {
    let store = MemoryStore::new();
    let hot = [LimitRequest {
        key: "tollgate:{ip=10.0.0.1/32}:api:per_ip".into(),
        limit: u64::MAX / 4,
        window_ms: 60_000,
        cost: 1,
        algorithm: Default::default(),
    }];
    let mut now = 1_800_000_000_000u64;
    c.bench_function("memory/hot_key", |b| {
        b.iter(|| {
            now += 1;
            black_box(store.decide_now(now, black_box(&hot)))
        })
    });

    let store = MemoryStore::new();
    let keys: Vec<LimitRequest> = (0..100_000u32)
        .map(|i| LimitRequest {
            key: format!(
                "tollgate:{{ip=10.{}.{}.{}/32}}:api:per_ip",
                i >> 16,
                (i >> 8) & 255,
                i & 255
            ),
            limit: 1_000_000,
            window_ms: 60_000,
            cost: 1,
            algorithm: Default::default(),
        })
        .collect();
    let mut i = 0usize;
    c.bench_function("memory/100k_keys", |b| {
        b.iter(|| {
            i = (i + 7919) % keys.len();
            black_box(store.decide_now(now, std::slice::from_ref(&keys[i])))
        })
    });
}

fn identity_key(c: &mut Criterion) {
    let headers = HeaderMap::new();
    let caller = Caller {
        ip: identity::group("2001:db8::1".parse().unwrap(), 64),
        api_key: Some(b"a34e15c0"),
        user: None,
        headers: &headers,
    };
    let spec = KeySpec {
        parts: vec![vec![KeySource::ApiKey, KeySource::User, KeySource::Ip]],
    };
    c.bench_function("identity/api_key_chain", |b| {
        b.iter(|| {
            let mut s = String::with_capacity(64);
            identity::write_key(&mut s, black_box(&spec), black_box(&caller));
            s
        })
    });
}

fn headers(c: &mut Criterion) {
    let limits = vec![Limit {
        name: "per_minute".into(),
        key: KeySpec { parts: vec![] },
        limit: NonZeroU64::new(100).unwrap(),
        window_ms: NonZeroU64::new(60_000).unwrap(),
        cost: None,
        shadow: false,
        algorithm: Default::default(),
        plan: false,
    }];
    let store = MemoryStore::new();
    let d = store.decide_now(
        1_800_000_000_000,
        &[LimitRequest {
            key: "k".into(),
            limit: 100,
            window_ms: 60_000,
            cost: 1,
            algorithm: Default::default(),
        }],
    );
    c.bench_function("headers/ratelimit_value", |b| {
        b.iter(|| tollgate::headers::ratelimit_value(black_box(&limits), black_box(&d)))
    });
}

criterion_group!(benches, memory_store, identity_key, headers);
criterion_main!(benches);
