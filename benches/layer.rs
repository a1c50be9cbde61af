//! The layer's overhead per request: a bare service, the same service
//! behind `RateLimitLayer` (in process: sliding window, then GCRA, keyed
//! by the client IP, always admitting), behind `tower_governor` (keyed
//! GCRA by peer IP, always admitting; its default middleware, then with
//! `.use_headers()`), and behind `RateLimitLayer` over a real
//! `redis-server` the bench starts on a free port (skipped, with a notice,
//! where there is none). Each request is one `oneshot` driven to
//! completion on a current-thread runtime, so every figure carries the
//! same driving cost; the difference to the bare service is the layer's.
//! Run with `cargo bench --bench layer`.
//!
//! The fair pair is tollgate against governor with headers: tollgate's
//! every answer carries `RateLimit` and `RateLimit-Policy` (the remaining
//! quota rendered per request), as governor's carries `x-ratelimit-limit`
//! and `x-ratelimit-remaining` with `.use_headers()`; the default governor
//! answers yes or no and adds no header. tollgate also runs the gateway's
//! decision phase (exemptions, overrides, plans), with nothing configured
//! for them here.

use std::hint::black_box;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

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

fn layer(rt: &tokio::runtime::Runtime, store: &str, algorithm: &str) -> RateLimitLayer {
    let yaml = format!(
        "{store}\nlimits: [ {{ name: per_ip, key: ip, limit: 1000000000, window: 1s, algorithm: {algorithm} }} ]\n"
    );
    rt.block_on(RateLimitLayer::from_yaml(&yaml).unwrap().build())
        .unwrap()
}

/// A `redis-server` on a free port, without persistence, killed on drop.
struct Redis {
    child: Child,
    port: u16,
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Redis {
    /// Starts one and waits for its `PONG`; `None` where `redis-server`
    /// cannot be run or never answers.
    fn start() -> Option<Redis> {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .ok()?
            .port();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .ok()?;
        let redis = Redis { child, port };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if redis.pong() {
                return Some(redis);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    fn pong(&self) -> bool {
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        let mut buf = [0u8; 7];
        s.write_all(b"PING\r\n").is_ok() && s.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
    }
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
        let service = layer(&rt, "", algorithm).layer(inner::<LayerRequestBody<Full<Bytes>>>());
        g.bench_function(format!("tollgate {algorithm}"), |b| {
            b.iter(|| {
                let res = rt.block_on(service.clone().oneshot(request(peer))).unwrap();
                assert!(res.status().is_success());
                assert!(res.headers().contains_key("ratelimit"));
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

    let config = GovernorConfigBuilder::default()
        .const_per_nanosecond(1)
        .const_burst_size(1_000_000_000)
        .use_headers()
        .finish()
        .unwrap();
    let governed = GovernorLayer::<_, _, axum::body::Body>::new(Arc::new(config))
        .layer(inner::<Full<Bytes>>());
    g.bench_function("tower_governor gcra headers", |b| {
        b.iter(|| {
            let res = rt
                .block_on(governed.clone().oneshot(request(peer)))
                .unwrap();
            assert!(res.status().is_success());
            assert!(res.headers().contains_key("x-ratelimit-remaining"));
            black_box(res)
        });
    });

    match Redis::start() {
        None => println!("layer/tollgate redis: skipped, no redis-server to start"),
        Some(redis) => {
            // The store of `benches/callgrind_paths.py redis`: every
            // decision goes to Redis (no deny cache to answer locally).
            let store = format!(
                "store: {{ redis: {{ url: \"redis://127.0.0.1:{}\", timeout: 2s }}, on_error: deny, deny_cache: 0 }}",
                redis.port
            );
            let layer = layer(&rt, &store, "sliding_window");
            let ready = rt.block_on(layer.limiter().health().wait_ready(Duration::from_secs(10)));
            assert!(ready, "the bench's redis-server answers the layer");
            let service = layer.layer(inner::<LayerRequestBody<Full<Bytes>>>());
            g.bench_function("tollgate redis sliding_window", |b| {
                b.iter(|| {
                    let res = rt.block_on(service.clone().oneshot(request(peer))).unwrap();
                    assert!(res.status().is_success());
                    assert!(res.headers().contains_key("ratelimit"));
                    black_box(res)
                });
            });
            drop(redis);
        }
    }
    g.finish();
}

criterion_group!(benches, overhead);
criterion_main!(benches);
