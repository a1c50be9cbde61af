//! The decision phase: who is calling, which limits apply to them, and what the
//! limits say.
//!
//! The caller is worked out only on routes with limits. A caller the
//! route's `exempt:` names ([`exempt`]) goes on with no limit asked. On
//! routes whose
//! limits come from plans, the caller's plan picks the limits (a caller
//! without one is refused with 401). The caller's overrides from the admin
//! API ([`overrides`]) come next: a plan, other numbers, an exemption.
//! The caller's limit requests are built here — each limit's store key and
//! its mode: enforced or shadow, decided in the store, in `sync` mode or as
//! a concurrency slot — and decided by [`stages::decide`].
//!
//! What the limits said ([`CheckedLimits`]) and the caller's kind go to
//! the [`Exchange`], the record the rate-limit headers and the access log
//! read at the end, refused or not. What the next phases need when the
//! request goes on is returned: the [`Holdings`], the concurrency slots
//! `act` hands to the response and the reservations the response settles.

use std::borrow::Cow;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use http::Request;
use smallvec::SmallVec;
use tokio::time::Instant;
use tracing::debug;

use super::delay;
use super::delay::Waiting;
use super::exchange::{CheckedLimits, Exchange, Identities};
use super::exempt;
use super::overrides::{self, Applied};
use crate::clock::Clock;
use crate::config::{Config, Limit, PlansFrom};
use crate::decision::limiter::Limiter;
use crate::decision::overrides::{CallerOverrides, Override};
use crate::decision::record::{self, KeyText};
use crate::decision::settle::{self, Reservations};
use crate::decision::slots::Slots;
use crate::decision::stages;
use crate::decision::sync::syncable;
use crate::decision::{Decision, Unanswered};
use crate::headers;
use crate::identity::{self, AppKey, BodyFields, Caller, IdentityConfig, Sources};
use crate::limit::{Effect, Enforcement, LimitKind, LimitRequest, Mode};
use crate::metrics::RouteMetrics;
use crate::metrics::delay::DelayMetrics;
use crate::plans::{PlanChoice, PlanResolver};
use crate::problem::GatewayError;
use crate::routing::{CompiledRoute, LimitView};
use crate::store::keys::{self, KeySuffix, StoreKey};
use crate::top::TopOffenders;

pub mod alone;

/// A request's limit requests, one per limit: on the stack for the usual
/// one or two.
pub type Requests = SmallVec<[LimitRequest; 2]>;

/// What a request holds while it goes on, handed on by the decision
/// phase: its concurrency slots and its reserved costs.
#[derive(Debug, Default)]
pub struct Holdings {
    /// The concurrency slots the request holds: handed to the response by
    /// `act`, given back when dropped.
    pub slots: Option<Slots>,
    /// Reserved costs the response settles.
    pub reservations: Option<Reservations>,
}

/// What the decision phase reads besides the request and its route: the
/// configuration served, the plans, the limiter and what sits beside it.
/// The gateway lends its own ([`Gateway::deciding`](super::Gateway)); an
/// application's [`RateLimitLayer`](crate::layer) holds its own.
#[derive(Clone, Copy)]
pub struct Deciding<'a> {
    /// The configuration served: callers' sections, the store's prefix.
    pub config: &'a Config,
    /// API key → plan.
    pub plans: &'a PlanResolver,
    /// Decides the limits.
    pub limiter: &'a Limiter,
    /// Per-caller overrides from the admin API.
    pub overrides: &'a CallerOverrides,
    /// The lines of `on_limit: delay`.
    pub waiting: &'a Waiting,
    /// Top offenders, counted per limit.
    pub top: &'a TopOffenders,
    /// The clock decisions are made on.
    pub clock: &'a dyn Clock,
    /// The caller's values the decision looks up besides its client IP
    /// (every one while the admin API's overrides, which may name any,
    /// are set).
    pub sources: Sources,
}

/// What deciding a request's limits came to: the decision, the slots it
/// holds, and its instant (a delayed request's is when it was last asked).
struct Decided {
    decision: Decision,
    slots: Option<Slots>,
    now_ms: u64,
}

impl Decided {
    /// The last decision of a wait that ends refused: it holds no slot.
    fn refused((decision, now_ms): (Decision, u64)) -> Self {
        Self {
            decision,
            slots: None,
            now_ms,
        }
    }
}

/// Whom a decision is for.
#[derive(Debug)]
pub enum Purpose<'a> {
    /// A served request: it may wait for its `on_limit: delay` limits.
    Serve,
    /// A rehearsal ([`Gateway::decide_only`]): decided at its instant and
    /// never waiting (see docs/simulate.md); notes who the caller is and
    /// what each limit counted it as.
    Rehearse(&'a mut Identities),
}

/// Decides the route's limits for the caller of `req`, recording what they
/// said in `ex`.
///
/// A decision the store answers at once (in process, without plans to
/// look up, concurrency slots or delays) is made before the first await
/// ([`begin`]), so nothing of it is held across one: this future is the
/// arguments and, for the rest, a pointer to the part that waits.
///
/// # Errors
/// [`GatewayError::UnknownApiKey`] when the route's limits come from plans
/// and the caller has none, [`GatewayError::StoreUnavailable`] when the
/// store cannot decide and the route fails closed, and
/// [`GatewayError::Limited`] when an enforced limit denies.
pub async fn decide<B>(
    d: &Deciding<'_>,
    route: &Arc<CompiledRoute>,
    req: &Request<B>,
    ex: &mut Exchange,
    mut purpose: Purpose<'_>,
) -> Result<Holdings, GatewayError> {
    let rest = match begin(d, route, req, ex, &mut purpose) {
        Step::Done(done) => return done,
        Step::Later(rest) => rest,
    };
    // Boxed: a Redis call, a plan's lookup, a slot or a wait would
    // otherwise sit in every request's future, in process too.
    Box::pin(rest.finish(d, route, req, ex, purpose)).await
}

/// [`decide`] of a served request when it needs no wait: in process,
/// without a plan to look up, concurrency slots or delays. `None` when it
/// would wait; [`decide`] then makes it, working the caller out again,
/// with an `ex` of its own (this one has been written to).
pub fn decide_at_once<B>(
    d: &Deciding<'_>,
    route: &Arc<CompiledRoute>,
    req: &Request<B>,
    ex: &mut Exchange,
) -> Option<Result<Holdings, GatewayError>> {
    match begin(d, route, req, ex, &mut Purpose::Serve) {
        Step::Done(done) => Some(done),
        Step::Later(_) => None,
    }
}

/// How far [`begin`] took a decision: done, or waiting on the store.
// A `Step` is returned once and its `Later` moved once, into the boxed
// rest of the decision: boxing it too would be a second allocation there.
#[allow(clippy::large_enum_variant)]
enum Step<'r> {
    Done(Result<Holdings, GatewayError>),
    Later(Later<'r>),
}

/// A decision that waits, with what [`begin`] found for it.
enum Later<'r> {
    /// The caller's plan is looked up by its API key.
    Plan {
        caller: Caller<'r>,
        now_ms: u64,
        found: Vec<Override>,
    },
    /// The limits' requests are ready; the store answers later.
    Store {
        caller: Caller<'r>,
        now_ms: u64,
        view: Option<Arc<LimitView>>,
        requests: Requests,
    },
}

/// The decision up to its first wait, all of it when the store answers at
/// once: the caller, exemptions, overrides and plan, the requests, and an
/// in-process decision.
fn begin<'r, B>(
    d: &Deciding<'_>,
    route: &Arc<CompiledRoute>,
    req: &'r Request<B>,
    ex: &mut Exchange,
    purpose: &mut Purpose<'_>,
) -> Step<'r> {
    if route.route.limits.is_empty() {
        return Step::Done(Ok(Holdings::default()));
    }
    let cfg = d.config;
    let now_ms = d.clock.now_ms();
    let caller = caller_of(d, route, req, ex.peer.ip());
    ex.identified(&caller);
    if let Purpose::Rehearse(ids) = purpose {
        ids.saw(&caller);
    }
    let exempt = route.route.exempt.as_deref();
    if exempt::applies(exempt, &cfg.client_ip, ex.peer.ip(), req.headers(), &caller) {
        ex.exempt = true;
        return Step::Done(Ok(Holdings::default()));
    }
    let found = if d.overrides.is_empty() {
        Vec::new()
    } else {
        d.overrides.of(&caller, now_ms)
    };
    let view = match plan_now(d, route, &caller, overrides::plan(&found)) {
        Some(Ok(view)) => view,
        Some(Err(e)) => return Step::Done(Err(e)),
        None => {
            return Step::Later(Later::Plan {
                caller,
                now_ms,
                found,
            });
        }
    };
    // Filled in place: the requests are a few hundred bytes, and every
    // move of them is a copy.
    let mut requests = Requests::new();
    let Some(view) = requested(
        d,
        route,
        req,
        view,
        &found,
        &caller,
        ex,
        purpose,
        &mut requests,
    ) else {
        return Step::Done(Ok(Holdings::default()));
    };
    let (limits, _) = route.limits_in(view.as_deref());
    if !limits.iter().any(|l| l.delay.is_some()) {
        let timer = ex.span.is_some().then(std::time::Instant::now);
        // The decision goes straight to `conclude`, in no tuple or
        // struct: it is over a hundred bytes, and every move is a copy.
        if let Some(decision) = stages::decide_now(d.limiter, now_ms, &requests) {
            if let (Some(span), Some(t)) = (ex.span.as_mut(), timer) {
                span.store_time = Some(t.elapsed());
            }
            let done = conclude(
                d, route, view, &requests, &caller, decision, None, now_ms, ex,
            );
            return Step::Done(done);
        }
    }
    Step::Later(Later::Store {
        caller,
        now_ms,
        view,
        requests,
    })
}

/// The caller of `req`, from `peer`, with the values the route's limits
/// read (every one while overrides, which may name any, are set).
fn caller_of<'r, B>(
    d: &Deciding<'_>,
    route: &CompiledRoute,
    req: &'r Request<B>,
    peer: IpAddr,
) -> Caller<'r> {
    let cfg = d.config;
    let idc = IdentityConfig {
        client_ip: &cfg.client_ip,
        api_keys: &cfg.api_keys,
        users: &cfg.users,
        plans_from: &cfg.plans_from,
    };
    let read = if d.overrides.is_empty() {
        d.sources
    } else {
        Sources::ALL
    };
    let mut caller = identity::caller_reading(idc, peer, req.headers(), read);
    // Each looked up in the extensions only where something reads it. The
    // body's fields: the pipeline peeked the body before this phase
    // ([`super::body`]), a replay took them from its log line.
    if let Some(AppKey(key)) = read.user.then(|| req.extensions().get()).flatten() {
        caller.user = Some(Cow::Borrowed(key.as_bytes()));
    }
    if !route.body_reads.is_empty() {
        caller.body = req.extensions().get::<BodyFields>();
    }
    caller
}

impl Later<'_> {
    /// The rest of a decision that waits: the plan looked up, then the
    /// limits decided ([`decide_limits`]).
    async fn finish<B>(
        self,
        d: &Deciding<'_>,
        route: &Arc<CompiledRoute>,
        req: &Request<B>,
        ex: &mut Exchange,
        mut purpose: Purpose<'_>,
    ) -> Result<Holdings, GatewayError> {
        let (caller, now_ms, view, requests) = match self {
            Later::Plan {
                caller,
                now_ms,
                found,
            } => {
                let view = plan(d, route, &caller, now_ms, overrides::plan(&found)).await?;
                let mut requests = Requests::new();
                let Some(view) = requested(
                    d,
                    route,
                    req,
                    view,
                    &found,
                    &caller,
                    ex,
                    &mut purpose,
                    &mut requests,
                ) else {
                    return Ok(Holdings::default());
                };
                (caller, now_ms, view, requests)
            }
            Later::Store {
                caller,
                now_ms,
                view,
                requests,
            } => (caller, now_ms, view, requests),
        };
        let (limits, _) = route.limits_in(view.as_deref());
        let metrics = ex.metrics.as_deref();
        // Timed for the request's span only: an untraced request reads no clock.
        let timer = ex.span.is_some().then(std::time::Instant::now);
        let Decided {
            decision,
            slots,
            now_ms,
        } = decide_limits(d, route, limits, &requests, now_ms, &purpose, metrics).await;
        if let (Some(span), Some(t)) = (ex.span.as_mut(), timer) {
            span.store_time = Some(t.elapsed());
        }
        conclude(
            d, route, view, &requests, &caller, decision, slots, now_ms, ex,
        )
    }
}

/// The limits to decide for the caller — `view` with `found`'s overrides
/// applied — with one store request per limit pushed to `requests`;
/// `None` when an override exempts the caller (recorded in `ex`).
#[allow(clippy::too_many_arguments)]
fn requested<B>(
    d: &Deciding<'_>,
    route: &CompiledRoute,
    req: &Request<B>,
    view: Option<Arc<LimitView>>,
    found: &[Override],
    caller: &Caller<'_>,
    ex: &mut Exchange,
    purpose: &mut Purpose<'_>,
    requests: &mut Requests,
) -> Option<Option<Arc<LimitView>>> {
    let view = match overrides::apply(d.config, route, view, found) {
        Applied::Limits(v) => v,
        Applied::Exempt => {
            ex.exempt = true;
            return None;
        }
    };
    let (limits, suffixes) = route.limits_in(view.as_deref());
    let length = limits
        .iter()
        .any(|l| l.settle.is_some())
        .then(|| crate::guard::content_length(req.headers()))
        .flatten();
    push_requests(requests, d.config, route, limits, suffixes, caller, length);
    if let Purpose::Rehearse(ids) = purpose {
        ids.counted_as(requests);
    }
    Some(view)
}

/// What the limits decided at `now_ms` (`decision`, with the slots it
/// holds), recorded (metrics, top offenders, `ex`) and answered: the
/// request's holdings, or why it is refused.
#[allow(clippy::too_many_arguments)]
fn conclude(
    d: &Deciding<'_>,
    route: &Arc<CompiledRoute>,
    view: Option<Arc<LimitView>>,
    requests: &[LimitRequest],
    caller: &Caller<'_>,
    decision: Decision,
    slots: Option<Slots>,
    now_ms: u64,
    ex: &mut Exchange,
) -> Result<Holdings, GatewayError> {
    let (limits, suffixes) = route.limits_in(view.as_deref());
    let keys = KeyText {
        requests,
        prefix: &d.config.store.prefix,
        suffixes,
        digest: d.config.store.digest_keys(),
    };
    record::record(
        &decision,
        &route.route.name,
        limits,
        keys,
        caller,
        ex.metrics.as_deref(),
        d.top,
    );
    if matches!(decision, Decision::Undecided(Unanswered::Unavailable)) {
        debug!(route = %route.route.name, "limiter unavailable; failing closed (on_error: deny)");
        return Err(GatewayError::StoreUnavailable);
    }
    let refused = refusal(route, limits, requests, &decision);
    let reservations = settle::pending(limits, requests, &decision, now_ms, ex.metrics.as_deref());
    ex.checked = Some(CheckedLimits {
        route: route.clone(),
        view,
        decision,
        now_ms,
    });
    match refused {
        Some(refusal) => Err(refusal),
        None => Ok(Holdings {
            slots,
            reservations,
        }),
    }
}

/// The 429 of a request `decision` refuses, `None` when it admits.
fn refusal(
    route: &CompiledRoute,
    limits: &[Limit],
    requests: &[LimitRequest],
    decision: &Decision,
) -> Option<GatewayError> {
    (!decision.allowed()).then(|| {
        debug!(route = %route.route.name, "limited");
        let in_flight = stages::refused_by_concurrency(decision, requests);
        GatewayError::Limited {
            policies: decision.violated(limits),
            retry_after: (!in_flight)
                .then(|| decision.retry_after_ms().map(headers::ceil_secs))
                .flatten(),
            in_flight,
        }
    })
}

/// Decides the request's limits — concurrency slots first, then the rate
/// limits ([`stages::decide`]) — and, when `on_limit: delay` lets it
/// and `purpose` is [`Purpose::Serve`], waits for them to admit it ([`wait`]). Returns the decision, the slots
/// it holds and its instant.
async fn decide_limits(
    d: &Deciding<'_>,
    route: &CompiledRoute,
    limits: &[Limit],
    requests: &[LimitRequest],
    now_ms: u64,
    purpose: &Purpose<'_>,
    route_metrics: Option<&RouteMetrics>,
) -> Decided {
    let (decision, slots) = stages::decide(d.limiter, now_ms, requests, route.route.on_error).await;
    match delay::budget(&decision, limits) {
        Some(budget) if matches!(purpose, Purpose::Serve) => {
            let metrics = route_metrics.map(|m| m.delay.clone());
            // Boxed, as the waits are rare: their timers and decisions
            // would otherwise sit in every request's future.
            let last = (decision, now_ms);
            Box::pin(wait(d, route, limits, requests, budget, last, metrics)).await
        }
        _ => Decided {
            decision,
            slots,
            now_ms,
        },
    }
}

/// `on_limit: delay`: waits in the request's line and decides it again
/// when its limits should admit it ([`delay`]), until they do or its
/// `max_delay` has passed. Returns the last decision and its instant.
async fn wait(
    d: &Deciding<'_>,
    route: &CompiledRoute,
    limits: &[Limit],
    requests: &[LimitRequest],
    (mut max, retry): (Duration, u64),
    mut last: (Decision, u64),
    metrics: Option<DelayMetrics>,
) -> Decided {
    let line = requests
        .iter()
        .map(|r| r.key.text())
        .collect::<Vec<_>>()
        .join("\n");
    let Some(mut place) = d.waiting.enter(
        &route.route.name,
        route.route.max_queue,
        line.into(),
        metrics,
    ) else {
        return Decided::refused(last);
    };
    let arrived = place.arrived();
    let earliest = delay::earliest_ms(&last.0, requests, last.1, (retry, place.ahead()));
    if Duration::from_millis(earliest) > max {
        // Its place in line puts it past `max_delay`: refused now, not
        // after the wait.
        return Decided::refused(last);
    }
    if !place.reach_head(arrived + max).await {
        return Decided::refused(last);
    }
    let mut ready = arrived + Duration::from_millis(retry);
    while ready <= arrived + max {
        tokio::time::sleep_until(ready).await;
        let now_ms = d.clock.now_ms();
        let (decision, slots) =
            stages::decide(d.limiter, now_ms, requests, route.route.on_error).await;
        if decision.allowed() {
            place.admitted();
            return Decided {
                decision,
                slots,
                now_ms,
            };
        }
        let Some((m, retry)) = delay::budget(&decision, limits) else {
            return Decided::refused((decision, now_ms));
        };
        max = max.min(m);
        // At least a millisecond: a store that says "now" again is asked
        // again on the next tick, not in a spin.
        ready = Instant::now() + Duration::from_millis(retry.max(1));
        last = (decision, now_ms);
    }
    Decided::refused(last)
}

/// The route's limits for the caller's plan, when they come from plans.
pub(super) async fn plan(
    d: &Deciding<'_>,
    route: &CompiledRoute,
    caller: &Caller<'_>,
    now_ms: u64,
    chosen: Option<Arc<str>>,
) -> Result<Option<Arc<LimitView>>, GatewayError> {
    if let Some(view) = plan_now(d, route, caller, chosen) {
        return view;
    }
    // Boxed: a Redis call's future is kilobytes, and this one would
    // otherwise sit in every request's future.
    let choice = Box::pin(d.plans.plan_of(caller.api_key, d.limiter, now_ms)).await;
    plan_view(route, choice)
}

/// [`plan`] when it needs no lookup: the route has no plans, an
/// override names the plan, or the plan comes from a claim or a header;
/// `None` when the API key's plan is to be looked up. Inlined: on a route
/// without plans it is one check, and no call.
#[inline]
fn plan_now(
    d: &Deciding<'_>,
    route: &CompiledRoute,
    caller: &Caller<'_>,
    chosen: Option<Arc<str>>,
) -> Option<Result<Option<Arc<LimitView>>, GatewayError>> {
    if route.plan_views.is_empty() {
        return Some(Ok(None));
    }
    plan_chosen(d, route, caller, chosen)
}

/// [`plan_now`] on a route whose limits come from plans.
fn plan_chosen(
    d: &Deciding<'_>,
    route: &CompiledRoute,
    caller: &Caller<'_>,
    chosen: Option<Arc<str>>,
) -> Option<Result<Option<Arc<LimitView>>, GatewayError>> {
    // An override's plan comes before the Redis hash and the file's keys.
    let choice = match (chosen, &d.config.plans_from) {
        (Some(p), _) if route.plan_views.contains_key(&p) => PlanChoice::Plan(p),
        (_, PlansFrom::ApiKey) => return None,
        (_, PlansFrom::Claim(_) | PlansFrom::Header(_)) => {
            d.plans.plan_named(caller.plan.as_deref())
        }
    };
    Some(plan_view(route, choice))
}

/// The view of the plan chosen; a caller without one is refused.
fn plan_view(
    route: &CompiledRoute,
    choice: PlanChoice,
) -> Result<Option<Arc<LimitView>>, GatewayError> {
    let view = match choice {
        PlanChoice::Plan(p) => route.plan_views.get(&p).cloned(),
        PlanChoice::Reject => None,
    };
    if view.is_none() {
        debug!(route = %route.route.name, "no plan for this caller");
        return Err(GatewayError::UnknownApiKey);
    }
    Ok(view)
}

/// One store request per limit: its counter key ([`keys::counter_key`]),
/// its numbers and its mode.
pub(super) fn limit_requests(
    cfg: &Config,
    route: &CompiledRoute,
    limits: &[Limit],
    suffixes: &[KeySuffix],
    caller: &Caller<'_>,
    content_length: Option<u64>,
) -> Requests {
    let mut requests = Requests::new();
    push_requests(
        &mut requests,
        cfg,
        route,
        limits,
        suffixes,
        caller,
        content_length,
    );
    requests
}

/// [`limit_requests`] pushed to `requests`.
fn push_requests(
    requests: &mut Requests,
    cfg: &Config,
    route: &CompiledRoute,
    limits: &[Limit],
    suffixes: &[KeySuffix],
    caller: &Caller<'_>,
    content_length: Option<u64>,
) {
    let mut scratch = String::new();
    // Pushed one by one: collecting into a `SmallVec` through its
    // `Extend` costs more.
    for (l, suffix) in limits.iter().zip(suffixes) {
        let key = match suffix.id() {
            // Numbered when the route was compiled: counted in process by
            // the client IP alone.
            Some(limit) => StoreKey::Address {
                limit,
                net: caller.ip,
            },
            // A share's identity is always a digest: its key must not
            // depend on `readable_keys` (see `keys::is_share`).
            None => StoreKey::Text(keys::counter_key(
                &cfg.store.prefix,
                cfg.store.digest_keys() || l.share.is_some(),
                suffix,
                &mut scratch,
                |out| identity::write_key(out, &l.key, caller),
            )),
        };
        requests.push(LimitRequest {
            key,
            limit: l.limit.get(),
            window_ms: l.window_ms.get(),
            cost: settle::reserve(l, route.route.cost, content_length, caller.body),
            algorithm: l.algorithm,
            mode: mode(l, route),
        });
    }
}

/// How limit `l` of `route` is asked: shadow when either says so; a
/// concurrency slot, in `sync` mode (when its algorithm can be synced), or
/// in the store.
fn mode(l: &Limit, route: &CompiledRoute) -> Mode {
    let kind = match (l.concurrency, l.sync) {
        (Some(cap), _) => LimitKind::Concurrency(cap.get()),
        (None, Some(every)) if syncable(l.algorithm) => {
            LimitKind::Synced(u64::try_from(every.as_millis()).unwrap_or(u64::MAX).max(1))
        }
        (None, _) => LimitKind::Exact,
    };
    Mode {
        effect: Effect::Count,
        enforcement: if route.route.shadow || l.shadow {
            Enforcement::Shadow
        } else {
            Enforcement::Enforced
        },
        kind,
    }
}
