//! `GET /admin/callers` and `DELETE /admin/callers`: one caller's limits as
//! the gateway would decide them, read from the live store without
//! counting, and reset.
//!
//! The caller is given by the identity values it would present
//! (`ip`, `api_key`, `user`, `header.NAME`, `json.FIELD` for a string
//! field of its request bodies, as `json:FIELD` keys read it); the IP is taken as the
//! resolved client, as if it came through a trusted proxy. Limits keyed by
//! the IP are left out when no `ip` is given. API keys are never echoed:
//! one is shown by its digest ([`identity::digest`]), which is also taken
//! in its place (`known_key`); counter keys are shown as the store holds
//! them (digests with Redis). A row whose key the caller lacks a part of
//! says it counts the bucket shared by every caller without it.

use std::borrow::Cow;

use bytes::Bytes;
use http::{HeaderMap, Response};
use http_body_util::Full;
use serde_json::{Value, json};
use tracing::info;

use super::known::known_key;
use super::reply::{self as api, Who};
use super::request::{BadField, CallerFields, CallerQuery, parse_query};
use crate::config::Limit;
use crate::identity::{self, BodyFields, Caller};
use crate::pipeline::Gateway;
use crate::pipeline::callers::{CallerLimit, Found};
use crate::store::keys::StoreKey;

/// The limits of `query`'s caller, `caller`.
async fn lookup(gw: &Gateway, q: &CallerQuery, caller: &Caller<'_>) -> Found {
    let (route, limit) = q.route_and_limit();
    gw.caller_limits(caller, q.caller.ip.is_some(), route, limit)
        .await
}

/// The query of `GET` and `DELETE`, its caller's key known when given by
/// its digest.
fn query_of(gw: &Gateway, query: &[u8]) -> Result<CallerQuery, BadField> {
    let mut q = parse_query(query)?;
    known_key(gw, &mut q.caller)?;
    Ok(q)
}

/// The caller `fields` describe, as the decision phase would see it.
pub fn caller<'a>(
    gw: &Gateway,
    fields: &'a CallerFields,
    headers: &'a HeaderMap,
    body: &'a BodyFields,
) -> Caller<'a> {
    let prefix = gw.with_config(|c| c.client_ip.ipv6_prefix);
    let ip = fields
        .ip
        .unwrap_or(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED));
    Caller {
        ip: identity::group(ip, prefix),
        api_key: fields.api_key.as_deref().map(str::as_bytes),
        user: fields.user.as_deref().map(|u| Cow::Borrowed(u.as_bytes())),
        plan: None,
        headers,
        body: Some(body),
    }
}

/// The request-body fields `fields` name (`json.FIELD=value`), as the
/// decision phase reads them for `json:FIELD` keys.
fn body_of(fields: &CallerFields) -> BodyFields {
    BodyFields {
        text: fields
            .json
            .iter()
            .map(|(f, v)| (f.as_str().into(), v.as_bytes().into()))
            .collect(),
        counts: Vec::new(),
    }
}

fn headers_of(fields: &CallerFields) -> HeaderMap {
    fields.headers.iter().cloned().collect()
}

/// `caller`'s identity for `limit` as shown: an API key as its digest.
fn shown(limit: &Limit, caller: &Caller<'_>) -> String {
    let mut out = String::new();
    identity::write_shown(&mut out, &limit.key, caller, false);
    out
}

/// The store key of `l` as shown: the identity in it as [`shown`] writes
/// it (with Redis, a key holds only digests and is shown as it is).
fn shown_key(l: &CallerLimit, caller: &Caller<'_>) -> String {
    l.request
        .key
        .text()
        .replace(&l.identity, &shown(&l.limit, caller))
}

/// What a row counts, when the caller lacks a part of its key: the bucket
/// shared by every caller without it.
fn shared_bucket(limit: &Limit, caller: &Caller<'_>) -> Option<String> {
    let absent = identity::absent_parts(&limit.key, caller);
    (!absent.is_empty()).then(|| {
        format!(
            "the bucket every caller without {} shares",
            absent.join(" and ")
        )
    })
}

/// `GET /admin/callers?…`
pub async fn show(gw: &Gateway, query: &[u8]) -> Response<Full<Bytes>> {
    let q = match query_of(gw, query) {
        Ok(q) => q,
        Err(e) => return api::bad_field(&e),
    };
    let headers = headers_of(&q.caller);
    let body = body_of(&q.caller);
    let caller = caller(gw, &q.caller, &headers, &body);
    let found = lookup(gw, &q, &caller).await;
    let (slots, rates): (Vec<&CallerLimit>, Vec<&CallerLimit>) = found
        .limits
        .iter()
        .partition(|l| l.limit.concurrency.is_some());
    let now_ms = gw.clock().now_ms();
    let requests = rates.iter().map(|l| &l.request);
    let read = match gw.limiter().admin().read(now_ms, requests).await {
        Ok(d) => d,
        Err(e) => return api::store_failed(&e),
    };
    let mut concurrency = Vec::with_capacity(slots.len());
    for l in slots {
        let held = match gw.limiter().concurrency().held(&l.request.key.text()).await {
            Ok(n) => n,
            Err(e) => return api::store_failed(&e),
        };
        concurrency.push(json!({
            "route": &*l.route,
            "limit": &*l.limit.name,
            "key": shown_key(l, &caller),
            "identity": shown(&l.limit, &caller),
            "shared": shared_bucket(&l.limit, &caller),
            "slots": l.limit.concurrency.map(std::num::NonZeroU64::get),
            "in_use": held,
        }));
    }
    let limits: Vec<Value> = rates
        .iter()
        .zip(&read.outcomes)
        .map(|(l, o)| {
            let quota = l.limit.limit.get();
            json!({
                "route": &*l.route,
                "limit": &*l.limit.name,
                "key": shown_key(l, &caller),
                "identity": shown(&l.limit, &caller),
                "shared": shared_bucket(&l.limit, &caller),
                "algorithm": l.limit.algorithm.name(),
                "quota": quota,
                "window_s": l.limit.window_ms.get() as f64 / 1000.0,
                "used": quota.saturating_sub(o.remaining),
                "remaining": o.remaining,
                "reset_s": o.reset_ms.div_ceil(1000),
                "override": l.override_.as_ref().map(|o| super::overrides::render(o, now_ms)),
                "waiting": gw.waiting_on(&l.request.key.text()),
            })
        })
        .collect();
    api::json(&json!({
        "limits": limits,
        "concurrency": concurrency,
        "exempt_routes": found.exempt_routes.iter().map(|r| &**r).collect::<Vec<_>>(),
        "no_plan_routes": found.no_plan_routes.iter().map(|r| &**r).collect::<Vec<_>>(),
    }))
}

/// `DELETE /admin/callers?…`: resets every counter `show` would list.
pub async fn reset(gw: &Gateway, query: &[u8], who: &Who) -> Response<Full<Bytes>> {
    let q = match query_of(gw, query) {
        Ok(q) => q,
        Err(e) => return api::bad_field(&e),
    };
    let headers = headers_of(&q.caller);
    let body = body_of(&q.caller);
    let caller = caller(gw, &q.caller, &headers, &body);
    let mut found = lookup(gw, &q, &caller).await;
    // Concurrency slots are held by requests in flight, which give them
    // back themselves; only counters are reset.
    found.limits.retain(|l| l.limit.concurrency.is_none());
    let keys: Vec<StoreKey> = found.limits.iter().map(|l| l.request.key.clone()).collect();
    let prefix = gw.with_config(|c| c.store.prefix.clone());
    let deleted = match gw.limiter().admin().reset(&prefix, &keys).await {
        Ok(n) => n,
        Err(e) => return api::store_failed(&e),
    };
    gw.limiter().admin().forget_denials();
    let reset: Vec<Value> = found
        .limits
        .iter()
        .map(|l| {
            json!({
                "route": &*l.route,
                "limit": &*l.limit.name,
                "key": shown_key(l, &caller),
            })
        })
        .collect();
    let what: Vec<String> = found
        .limits
        .iter()
        .map(|l| format!("{}/{}", l.route, l.limit.name))
        .collect();
    info!(
        target: "tollgate::audit",
        token = %who.0,
        action = "callers.reset",
        caller = %q.caller.describe(),
        limits = %what.join(","),
        counters_held = deleted,
        "admin write"
    );
    api::json(&json!({ "reset": reset, "counters_held": deleted }))
}
