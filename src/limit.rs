//! The limiter's vocabulary: what one decision asks and what it answers.
//!
//! A request carries one [`LimitRequest`] per configured limit. A store
//! decides them together: the request is admitted only when every limit
//! admits, and only then is anything consumed ("count admitted requests, not
//! attempts"). The [`Answer`] carries everything the response needs —
//! remaining quota, reset and Retry-After per limit — so the header phase
//! never asks the store again.

pub mod calendar;
pub mod concurrency;
pub mod deny_cache;
pub mod fixed_window;
pub mod gcra;
pub mod settle;
pub mod sliding_log;
pub mod sliding_window;

use smallvec::SmallVec;

/// How a limit counts (docs/design.md#what-a-limit-promises). Every store implements all four with the
/// same numbers; see each module for the arithmetic.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// Sliding-window counter: two counts per key, weighted estimate
    /// ([`sliding_window`]). Approximate, O(1) memory.
    #[default]
    SlidingWindow,
    /// Fixed window: one count per window ([`fixed_window`]). Exact within a
    /// window, admits up to 2·L across a boundary.
    FixedWindow,
    /// Sliding log: one timestamp per admitted unit ([`sliding_log`]).
    /// Exact, O(L) memory.
    SlidingLog,
    /// A fixed window that is the calendar month in UTC ([`calendar`]);
    /// `window: month` in the configuration.
    CalendarMonth,
    /// GCRA / token bucket: one theoretical arrival time per key ([`gcra`]).
    /// `burst` units may arrive at once; the bucket refills at L per window.
    Gcra {
        /// Bucket capacity in cost units.
        burst: u64,
    },
}

impl Algorithm {
    /// Every spelling a limit's `algorithm:` accepts, with its value; read
    /// by the configuration loader and by `tollgate schema`. `gcra`'s burst
    /// is a placeholder the loader replaces with the limit's `burst`;
    /// [`Algorithm::CalendarMonth`] is written `window: month`, not here.
    pub const SPELLINGS: [(&'static str, Self); 4] = [
        ("sliding_window", Self::SlidingWindow),
        ("fixed_window", Self::FixedWindow),
        ("sliding_log", Self::SlidingLog),
        ("gcra", Self::Gcra { burst: 0 }),
    ];

    /// The name used in the configuration file.
    pub fn name(self) -> &'static str {
        match self {
            Self::SlidingWindow => "sliding_window",
            Self::FixedWindow => "fixed_window",
            Self::SlidingLog => "sliding_log",
            Self::CalendarMonth => "calendar_month",
            Self::Gcra { .. } => "gcra",
        }
    }

    /// The number the Redis script dispatches on.
    pub fn code(self) -> u64 {
        match self {
            Self::SlidingWindow => 0,
            Self::FixedWindow => 1,
            Self::SlidingLog => 2,
            Self::Gcra { .. } => 3,
            Self::CalendarMonth => 4,
        }
    }
}

/// One limit to check for one request.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct LimitRequest {
    /// Full store key: prefix, route, limit and identity.
    pub key: String,
    /// Quota per window (`L`).
    pub limit: u64,
    /// Window length in milliseconds (`w`).
    pub window_ms: u64,
    /// Units this request consumes (`c`) when it is counted.
    pub cost: u64,
    /// How the limit counts.
    pub algorithm: Algorithm,
    /// How the decision asks this limit.
    pub mode: Mode,
}

impl LimitRequest {
    /// The units the store adds when it admits: the cost when the limit is
    /// counted, none when it is only read.
    pub fn units(&self) -> u64 {
        match self.mode.effect {
            Effect::Count => self.cost,
            Effect::Read => 0,
        }
    }

    /// The same limit, only read: its numbers without consuming anything.
    #[must_use]
    pub fn read_only(&self) -> Self {
        let mut r = self.clone();
        r.mode.effect = Effect::Read;
        r
    }

    /// The limit's `sync` interval in ms when it is decided in process in
    /// `sync` mode, else 0.
    pub fn sync_ms(&self) -> u64 {
        match self.mode.kind {
            LimitKind::Synced(every) => every,
            LimitKind::Exact | LimitKind::Concurrency(_) => 0,
        }
    }
}

/// How a decision asks one limit: whether the request is counted, whether
/// a denial refuses it, and where the limit is decided. Each request
/// carries its own, so the decision splits one list of requests by what
/// they are rather than keeping lists side by side.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Mode {
    /// Counted, or only read.
    pub effect: Effect,
    /// Enforced, or shadow.
    pub enforcement: Enforcement,
    /// A rate limit decided in the store, one in `sync` mode, or a
    /// concurrency limit.
    pub kind: LimitKind,
}

/// Whether an admitted request is counted by a limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Effect {
    /// Counted when admitted.
    #[default]
    Count,
    /// Only read: the limit's numbers for the headers, nothing consumed
    /// (the store decides it as a request of no units).
    Read,
}

/// Whether a limit's denial refuses the request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Enforcement {
    /// A denial refuses the request.
    #[default]
    Enforced,
    /// `shadow: true` (on the limit or its route): decided, counted and
    /// shown, but the request goes on.
    Shadow,
}

/// Where a limit is decided.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum LimitKind {
    /// A rate limit decided in the store.
    #[default]
    Exact,
    /// A rate limit decided in process against the fleet's counts, which
    /// are exchanged with Redis every this many ms (`sync` mode).
    Synced(u64),
    /// A concurrency limit of this many requests in flight: a slot, not a
    /// count.
    Concurrency(u64),
}

/// Where one limit stands for one request after the store answered: the
/// numbers its headers show.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Standing {
    /// This limit, on its own, would admit the request.
    pub admits: bool,
    /// Quota left after the decision (`floor(L − E_after)`, at least 0):
    /// with the request's cost taken when the request is admitted, without
    /// it when it is denied, by this limit or another (a denied request
    /// consumes nothing, and its 429 shows every limit so).
    pub remaining: u64,
    /// Milliseconds until the quota is fully restored if nothing else
    /// arrives, after the decision as for `remaining`.
    pub reset_ms: u64,
    /// When this limit denies: the smallest wait in milliseconds after which
    /// it admits the same request, or `None` when it never can (cost > limit).
    /// `Some(0)` when it admits.
    pub retry_after_ms: Option<u64>,
}

/// One standing per limit, held inline for up to two limits: most routes
/// have one or two, and a decision then allocates nothing.
pub type Standings = SmallVec<[Standing; 2]>;

/// The store's answer for all limits of one request. What the limits
/// decided for the request — shadow limits and the failure policy
/// included — is the decision layer's `Decision`, made from it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// Every limit admitted and the cost was consumed from each (a shadow
    /// limit's denial counts here; it refuses nothing in the `Decision`).
    pub allowed: bool,
    /// One standing per [`LimitRequest`], in the same order.
    pub outcomes: Standings,
}

/// The wait before every one of `denying` admits the request: the largest
/// of their Retry-Afters, 0 when there is none, `None` when one of them
/// can never admit it. The one place a request's Retry-After is computed.
pub fn longest_wait<'a>(denying: impl IntoIterator<Item = &'a Standing>) -> Option<u64> {
    let mut wait = 0;
    for o in denying {
        wait = wait.max(o.retry_after_ms?);
    }
    Some(wait)
}

/// What one limit said about one request, as `tollgate_decisions_total`
/// counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The limit admitted.
    Allowed,
    /// The enforced limit denied.
    Limited,
    /// The shadow limit would have denied.
    ShadowLimited,
    /// The store could not decide it (`on_error: allow` or `deny`, or a
    /// concurrency slot Redis could not lease): counted as `error`.
    Undecided,
}

impl Verdict {
    /// The metric label and `tollgate simulate`'s word for it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Allowed => "allowed",
            Self::Limited => "limited",
            Self::ShadowLimited => "shadow_limited",
            Self::Undecided => "error",
        }
    }
}
