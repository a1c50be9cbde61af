//! A route's limits decided for one request, in stages, from one list of
//! requests that each carry their [`Mode`]: which of them are concurrency
//! limits, which are shadow, which are only read. The list is split once
//! by stage, each stage is asked, and every answer goes back to its
//! limit's position in one [`Decision`].
//!
//! The stages, in order:
//!
//! 1. **Concurrency slots** (docs/limits.md#concurrency-limits): one slot
//!    per concurrency limit, taken before any rate limit is asked, so a
//!    request a concurrency limit refuses consumes no rate quota. A shadow
//!    concurrency limit takes a slot when one is free and lets the request
//!    through without one when none is (a shadow denial). The failure
//!    policy is the rate limits' (`on_error`, the route's before the
//!    store's), applied in [`slots`](super::slots).
//! 2. **Enforced rate limits**, together in one store call: the request is
//!    admitted only when every one admits, and only then is anything
//!    consumed.
//! 3. **Shadow rate limits** (`shadow: true` on a route or on one limit),
//!    together in one call: decided, counted, logged and shown exactly as
//!    enforcement would, but the request goes on. They are asked only after
//!    the enforced limits admitted, since a request enforcement refuses
//!    would never have reached them; a shadow-denied request stays counted
//!    by the enforced limits, as it did use the upstream.
//!
//! Once an enforced limit has refused, the later stages are asked with
//! [`Effect::Read`]: their numbers for the 429's `RateLimit` headers,
//! nothing consumed, no verdict counted. A refused request holds nothing:
//! its slots go back before the answer (a slot's outcome then shows it
//! free again). A route whose limits all sit in one stage — the usual
//! case — is one store call with no split at all.
//!
//! When the store cannot decide, the failure policy answers for the whole
//! request if it was the first rate stage asking to count ([`Unanswered`]);
//! a later stage's failure, or a failed read, leaves those limits without
//! outcomes and decides nothing. A failed-open request keeps its slots.
//!
//! The slots held are a [`Slots`] guard whose `Drop` gives them back: the
//! pipeline keeps it in the response body's watch, or the upgrade tunnel's
//! task, or drops it with the refusal. A slot in process is given back at
//! once; a lease in Redis by a spawned removal, never waited for.

use smallvec::SmallVec;

use super::limiter::Limiter;
use super::slots::{Slots, Take};
use super::{Decision, PerLimit, Unanswered, Verdicts};
use crate::config::OnError;
use crate::limit::{
    Effect, Enforcement, LimitKind, LimitRequest, Standing, Standings, Verdict, concurrency,
};

/// The stage a limit is asked in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    Slots,
    Enforced,
    Shadow,
}

impl Stage {
    fn of(r: &LimitRequest) -> Self {
        match (r.mode.kind, r.mode.enforcement) {
            (LimitKind::Concurrency(_), _) => Self::Slots,
            (_, Enforcement::Enforced) => Self::Enforced,
            (_, Enforcement::Shadow) => Self::Shadow,
        }
    }
}

/// Decides `requests` (one per limit of the route, in order) at `now_ms`;
/// `on_error` is the route's own failure policy, before the store's.
/// Returns the decision and, when the request goes on, the slots it holds.
pub async fn decide(
    limiter: &Limiter,
    now_ms: u64,
    requests: &[LimitRequest],
    on_error: Option<OnError>,
) -> (Decision, Option<Slots>) {
    let first = requests.first().map_or(Stage::Enforced, Stage::of);
    if first != Stage::Slots && requests.iter().all(|r| Stage::of(r) == first) {
        let decided = limiter.decide_with(now_ms, requests, on_error).await;
        return (one_stage(decided, first), None);
    }
    // Boxed, as routes mixing stages are few: their slot calls and second
    // store call would otherwise sit in every request's future.
    Box::pin(staged(limiter, now_ms, requests, on_error)).await
}

/// [`decide`] when the store answers at once ([`Limiter::decide_now`])
/// and the limits are one rate stage, which holds no slot; `None`
/// otherwise, to be decided by [`decide`].
pub fn decide_now(limiter: &Limiter, now_ms: u64, requests: &[LimitRequest]) -> Option<Decision> {
    let first = requests.first().map_or(Stage::Enforced, Stage::of);
    if first == Stage::Slots || !requests.iter().all(|r| Stage::of(r) == first) {
        return None;
    }
    let answer = limiter.decide_now(now_ms, requests)?;
    Some(answered(answer, first))
}

/// The decision of a route whose rate limits are all in `stage`, from
/// its one store call.
fn one_stage(decided: Result<crate::limit::Answer, Unanswered>, stage: Stage) -> Decision {
    match decided {
        Ok(d) => answered(d, stage),
        Err(u) => Decision::Undecided(u),
    }
}

/// The decision of enforced rate limits the store answered with `answer`.
pub fn enforced(answer: crate::limit::Answer) -> Decision {
    answered(answer, Stage::Enforced)
}

/// [`one_stage`] of a store's answer: taken as it is, not in a `Result`,
/// which would be a copy of it.
fn answered(d: crate::limit::Answer, stage: Stage) -> Decision {
    let shadow = stage == Stage::Shadow;
    // Pushed one by one: collected through a `SmallVec`'s `Extend`, the
    // usual one or two cost more.
    let mut verdicts = Verdicts::new();
    for o in &d.outcomes {
        verdicts.push(Some(verdict(o, stage)));
    }
    Decision::Decided(PerLimit {
        allowed: d.allowed || shadow,
        verdicts,
        outcomes: Some(d.outcomes),
    })
}

fn verdict(o: &Standing, stage: Stage) -> Verdict {
    match (o.admits, stage) {
        (true, _) => Verdict::Allowed,
        (false, Stage::Shadow) => Verdict::ShadowLimited,
        (false, _) => Verdict::Limited,
    }
}

/// Every limit's answer, at its position, as the stages fill them in.
struct Answers {
    outcomes: Vec<Option<Standing>>,
    verdicts: Verdicts,
    /// Whether an enforced limit refused.
    refused: bool,
}

impl Answers {
    fn set(&mut self, i: usize, outcome: Option<Standing>, verdict: Option<Verdict>) {
        self.outcomes[i] = outcome;
        self.verdicts[i] = verdict;
    }

    /// What the next stage's limits are asked for: counted, or only read
    /// once the request is refused.
    fn effect(&self) -> Effect {
        if self.refused {
            Effect::Read
        } else {
            Effect::Count
        }
    }
}

/// The request's limits in stages: slots, enforced rate limits, shadow
/// rate limits (see the module docs).
async fn staged(
    limiter: &Limiter,
    now_ms: u64,
    requests: &[LimitRequest],
    on_error: Option<OnError>,
) -> (Decision, Option<Slots>) {
    let n = requests.len();
    let mut answers = Answers {
        outcomes: vec![None; n],
        verdicts: smallvec::smallvec![None; n],
        refused: false,
    };
    let Some(slots) = take_slots(limiter, requests, on_error, &mut answers).await else {
        return (Unanswered::Unavailable.into(), None);
    };
    let mut first_rate = true;
    for stage in [Stage::Enforced, Stage::Shadow] {
        let at: SmallVec<[usize; 4]> = (0..n)
            .filter(|&i| Stage::of(&requests[i]) == stage)
            .collect();
        if at.is_empty() {
            continue;
        }
        let effect = answers.effect();
        let asked: Vec<LimitRequest> = at
            .iter()
            .map(|&i| {
                let mut r = requests[i].clone();
                r.mode.effect = effect;
                r
            })
            .collect();
        match limiter.decide_with(now_ms, &asked, on_error).await {
            Ok(d) => {
                for (&i, o) in at.iter().zip(&d.outcomes) {
                    let counted = (effect == Effect::Count).then(|| verdict(o, stage));
                    answers.set(i, Some(*o), counted);
                }
                answers.refused |= stage == Stage::Enforced && !d.allowed;
            }
            // The failure policy answers for the request.
            Err(u) if first_rate && effect == Effect::Count => {
                let slots = (u == Unanswered::FailedOpen).then_some(slots);
                return (u.into(), slots);
            }
            // A later stage or a read: those limits stay without outcomes.
            Err(_) => {}
        }
        first_rate = false;
    }
    if answers.refused {
        // The slots go back with the refusal: each shows itself free again.
        for (r, o) in requests.iter().zip(&mut answers.outcomes) {
            if let (LimitKind::Concurrency(_), Some(o)) = (r.mode.kind, o)
                && o.admits
            {
                o.remaining += 1;
            }
        }
    }
    let decision = Decision::Decided(PerLimit {
        allowed: !answers.refused,
        outcomes: answers.outcomes.into_iter().collect::<Option<Standings>>(),
        verdicts: answers.verdicts,
    });
    let slots = (!answers.refused).then_some(slots);
    (decision, slots)
}

/// Stage 1: one slot per concurrency limit, each answer at its position.
/// `None` when the store failed and `on_error: deny` refuses (the slots
/// taken so far go back).
async fn take_slots(
    limiter: &Limiter,
    requests: &[LimitRequest],
    on_error: Option<OnError>,
    answers: &mut Answers,
) -> Option<Slots> {
    let mut slots = Slots::default();
    for (i, r) in requests.iter().enumerate() {
        let LimitKind::Concurrency(cap) = r.mode.kind else {
            continue;
        };
        let take = limiter
            .concurrency()
            .take(
                &r.key.text(),
                cap,
                on_error,
                limiter.health().live_instances(),
            )
            .await;
        let full = Some(concurrency::full());
        match take {
            Take::Held(slot, free) => {
                slots.push(slot);
                answers.set(i, Some(concurrency::held(free)), Some(Verdict::Allowed));
            }
            Take::Full if r.mode.enforcement == Enforcement::Shadow => {
                answers.set(i, full, Some(Verdict::ShadowLimited));
            }
            Take::Full => {
                answers.refused = true;
                answers.set(i, full, Some(Verdict::Limited));
            }
            Take::FailedOpen => answers.set(i, None, Some(Verdict::Undecided)),
            Take::Unavailable => return None,
        }
    }
    Some(slots)
}

/// Whether a concurrency limit refused the request: its 429 then names no
/// Retry-After, since nothing tells when a request in flight will end.
pub fn refused_by_concurrency(decision: &Decision, requests: &[LimitRequest]) -> bool {
    decision.denied().any(|(i, shadow)| {
        !shadow
            && requests
                .get(i)
                .is_some_and(|r| matches!(r.mode.kind, LimitKind::Concurrency(_)))
    })
}
