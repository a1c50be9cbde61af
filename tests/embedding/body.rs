//! Limits that read the request body, in the layer: a `json:` key, a
//! `json` reservation, a body past the cap, a request byte quota; and the
//! inner service reading the very bytes (and trailers) the client sent.

use std::convert::Infallible;
use std::net::SocketAddr;

use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body::Frame;
use http_body_util::{BodyExt, Full, StreamBody};
use tollgate::layer::LayerRequestBody;
use tollgate::pipeline::body::BODY_CAP;
use tower::ServiceExt;

use super::support::gateway::send;
use super::{SECONDS, layer_of, serve};

type Frames = std::vec::IntoIter<Result<Frame<Bytes>, Infallible>>;

/// A body of `frames`, frame by frame, of no announced length.
type Streamed = StreamBody<futures_util::stream::Iter<Frames>>;

fn streamed(frames: Vec<Frame<Bytes>>) -> Streamed {
    StreamBody::new(futures_util::stream::iter(
        frames.into_iter().map(Ok).collect::<Vec<_>>(),
    ))
}

/// The inner service: answers with the body it read, `x-replayed` (1 when
/// the layer read the body ahead) and `x-trailers` (the trailers' names).
async fn echo<B>(
    req: Request<LayerRequestBody<B>>,
) -> Result<http::Response<Full<Bytes>>, Infallible>
where
    B: http_body::Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Debug,
{
    let replayed = if req.body().is_replayed() { "1" } else { "0" };
    let collected = req.into_body().collect().await.expect("the request body");
    let trailers = collected
        .trailers()
        .map(|t| t.keys().map(|k| k.as_str()).collect::<Vec<_>>().join(","))
        .unwrap_or_default();
    let mut res = http::Response::new(Full::new(collected.to_bytes()));
    res.headers_mut()
        .insert("x-replayed", replayed.parse().unwrap());
    res.headers_mut()
        .insert("x-trailers", trailers.parse().unwrap());
    Ok(res)
}

/// The remaining count `RateLimit` gives for `name` in `headers`.
fn left(headers: &HeaderMap, name: &str) -> u64 {
    let got = headers["ratelimit"].to_str().unwrap();
    let item = format!(r#""{name}";r="#);
    let at = got.find(&item).expect("the limit's item") + item.len();
    got[at..]
        .split(';')
        .next()
        .and_then(|r| r.parse().ok())
        .expect("a count")
}

fn post(body: &'static str) -> Request<Full<Bytes>> {
    Request::post("/")
        .header("host", "app.test")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .unwrap()
}

#[tokio::test]
async fn a_json_key_counts_each_value_of_the_field_apart() {
    let layer =
        layer_of("  - { name: by_model, key: \"json:model\", limit: 2, window: 1m }\n").await;
    // A real axum app on a socket, echoing what it read.
    let router = axum::Router::new()
        .route("/", axum::routing::post(|body: Bytes| async move { body }))
        .layer(layer);
    let app: SocketAddr = serve(router).await;
    let a = r#"{"model":"a","messages":[{"role":"user","content":"hi"}]}"#;
    let b = r#"{"messages":[],"model":"b"}"#;
    for (i, body, left_after) in [(0, a, 1), (1, b, 1), (2, a, 0)] {
        let r = send(app, post(body)).await;
        assert_eq!(r.status, StatusCode::OK, "request {i}: {}", r.text());
        assert_eq!(r.body, body.as_bytes(), "the app read the bytes sent");
        assert_eq!(left(&r.headers, "by_model"), left_after, "request {i}");
    }
    // The third of model a is one too many; b still has room.
    let refused = send(app, post(a)).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        refused.header("content-type"),
        Some("application/problem+json")
    );
    assert!(refused.header("retry-after").is_some());
    assert!(refused.text().contains("by_model"), "{}", refused.text());
    let r = send(app, post(b)).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(left(&r.headers, "by_model"), 0);
}

#[tokio::test]
async fn a_json_reservation_takes_the_bodys_field() {
    let layer = layer_of(
        "  - { name: tokens, key: ip, limit: 100, window: 1m, algorithm: fixed_window,\n      cost: { reserve: { json: max_tokens, default: 10 }, from_header: x-used } }\n",
    )
    .await;
    let service = tower::Layer::layer(&layer, tower::service_fn(echo::<Full<Bytes>>));
    // The inner service reports no `x-used`: each reservation stands.
    let steps = [
        (r#"{"max_tokens":60}"#, StatusCode::OK, Some(40)),
        (r#"{"max_tokens":50}"#, StatusCode::TOO_MANY_REQUESTS, None),
        // Without the field, or without JSON: the default.
        (r#"{"prompt":"x"}"#, StatusCode::OK, Some(30)),
        ("max_tokens=5", StatusCode::OK, Some(20)),
        (r#"{"max_tokens":20}"#, StatusCode::OK, Some(0)),
    ];
    for (body, status, left_after) in steps {
        let res = service.clone().oneshot(post(body)).await.unwrap();
        assert_eq!(res.status(), status, "{body}");
        if let Some(n) = left_after {
            assert_eq!(left(res.headers(), "tokens"), n, "{body}");
            assert_eq!(res.headers()["x-replayed"], "1");
            let got = res.into_body().collect().await.unwrap().to_bytes();
            assert_eq!(
                got,
                body.as_bytes(),
                "the inner service read the bytes sent"
            );
        }
    }
}

/// A JSON body of `model` padded past the cap, in frames of 64 KiB.
fn past_the_cap(model: &str) -> Vec<u8> {
    let mut body = format!(r#"{{"model":"{model}","pad":""#).into_bytes();
    body.resize(BODY_CAP + BODY_CAP / 4, b'x');
    body.extend_from_slice(b"\"}");
    body
}

#[tokio::test]
async fn a_body_past_the_cap_goes_on_unread_with_its_fields_absent() {
    let layer =
        layer_of("  - { name: by_model, key: \"json:model\", limit: 1, window: 1m }\n").await;
    let service = tower::Layer::layer(&layer, tower::service_fn(echo::<Streamed>));
    let call = |frames| Request::post("/").body(streamed(frames)).unwrap();
    // Streamed, of no announced length: read up to the cap, then the
    // bytes read are replayed and the rest follows.
    let big = past_the_cap("a");
    let frames = big
        .chunks(64 * 1024)
        .map(|c| Frame::data(Bytes::copy_from_slice(c)))
        .collect();
    let res = service.clone().oneshot(call(frames)).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.headers()["x-replayed"], "1");
    let got = res.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(got.len(), big.len());
    assert!(
        got == big,
        "the inner service read the bytes sent, in order"
    );
    // Unread, the field is absent: the key falls back to the one bucket
    // of callers without it, which the first has used up — as the
    // gateway counts a body past the cap.
    let frames = vec![Frame::data(Bytes::from(past_the_cap("b")))];
    let res = service.clone().oneshot(call(frames)).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    // A body within the cap is read: model a has its own count. Its
    // frames and trailers reach the inner service as they were sent.
    let mut trailers = HeaderMap::new();
    trailers.insert("x-checksum", "1".parse().unwrap());
    let frames = vec![
        Frame::data(Bytes::from_static(br#"{"model":"#)),
        Frame::data(Bytes::from_static(br#""a"}"#)),
        Frame::trailers(trailers),
    ];
    let res = service.clone().oneshot(call(frames)).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.headers()["x-trailers"], "x-checksum");
    let got = res.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(got, &br#"{"model":"a"}"#[..]);
}

#[tokio::test]
async fn a_body_announced_past_the_cap_is_not_read() {
    let layer =
        layer_of("  - { name: by_model, key: \"json:model\", limit: 1, window: 1m }\n").await;
    let service = tower::Layer::layer(&layer, tower::service_fn(echo::<Full<Bytes>>));
    let big = Bytes::from(past_the_cap("a"));
    let call = || {
        Request::post("/")
            .header("content-length", big.len())
            .body(Full::new(big.clone()))
            .unwrap()
    };
    let res = service.clone().oneshot(call()).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.headers()["x-replayed"], "0", "passed as it is");
    assert_eq!(res.into_body().collect().await.unwrap().to_bytes(), big);
    let res = service.oneshot(call()).await.unwrap();
    assert_eq!(
        res.status(),
        StatusCode::TOO_MANY_REQUESTS,
        "one absent bucket"
    );
}

#[tokio::test]
async fn a_request_byte_quota_counts_what_the_inner_service_read() {
    const LIMIT: u64 = 1_000_000;
    let layer = layer_of(&format!(
        "  - {{ name: up, key: ip, limit: {LIMIT}, window: 1h, algorithm: fixed_window, bytes: request }}\n"
    ))
    .await;
    let service = tower::Layer::layer(&layer, tower::service_fn(echo::<Streamed>));
    // Of no announced length: 1 reserved, 3000 read.
    let frames = (0..3)
        .map(|_| Frame::data(Bytes::from(vec![b'y'; 1000])))
        .collect();
    let res = service
        .clone()
        .oneshot(Request::post("/").body(streamed(frames)).unwrap())
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.headers()["x-replayed"], "0", "counted, not read ahead");
    assert_eq!(left(res.headers(), "up"), LIMIT - 1, "1 reserved");
    assert_eq!(
        res.into_body().collect().await.unwrap().to_bytes().len(),
        3000
    );
    // Announced: its length reserved, and read.
    let frames = vec![Frame::data(Bytes::from(vec![b'z'; 5000]))];
    let req = Request::post("/")
        .header("content-length", "5000")
        .body(streamed(frames))
        .unwrap();
    let res = service.clone().oneshot(req).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert!(
        left(res.headers(), "up") <= LIMIT - 5000,
        "its length reserved"
    );
    drop(res);
    // A probe reserves 1 and is refunded once its empty body is read.
    let used = || {
        let service = service.clone();
        async move {
            let probe = Request::get("/").body(streamed(Vec::new())).unwrap();
            let res = service.oneshot(probe).await.unwrap();
            LIMIT - 1 - left(res.headers(), "up")
        }
    };
    until_used(8000, used).await;
}

/// Waits until `used` reports `want` (the settlements run in tasks of
/// their own once the answers' bodies end).
async fn until_used<F, Fut>(want: u64, mut used: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = u64>,
{
    super::support::wait::until(&format!("{want} bytes counted"), SECONDS, || {
        let got = used();
        async move { got.await == want }
    })
    .await;
}

#[tokio::test]
async fn a_body_that_fails_while_read_reaches_the_inner_service_failing() {
    let layer =
        layer_of("  - { name: by_model, key: \"json:model\", limit: 5, window: 1m }\n").await;
    type Failing = StreamBody<
        futures_util::stream::Iter<std::vec::IntoIter<Result<Frame<Bytes>, std::io::Error>>>,
    >;
    // The inner service answers 400 with what its body said, as an
    // application's would.
    let inner = tower::service_fn(|req: Request<LayerRequestBody<Failing>>| async move {
        let res = match req.into_body().collect().await {
            Ok(c) => http::Response::new(Full::new(c.to_bytes())),
            Err(e) => {
                let mut res = http::Response::new(Full::new(Bytes::from(e.to_string())));
                *res.status_mut() = StatusCode::BAD_REQUEST;
                res
            }
        };
        Ok::<_, Infallible>(res)
    });
    let service = tower::Layer::layer(&layer, inner);
    let body: Failing = StreamBody::new(futures_util::stream::iter(vec![
        Ok(Frame::data(Bytes::from_static(br#"{"model":"#))),
        Err(std::io::Error::other("the client reset")),
    ]));
    let res = service
        .oneshot(Request::post("/").body(body).unwrap())
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    // Decided without the field (the body did not end whole).
    assert_eq!(left(res.headers(), "by_model"), 4);
    let said = res.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(said, "the client reset");
}
