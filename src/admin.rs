//! The admin listener: `/metrics`, `/healthz`, `/readyz`, `/admin/top`,
//! `/admin/upstreams` and the support API.
//!
//! It is a separate listener (`admin:` in the file) so that operators can
//! keep it off the public network: the top-offenders view and the metrics
//! describe traffic, and nothing here is rate limited. It speaks plain
//! HTTP/1.1 and answers `GET`/`HEAD` (the support API `PUT` and `DELETE`
//! too).
//!
//! - `/healthz`: the process is up and serving this listener (liveness).
//! - `/readyz`: the configuration is loaded (it is, or nothing would run)
//!   and the limiter can decide — no Redis is configured, Redis is
//!   connected, or its `on_error` fallback answers — and the gateway is not
//!   draining. A load balancer takes the instance out on 503. Redis
//!   refusing the gateway (wrong credentials, a missing ACL permission, a
//!   TLS mismatch) is 503 too, whatever `on_error`, with the reason in
//!   Redis's words: `redis: authentication failed: WRONGPASS …`.
//! - `/metrics`: Prometheus/OpenMetrics text (see [`crate::metrics`]).
//! - `/admin/top?n=10`: per limit, the identities (hashed) it denied most,
//!   enforced or in shadow mode (see [`crate::top`]), as JSON.
//! - `/` and `/console/`: the operators' console ([`console`]), a page
//!   whose data (`/admin/console/…`) ask for the admin token.
//! - `/admin/callers`, `/admin/overrides`: the support API ([`api`]), one
//!   caller's limits read, reset and overridden, behind the admin token;
//!   the only endpoints that take `PUT` and `DELETE`.
//!
//! [`probe`] is the other end of `/healthz` and `/readyz`: the client
//! `tollgate health` asks them with, and `tollgate callers` and
//! `tollgate overrides` ask the support API with ([`table`] prints the
//! answers).

pub mod api;
pub mod callers;
pub mod console;
pub mod known;
pub mod overrides;
pub mod pools;
pub mod probe;
pub mod reply;
pub mod request;
pub mod table;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tracing::info;

use crate::listener;
use crate::pipeline::Gateway;
use crate::top::CAPACITY;

/// Accepts admin connections until `stop` turns true, with the accept loop
/// and connection caps of the proxy's listeners ([`listener`]), serving
/// [`AdminService`].
pub async fn serve_admin(
    gateway: Arc<Gateway>,
    listener: TcpListener,
    draining: Arc<AtomicBool>,
    stop: tokio::sync::watch::Receiver<bool>,
) {
    if let Ok(addr) = listener.local_addr() {
        info!(%addr, "admin listening");
    }
    let shared = gateway.with_config(|c| Arc::new(listener::Shared::new(&c.server, &c.timeouts)));
    // The admin listener is not drained: it stops after the proxy's drain,
    // and its connections end with the process.
    let graceful = Arc::new(GracefulShutdown::new());
    let service = Arc::new(AdminService { gateway, draining });
    listener::accept_loop(listener, service, Arc::new(|| None), shared, graceful, stop).await;
}

/// The admin listener's answers, one tower service per connection: the
/// support API's paths ([`api`]) and the rest ([`answer`]).
pub struct AdminService {
    gateway: Arc<Gateway>,
    draining: Arc<AtomicBool>,
}

impl listener::Served for AdminService {
    type Body = Full<Bytes>;

    fn connection<B>(
        &self,
        _: SocketAddr,
        _: bool,
    ) -> impl tower::Service<
        Request<B>,
        Response = Response<Full<Bytes>>,
        Error = Infallible,
        Future: Send + 'static,
    > + Clone
    + Send
    + 'static
    where
        B: listener::ServedBody,
    {
        let (gateway, draining) = (self.gateway.clone(), self.draining.clone());
        tower::service_fn(move |req: Request<B>| {
            let (gw, draining) = (gateway.clone(), draining.clone());
            async move {
                if api::serves(req.uri().path()) {
                    return Ok(api::answer(&gw, req).await);
                }
                Ok(answer(&gw, &req, draining.load(Ordering::Relaxed)))
            }
        })
    }
}

fn reply(
    status: StatusCode,
    content_type: &'static str,
    body: impl Into<Bytes>,
) -> Response<Full<Bytes>> {
    let mut res = Response::new(Full::new(body.into()));
    *res.status_mut() = status;
    res.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    res
}

const TEXT: &str = "text/plain; charset=utf-8";

/// The answer to one admin request.
pub fn answer<B>(gw: &Gateway, req: &Request<B>, draining: bool) -> Response<Full<Bytes>> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let mut res = reply(StatusCode::METHOD_NOT_ALLOWED, TEXT, "use GET\n");
        res.headers_mut()
            .insert(http::header::ALLOW, HeaderValue::from_static("GET, HEAD"));
        return res;
    }
    match req.uri().path() {
        "/healthz" => reply(StatusCode::OK, TEXT, "ok\n"),
        "/readyz" => readyz(gw, draining),
        "/metrics" => reply(
            StatusCode::OK,
            crate::metrics::CONTENT_TYPE,
            gw.metrics().render(),
        ),
        "/admin/top" => {
            let n = req
                .uri()
                .query()
                .and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("n=")))
                .and_then(|v| v.parse::<usize>().ok())
                .unwrap_or(10)
                .min(CAPACITY);
            let body = serde_json::json!({
                "capacity": CAPACITY,
                "limits": gw.top().snapshot(n),
            });
            reply(StatusCode::OK, "application/json", body.to_string())
        }
        "/admin/upstreams" => reply(
            StatusCode::OK,
            "application/json",
            pools::upstreams(gw).to_string(),
        ),
        p if console::serves_page(p) => console::page(gw, p, req.uri().query().unwrap_or("")),
        _ => reply(
            StatusCode::NOT_FOUND,
            TEXT,
            "not found; try /console/, /metrics, /healthz, /readyz, /admin/top, /admin/upstreams, /admin/callers or /admin/overrides\n",
        ),
    }
}

fn readyz(gw: &Gateway, draining: bool) -> Response<Full<Bytes>> {
    let limiter = gw.limiter();
    // A refusal says why, in Redis's words.
    let store = match (
        limiter.health().redis_connected(),
        limiter.health().redis_fault(),
    ) {
        (None, _) => "store: memory".to_owned(),
        (Some(_), Some(fault)) => format!("redis: {fault}\non_error decides requests meanwhile"),
        (Some(true), None) => "store: redis connected".to_owned(),
        (Some(false), None) => "store: redis unreachable; on_error decides".to_owned(),
    };
    if draining {
        return reply(
            StatusCode::SERVICE_UNAVAILABLE,
            TEXT,
            format!("not ready: draining\n{store}\n"),
        );
    }
    if limiter.health().is_ready() {
        reply(StatusCode::OK, TEXT, format!("ready\n{store}\n"))
    } else {
        reply(
            StatusCode::SERVICE_UNAVAILABLE,
            TEXT,
            format!("not ready\n{store}\n"),
        )
    }
}
