//! Micro-benchmarks of the per-request phases: one limiter decision on the
//! memory store against `governor`'s keyed limiter in the same run (one hot
//! key; 1,000,000 keys), a two-limit decision, identity extraction and key
//! building, route
//! matching and header rendering. Run with `cargo bench --bench limiter`.
//!
//! The two limiters do not do the same work: governor's keyed GCRA keeps
//! one `u64` per key in a `DashMap` and answers yes or no, while a tollgate
//! decision runs the configured algorithm (sliding window here) and returns
//! remaining, reset and retry-after for the response headers. The
//! comparison says what that costs per decision.

use std::hint::black_box;
use std::net::IpAddr;
use std::num::{NonZeroU32, NonZeroU64};

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use governor::{Quota, RateLimiter};
use http::{HeaderMap, HeaderValue, Method};
use tollgate::config::{HeaderMode, KeySource, KeySpec, Limit};
use tollgate::identity::{self, Caller, IdentityConfig};
use tollgate::limit::{LimitKind, LimitRequest, Mode};
use tollgate::routing::Router;
use tollgate::store::MemoryStore;

/// Keys in the large-keyspace runs.
const MANY: u32 = 1_000_000;

fn request(key: String) -> LimitRequest {
    LimitRequest {
        key: key.into(),
        // High enough that every decision admits: the admitted path is the
        // one every forwarded request takes.
        limit: 1_000_000_000_000,
        window_ms: 60_000,
        cost: 1,
        algorithm: Default::default(),
        mode: Default::default(),
    }
}

fn ip_key(i: u32) -> String {
    format!(
        "tollgate:{{ip=10.{}.{}.{}/32}}:api:per_ip",
        i >> 16,
        (i >> 8) & 255,
        i & 255
    )
}

fn decisions(c: &mut Criterion) {
    let mut g = c.benchmark_group("decision");

    // One hot key.
    let store = MemoryStore::new();
    let hot = [request(ip_key(1))];
    let mut now = 1_800_000_000_000u64;
    g.bench_function("tollgate_memory/hot_key", |b| {
        b.iter(|| {
            now += 1;
            black_box(store.decide_now(now, black_box(&hot)))
        })
    });
    let quota = Quota::per_second(NonZeroU32::MAX);
    let gov = RateLimiter::keyed(quota);
    let hot_key = ip_key(1);
    g.bench_function("governor_keyed/hot_key", |b| {
        b.iter(|| black_box(gov.check_key(black_box(&hot_key))))
    });
    // sync mode's decision: the same arithmetic on the fleet's last totals
    // plus what this instance has not sent (no exchange runs here).
    let table = tollgate::decision::sync::SyncTable::new();
    let synced = [LimitRequest {
        mode: Mode {
            kind: LimitKind::Synced(100),
            ..Mode::default()
        },
        ..request(ip_key(1))
    }];
    g.bench_function("tollgate_sync/hot_key", |b| {
        b.iter(|| {
            now += 1;
            black_box(table.decide(
                now,
                black_box(&synced),
                tollgate::decision::sync::Intent::Consume,
            ))
        })
    });

    // Two limits on one identity (a per-minute and a per-day limit, as
    // routes often have): the general path, which locks each shard once.
    let store = MemoryStore::new();
    let two = [
        request(ip_key(2)),
        LimitRequest {
            key: format!("{}:day", ip_key(2)).into(),
            window_ms: 86_400_000,
            ..request(ip_key(2))
        },
    ];
    g.bench_function("tollgate_memory/two_limits", |b| {
        b.iter(|| {
            now += 1;
            black_box(store.decide_now(now, black_box(&two)))
        })
    });

    // The same two limits when the per-day one has nothing left: every
    // decision is a deny, and the per-minute limit, which would admit, is
    // shown without the refused request.
    let store = MemoryStore::new();
    let denied = [
        request(ip_key(3)),
        LimitRequest {
            key: format!("{}:day", ip_key(3)).into(),
            limit: 1,
            window_ms: 86_400_000,
            ..request(ip_key(3))
        },
    ];
    assert!(store.decide_now(now, &denied).allowed);
    g.bench_function("tollgate_memory/two_limits_denied", |b| {
        b.iter(|| {
            now += 1;
            black_box(store.decide_now(now, black_box(&denied)))
        })
    });

    // 1,000,000 keys, visited in a scattered order so caches do not help.
    let store = MemoryStore::new();
    let keys: Vec<LimitRequest> = (0..MANY).map(|i| request(ip_key(i))).collect();
    for k in &keys {
        store.decide_now(now, std::slice::from_ref(k));
    }
    let mut i = 0usize;
    g.bench_function("tollgate_memory/1m_keys", |b| {
        b.iter(|| {
            i = (i + 7919) % keys.len();
            black_box(store.decide_now(now, std::slice::from_ref(&keys[i])))
        })
    });
    let gov = RateLimiter::keyed(quota);
    for k in &keys {
        let _ = gov.check_key(&k.key);
    }
    let mut i = 0usize;
    g.bench_function("governor_keyed/1m_keys", |b| {
        b.iter(|| {
            i = (i + 7919) % keys.len();
            black_box(gov.check_key(&keys[i].key))
        })
    });
    g.finish();
}

fn identity_key(c: &mut Criterion) {
    let cfg = tollgate::config::load::parse_str(
        "listen: 127.0.0.1:8080\nroutes: [{ name: api, match: { path_prefix: / }, upstream: http://127.0.0.1:1 }]",
    )
    .expect("bench config");
    let mut headers = HeaderMap::new();
    headers.insert("x-api-key", HeaderValue::from_static("a34e15c0"));
    headers.insert("user-agent", HeaderValue::from_static("wrk"));
    let peer: IpAddr = "192.0.2.7".parse().expect("address");
    c.bench_function("identity/extract", |b| {
        b.iter(|| {
            let idc = IdentityConfig {
                client_ip: &cfg.client_ip,
                api_keys: &cfg.api_keys,
                users: &cfg.users,
                plans_from: &cfg.plans_from,
            };
            black_box(identity::caller(idc, black_box(peer), black_box(&headers)).api_key)
        })
    });

    let caller = Caller {
        ip: identity::group("2001:db8::1".parse().expect("address"), 64),
        api_key: Some(b"a34e15c0"),
        user: None,
        plan: None,
        headers: &headers,
        body: None,
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

fn route_matching(c: &mut Criterion) {
    // Ten routes; the request takes the last but one, after hosts, methods,
    // exact paths and prefixes have been tried.
    let mut yaml = String::from("listen: 127.0.0.1:8080\nroutes:\n");
    for i in 0..8 {
        yaml.push_str(&format!(
            "  - {{ name: r{i}, match: {{ path_prefix: /v{i}/, methods: [POST] }}, upstream: http://127.0.0.1:1 }}\n"
        ));
    }
    yaml.push_str(
        "  - { name: api, match: { host: api.example.com, path_prefix: /api/ }, upstream: http://127.0.0.1:1 }\n\
         \x20 - { name: rest, match: { path_prefix: / }, upstream: http://127.0.0.1:1 }\n",
    );
    let cfg = tollgate::config::load::parse_str(&yaml).expect("bench config");
    let router = Router::new(&cfg);
    let req = http::Request::builder()
        .uri("/api/users/42")
        .header("host", "api.example.com:8080")
        .body(())
        .expect("request");
    c.bench_function("routing/find_10_routes", |b| {
        b.iter(|| {
            let req = black_box(&req);
            let target = tollgate::target::canonical(
                req.uri(),
                req.version(),
                req.headers(),
                &tollgate::target::PathRules::default(),
            )
            .expect("canonical target");
            black_box(
                router
                    .find(&Method::GET, target.host(), &target.match_path)
                    .map(|r| r.route.name.len()),
            )
        })
    });
}

fn headers(c: &mut Criterion) {
    let limits = vec![Limit::new(
        "per_minute",
        KeySpec { parts: vec![] },
        NonZeroU64::new(100).expect("non-zero"),
        NonZeroU64::new(60_000).expect("non-zero"),
    )];
    let store = MemoryStore::new();
    let d = store.decide_now(
        1_800_000_000_000,
        &[LimitRequest {
            key: "k".into(),
            limit: 100,
            window_ms: 60_000,
            cost: 1,
            algorithm: Default::default(),
            mode: Default::default(),
        }],
    );
    c.bench_function("headers/ratelimit_value", |b| {
        b.iter(|| tollgate::headers::ratelimit_value(black_box(&limits), black_box(&d.outcomes)))
    });
    let policy = tollgate::headers::policy_header(HeaderMode::Ietf, &limits);
    c.bench_function("headers/apply", |b| {
        b.iter_batched_ref(
            HeaderMap::new,
            |h| {
                tollgate::headers::apply(
                    HeaderMode::Ietf,
                    h,
                    policy.as_ref(),
                    black_box(&limits),
                    d.allowed,
                    Some(&d.outcomes),
                    1_800_000_000_000,
                )
            },
            BatchSize::SmallInput,
        )
    });
}

/// The canonical request target: the common case (a path already
/// canonical, borrowed without allocating) against a spelling the slow
/// path rewrites.
fn canonical_target(c: &mut Criterion) {
    let rules = tollgate::target::PathRules::default();
    for (name, path) in [
        ("clean", "/api/v1/users/42/orders"),
        ("dotted", "/api/v1/x/../users/%34%32//orders"),
    ] {
        c.bench_function(&format!("target/canonical_path_{name}"), |b| {
            b.iter(|| {
                black_box(
                    tollgate::target::canonical_path(black_box(path), &rules).map(|p| p.len()),
                )
            })
        });
    }
}

criterion_group!(
    benches,
    decisions,
    identity_key,
    route_matching,
    headers,
    canonical_target
);
criterion_main!(benches);
