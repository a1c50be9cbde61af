//! Deciding a request against its limits, and the one answer the rest of
//! the gateway reads.
//!
//! The pipeline asks [`stages::decide`] with one
//! [`LimitRequest`](crate::limit::LimitRequest) per limit,
//! each carrying its mode (counted or read, enforced or shadow, exact,
//! synced or a concurrency slot); every stage ends in the [`limiter`], which holds
//! the store, the deny cache and the failure policy (`on_error`), with
//! `sync` mode's in-process counts ([`sync`]) and their exchange task
//! (`sync_task`, `synced`), what it holds of Redis (`redis_side`) and how
//! it reaches Redis, including the way back after an outage (`reach`),
//! beside it. What they answer is a [`RouteDecision`]: per limit an
//! outcome ([`Standing`]: the numbers for the headers) and a
//! [`Verdict`] (what it said, as the metrics count it), or the failure
//! policy's answer when the store could not decide ([`Undecided`]).

pub mod limiter;
pub mod overrides;
mod reach;
pub mod record;
mod redis_side;
pub mod settle;
pub mod slots;
pub mod stages;
pub mod sync;

use crate::config::Limit;
use crate::limit::{self, Standing, Standings, Verdict};

/// What a route's limits said about one request: decided, or the store
/// could not decide and the failure policy answered.
#[derive(Debug, Clone)]
pub enum RouteDecision {
    /// The limits decided (in the store, or in process by `on_error: local`).
    Decided(Decided),
    /// The store could not decide and `on_error` answered without deciding.
    Undecided(Undecided),
}

/// The store could not decide: what the failure policy answered instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Undecided {
    /// `on_error: allow` admits without deciding.
    FailedOpen,
    /// `on_error: deny` refuses: answer 503.
    Unavailable,
}

impl From<Undecided> for RouteDecision {
    fn from(u: Undecided) -> Self {
        Self::Undecided(u)
    }
}

/// What the limits of a route said about one request, limit by limit.
#[derive(Debug, Clone)]
pub struct Decided {
    /// False only when an enforced limit denied: answer 429.
    pub allowed: bool,
    /// One outcome per limit, in route order, for the rate-limit headers;
    /// `None` when a limit could not be read.
    pub outcomes: Option<Standings>,
    /// Per limit: what it said, or `None` when it was only read (not
    /// decided, so not counted).
    pub verdicts: Vec<Option<Verdict>>,
}

impl RouteDecision {
    /// Whether the request may go on (admitted, or admitted undecided).
    pub fn allowed(&self) -> bool {
        match self {
            Self::Decided(d) => d.allowed,
            Self::Undecided(Undecided::FailedOpen) => true,
            Self::Undecided(Undecided::Unavailable) => false,
        }
    }

    /// Every limit's outcome, when the limits decided and each was read.
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
    pub fn violated(&self, limits: &[Limit]) -> Vec<String> {
        self.denied()
            .filter(|&(_, shadow)| !shadow)
            .filter_map(|(i, _)| limits.get(i).map(|l| l.name.to_string()))
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
