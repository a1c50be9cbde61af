//! Concurrency limits decided (docs/limits.md#concurrency-limits): slots taken before the rate
//! limits, held by a guard as long as the response, given back on every
//! path.
//!
//! [`decide`] takes one slot per concurrency limit of the request, then
//! decides the rate limits ([`shadow::decide`]) — only when every slot was
//! free, so a request a concurrency limit refuses consumes no rate quota.
//! When the rate limits refuse (or the store fails closed) the slots are
//! given back before the answer, so a refused request holds nothing. The
//! outcomes are merged back at the limits' positions: the [`RouteDecision`]
//! has one outcome and one verdict per limit, in order, as without
//! concurrency limits.
//!
//! The slots held are a [`Slots`] guard whose `Drop` gives them back: the
//! pipeline keeps it in the response body's watch, or the upgrade tunnel's
//! task, or drops it with the refusal. A slot in process is given back at
//! once; a lease in Redis by a spawned removal ([`RedisLeases::release`]),
//! never waited for. One task per gateway renews the live leases every
//! third of `store.redis.lease`.
//!
//! The failure policy is the rate limits' (`on_error`, the route's before
//! the store's), applied in [`slots`](super::slots): when Redis cannot take a slot, `allow` goes on without one
//! (the limit counts an error and no `RateLimit` header is sent), `deny`
//! answers 503, and `local` takes it in process, the cap divided by the
//! live gateway instances as `local` divides a rate.
//!
//! A shadow concurrency limit takes a slot when one is free and lets the
//! request through without one when none is, counted as a shadow denial.

use super::limiter::Limiter;
use super::shadow::{self, is_shadow};
use super::slots::{Slots, Take};
use super::{Decided, RouteDecision, Undecided};
use crate::config::{Limit, OnError};
use crate::limit::{LimitRequest, Outcomes, Verdict, concurrency};

/// What one concurrency limit said.
#[derive(Clone, Copy)]
enum Said {
    Held(u64),
    Full,
    ShadowFull,
    Unleased,
}

/// Decides `requests` (one per limit of `limits`, some of them concurrency
/// limits): the concurrency limits' slots first, then the rate limits by
/// [`shadow::decide`]. The slots come back only when the request goes on;
/// see the module docs. A request without concurrency limits goes to
/// [`shadow::decide`] directly (the pipeline's decision phase chooses).
pub async fn decide(
    limiter: &Limiter,
    now_ms: u64,
    limits: &[Limit],
    route_shadow: bool,
    requests: &[LimitRequest],
    on_error: Option<OnError>,
) -> (RouteDecision, Option<Slots>) {
    let conc = limiter.concurrency();
    let mut slots = Slots::default();
    let mut said: Vec<Option<Said>> = vec![None; limits.len()];
    let mut full = false;
    for (i, (l, r)) in limits.iter().zip(requests).enumerate() {
        let Some(cap) = l.concurrency else { continue };
        let s = match conc
            .take(&r.key, cap.get(), on_error, limiter.live_instances())
            .await
        {
            Take::Held(slot, free) => {
                slots.push(slot);
                Said::Held(free)
            }
            Take::Full if is_shadow(route_shadow, l) => Said::ShadowFull,
            Take::Full => {
                full = true;
                Said::Full
            }
            Take::Unleased => Said::Unleased,
            // The slots taken so far go back with `slots`.
            Take::Unavailable => return (Undecided::Unavailable.into(), None),
        };
        said[i] = Some(s);
    }
    let rate: Vec<usize> = (0..limits.len()).filter(|&i| said[i].is_none()).collect();
    let rate_limits: Vec<&Limit> = rate.iter().map(|&i| &limits[i]).collect();
    let mut rate_requests: Vec<LimitRequest> = rate.iter().map(|&i| requests[i].clone()).collect();
    // Refused: the slots go back, and the rate limits are only read
    // (cost 0) for the 429's headers, so nothing is consumed.
    let slots = (!full).then_some(slots);
    if full {
        for r in &mut rate_requests {
            r.cost = 0;
        }
    }
    let rated = if rate.is_empty() {
        RouteDecision::Decided(Decided {
            allowed: true,
            outcomes: Some(Outcomes::new()),
            verdicts: Vec::new(),
        })
    } else {
        shadow::decide(
            limiter,
            now_ms,
            &rate_limits,
            route_shadow,
            &rate_requests,
            on_error,
        )
        .await
    };
    if full {
        return (merge(&rated, &rate, &said, Ending::Full), None);
    }
    match rated {
        RouteDecision::Decided(ref d) if d.allowed => {
            (merge(&rated, &rate, &said, Ending::Admitted), slots)
        }
        // Refused by a rate limit: the slots go back before the answer.
        RouteDecision::Decided(_) => (merge(&rated, &rate, &said, Ending::RateRefused), None),
        RouteDecision::Undecided(Undecided::FailedOpen) => (rated, slots),
        RouteDecision::Undecided(Undecided::Unavailable) => (rated, None),
    }
}

/// How a request with concurrency limits ended, for [`merge`].
#[derive(Clone, Copy, PartialEq, Eq)]
enum Ending {
    /// Admitted: the slots stay held.
    Admitted,
    /// A rate limit refused: the slots go back, so a held slot shows as
    /// free again.
    RateRefused,
    /// A concurrency limit refused: the slots go back and the rate limits
    /// were only read, so their verdicts are not counted.
    Full,
}

/// The whole request's decision from the rate limits' (`rated`, at the
/// positions `rate`) and the concurrency limits' (`said`), as `ending`
/// leaves them.
fn merge(
    rated: &RouteDecision,
    rate: &[usize],
    said: &[Option<Said>],
    ending: Ending,
) -> RouteDecision {
    let kept = ending == Ending::Admitted;
    let read = ending == Ending::Full;
    let n = said.len();
    let mut verdicts: Vec<Option<Verdict>> = vec![None; n];
    let rate_verdicts: &[Option<Verdict>] = match rated {
        RouteDecision::Decided(d) if !read => &d.verdicts,
        _ => &[],
    };
    for (&i, v) in rate.iter().zip(rate_verdicts) {
        verdicts[i] = *v;
    }
    let rate_outcomes = rated.outcomes();
    let mut outcomes = Some(Outcomes::with_capacity(n));
    let mut next_rate = rate_outcomes.map(<[_]>::iter);
    for (i, s) in said.iter().enumerate() {
        let o = match s {
            None => next_rate.as_mut().and_then(Iterator::next).copied(),
            Some(Said::Held(free)) => {
                verdicts[i] = Some(Verdict::Allowed);
                let free = if kept { *free } else { free + 1 };
                Some(concurrency::outcome(true, free))
            }
            Some(Said::Full) => {
                verdicts[i] = Some(Verdict::Limited);
                Some(concurrency::outcome(false, 0))
            }
            Some(Said::ShadowFull) => {
                verdicts[i] = Some(Verdict::ShadowLimited);
                Some(concurrency::outcome(false, 0))
            }
            Some(Said::Unleased) => {
                verdicts[i] = Some(Verdict::Error);
                None
            }
        };
        match (o, &mut outcomes) {
            (Some(o), Some(all)) => all.push(o),
            _ => outcomes = None,
        }
    }
    RouteDecision::Decided(Decided {
        allowed: kept,
        outcomes,
        verdicts,
    })
}

/// Whether a concurrency limit refused the request: its 429 then names no
/// Retry-After, since nothing tells when a request in flight will end.
pub fn refused_by_concurrency(decision: &RouteDecision, limits: &[Limit]) -> bool {
    decision
        .denied()
        .any(|(i, shadow)| !shadow && limits.get(i).is_some_and(|l| l.concurrency.is_some()))
}
