//! tollgate inside an application: `RateLimitLayer` on a real axum app,
//! sharing a counter with a real gateway over a real `redis-server`; the
//! in-process store in an app alone; a gRPC call refused; the layer's
//! configuration errors with their positions; limits that read the
//! request body (`body`).

#[path = "support/mod.rs"]
mod support;

#[path = "embedding/body.rs"]
mod body;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::ConnectInfo;
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use tollgate::RateLimitLayer;
use tollgate::clock::ManualClock;
use tollgate::identity::Peer;
use tollgate::layer::LayerRequestBody;
use tower::ServiceExt;

use support::gateway::{Gateway, get, send};
use support::redis::RedisServer;

/// A fixed instant well inside a window, so no test straddles a boundary.
const T0: u64 = 1_800_000_000_000;

/// The app: `GET /` answers 200, behind `layer`.
fn app(layer: RateLimitLayer) -> axum::Router {
    axum::Router::new()
        .route("/", axum::routing::get(|| async { "hello from the app\n" }))
        .layer(layer)
}

/// Serves `router` on 127.0.0.1:0 with the connection's address as axum's
/// `ConnectInfo`; returns the address.
async fn serve(router: axum::Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind app");
    let addr = listener.local_addr().expect("bound");
    tokio::spawn(async move {
        let _ = axum::serve(
            listener,
            router.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await;
    });
    addr
}

/// What the app's and the gateway's limit share: 5 a minute by IP.
const SHARED: &str = "{ name: per_ip, share: per_ip, key: ip, limit: 5, window: 1m }";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_share_counts_once_across_the_gateway_and_the_app() {
    let redis = RedisServer::start().await;
    let clock = Arc::new(ManualClock::new(T0));
    // The gateway's file has more limits (their digests are worked out
    // over the whole file) and readable keys; the share's key does not
    // depend on either.
    let gateway_yaml = format!(
        r#"
listen: 127.0.0.1:0
store:
  redis: {{ url: "{url}" }}
  readable_keys: true
routes:
  - name: other
    match: {{ path_prefix: /other }}
    respond: {{ status: 200 }}
    limits: [ {{ name: a, key: ip, limit: 50, window: 1m }} ]
  - name: api
    match: {{ path_prefix: / }}
    respond: {{ status: 200, body: "hello from the gateway\n" }}
    limits: [ {{ name: b, key: ip, limit: 100, window: 1h }}, {SHARED} ]
"#,
        url = redis.url()
    );
    let gw = Gateway::start_with_clock(&gateway_yaml, clock.clone()).await;
    let layer = RateLimitLayer::from_yaml(&format!(
        "store:\n  redis: {{ url: \"{url}\" }}\nlimits: [ {SHARED} ]\n",
        url = redis.url()
    ))
    .expect("the layer's file")
    .peer_from(|ext| ext.get::<ConnectInfo<SocketAddr>>().map(|c| c.0))
    .clock(clock.clone())
    .build()
    .await
    .expect("the layer");
    assert!(
        layer
            .limiter()
            .health()
            .wait_ready(std::time::Duration::from_secs(5))
            .await,
        "the layer's Redis answers"
    );
    let app = serve(app(layer)).await;

    let mut replies = Vec::new();
    for to in [gw.addr, gw.addr, gw.addr, app, app, app] {
        let r = send(to, get("/", &[])).await;
        assert!(r.header("ratelimit").is_some(), "RateLimit on every answer");
        replies.push(r);
    }
    let statuses: Vec<StatusCode> = replies.iter().map(|r| r.status).collect();
    let admitted = statuses.iter().filter(|s| **s == StatusCode::OK).count();
    assert_eq!(admitted, 5, "{statuses:?}");
    assert_eq!(statuses[5], StatusCode::TOO_MANY_REQUESTS, "{statuses:?}");
    let refused = replies.pop();
    let refused = refused.expect("a refusal");
    assert_eq!(
        refused.header("content-type"),
        Some("application/problem+json")
    );
    assert_eq!(
        refused.header("ratelimit-policy"),
        Some(r#""per_ip";q=5;w=60"#)
    );
    assert!(
        refused
            .header("ratelimit")
            .is_some_and(|v| v.starts_with(r#""per_ip";r=0;"#)),
        "{:?}",
        refused.header("ratelimit")
    );
    assert!(refused.header("retry-after").is_some());
    // And the gateway, the next time, is refused too: one counter.
    let r = send(gw.addr, get("/", &[])).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    // The key is the prefix, the identity's digest and the share.
    let mut conn = redis.connection().await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut conn)
        .await
        .expect("KEYS");
    let keys: Vec<&String> = keys.iter().filter(|k| k.contains("@per_ip")).collect();
    assert!(!keys.is_empty(), "the share's key in Redis");
    for k in keys {
        assert!(!k.contains("ip="), "a share's identity is a digest: {k}");
    }
}

#[tokio::test]
async fn the_in_process_store_limits_an_app_alone() {
    let layer =
        RateLimitLayer::from_yaml("limits: [ { name: per_ip, key: ip, limit: 5, window: 1m } ]\n")
            .expect("the layer's file")
            .clock(Arc::new(ManualClock::new(T0)))
            .build()
            .await
            .expect("the layer");
    let app = app(layer);
    let from = |ip: [u8; 4]| {
        let mut req = Request::get("/").body(axum::body::Body::empty()).unwrap();
        req.extensions_mut()
            .insert(Peer(SocketAddr::from((ip, 40_000))));
        req
    };
    for i in 0..5 {
        let res = app.clone().oneshot(from([10, 0, 0, 1])).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK, "request {i}");
        let want = format!(r#""per_ip";r={};"#, 4 - i);
        let got = res.headers()["ratelimit"].to_str().unwrap();
        assert!(got.starts_with(&want), "{got}");
        let body = res.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body, Bytes::from_static(b"hello from the app\n"));
    }
    let res = app.clone().oneshot(from([10, 0, 0, 1])).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(res.headers()["content-type"], "application/problem+json");
    assert!(res.headers().contains_key("retry-after"));
    assert!(res.headers().contains_key("ratelimit"));
    // Another address is another caller.
    let res = app.oneshot(from([10, 0, 0, 2])).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
}

#[tokio::test]
async fn an_apps_own_key_names_the_caller() {
    let layer = RateLimitLayer::from_yaml(
        "limits: [ { name: per_tenant, key: user, limit: 1, window: 1m } ]\n",
    )
    .expect("the layer's file")
    .key_from(|parts| {
        parts
            .headers
            .get("x-tenant")
            .and_then(|v| v.to_str().ok())
            .map(|t| Arc::from(format!("tenant-{t}")))
    })
    .clock(Arc::new(ManualClock::new(T0)))
    .build()
    .await
    .expect("the layer");
    let app = app(layer);
    let as_tenant = |t: &str| {
        Request::get("/")
            .header("x-tenant", t)
            .body(axum::body::Body::empty())
            .unwrap()
    };
    let first = app.clone().oneshot(as_tenant("a")).await.unwrap();
    let again = app.clone().oneshot(as_tenant("a")).await.unwrap();
    let other = app.oneshot(as_tenant("b")).await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(again.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(other.status(), StatusCode::OK);
}

#[tokio::test]
async fn a_layer_reads_the_api_key_where_its_limits_or_exemptions_name_it() {
    // Limits by IP alone: an exempt API key still lets its caller through.
    let layer = RateLimitLayer::from_yaml(
        "exempt: { api_keys: [internal-batch] }\n\
         limits: [ { name: per_ip, key: ip, limit: 1, window: 1m } ]\n",
    )
    .expect("the layer's file")
    .clock(Arc::new(ManualClock::new(T0)))
    .build()
    .await
    .expect("the layer");
    let by_ip = app(layer);
    let with_key = |key: &str| {
        let mut req = Request::get("/")
            .header("x-api-key", key)
            .body(axum::body::Body::empty())
            .unwrap();
        req.extensions_mut()
            .insert(Peer(SocketAddr::from(([10, 0, 0, 3], 40_000))));
        req
    };
    for _ in 0..3 {
        let res = by_ip
            .clone()
            .oneshot(with_key("internal-batch"))
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK);
    }
    let res = by_ip.clone().oneshot(with_key("k1")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let res = by_ip.oneshot(with_key("k2")).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS, "one address");

    // Limits by API key: each key is a caller of its own.
    let layer = layer_of("  - { name: per_key, key: api_key | ip, limit: 1, window: 1m }\n").await;
    let by_key = app(layer);
    let first = by_key.clone().oneshot(with_key("k1")).await.unwrap();
    let again = by_key.clone().oneshot(with_key("k1")).await.unwrap();
    let other = by_key.oneshot(with_key("k2")).await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(again.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(other.status(), StatusCode::OK);
}

#[tokio::test]
async fn a_grpc_call_is_refused_with_resource_exhausted_and_pushback() {
    let layer =
        RateLimitLayer::from_yaml("limits: [ { name: per_ip, key: ip, limit: 1, window: 1m } ]\n")
            .expect("the layer's file")
            .clock(Arc::new(ManualClock::new(T0)))
            .build()
            .await
            .expect("the layer");
    // A gRPC service's place: what the layer wraps answers every call OK.
    let inner = tower::service_fn(|_req: Request<LayerRequestBody<Full<Bytes>>>| async {
        let mut res = http::Response::new(Full::new(Bytes::new()));
        res.headers_mut()
            .insert("content-type", "application/grpc".parse().unwrap());
        res.headers_mut()
            .insert("grpc-status", "0".parse().unwrap());
        Ok::<_, std::convert::Infallible>(res)
    });
    let service = tower::Layer::layer(&layer, inner);
    let call = || {
        Request::post("/echo.Echo/Say")
            .version(http::Version::HTTP_2)
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(Full::new(Bytes::from_static(b"\0\0\0\0\0")))
            .unwrap()
    };
    let ok = service.clone().oneshot(call()).await.unwrap();
    assert_eq!(ok.headers()["grpc-status"], "0");
    let refused = service.oneshot(call()).await.unwrap();
    // gRPC's refusal: HTTP 200 and the status in a trailers-only answer.
    assert_eq!(refused.status(), StatusCode::OK);
    assert_eq!(refused.headers()["grpc-status"], "8", "RESOURCE_EXHAUSTED");
    let pushback = refused.headers()["grpc-retry-pushback-ms"]
        .to_str()
        .unwrap()
        .parse::<u64>()
        .unwrap();
    // A sliding window of a minute admits again within two.
    assert!(pushback > 0 && pushback <= 120_000, "{pushback}");
}

#[test]
fn a_layers_config_errors_carry_line_and_column() {
    let yaml = "store: {}\nlimits:\n  - { name: per_ip, key: ip, limit: 5, window: 5 minutes }\n";
    let err = RateLimitLayer::from_yaml(yaml).expect_err("a bad window");
    let tollgate::layer::LayerError::Config(errors) = err else {
        panic!("a configuration error: {err}");
    };
    let e = &errors.0[0];
    assert_eq!(e.path, "limits[0].window");
    assert_eq!((e.line, e.column), (Some(3), Some(48)), "{e}");
    // Without limits there is nothing to apply.
    let Err(tollgate::layer::LayerError::Config(errors)) = RateLimitLayer::from_yaml("store: {}\n")
    else {
        panic!("limits are required");
    };
    assert!(errors.0[0].message.contains("limits"), "{}", errors.0[0]);
    // The gateway's file keeps its limits under a route.
    let gateway =
        "listen: 127.0.0.1:0\nroutes: []\nlimits: [ { name: a, key: ip, limit: 5, window: 1m } ]\n";
    let errors = tollgate::config::load::parse_str(gateway).expect_err("top-level limits");
    let e = errors
        .0
        .iter()
        .find(|e| e.path == "limits")
        .expect("at limits");
    assert_eq!(e.line, Some(3), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_share_defined_apart_is_told_not_counted_twice_in_silence() {
    let redis = RedisServer::start().await;
    let store = format!("store:\n  redis: {{ url: \"{}\" }}\n", redis.url());
    // The app counts the share by 6 a minute, and checks first.
    let layer = RateLimitLayer::from_yaml(&format!(
        "{store}limits: [ {{ name: per_ip, share: per_ip, key: ip, limit: 6, window: 1m }} ]\n"
    ))
    .expect("the layer's file")
    .build()
    .await
    .expect("the layer");
    let mut conn = redis.connection().await;
    let key = "tg:{@per_ip}definition";
    let written: String = support::wait::value("the app's fingerprint", SECONDS, || {
        let mut conn = conn.clone();
        async move {
            redis::cmd("GET")
                .arg(key)
                .query_async::<String>(&mut conn)
                .await
        }
    })
    .await;
    assert_eq!(written.len(), 12);
    // A gateway that agrees is quiet; one with 5 a minute is told.
    let agreeing = Gateway::start(&format!(
        "listen: 127.0.0.1:0\n{store}routes:\n  - name: api\n    match: {{ path_prefix: / }}\n    respond: {{ status: 200 }}\n    limits: [ {{ name: x, share: per_ip, key: ip, limit: 6, window: 1m }} ]\n"
    ))
    .await;
    let apart = Gateway::start(&format!(
        "listen: 127.0.0.1:0\n{store}routes:\n  - name: api\n    match: {{ path_prefix: / }}\n    respond: {{ status: 200 }}\n    limits: [ {SHARED} ]\n"
    ))
    .await;
    support::wait::until("the mismatch counted", SECONDS, || async {
        apart
            .inner
            .metrics()
            .render()
            .contains("tollgate_share_mismatches_total 1")
    })
    .await;
    // The agreeing one has checked by now too (it started first).
    let checked: String = redis::cmd("GET")
        .arg(key)
        .query_async(&mut conn)
        .await
        .expect("GET");
    assert_eq!(checked, written, "the first fingerprint stands");
    assert!(
        agreeing
            .inner
            .metrics()
            .render()
            .contains("tollgate_share_mismatches_total 0")
    );
    drop(layer);
}

const SECONDS: std::time::Duration = std::time::Duration::from_secs(5);

/// The remaining count `RateLimit` gives for `name`.
fn remaining(res: &http::Response<impl Sized>, name: &str) -> u64 {
    let got = res.headers()["ratelimit"].to_str().unwrap();
    let at = got
        .find(&format!(r#""{name}";r="#))
        .expect("the limit's item")
        + name.len()
        + 5;
    got[at..]
        .split(';')
        .next()
        .and_then(|r| r.parse().ok())
        .expect("a count")
}

/// A layer of `limits` on the in-process store at `T0`.
async fn layer_of(limits: &str) -> RateLimitLayer {
    RateLimitLayer::from_yaml(&format!("limits:\n{limits}"))
        .expect("the layer's file")
        .clock(Arc::new(ManualClock::new(T0)))
        .build()
        .await
        .expect("the layer")
}

fn from_peer() -> Request<Full<Bytes>> {
    let mut req = Request::get("/").body(Full::new(Bytes::new())).unwrap();
    req.extensions_mut()
        .insert(Peer(SocketAddr::from(([10, 0, 0, 9], 40_000))));
    req
}

/// The layer decides an admitted request to limits the in-process store
/// alone answers without the rest of the decision phase: its answers must
/// be the whole phase's. The same limits are asked of two layers, one of
/// which also has an `exempt:` (naming nobody here), which takes every
/// request through the whole phase; they must say the same, request by
/// request, admitted and refused, for every algorithm and with two limits,
/// counted by address and (a share's) by the key's text.
#[tokio::test]
async fn an_admitted_request_is_answered_as_the_whole_phase_would() {
    let algorithms = ["sliding_window", "fixed_window", "sliding_log", "gcra"];
    for (algorithm, share) in algorithms
        .into_iter()
        .flat_map(|a| [(a, ""), (a, ", share: burst")])
    {
        let limits = format!(
            "  - {{ name: per_ip, key: ip, limit: 4, window: 1m, algorithm: {algorithm} }}\n  \
             - {{ name: burst, key: ip, limit: 3, window: 10s, algorithm: {algorithm}, cost: 1{share} }}\n"
        );
        let alone = tower::Layer::layer(&layer_of(&limits).await, echo_ok());
        let whole = tower::Layer::layer(
            &layer_of(&format!("{limits}exempt: {{ ips: [192.0.2.1/32] }}\n")).await,
            echo_ok(),
        );
        for i in 0..6 {
            let a = alone.clone().oneshot(from_peer()).await.unwrap();
            let w = whole.clone().oneshot(from_peer()).await.unwrap();
            let what = format!("{algorithm}{share}, request {i}");
            assert_eq!(a.status(), w.status(), "{what}");
            assert_eq!(a.status() == StatusCode::OK, i < 3, "{what}");
            for name in ["ratelimit", "ratelimit-policy", "retry-after"] {
                assert_eq!(
                    a.headers().get(name),
                    w.headers().get(name),
                    "{what}: {name}"
                );
            }
        }
    }
}

/// A service answering `ok`.
fn echo_ok() -> impl tower::Service<
    Request<LayerRequestBody<Full<Bytes>>>,
    Response = http::Response<Full<Bytes>>,
    Error = std::convert::Infallible,
    Future = impl Send,
> + Clone {
    tower::service_fn(|_req: Request<LayerRequestBody<Full<Bytes>>>| async {
        Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(Bytes::from_static(b"ok"))))
    })
}

#[tokio::test]
async fn a_cost_from_a_header_is_settled_when_the_inner_service_answers() {
    let layer = layer_of(
        "  - { name: tokens, key: ip, limit: 100, window: 1m, algorithm: fixed_window,\n      cost: { reserve: 50, from_header: x-used } }\n",
    )
    .await;
    let inner = tower::service_fn(|_req: Request<LayerRequestBody<Full<Bytes>>>| async {
        let mut res = http::Response::new(Full::new(Bytes::from_static(b"ok")));
        res.headers_mut().insert("x-used", "10".parse().unwrap());
        Ok::<_, std::convert::Infallible>(res)
    });
    let service = tower::Layer::layer(&layer, inner);
    // Each request reserves 50 and settles 10: without the settlement the
    // third would find 100 used and be refused.
    for (i, left) in [50, 40, 30].into_iter().enumerate() {
        let res = service.clone().oneshot(from_peer()).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK, "request {i}");
        assert_eq!(remaining(&res, "tokens"), left, "request {i}");
    }
}

/// The frames of a body, one by one.
type Frames = std::vec::IntoIter<Result<http_body::Frame<Bytes>, std::convert::Infallible>>;

/// A body of `ok`, then `trailers`, frame by frame.
fn with_trailers(
    trailers: http::HeaderMap,
) -> http_body_util::StreamBody<futures_util::stream::Iter<Frames>> {
    http_body_util::StreamBody::new(futures_util::stream::iter(vec![
        Ok(http_body::Frame::data(Bytes::from_static(b"ok"))),
        Ok(http_body::Frame::trailers(trailers)),
    ]))
}

#[tokio::test]
async fn a_cost_from_a_trailer_is_settled_when_the_body_ends() {
    let layer = layer_of(
        "  - { name: tokens, key: ip, limit: 100, window: 1m, algorithm: fixed_window,\n      cost: { reserve: 60, from_trailer: x-used } }\n",
    )
    .await;
    let inner = tower::service_fn(|_req: Request<LayerRequestBody<Full<Bytes>>>| async {
        let mut trailers = http::HeaderMap::new();
        trailers.insert("x-used", "5".parse().unwrap());
        Ok::<_, std::convert::Infallible>(http::Response::new(with_trailers(trailers)))
    });
    let service = tower::Layer::layer(&layer, inner);
    let first = service.clone().oneshot(from_peer()).await.unwrap();
    assert_eq!(remaining(&first, "tokens"), 40);
    // Until the body ends the reservation stands: a second 60 does not fit.
    let held = service.clone().oneshot(from_peer()).await.unwrap();
    assert_eq!(held.status(), StatusCode::TOO_MANY_REQUESTS);
    let collected = first.into_body().collect().await.unwrap();
    assert_eq!(collected.trailers().unwrap()["x-used"], "5");
    // The settlement runs in a task of its own once the body has ended.
    support::wait::until(
        "the trailer's amount settled",
        std::time::Duration::from_secs(5),
        || {
            let service = service.clone();
            async move {
                let res = service.oneshot(from_peer()).await.unwrap();
                res.status() == StatusCode::OK
            }
        },
    )
    .await;
}

#[tokio::test]
async fn a_concurrency_slot_is_held_until_the_response_body_ends() {
    let layer = layer_of("  - { name: at_once, key: ip, concurrency: 1 }\n").await;
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(1);
    let rx = Arc::new(tokio::sync::Mutex::new(Some(rx)));
    let inner = tower::service_fn(move |_req: Request<LayerRequestBody<Full<Bytes>>>| {
        let rx = rx.clone();
        async move {
            // The first answer streams from the channel; the others are
            // whole.
            let body = match rx.lock().await.take() {
                Some(rx) => http_body_util::Either::Left(http_body_util::StreamBody::new(
                    futures_util::stream::unfold(rx, |mut rx| async move {
                        let chunk = rx.recv().await?;
                        Some((
                            Ok::<_, std::convert::Infallible>(http_body::Frame::data(chunk)),
                            rx,
                        ))
                    }),
                )),
                None => http_body_util::Either::Right(Full::new(Bytes::from_static(b"ok"))),
            };
            Ok::<_, std::convert::Infallible>(http::Response::new(body))
        }
    });
    let service = tower::Layer::layer(&layer, inner);
    let streaming = service.clone().oneshot(from_peer()).await.unwrap();
    assert_eq!(streaming.status(), StatusCode::OK);
    // The head has gone out, the body has not ended: the slot is held.
    let refused = service.clone().oneshot(from_peer()).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    let mut body = Box::pin(streaming.into_body());
    tx.send(Bytes::from_static(b"last")).await.unwrap();
    drop(tx);
    let frame = body.frame().await.unwrap().unwrap();
    assert_eq!(frame.into_data().unwrap(), "last");
    assert!(body.frame().await.is_none(), "the body has ended");
    support::wait::until(
        "the slot given back",
        std::time::Duration::from_secs(5),
        || {
            let service = service.clone();
            async move {
                let res = service.oneshot(from_peer()).await.unwrap();
                res.status() == StatusCode::OK
            }
        },
    )
    .await;
}
