//! An upstream that holds requests until the test releases them, shared
//! by the concurrency and settled-cost tests.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

type TestBody = BoxBody<Bytes, Infallible>;

/// An upstream that counts the requests it holds. Any path but the two
/// below is held: `arrived` gets a permit as it comes in, and it answers
/// `done` with `x-tokens-used: 7` (for a cost settled by the response)
/// only once the test adds a permit to `release`. `/stream` sends its
/// head and one chunk at once, then never ends its body; `/ws` switches
/// protocols and echoes.
pub struct Held {
    pub addr: SocketAddr,
    pub in_flight: Arc<AtomicUsize>,
    /// The most held at once.
    pub most: Arc<AtomicUsize>,
    pub arrived: Arc<Semaphore>,
    pub release: Arc<Semaphore>,
}

impl Held {
    pub async fn start() -> Held {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let in_flight = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let arrived = Arc::new(Semaphore::new(0));
        let release = Arc::new(Semaphore::new(0));
        let counts = Counts {
            in_flight: in_flight.clone(),
            most: most.clone(),
            arrived: arrived.clone(),
            release: release.clone(),
        };
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let counts = counts.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req| answer(req, counts.clone()));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tcp), svc)
                        .with_upgrades()
                        .await;
                });
            }
        });
        Held {
            addr,
            in_flight,
            most,
            arrived,
            release,
        }
    }
}

/// What [`answer`] shares with the [`Held`] that started it.
#[derive(Clone)]
struct Counts {
    in_flight: Arc<AtomicUsize>,
    most: Arc<AtomicUsize>,
    arrived: Arc<Semaphore>,
    release: Arc<Semaphore>,
}

async fn answer(
    mut req: Request<hyper::body::Incoming>,
    Counts {
        in_flight,
        most,
        arrived,
        release,
    }: Counts,
) -> Result<Response<TestBody>, Infallible> {
    match req.uri().path() {
        "/ws" => {
            let on = hyper::upgrade::on(&mut req);
            tokio::spawn(async move {
                let Ok(up) = on.await else { return };
                let mut io = TokioIo::new(up);
                let mut buf = [0u8; 256];
                while let Ok(n @ 1..) = io.read(&mut buf).await {
                    if io.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                }
            });
            Ok(Response::builder()
                .status(StatusCode::SWITCHING_PROTOCOLS)
                .header("connection", "upgrade")
                .header("upgrade", "websocket")
                .body(Full::new(Bytes::new()).boxed())
                .expect("101"))
        }
        "/stream" => {
            // One chunk now, then the body stays open until it is dropped.
            let mut first = Some(Bytes::from_static(b"first\n"));
            let chunks = futures_util::stream::poll_fn(move |_| match first.take() {
                Some(b) => std::task::Poll::Ready(Some(Ok::<_, Infallible>(Frame::data(b)))),
                None => std::task::Poll::Pending,
            });
            Ok(Response::new(StreamBody::new(chunks).boxed()))
        }
        _ => {
            let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(now, Ordering::SeqCst);
            arrived.add_permits(1);
            release.acquire().await.expect("semaphore open").forget();
            in_flight.fetch_sub(1, Ordering::SeqCst);
            Ok(Response::builder()
                .header("x-tokens-used", "7")
                .body(Full::new(Bytes::from_static(b"done\n")).boxed())
                .expect("200"))
        }
    }
}
