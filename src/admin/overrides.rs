//! `PUT`, `GET` and `DELETE /admin/overrides`: per-caller numbers for one
//! limit, a plan, or an exemption ([`crate::decision::overrides`] keeps
//! them in the store).
//!
//! A limit is named by its name where that is unique among the routes'
//! limits and their plans' limits, else as `route/name`; the override is
//! stored with its route, so a limit of the same name added later on
//! another route is not touched by it. An override whose limit or plan a
//! reload removed is listed as orphaned and matches nothing.

use bytes::Bytes;
use http::{Response, StatusCode};
use http_body_util::Full;
use serde_json::{Value, json};
use tracing::info;

use super::reply::{self as api, Who};
use super::request::{BadField, OverrideBody, bad, parse_override, parse_query};
use crate::decision::overrides::Override;
use crate::pipeline::Gateway;
use crate::pipeline::callers::LimitNames;

/// An override as the API shows it; an API key by its digest.
pub fn render(o: &Override, now_ms: u64) -> Value {
    let value = if o.subject.field == "api_key" {
        crate::identity::digest(o.subject.value.as_bytes())
    } else {
        o.subject.value.clone()
    };
    let mut caller = serde_json::Map::new();
    caller.insert(o.subject.field.clone(), value.into());
    for (field, v) in &o.subject.json {
        caller.insert(format!("json.{field}"), v.clone().into());
    }
    json!({
        "caller": caller,
        "route": o.route,
        "limit": o.limit,
        "share": o.share,
        "quota": o.quota,
        "window_s": o.window_ms.map(|w| w as f64 / 1000.0),
        "plan": o.plan,
        "exempt": o.exempt,
        "expires_in_s": o.expires_ms.map(|t| t.saturating_sub(now_ms).div_ceil(1000)),
    })
}

/// What an override's `limit` names.
enum Named {
    /// Limit `.1` of route `.0`.
    Limit(String, String),
    /// The limits counted on a shared counter.
    Share(String),
}

/// `limit` (`name`, `route/name` or a `share` name) as what it stands for.
/// A share's name stands for its counter even where its limits carry the
/// same name: one counter takes one override.
fn resolve(names: &LimitNames, limit: &str) -> Result<Named, BadField> {
    let names_share = names.shares.iter().any(|s| &**s == limit);
    if names_share {
        return Ok(Named::Share(limit.into()));
    }
    let names = &names.limits;
    if let Some((route, name)) = limit.split_once('/') {
        if names.iter().any(|(r, l)| &**r == route && &**l == name) {
            return Ok(Named::Limit(route.into(), name.into()));
        }
        return Err(bad(
            "limit",
            format!("no route {route:?} with a limit {name:?}"),
        ));
    }
    let routes: Vec<&str> = names
        .iter()
        .filter(|(_, l)| &**l == limit)
        .map(|(r, _)| &**r)
        .collect();
    match routes.as_slice() {
        [route] => Ok(Named::Limit((*route).into(), limit.into())),
        [] => Err(bad("limit", format!("no limit is named {limit:?}"))),
        many => Err(bad(
            "limit",
            format!(
                "{limit:?} is a limit of several routes; write one of {}",
                many.iter()
                    .map(|r| format!("{r}/{limit}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )),
    }
}

fn build(gw: &Gateway, b: &OverrideBody, now_ms: u64) -> Result<Override, BadField> {
    let subject = b.caller.subject()?;
    let names = gw.limit_names();
    let (route, limit, share) = match &b.limit {
        Some(l) => match resolve(&names, l)? {
            Named::Limit(r, l) => (Some(r), Some(l), false),
            Named::Share(s) => (None, Some(s), true),
        },
        None => (None, None, false),
    };
    if let Some(p) = &b.plan
        && !names.plans.iter().any(|n| **n == **p)
    {
        return Err(bad("plan", format!("no plan is named {p:?}")));
    }
    let ms = |d: std::time::Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    Ok(Override {
        subject,
        route,
        limit,
        share,
        quota: b.quota,
        window_ms: b.window.map(ms),
        plan: b.plan.clone(),
        exempt: b.exempt,
        expires_ms: b.ttl.map(|t| now_ms.saturating_add(ms(t))),
        set_ms: now_ms,
    })
}

/// The audit line of a write to the overrides: who, what, about whom,
/// and the overrides before and after.
fn audit(who: &Who, action: &str, caller: &str, before: &Value, after: &Value) {
    info!(
        target: "tollgate::audit",
        token = %who.0,
        action,
        caller,
        before = %before,
        after = %after,
        "admin write"
    );
}

/// `PUT /admin/overrides` with a JSON body.
pub async fn put(gw: &Gateway, body: &Bytes, who: &Who) -> Response<Full<Bytes>> {
    let mut parsed = match parse_override(body) {
        Ok(b) => b,
        Err(e) => return api::bad_field(&e),
    };
    if let Err(e) = super::known::known_key(gw, &mut parsed.caller) {
        return api::bad_field(&e);
    }
    let now_ms = gw.clock().now_ms();
    let o = match build(gw, &parsed, now_ms) {
        Ok(o) => o,
        Err(e) => return api::bad_field(&e),
    };
    let before = match gw.overrides().put(gw.limiter(), o.clone()).await {
        Ok(b) => b,
        Err(e) => return api::store_failed(&e),
    };
    let before = before.map(|b| render(&b, now_ms));
    let after = render(&o, now_ms);
    let was = before.clone().unwrap_or_default();
    audit(
        who,
        "overrides.put",
        &parsed.caller.describe(),
        &was,
        &after,
    );
    api::json(&json!({ "override": after, "replaced": before }))
}

/// `GET /admin/overrides`: every override, with whether its limit or plan
/// still exists (`orphaned` when not) and whether it has lapsed.
pub fn list(gw: &Gateway) -> Response<Full<Bytes>> {
    let now_ms = gw.clock().now_ms();
    let names = gw.limit_names();
    let all: Vec<Value> = gw
        .overrides()
        .all()
        .iter()
        .map(|o| {
            let limit_gone = o.limit.as_deref().is_some_and(|l| {
                if o.share {
                    return !names.shares.iter().any(|s| &**s == l);
                }
                !names
                    .limits
                    .iter()
                    .any(|(r, n)| &**n == l && o.route.as_deref().is_none_or(|or| or == &**r))
            });
            let plan_gone = o
                .plan
                .as_deref()
                .is_some_and(|p| !names.plans.iter().any(|n| &**n == p));
            let mut v = render(o, now_ms);
            v["orphaned"] = (limit_gone || plan_gone).into();
            v["expired"] = (!o.live(now_ms)).into();
            v
        })
        .collect();
    api::json(&json!({ "overrides": all }))
}

/// `DELETE /admin/overrides?api_key=k1&limit=per_key`: removes the
/// caller's override of that limit, or every override of the caller when
/// no `limit` (nor `route`) is given. `json.FIELD` values given narrow the
/// choice to the overrides naming them; those not given match any.
pub async fn remove(gw: &Gateway, query: &[u8], who: &Who) -> Response<Full<Bytes>> {
    let mut q = match parse_query(query) {
        Ok(q) => q,
        Err(e) => return api::bad_field(&e),
    };
    if let Err(e) = super::known::known_key(gw, &mut q.caller) {
        return api::bad_field(&e);
    }
    let subject = match q.caller.subject() {
        Ok(s) => s,
        Err(e) => return api::bad_field(&e),
    };
    let (route, limit) = q.route_and_limit();
    let now_ms = gw.clock().now_ms();
    let chosen: Vec<Override> = gw
        .overrides()
        .all()
        .iter()
        .filter(|o| o.subject.field == subject.field && o.subject.value == subject.value)
        .filter(|o| subject.json.iter().all(|j| o.subject.json.contains(j)))
        .filter(|o| limit.is_none_or(|l| o.limit.as_deref() == Some(l)))
        .filter(|o| route.is_none_or(|r| o.route.as_deref() == Some(r)))
        .cloned()
        .collect();
    if chosen.is_empty() {
        return api::problem(
            StatusCode::NOT_FOUND,
            "Not Found",
            "no override matches; GET /admin/overrides lists them",
            None,
        );
    }
    let mut removed = Vec::new();
    for o in &chosen {
        match gw.overrides().remove(gw.limiter(), &o.id()).await {
            Ok(Some(b)) => removed.push(render(&b, now_ms)),
            Ok(None) => {}
            Err(e) => return api::store_failed(&e),
        }
    }
    let was = Value::from(removed.clone());
    audit(
        who,
        "overrides.remove",
        &q.caller.describe(),
        &was,
        &Value::Null,
    );
    api::json(&json!({ "removed": removed }))
}
