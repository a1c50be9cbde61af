//! Support's view of one caller through the admin API: `/admin/callers`
//! (read without counting, reset) and `/admin/overrides` (other numbers,
//! a plan, an exemption), behind the admin token.
//!
//! `redis` runs two gateways on one real `redis-server`: what one gateway
//! counts, resets or overrides, the other reads, forgets from its deny
//! cache and applies. `memory` runs one gateway on the in-process store.
//! `access` holds the token rules and the 400s that name the field, `cli`
//! the command line that calls the API, `console` the operators' page and
//! its data.

mod support;

#[path = "callers/access.rs"]
mod access;
#[path = "callers/cli.rs"]
mod cli;
#[path = "callers/console.rs"]
mod console;
#[path = "callers/memory.rs"]
mod memory;
#[path = "callers/redis.rs"]
mod redis;

use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request};
use http_body_util::Full;
use serde_json::Value;

use support::admin::AdminGateway;
use support::gateway::{Reply, get, send};

/// The admin token of the test files.
const TOKEN: &str = "s3cret-admin-token";

/// A gateway file: route `api` limits each API key to `quota` an hour
/// (`per_key`), route `other` has a per-key limit too; `store` is the
/// store section (empty for memory).
fn yaml(store: &str, admin: &str, quota: u64) -> String {
    format!(
        "listen: 127.0.0.1:0
admin: {admin}
{store}
plans:
  free: [ {{ name: per_hour, limit: 2, window: 1h }} ]
  pro:  [ {{ name: per_hour, limit: 50, window: 1h }} ]
api_keys: {{ keys: {{ pk: free }} }}
routes:
  - name: api
    match: {{ path_prefix: /api }}
    respond: {{ status: 200, body: ok }}
    limits: [ {{ name: per_key, key: api_key, limit: {quota}, window: 1h }} ]
  - name: planned
    match: {{ path_prefix: /planned }}
    respond: {{ status: 200, body: ok }}
    limits: [ {{ name: tier, key: api_key, plan: true }} ]
  - name: other
    match: {{ path_prefix: /other }}
    respond: {{ status: 200, body: ok }}
    limits: [ {{ name: shared, key: api_key, limit: 5, window: 1h }} ]
  - name: more
    match: {{ path_prefix: /more }}
    respond: {{ status: 200, body: ok }}
    limits: [ {{ name: shared, key: api_key, limit: 5, window: 1h }} ]
  - name: reports
    match: {{ path_prefix: /reports }}
    respond: {{ status: 200, body: ok }}
    limits: [ {{ name: at_once, key: api_key, concurrency: 2 }} ]
"
    )
}

fn with_token() -> String {
    format!("{{ addr: 127.0.0.1:0, token: {TOKEN} }}")
}

async fn start(yaml: &str) -> AdminGateway {
    AdminGateway::start(yaml, Arc::new(tollgate::clock::SystemClock)).await
}

/// One admin request with the test token (or `token`).
async fn admin(
    gw: &AdminGateway,
    method: Method,
    path: &str,
    body: Option<&str>,
    token: Option<&str>,
) -> Reply {
    let mut b = Request::builder()
        .method(method)
        .uri(path)
        .header("host", "admin.test");
    if let Some(t) = token {
        b = b.header("authorization", format!("Bearer {t}"));
    }
    let body = Full::new(Bytes::from(body.unwrap_or("").to_owned()));
    send(gw.admin, b.body(body).unwrap()).await
}

async fn call(gw: &AdminGateway, method: Method, path: &str, body: Option<&str>) -> (u16, Value) {
    let r = admin(gw, method, path, body, Some(TOKEN)).await;
    let v = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
    (r.status.as_u16(), v)
}

/// A proxied request to `path` with API key `key`: its status.
async fn hit(gw: &AdminGateway, path: &str, key: &str) -> u16 {
    send(gw.addr, get(path, &[("x-api-key", key)]))
        .await
        .status
        .as_u16()
}

/// The entry of `route/limit` in a `GET /admin/callers` answer.
fn entry<'a>(v: &'a Value, route: &str, limit: &str) -> &'a Value {
    v["limits"]
        .as_array()
        .and_then(|a| {
            a.iter()
                .find(|e| e["route"] == route && e["limit"] == limit)
        })
        .unwrap_or_else(|| panic!("no {route}/{limit} in {v}"))
}
