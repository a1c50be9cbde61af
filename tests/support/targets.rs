//! Targets of an upstream pool: HTTP servers on loopback whose behaviour a
//! test switches while they run — answer, stay silent, break the
//! connection, answer a status — and that can be killed outright.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU16, AtomicUsize, Ordering};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::sync::watch;

/// What a target does with a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `200` with the target's name as the body.
    Answer,
    /// Reads the request and never answers (nor closes).
    Silent,
    /// Reads the request, then closes the connection without a response.
    Break,
    /// Answers this status.
    Status(u16),
}

const ANSWER: u16 = 0;
const SILENT: u16 = 1;
const BREAK: u16 = 2;

/// One target.
pub struct Target {
    pub addr: SocketAddr,
    pub name: String,
    mode: Arc<AtomicU16>,
    /// Requests seen, health checks not included.
    requests: Arc<AtomicUsize>,
    /// Health checks seen (`GET /healthz`).
    checks: Arc<AtomicUsize>,
    kill: watch::Sender<bool>,
}

impl Target {
    /// A target on 127.0.0.1, a free port.
    pub async fn start(name: &str) -> Target {
        Self::start_on(name, "127.0.0.1:0".parse().unwrap()).await
    }

    /// A target on `addr`.
    pub async fn start_on(name: &str, addr: SocketAddr) -> Target {
        Self::try_start_on(name, addr).await.expect("bind target")
    }

    /// Two targets on one port, `a` on 127.0.0.1 and `b` on 127.0.0.2 (as
    /// two addresses of one name): a port free on the first may be taken
    /// on the second, so pairs are tried until both listen.
    pub async fn pair_on_one_port(a: &str, b: &str) -> (Target, Target) {
        for _ in 0..20 {
            let first = Target::start(a).await;
            let on_b = SocketAddr::new([127, 0, 0, 2].into(), first.addr.port());
            if let Ok(second) = Target::try_start_on(b, on_b).await {
                return (first, second);
            }
        }
        panic!("no port free on both 127.0.0.1 and 127.0.0.2");
    }

    /// A target on `addr`, or why it cannot listen there.
    pub async fn try_start_on(name: &str, addr: SocketAddr) -> std::io::Result<Target> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr().unwrap();
        let mode = Arc::new(AtomicU16::new(ANSWER));
        let requests = Arc::new(AtomicUsize::new(0));
        let checks = Arc::new(AtomicUsize::new(0));
        let (kill, killed) = watch::channel(false);
        let (m, r, c, n) = (
            mode.clone(),
            requests.clone(),
            checks.clone(),
            name.to_owned(),
        );
        tokio::spawn(async move {
            let mut stop = killed.clone();
            loop {
                let stream = tokio::select! {
                    _ = stop.changed() => return,
                    a = listener.accept() => match a { Ok((s, _)) => s, Err(_) => continue },
                };
                let (m, r, c, n) = (m.clone(), r.clone(), c.clone(), n.clone());
                let mut stop = killed.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req: Request<Incoming>| {
                        let (m, r, c, n) = (m.clone(), r.clone(), c.clone(), n.clone());
                        async move {
                            if req.uri().path() == "/healthz" {
                                c.fetch_add(1, Ordering::SeqCst);
                            } else {
                                r.fetch_add(1, Ordering::SeqCst);
                            }
                            let _ = req.into_body().collect().await;
                            match m.load(Ordering::SeqCst) {
                                ANSWER => Ok(Response::new(Full::new(Bytes::from(n)))),
                                SILENT => std::future::pending().await,
                                BREAK => Err("break"),
                                status => {
                                    let mut res = Response::new(Full::new(Bytes::from(n)));
                                    *res.status_mut() = StatusCode::from_u16(status).unwrap();
                                    Ok::<_, &str>(res)
                                }
                            }
                        }
                    });
                    let builder =
                        hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                    let serving = builder.serve_connection(TokioIo::new(stream), svc);
                    tokio::select! {
                        _ = serving => {}
                        _ = stop.changed() => {}
                    }
                });
            }
        });
        Ok(Target {
            addr,
            name: name.to_owned(),
            mode,
            requests,
            checks,
            kill,
        })
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn set(&self, mode: Mode) {
        let v = match mode {
            Mode::Answer => ANSWER,
            Mode::Silent => SILENT,
            Mode::Break => BREAK,
            Mode::Status(s) => s,
        };
        self.mode.store(v, Ordering::SeqCst);
    }

    /// Requests seen, health checks not included.
    pub fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }

    /// Health checks seen.
    pub fn checks(&self) -> usize {
        self.checks.load(Ordering::SeqCst)
    }

    /// Stops listening and drops every connection.
    pub fn kill(&self) {
        let _ = self.kill.send(true);
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        self.kill();
    }
}
