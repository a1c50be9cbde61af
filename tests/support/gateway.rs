//! Real upstream servers and real gateways on free loopback ports.
#![allow(dead_code)]

use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::{Notify, oneshot};

/// What an upstream saw of one request.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: http::Method,
    pub uri: http::Uri,
    pub headers: HeaderMap,
}

/// An HTTP upstream on 127.0.0.1:0 that records requests.
///
/// - `/echo` streams the request body back;
/// - `/collect` reads the whole request body, then answers `read N bytes`
///   (`400` when the body breaks);
/// - `/slow?ms=N` answers after N milliseconds;
/// - `/big?bytes=N` answers N bytes;
/// - `/tokens?used=V` answers with no body and `x-tokens-used: V`, V as
///   sent (a number or not; no header without `used`), for a cost
///   settled by the response;
/// - `/cors` answers `200 upstream ok` with CORS headers of its own
///   (`Access-Control-Allow-Origin: *`, `-Allow-Credentials`,
///   `-Expose-Headers`), `Server` and `X-Debug`, for a gateway to replace
///   or remove;
/// - anything else answers `200 upstream ok` with hop-by-hop headers that
///   the gateway must remove.
pub struct Upstream {
    pub addr: SocketAddr,
    pub seen: Arc<Mutex<Vec<Seen>>>,
    /// Woken whenever a request arrives.
    arrived: Arc<Notify>,
    stop: Option<oneshot::Sender<()>>,
}

type UpBody = BoxBody<Bytes, hyper::Error>;

fn full(b: impl Into<Bytes>) -> UpBody {
    Full::new(b.into())
        .map_err(|never: Infallible| match never {})
        .boxed()
}

fn query_num(uri: &http::Uri, name: &str) -> u64 {
    uri.query()
        .and_then(|q| {
            q.split('&')
                .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
        })
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

impl Upstream {
    pub async fn start() -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind upstream");
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (tx, mut rx) = oneshot::channel::<()>();
        let seen2 = seen.clone();
        let arrived = Arc::new(Notify::new());
        let arrived2 = arrived.clone();
        tokio::spawn(async move {
            loop {
                let (stream, _) = tokio::select! {
                    _ = &mut rx => break,
                    a = listener.accept() => match a { Ok(a) => a, Err(_) => continue },
                };
                let seen = seen2.clone();
                let arrived = arrived2.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req: Request<Incoming>| {
                        let seen = seen.clone();
                        let arrived = arrived.clone();
                        async move {
                            seen.lock().unwrap().push(Seen {
                                method: req.method().clone(),
                                uri: req.uri().clone(),
                                headers: req.headers().clone(),
                            });
                            arrived.notify_waiters();
                            let path = req.uri().path().to_owned();
                            let res: Response<UpBody> = match path.as_str() {
                                "/echo" => Response::new(req.into_body().boxed()),
                                "/collect" => match req.into_body().collect().await {
                                    Ok(b) => Response::new(full(format!(
                                        "read {} bytes",
                                        b.to_bytes().len()
                                    ))),
                                    Err(_) => {
                                        let mut r = Response::new(full("broken body"));
                                        *r.status_mut() = StatusCode::BAD_REQUEST;
                                        r
                                    }
                                },
                                "/slow" => {
                                    let ms = query_num(req.uri(), "ms");
                                    tokio::time::sleep(Duration::from_millis(ms)).await;
                                    Response::new(full("slow ok"))
                                }
                                "/big" => {
                                    let n = query_num(req.uri(), "bytes") as usize;
                                    Response::new(full(vec![b'x'; n]))
                                }
                                "/tokens" => {
                                    let mut r = Response::new(full(Bytes::new()));
                                    let used = req.uri().query().and_then(|q| {
                                        q.split('&').find_map(|kv| kv.strip_prefix("used="))
                                    });
                                    if let Some(v) = used {
                                        r.headers_mut().insert("x-tokens-used", v.parse().unwrap());
                                    }
                                    r
                                }
                                // An OpenAI-style JSON answer reporting
                                // `?used=N` tokens.
                                "/usage" => {
                                    let n = query_num(req.uri(), "used");
                                    let body = format!("{{\"usage\":{{\"total_tokens\":{n}}}}}");
                                    let mut r = Response::new(full(body));
                                    r.headers_mut().insert(
                                        "content-type",
                                        "application/json".parse().unwrap(),
                                    );
                                    r
                                }
                                "/cors" => {
                                    let mut r = Response::new(full("upstream ok"));
                                    let h = r.headers_mut();
                                    h.insert("access-control-allow-origin", "*".parse().unwrap());
                                    h.insert(
                                        "access-control-allow-credentials",
                                        "true".parse().unwrap(),
                                    );
                                    h.insert(
                                        "access-control-expose-headers",
                                        "x-secret".parse().unwrap(),
                                    );
                                    h.insert("server", "upstream/1.0".parse().unwrap());
                                    h.insert("x-debug", "stack trace".parse().unwrap());
                                    r
                                }
                                _ => {
                                    let mut r = Response::new(full("upstream ok"));
                                    let h = r.headers_mut();
                                    h.insert("connection", "x-upstream-hop".parse().unwrap());
                                    h.insert("x-upstream-hop", "1".parse().unwrap());
                                    h.insert("keep-alive", "timeout=5".parse().unwrap());
                                    r
                                }
                            };
                            Ok::<_, Infallible>(res)
                        }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Upstream {
            addr,
            seen,
            arrived,
            stop: Some(tx),
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn last(&self) -> Seen {
        self.seen
            .lock()
            .unwrap()
            .last()
            .cloned()
            .expect("upstream saw a request")
    }

    pub fn count(&self) -> usize {
        self.seen.lock().unwrap().len()
    }

    /// Returns once `n` requests have arrived; woken by each arrival, not
    /// by polling.
    ///
    /// # Panics
    /// When fewer have arrived within `within`.
    pub async fn wait_for(&self, n: usize, within: Duration) {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            // Created before the check, so an arrival in between wakes it.
            let arrived = self.arrived.notified();
            if self.count() >= n {
                return;
            }
            if tokio::time::timeout_at(deadline, arrived).await.is_err() {
                assert!(
                    self.count() >= n,
                    "{} of {n} requests arrived",
                    self.count()
                );
                return;
            }
        }
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }
}

/// A gateway running in this process through the library API.
pub struct Gateway {
    pub addr: SocketAddr,
    /// The gateway itself, for its getters (breaker state, instances).
    pub inner: Arc<tollgate::Gateway>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Gateway {
    /// Starts a gateway for `yaml` (its `listen` is ignored: the gateway is
    /// bound on 127.0.0.1:0).
    pub async fn start(yaml: &str) -> Gateway {
        Self::start_with_clock(yaml, Arc::new(tollgate::clock::SystemClock)).await
    }

    /// Starts a gateway whose limiter reads time from `clock`.
    pub async fn start_with_clock(yaml: &str, clock: Arc<dyn tollgate::clock::Clock>) -> Gateway {
        Self::start_logging(yaml, clock, None).await
    }

    /// Starts a gateway on `clock` that writes its access log to
    /// `access_log` (none when `None`, as the other starts).
    pub async fn start_logging(
        yaml: &str,
        clock: Arc<dyn tollgate::clock::Clock>,
        access_log: Option<tollgate::logs::AccessWriter>,
    ) -> Gateway {
        Self::start_with(yaml, clock, access_log, None).await
    }

    /// Starts a gateway whose pools resolve names with `resolver`.
    pub async fn start_resolving(
        yaml: &str,
        resolver: Arc<dyn tollgate::proxy::upstreams::resolve::Resolve>,
    ) -> Gateway {
        Self::start_with(
            yaml,
            Arc::new(tollgate::clock::SystemClock),
            None,
            Some(resolver),
        )
        .await
    }

    async fn start_with(
        yaml: &str,
        clock: Arc<dyn tollgate::clock::Clock>,
        access_log: Option<tollgate::logs::AccessWriter>,
        resolver: Option<Arc<dyn tollgate::proxy::upstreams::resolve::Resolve>>,
    ) -> Gateway {
        let mut config = tollgate::config::load::parse_str(yaml)
            .unwrap_or_else(|e| panic!("test config is invalid:\n{e}"));
        with_http1_from_env(&mut config);
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind gateway");
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = oneshot::channel::<()>();
        let serve = tollgate::server::Serve {
            clock,
            access_log,
            resolver,
            ..tollgate::server::Serve::on(vec![listener])
        };
        let started = start_connected(config, serve).await;
        let inner = Arc::clone(started.gateway());
        let task = tokio::spawn(started.until(async {
            let _ = rx.await;
        }));
        Gateway {
            addr,
            inner,
            stop: Some(tx),
            task: Some(task),
        }
    }

    /// Stops accepting and waits for the drain.
    pub async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.task.take() {
            let _ = t.await;
        }
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }
}

/// An access log (JSON) written in memory: the writer given to
/// `tollgate::logs::queue`, read back with [`Captured::text`].
#[derive(Clone, Default)]
pub struct Captured(Arc<Mutex<Vec<u8>>>);

impl Captured {
    /// What was written so far.
    pub fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }
}

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A response read whole.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Reply {
    /// `res` with its body read to the end.
    pub async fn read(res: Response<Incoming>) -> Reply {
        let (parts, body) = res.into_parts();
        let body = body.collect().await.expect("body").to_bytes();
        Reply {
            status: parts.status,
            headers: parts.headers,
            body,
        }
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Sends one request on a new HTTP/1.1 connection from source address `from`
/// (any 127.x.y.z works on Linux loopback) to `to`.
pub async fn send_from(from: IpAddr, to: SocketAddr, req: Request<Full<Bytes>>) -> Reply {
    let socket = TcpSocket::new_v4().expect("socket");
    socket
        .bind(SocketAddr::new(from, 0))
        .expect("bind source address");
    let stream = socket.connect(to).await.expect("connect to gateway");
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    tokio::spawn(conn);
    Reply::read(sender.send_request(req).await.expect("response")).await
}

/// A new cleartext HTTP/2 (prior knowledge) connection to `to`: the
/// sender, and the connection to spawn.
pub async fn h2c(
    to: SocketAddr,
) -> (
    hyper::client::conn::http2::SendRequest<Full<Bytes>>,
    hyper::client::conn::http2::Connection<
        TokioIo<tokio::net::TcpStream>,
        Full<Bytes>,
        TokioExecutor,
    >,
) {
    let stream = tokio::net::TcpStream::connect(to).await.expect("connect");
    hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
        .await
        .expect("h2c handshake")
}

/// Sends a request from 127.0.0.1.
pub async fn send(to: SocketAddr, req: Request<Full<Bytes>>) -> Reply {
    send_from("127.0.0.1".parse().unwrap(), to, req).await
}

/// A GET with extra headers.
pub fn get(path: &str, headers: &[(&str, &str)]) -> Request<Full<Bytes>> {
    let mut b = Request::builder().uri(path).header("host", "gateway.test");
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(Full::new(Bytes::new())).unwrap()
}

/// A free TCP port on 127.0.0.1 (for the binary, which binds by itself).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Starts a gateway for `config`, then gives its Redis link the moment it
/// needs, at most a second: serving starts before Redis is connected (the
/// first requests are decided by `on_error`), and the tests mean the
/// connected gateway — as the binary's "redis not reachable at startup"
/// warning does.
pub async fn start_connected(
    mut config: tollgate::config::Config,
    serve: tollgate::server::Serve,
) -> tollgate::server::Started {
    with_http1_from_env(&mut config);
    let started = tollgate::server::start(config, serve)
        .await
        .expect("gateway starts");
    started
        .gateway()
        .limiter()
        .health()
        .wait_connected(std::time::Duration::from_secs(1))
        .await;
    started
}

/// `TOLLGATE_TEST_HTTP1=hyper` (or `native`) serves every test gateway
/// with that HTTP/1.1 server, whatever its YAML says, so that one suite
/// holds both servers to the same contract (scripts/test.sh runs the edge
/// crates both ways).
pub fn with_http1_from_env(config: &mut tollgate::config::Config) {
    match std::env::var("TOLLGATE_TEST_HTTP1").as_deref() {
        Ok("native") => config.server.http1 = tollgate::config::Http1::Native,
        Ok("hyper") => config.server.http1 = tollgate::config::Http1::Hyper,
        Ok(other) => panic!("TOLLGATE_TEST_HTTP1={other}: write native or hyper"),
        Err(_) => {}
    }
}
