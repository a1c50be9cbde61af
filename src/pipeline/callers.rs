//! The limits one caller meets, as the admin API shows and resets them:
//! for every route (or one), the limits the request path would decide for
//! this caller — its plan, its overrides — with the counter keys it would
//! use. Built from the same functions the decision phase uses, so the
//! keys shown are the keys counted.

use std::sync::Arc;

use super::decide::{limit_requests, plan};
use super::gateway::Gateway;
use super::overrides::{self, Applied};
use crate::config::Limit;
use crate::decision::overrides::Override;
use crate::identity::{self, Caller};
use crate::limit::LimitRequest;

/// A route's name and one of its limits' names.
pub type RouteLimit = (Arc<str>, Arc<str>);

/// What an override may name ([`Gateway::limit_names`]).
#[derive(Debug, Default)]
pub struct LimitNames {
    /// Every `(route, limit)`.
    pub limits: Vec<RouteLimit>,
    /// Every `share` name.
    pub shares: Vec<Arc<str>>,
    /// Every plan's name.
    pub plans: Vec<Arc<str>>,
}

/// One limit a caller meets on one route.
#[derive(Debug, Clone)]
pub struct CallerLimit {
    /// The route's name.
    pub route: Arc<str>,
    /// The limit, with the caller's override applied.
    pub limit: Limit,
    /// Its store request: the counter key and numbers.
    pub request: LimitRequest,
    /// The identity text the key is made of (`ip=…`, `key=…`).
    pub identity: String,
    /// The override that changed it, if one did.
    pub override_: Option<Override>,
}

/// What a lookup found for a caller.
#[derive(Debug, Default)]
pub struct Found {
    /// The limits met, route by route.
    pub limits: Vec<CallerLimit>,
    /// Routes where an override exempts the caller from every limit.
    pub exempt_routes: Vec<Arc<str>>,
    /// Routes whose limits come from plans and the caller has none.
    pub no_plan_routes: Vec<Arc<str>>,
}

impl Gateway {
    /// Requests of this gateway waiting (`on_limit: delay`) in a line that
    /// counts `key`.
    pub fn waiting_on(&self, key: &str) -> u64 {
        self.waiting.waiting_on(key)
    }

    /// The limits `caller` meets, on route `route` (all when `None`) and
    /// of limit `limit` (all when `None`). Without `has_ip` the caller's
    /// IP is unknown, and limits keyed by it are left out.
    pub async fn caller_limits(
        &self,
        caller: &Caller<'_>,
        has_ip: bool,
        route: Option<&str>,
        limit: Option<&str>,
    ) -> Found {
        let rt = self.snapshot.load();
        let now_ms = self.clock.now_ms();
        let found_overrides = self.overrides.of(caller, now_ms);
        let mut found = Found::default();
        for r in rt.router.routes() {
            if r.route.limits.is_empty() || route.is_some_and(|n| n != &*r.route.name) {
                continue;
            }
            let chosen = overrides::plan(&found_overrides);
            let Ok(view) = plan(self, &rt, r, caller, now_ms, chosen).await else {
                found.no_plan_routes.push(r.route.name.clone());
                continue;
            };
            let view = match overrides::apply(&rt.config, r, view, &found_overrides) {
                Applied::Limits(v) => v,
                Applied::Exempt => {
                    found.exempt_routes.push(r.route.name.clone());
                    continue;
                }
            };
            let (limits, suffixes) = r.limits_in(view.as_deref());
            let requests = limit_requests(&rt.config, r, limits, suffixes, caller, None);
            for (l, request) in limits.iter().zip(requests) {
                if limit.is_some_and(|n| n != &*l.name) {
                    continue;
                }
                let mut text = String::new();
                identity::write_key(&mut text, &l.key, caller);
                if !has_ip && text.contains("ip=") {
                    continue;
                }
                found.limits.push(CallerLimit {
                    route: r.route.name.clone(),
                    override_: found_overrides
                        .iter()
                        .find(|o| o.about(&r.route.name, &l.name, l.share.as_deref()))
                        .cloned(),
                    limit: l.clone(),
                    request,
                    identity: text,
                });
            }
        }
        found
    }

    /// What an override may name: every `(route, limit)` a caller can
    /// meet — the routes' own limits and their plans' — the `share` names,
    /// and the plans' names.
    pub fn limit_names(&self) -> LimitNames {
        let rt = self.snapshot.load();
        let mut names = LimitNames::default();
        for r in rt.router.routes() {
            let views = r.plan_views.values().map(|v| &v.limits);
            for l in std::iter::once(&r.route.limits).chain(views).flatten() {
                let pair = (r.route.name.clone(), l.name.clone());
                if !l.plan && !names.limits.contains(&pair) {
                    names.limits.push(pair);
                }
                if let Some(s) = &l.share
                    && !names.shares.contains(s)
                {
                    names.shares.push(s.clone());
                }
            }
        }
        names.plans = rt.config.plans.iter().map(|p| p.name.clone()).collect();
        names
    }
}
