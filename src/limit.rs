//! The limiter's vocabulary: what one decision asks and what it answers.
//!
//! A request carries one [`LimitRequest`] per configured limit. A store
//! decides them together: the request is admitted only when every limit
//! admits, and only then is anything consumed ("count admitted requests, not
//! attempts"). The [`Answer`] carries everything the response needs —
//! remaining quota, reset and Retry-After per limit — so the header phase
//! never asks the store again.

pub mod buckets;
pub mod calendar;
pub mod concurrency;
pub mod deny_cache;
pub mod fixed_window;
pub mod gcra;
pub mod key;
pub mod settle;
pub mod sliding_log;
pub mod sliding_window;
pub mod state;
pub mod usage;

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
    /// Sliding window in precision buckets: one count per bucket of
    /// `precision_ms` ([`buckets`]); `algorithm: sliding_window` with
    /// `precision`. Exact to a bucket, never over the limit in any span of
    /// one window, O(w/p) memory.
    SlidingBuckets {
        /// Bucket length in ms; the window is a whole multiple of it.
        precision_ms: u64,
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
            Self::SlidingBuckets { .. } => "sliding_window",
        }
    }

    /// The number the Redis script dispatches on.
    #[inline]
    pub fn code(self) -> u64 {
        match self {
            Self::SlidingWindow => 0,
            Self::FixedWindow => 1,
            Self::SlidingLog => 2,
            Self::Gcra { .. } => 3,
            Self::CalendarMonth => 4,
            Self::SlidingBuckets { .. } => 5,
        }
    }

    /// The name with what else the configuration wrote for it, as a
    /// message that compares two limits shows it: `gcra, burst 20`.
    pub fn described(self) -> String {
        match self {
            Self::Gcra { burst } => format!("gcra, burst {burst}"),
            Self::SlidingBuckets { precision_ms } => {
                format!("sliding_window, precision {precision_ms}ms")
            }
            Self::SlidingWindow | Self::FixedWindow | Self::SlidingLog | Self::CalendarMonth => {
                self.name().to_owned()
            }
        }
    }

    /// What a store key's suffix adds for this algorithm, `None` for the
    /// default sliding window: each algorithm keeps state of its own shape,
    /// so a limit whose algorithm changes starts a fresh key instead of
    /// misreading the old one (and sliding-window keys stay what they
    /// always were).
    pub fn key_tag(self) -> Option<String> {
        match self {
            Self::SlidingWindow => None,
            Self::FixedWindow | Self::SlidingLog | Self::CalendarMonth | Self::Gcra { .. } => {
                Some(self.name().to_owned())
            }
            // The precision too: a hash of buckets never meets the string
            // counter of the same limit without one, nor buckets of another
            // length.
            Self::SlidingBuckets { precision_ms } => Some(format!("buckets_{precision_ms}ms")),
        }
    }

    /// This algorithm for a window of one calendar month (`window:
    /// month`), which is counted as a fixed window; `None` for an
    /// algorithm that cannot count one.
    pub fn for_month(self) -> Option<Self> {
        match self {
            Self::FixedWindow | Self::CalendarMonth => Some(Self::CalendarMonth),
            Self::SlidingWindow
            | Self::SlidingLog
            | Self::Gcra { .. }
            | Self::SlidingBuckets { .. } => None,
        }
    }

    /// The algorithm of a `window: month` limit that names none.
    pub const MONTH: Self = Self::CalendarMonth;

    /// Whether the limit's `burst` applies (gcra's bucket capacity); the
    /// others refuse one.
    pub fn takes_burst(self) -> bool {
        match self {
            Self::Gcra { .. } => true,
            Self::SlidingWindow
            | Self::FixedWindow
            | Self::SlidingLog
            | Self::CalendarMonth
            | Self::SlidingBuckets { .. } => false,
        }
    }

    /// This algorithm with a bucket of `burst` units, when it
    /// [takes one](Self::takes_burst); else itself.
    #[must_use]
    pub fn with_burst(self, burst: u64) -> Self {
        match self {
            Self::Gcra { .. } => Self::Gcra { burst },
            Self::SlidingWindow
            | Self::FixedWindow
            | Self::SlidingLog
            | Self::CalendarMonth
            | Self::SlidingBuckets { .. } => self,
        }
    }

    /// This algorithm counted in buckets of `precision_ms`: a sliding
    /// window becomes precision buckets; `None` for the others, which have
    /// no precision.
    pub fn with_precision(self, precision_ms: u64) -> Option<Self> {
        match self {
            Self::SlidingWindow | Self::SlidingBuckets { .. } => {
                Some(Self::SlidingBuckets { precision_ms })
            }
            Self::FixedWindow | Self::SlidingLog | Self::CalendarMonth | Self::Gcra { .. } => None,
        }
    }

    /// The most units the state holds at once: gcra's burst, else the
    /// limit.
    #[inline]
    pub fn capacity(self, limit: u64) -> u64 {
        match self {
            Self::Gcra { burst } => burst,
            Self::SlidingWindow
            | Self::FixedWindow
            | Self::SlidingLog
            | Self::CalendarMonth
            | Self::SlidingBuckets { .. } => limit,
        }
    }

    /// Whether the stores' arithmetic multiplies units by the window's
    /// milliseconds, so that exactness in the Redis script's doubles needs
    /// `3·L·w < 2^53`: a sliding window weighs the previous window's count
    /// by the time left of it, GCRA turns units into time, a log and
    /// buckets are bounded with them. A fixed window and a calendar month
    /// only add counts (and compare them with `L`; their ends are instants,
    /// exact on their own), so they need `3·L < 2^53` whatever the window:
    /// a quota of 10^10 a month is exact.
    #[inline]
    pub fn weighs_by_window(self) -> bool {
        match self {
            Self::FixedWindow | Self::CalendarMonth => false,
            Self::SlidingWindow
            | Self::SlidingLog
            | Self::Gcra { .. }
            | Self::SlidingBuckets { .. } => true,
        }
    }

    /// Whether the state holds one entry per admitted unit (a sliding log),
    /// which the in-process store prunes and grows in place instead of
    /// copying, and the configuration bounds in its limit.
    #[inline]
    pub fn one_entry_per_unit(self) -> bool {
        match self {
            Self::SlidingLog => true,
            Self::SlidingWindow
            | Self::FixedWindow
            | Self::CalendarMonth
            | Self::Gcra { .. }
            | Self::SlidingBuckets { .. } => false,
        }
    }

    /// The calendar month `now_ms` falls in, as its index and the instant
    /// it ends ([`calendar::month`]), for a limit counted by calendar
    /// month; `None` for the others, whose windows are `window_ms` long.
    pub fn month(self, now_ms: u64) -> Option<(u64, u64)> {
        match self {
            Self::CalendarMonth => Some(calendar::month(now_ms)),
            Self::SlidingWindow
            | Self::FixedWindow
            | Self::SlidingLog
            | Self::Gcra { .. }
            | Self::SlidingBuckets { .. } => None,
        }
    }

    /// The index of the window the instant `t` falls in: months since
    /// January 1970 for a calendar month, the bucket's for precision
    /// buckets, `t / window_ms` for the others.
    #[inline]
    pub fn window_index(self, t: u64, window_ms: u64) -> u64 {
        match self {
            Self::CalendarMonth => calendar::month_index(t),
            Self::SlidingBuckets { precision_ms } => t / precision_ms.max(1),
            Self::SlidingWindow | Self::FixedWindow | Self::SlidingLog | Self::Gcra { .. } => {
                t / window_ms.max(1)
            }
        }
    }

    /// The window and burst arguments of this limit in the decision
    /// script's shape at `now_ms` (limits.lua's header): for a calendar
    /// month, computed here once for both stores' sake, the month's end and
    /// its index; for precision buckets, the window and the precision.
    #[inline]
    pub fn script_args(self, now_ms: u64, limit: u64, window_ms: u64) -> (u64, u64) {
        match self {
            Self::Gcra { burst } => (window_ms, burst),
            Self::CalendarMonth => {
                let (index, end) = calendar::month(now_ms);
                (end, index)
            }
            Self::SlidingBuckets { precision_ms } => (window_ms, precision_ms),
            Self::SlidingWindow | Self::FixedWindow | Self::SlidingLog => (window_ms, limit),
        }
    }

    /// The last argument of the settle script (settle.lua's header): gcra's
    /// burst, precision buckets' precision.
    pub fn settle_arg(self) -> u64 {
        match self {
            Self::Gcra { burst } => burst,
            Self::SlidingBuckets { precision_ms } => precision_ms,
            Self::SlidingWindow | Self::FixedWindow | Self::SlidingLog | Self::CalendarMonth => 0,
        }
    }

    /// Why a limit of this algorithm cannot be settled by the response, or
    /// `None` when it can ([`settle`]).
    pub fn unsettled_because(self) -> Option<&'static str> {
        match self {
            Self::SlidingLog => Some(
                "a sliding_log limit cannot be settled by the response (its log holds one entry per unit at its instant); count with sliding_window, fixed_window or gcra",
            ),
            Self::SlidingWindow
            | Self::FixedWindow
            | Self::CalendarMonth
            | Self::Gcra { .. }
            | Self::SlidingBuckets { .. } => None,
        }
    }

    /// Whether a decision's units can be given back by the Redis store's
    /// refund script, which knows the two-count sliding window only (a
    /// Cluster decision that spans slots refunds the groups that admitted
    /// when another denied).
    #[inline]
    pub fn refundable(self) -> bool {
        match self {
            Self::SlidingWindow => true,
            Self::FixedWindow
            | Self::SlidingLog
            | Self::CalendarMonth
            | Self::Gcra { .. }
            | Self::SlidingBuckets { .. } => false,
        }
    }

    /// How `sync` mode sums this algorithm's counts across gateways, or
    /// `None` when its state is not a sum that gateways can add to apart.
    pub fn summed(self) -> Option<Summed> {
        match self {
            Self::SlidingWindow => Some(Summed::Sliding),
            Self::FixedWindow => Some(Summed::Fixed),
            Self::CalendarMonth => Some(Summed::Month),
            Self::SlidingLog | Self::Gcra { .. } | Self::SlidingBuckets { .. } => None,
        }
    }

    /// Why a limit of this algorithm cannot be decided in `sync` mode, or
    /// `None` when it can.
    pub fn unsynced_because(self) -> Option<String> {
        match self {
            Self::SlidingWindow | Self::FixedWindow | Self::CalendarMonth => None,
            Self::SlidingLog | Self::Gcra { .. } => Some(format!(
                "sync applies to sliding_window and fixed_window limits, whose counts gateways can add up; a {} limit is decided in Redis on every request: remove sync, or count with sliding_window",
                self.name()
            )),
            Self::SlidingBuckets { .. } => Some(
                "sync exchanges a window's count and the one before it, and a sliding_window with a precision counts per bucket, which Redis decides on every request: remove sync, or remove precision".to_owned(),
            ),
        }
    }

    /// Whether it decides by an estimate whose worst wait can pass a window
    /// by far for a small limit (`w + w/L`): `tollgate check` warns of
    /// those (docs/limits.md#worst-waits).
    pub fn estimates(self) -> bool {
        match self {
            Self::SlidingWindow => true,
            Self::FixedWindow
            | Self::SlidingLog
            | Self::CalendarMonth
            | Self::Gcra { .. }
            | Self::SlidingBuckets { .. } => false,
        }
    }

    /// The longest a caller who spent its whole quota at once waits for its
    /// next request (of cost 1), for limit `l` and window `w` (ms).
    /// docs/limits.md has the table.
    pub fn worst_wait_ms(self, l: u64, w: u64) -> u64 {
        let l = l.max(1);
        match self {
            // The burst at the very start of window i counts `prev = L` in
            // window i+1 until `L·(1 − f) + 1 ≤ L`, that is `f = 1/L`.
            Self::SlidingWindow => w + w.div_ceil(l),
            // The burst at a window's start waits for the next one; a log's
            // entries leave one window after they came.
            Self::FixedWindow | Self::CalendarMonth | Self::SlidingLog => w,
            // One emission interval after the bucket emptied.
            Self::Gcra { .. } => w.div_ceil(l),
            // A burst at the very start of a bucket counts until all of
            // the bucket is older than the window.
            Self::SlidingBuckets { precision_ms } => w + precision_ms,
        }
    }

    /// A lower bound of when `ahead + 1` requests of cost `c` can all be
    /// admitted by a limit of `l` per window `w` (ms), the first of them at
    /// `at`, with `windows = ⌈(ahead + 1)·c / L⌉ − 1`
    /// (`pipeline::delay::earliest_ms` has the reasoning):
    /// - a sliding log, and precision buckets, admit at most `L` in any
    ///   span of one window;
    /// - fixed and sliding windows at most `L` per window index;
    /// - gcra frees one unit every `w/L`;
    /// - a calendar month's windows differ in length: `at` alone.
    pub fn earliest_ms(self, at: u64, (l, w, c): (u64, u64, u64), ahead: u64) -> u64 {
        let (l, w) = (l.max(1), w.max(1));
        let units = ahead.saturating_add(1).saturating_mul(c);
        let windows = units.div_ceil(l).saturating_sub(1);
        match self {
            Self::SlidingLog | Self::SlidingBuckets { .. } => {
                at.saturating_add(windows.saturating_mul(w))
            }
            Self::FixedWindow | Self::SlidingWindow => {
                let start = (at / w).saturating_add(windows).saturating_mul(w);
                start.max(at)
            }
            Self::Gcra { .. } => {
                let spaced = ahead.saturating_mul(c).saturating_sub(1);
                at.saturating_add(spaced.saturating_mul(w) / l)
            }
            Self::CalendarMonth => at,
        }
    }
}

/// How `sync` mode keeps an algorithm's counts ([`Algorithm::summed`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Summed {
    /// A window's count and the one before it.
    Sliding,
    /// One window's count.
    Fixed,
    /// One calendar month's count.
    Month,
}

/// One limit to check for one request.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct LimitRequest {
    /// Full store key: prefix, route, limit and identity.
    pub key: key::StoreKey,
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
