//! The limits one caller meets, as the admin API shows and resets them:
//! for every route (or one), the limits the request path would decide for
//! this caller — its plan, its overrides — with the counter keys it would
//! use. Built from the same functions the decision phase uses, so the
//! keys shown are the keys counted.

use std::sync::Arc;

use crate::config::Limit;
use crate::decision::overrides::Override;
use crate::limit::LimitRequest;

/// A route's name and one of its limits' names.
pub type RouteLimit = (Arc<str>, Arc<str>);

/// What an override may name ([`Gateway::limit_names`](super::Gateway::limit_names)).
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
