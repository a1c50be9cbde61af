//! The layer's overhead per request, in process: a bare service, the same
//! service behind `RateLimitLayer` (sliding window, then GCRA, keyed by
//! the client IP, always admitting), and behind `tower_governor` (keyed
//! GCRA by peer IP, always admitting), in one run. Each request is one
//! `oneshot` driven to completion on a current-thread runtime, so every
//! figure carries the same driving cost; the difference to the bare
//! service is the layer's. Run with `cargo bench --bench layer`.
//!
//! They do not do the same work: tollgate's answer carries `RateLimit` and
//! `RateLimit-Policy` headers (rendered per request) and runs the
//! gateway's decision phase (exemptions, overrides, plans); governor's
//! default middleware answers yes or no and adds no header.

use std::hint::black_box;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::ConnectInfo;
use bytes::Bytes;
use criterion::{Criterion, criterion_group, criterion_main};
use http::{Request, Response};
use http_body_util::Full;
use tollgate::RateLimitLayer;
use tollgate::identity::Peer;
use tollgate::layer::LayerRequestBody;
use tower::{Layer, ServiceExt};
use tower_governor::GovernorLayer;
use tower_governor::governor::GovernorConfigBuilder;

/// A service answering `ok`, of requests with bodies of type `B`.
fn inner<B: Send + 'static>() -> impl tower::Service<
    Request<B>,
    Response = Response<axum::body::Body>,
    Error = std::convert::Infallible,
    Future = impl Send,
> + Clone {
    tower::service_fn(|_req: Request<B>| async {
        Ok::<_, std::convert::Infallible>(Response::new(axum::body::Body::from("ok")))
    })
}

fn request(peer: SocketAddr) -> Request<Full<Bytes>> {
    let mut req = Request::get("/").body(Full::new(Bytes::new())).unwrap();
    req.extensions_mut().insert(Peer(peer));
    req.extensions_mut().insert(ConnectInfo(peer));
    req
}

fn layer(rt: &tokio::runtime::Runtime, algorithm: &str) -> RateLimitLayer {
    let yaml = format!(
        "limits: [ {{ name: per_ip, key: ip, limit: 1000000000, window: 1s, algorithm: {algorithm} }} ]\n"
    );
    rt.block_on(RateLimitLayer::from_yaml(&yaml).unwrap().build())
        .unwrap()
}

fn overhead(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let peer: SocketAddr = "10.0.0.1:40000".parse().unwrap();
    let mut g = c.benchmark_group("layer");

    let bare = inner::<Full<Bytes>>();
    g.bench_function("bare service", |b| {
        b.iter(|| black_box(rt.block_on(bare.clone().oneshot(request(peer))).unwrap()));
    });

    for algorithm in ["sliding_window", "gcra"] {
        let service = layer(&rt, algorithm).layer(inner::<LayerRequestBody<Full<Bytes>>>());
        g.bench_function(format!("tollgate {algorithm}"), |b| {
            b.iter(|| {
                let res = rt.block_on(service.clone().oneshot(request(peer))).unwrap();
                assert!(res.status().is_success());
                black_box(res)
            });
        });
    }

    let config = GovernorConfigBuilder::default()
        .const_per_nanosecond(1)
        .const_burst_size(1_000_000_000)
        .finish()
        .unwrap();
    let governed = GovernorLayer::<_, _, axum::body::Body>::new(Arc::new(config))
        .layer(inner::<Full<Bytes>>());
    g.bench_function("tower_governor gcra", |b| {
        b.iter(|| {
            let res = rt
                .block_on(governed.clone().oneshot(request(peer)))
                .unwrap();
            assert!(res.status().is_success());
            black_box(res)
        });
    });
    g.finish();
}

criterion_group!(benches, overhead);
criterion_main!(benches);
