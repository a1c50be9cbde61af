//! The operators' console: one page served by the admin listener, embedded
//! in the binary (`console/index.html`, `console.css`, `console.js`; no
//! network needed to build or show it), and the JSON it reads.
//!
//! - `/` redirects to `/console/`; the page, its script and its style are
//!   open, and show nothing but a login prompt without the admin token. The
//!   page keeps the token in `sessionStorage` (`tollgate.token`) and sends
//!   it as a bearer header — no cookie, so no cross-site request can use it.
//! - `/admin/console/now`, `/admin/console/denied`,
//!   `/admin/console/replays`: the data, behind the admin token like the
//!   support API ([`super::api`]), which the page calls itself to look up,
//!   reset and override one caller.
//! - `/console/replays/NAME`: one of `simulate`'s reports ([`replays`]),
//!   under a sandboxing policy of its own.
//! - Every answer of the page's paths carries a strict
//!   Content-Security-Policy: scripts and styles from this origin only, no
//!   inline script, no framing; the page inserts every value as text.
//!
//! [`sample`] fills the history once a second, off the request path;
//! [`fleet`] publishes this gateway's summary to Redis and merges the live
//! gateways'.

pub mod fleet;
pub mod policy;
pub mod replays;
pub mod sample;

use std::sync::Arc;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderValue, LOCATION};
use http::{Response, StatusCode};
use http_body_util::Full;
use serde_json::json;

use crate::pipeline::Gateway;

/// Where the page is.
pub const PAGE: &str = "/console/";

const INDEX: &str = include_str!("console/index.html");
const SCRIPT: &str = include_str!("console/console.js");
const STYLE: &str = include_str!("console/console.css");

/// Starts the sampler (and, with Redis, the publisher) for `gw`; abort the
/// handle to stop it.
pub fn start(gw: Arc<Gateway>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(sample::run(gw))
}

/// Whether `path` is one of the page's open paths.
pub fn serves_page(path: &str) -> bool {
    path == "/" || path == "/console" || path.starts_with(PAGE)
}

/// Whether `path` is one of the console's data paths (behind the token).
pub fn serves_data(path: &str) -> bool {
    path.starts_with("/admin/console/")
}

/// The page, its script and style, the redirect to it, or a report.
pub fn page(gw: &Gateway, path: &str, query: &str) -> Response<Full<Bytes>> {
    if path.starts_with(replays::PREFIX) {
        return replays::open(gw, path, query, sample::now_ms());
    }
    let (status, body, kind) = match path {
        "/" | "/console" => {
            let mut res = Response::new(Full::new(Bytes::new()));
            *res.status_mut() = StatusCode::FOUND;
            res.headers_mut()
                .insert(LOCATION, HeaderValue::from_static(PAGE));
            return res;
        }
        "/console/" | "/console/index.html" => (StatusCode::OK, INDEX, "text/html; charset=utf-8"),
        "/console/console.js" => (StatusCode::OK, SCRIPT, "text/javascript; charset=utf-8"),
        "/console/console.css" => (StatusCode::OK, STYLE, "text/css; charset=utf-8"),
        _ => (
            StatusCode::NOT_FOUND,
            "not found\n",
            "text/plain; charset=utf-8",
        ),
    };
    let mut res = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *res.status_mut() = status;
    res.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(kind));
    policy::guard(&mut res, policy::CSP);
    res
}

/// The answer to an authorised `GET` of a data path.
pub fn data(gw: &Gateway, path: &str, query: &str) -> Response<Full<Bytes>> {
    let body = match path {
        "/admin/console/now" => now(gw, since(query)),
        "/admin/console/denied" => denied(gw),
        "/admin/console/replays" => replays::list(gw, sample::now_ms()),
        _ => {
            return super::reply::problem(
                StatusCode::NOT_FOUND,
                "Not Found",
                "the console's data are /admin/console/now, /admin/console/denied and /admin/console/replays",
                None,
            );
        }
    };
    let mut res = super::reply::json(&body);
    policy::guard(&mut res, policy::CSP);
    res
}

/// `since=MS` in `query`, else 0 (everything held).
fn since(query: &str) -> u64 {
    query
        .split('&')
        .find_map(|kv| kv.strip_prefix("since="))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Whether the views are the fleet's (Redis) or this gateway's alone.
fn scope(gw: &Gateway) -> &'static str {
    if gw.limiter().admin().redis().is_some() {
        "fleet"
    } else {
        "gateway"
    }
}

fn now(gw: &Gateway, since: u64) -> serde_json::Value {
    let history = &gw.metrics().history;
    let health = gw.limiter().health();
    let (sync, on_error, prefix) = gw.with_config(|c| {
        (
            c.store
                .redis
                .as_ref()
                .and_then(|r| r.sync)
                .map(|d| d.as_millis()),
            format!("{:?}", c.store.on_error).to_lowercase(),
            c.store.prefix.clone(),
        )
    });
    let redis = gw.limiter().admin().redis();
    json!({
        "scope": scope(gw),
        "now": sample::now_ms(),
        "instance": redis.map(|r| r.instance_id().to_owned()),
        "gateways": history.fleet_denied().1.max(1),
        "history_seconds": crate::metrics::history::SECONDS,
        "fleet": history.fleet_since(since),
        "local": history.local_since(since),
        "store": {
            "kind": if redis.is_some() { "redis" } else { "memory" },
            "connected": health.redis_connected(),
            "fault": health.redis_fault().map(|f| f.to_string()),
            "breaker": format!("{:?}", health.breaker_state()).to_lowercase(),
            "fallback": health.fallback_active(),
            "ready": health.is_ready(),
            "sync_ms": sync,
            "on_error": on_error,
            "live_instances": health.live_instances(),
            "prefix": prefix,
        },
        "pools": super::pools::upstreams(gw)["pools"],
    })
}

fn denied(gw: &Gateway) -> serde_json::Value {
    let (windows, gateways) = gw.metrics().history.fleet_denied();
    json!({
        "scope": scope(gw),
        "gateways": gateways.max(1),
        "windows": fleet::WINDOWS,
        "limits": windows,
    })
}
