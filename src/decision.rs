//! Deciding a request against its limits, and the one answer the rest of
//! the gateway reads.
//!
//! The pipeline asks [`stages::decide`] with one
//! [`LimitRequest`](crate::limit::LimitRequest) per limit,
//! each carrying its mode (counted or read, enforced or shadow, exact,
//! synced or a concurrency slot); every stage ends in the [`limiter`], which holds
//! the store, the deny cache and the failure policy (`on_error`), with
//! `sync` mode's in-process counts and their exchange task ([`sync`]),
//! what it holds of Redis (`redis_side`) and how it reaches Redis,
//! including the way back after an outage (`reach`), beside it. What
//! they answer is a [`Decision`], the one value for what a request's
//! limits decided: per limit a [`Standing`] (the numbers for the headers)
//! and a [`Verdict`] (what it said, as the metrics count it), or the
//! failure policy's answer when the store could not decide
//! ([`Unanswered`]).

pub mod admin;
pub mod health;
pub mod limiter;
pub mod overrides;
mod reach;
pub mod record;
mod redis_side;
pub mod settle;
pub mod shares;
pub mod slots;
pub mod stages;
pub mod sync;

use std::sync::Arc;

use smallvec::SmallVec;

use crate::config::Limit;
use crate::limit::{self, Standing, Standings, Verdict};

/// Per limit of a decision, what it said: on the stack for up to eight
/// limits (a byte each), so the usual decision allocates nothing for it.
pub type Verdicts = SmallVec<[Option<Verdict>; 8]>;

/// What a request's limits decided: decided, or the store could not
/// decide and the failure policy answered. The rest of the gateway reads
/// this one value (headers, refusal, metrics, access log, span).
#[derive(Debug, Clone)]
pub enum Decision {
    /// The limits decided (in the store, or in process by `on_error: local`).
    Decided(PerLimit),
    /// The store could not decide and `on_error` answered without deciding.
    Undecided(Unanswered),
}

/// The store could not decide: what the failure policy answered instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unanswered {
    /// `on_error: allow` admits without deciding.
    FailedOpen,
    /// `on_error: deny` refuses: answer 503.
    Unavailable,
}

impl From<Unanswered> for Decision {
    fn from(u: Unanswered) -> Self {
        Self::Undecided(u)
    }
}

/// What the limits of a route decided about one request, limit by limit.
#[derive(Debug, Clone)]
pub struct PerLimit {
    /// False only when an enforced limit denied: answer 429.
    pub allowed: bool,
    /// One standing per limit, in route order, for the rate-limit headers;
    /// `None` when a limit could not be read.
    pub outcomes: Option<Standings>,
    /// Per limit: what it said, or `None` when it was only read (not
    /// decided, so not counted).
    pub verdicts: Verdicts,
}

impl Decision {
    /// Whether the request may go on (admitted, or admitted undecided).
    pub fn allowed(&self) -> bool {
        match self {
            Self::Decided(d) => d.allowed,
            Self::Undecided(Unanswered::FailedOpen) => true,
            Self::Undecided(Unanswered::Unavailable) => false,
        }
    }

    /// Every limit's standing, when the limits decided and each was read.
    pub fn outcomes(&self) -> Option<&[Standing]> {
        match self {
            Self::Decided(d) => d.outcomes.as_deref(),
            Self::Undecided(_) => None,
        }
    }

    /// Each limit's verdict; empty when undecided.
    pub fn verdicts(&self) -> &[Option<Verdict>] {
        match self {
            Self::Decided(d) => &d.verdicts,
            Self::Undecided(_) => &[],
        }
    }

    /// Whether a shadow limit would have denied this request.
    pub fn shadow_denied(&self) -> bool {
        self.verdicts().contains(&Some(Verdict::ShadowLimited))
    }

    /// Indices of the limits that denied, each with whether it is a
    /// shadow limit.
    pub fn denied(&self) -> impl Iterator<Item = (usize, bool)> + '_ {
        self.verdicts()
            .iter()
            .enumerate()
            .filter_map(|(i, v)| match v {
                Some(Verdict::Limited) => Some((i, false)),
                Some(Verdict::ShadowLimited) => Some((i, true)),
                _ => None,
            })
    }

    /// Names of the enforced limits that denied, for the problem body.
    pub fn violated(&self, limits: &[Limit]) -> Vec<Arc<str>> {
        self.denied()
            .filter(|&(_, shadow)| !shadow)
            .filter_map(|(i, _)| limits.get(i).map(|l| Arc::clone(&l.name)))
            .collect()
    }

    /// Milliseconds until the enforced limits admit the request
    /// ([`limit::longest_wait`] of those that denied); `None` if one never
    /// can.
    pub fn retry_after_ms(&self) -> Option<u64> {
        let outcomes = self.outcomes().unwrap_or_default();
        limit::longest_wait(
            outcomes
                .iter()
                .zip(self.verdicts())
                .filter(|(_, v)| **v == Some(Verdict::Limited))
                .map(|(o, _)| o),
        )
    }
}
