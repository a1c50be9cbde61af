//! A caller's overrides applied to the limits of one route, between the
//! plan and the decision: a plan override picks the plan (before the Redis
//! hash and the file's keys), an exemption takes a limit (or every limit)
//! out of the decision, and other numbers replace a limit's quota and
//! window. A changed set of limits becomes a view of its own, so the
//! rate-limit headers show the numbers the caller is held to. Counter keys
//! do not change: a caller keeps what it has used.

use std::num::NonZeroU64;
use std::sync::Arc;

use crate::config::Config;
use crate::decision::overrides::Override;
use crate::headers;
use crate::routing::{CompiledRoute, LimitView};

/// The route's limits after the caller's overrides.
#[derive(Debug)]
pub enum Applied {
    /// The limits to decide: the plan's view, a view of their own, or the
    /// route's own (`None`).
    Limits(Option<Arc<LimitView>>),
    /// Every limit of the route is waived for this caller.
    Exempt,
}

/// The plan a whole-caller override serves `found`'s caller by.
#[inline]
pub fn plan(found: &[Override]) -> Option<Arc<str>> {
    found
        .iter()
        .find(|o| o.limit.is_none() && o.plan.is_some())
        .and_then(|o| o.plan.as_deref().map(Arc::from))
}

/// `view` (the plan's, or the route's own when `None`) with `found`'s
/// overrides applied. Inlined: most callers have no override, and their
/// requests then make no call.
#[inline]
pub fn apply(
    cfg: &Config,
    route: &CompiledRoute,
    view: Option<Arc<LimitView>>,
    found: &[Override],
) -> Applied {
    if found.is_empty() {
        return Applied::Limits(view);
    }
    apply_found(cfg, route, view, found)
}

/// [`apply`] of a caller with overrides.
fn apply_found(
    cfg: &Config,
    route: &CompiledRoute,
    view: Option<Arc<LimitView>>,
    found: &[Override],
) -> Applied {
    if found.iter().any(|o| o.limit.is_none() && o.exempt) {
        return Applied::Exempt;
    }
    let name = &*route.route.name;
    let (limits, suffixes) = route.limits_in(view.as_deref());
    let about = |l: &crate::config::Limit| {
        found
            .iter()
            .find(|o| o.about(name, &l.name, l.share.as_deref()))
    };
    if !limits.iter().any(|l| about(l).is_some()) {
        return Applied::Limits(view);
    }
    let mut kept = Vec::with_capacity(limits.len());
    let mut key_suffixes = Vec::with_capacity(limits.len());
    for (l, suffix) in limits.iter().zip(suffixes) {
        let mut l = l.clone();
        if let Some(o) = about(&l) {
            if o.exempt {
                continue;
            }
            if let Some(q) = o.quota.and_then(NonZeroU64::new) {
                l.limit = q;
                if l.concurrency.is_some() {
                    l.concurrency = Some(q);
                }
            }
            if let Some(w) = o.window_ms.and_then(NonZeroU64::new) {
                l.window_ms = w;
            }
        }
        kept.push(l);
        key_suffixes.push(suffix.clone());
    }
    if kept.is_empty() {
        return Applied::Exempt;
    }
    Applied::Limits(Some(Arc::new(LimitView {
        policy_header: headers::policy_header(cfg.headers, &kept),
        limits: kept,
        key_suffixes,
    })))
}
