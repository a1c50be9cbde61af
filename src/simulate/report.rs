//! The report: what the tallies say, in the shape every renderer reads and
//! the JSON output writes. Field names here are the JSON's and are kept
//! stable (`version` changes when one does).
//!
//! Identities are shown as `/admin/top` shows them, every value as its
//! digest (`ip=sha256:…`, `key=sha256:…`), with their kind.

use serde::Serialize;

use super::replay::{BadLine, InputStats, Replayed};
use super::tally::{IdentityTally, LimitTally, Quota, RequestCounts, RouteTally, Timeline};
use super::time::minute_label;
use crate::pipeline::exchange::Strongest;

/// Version of the JSON shape.
pub const VERSION: u32 = 1;

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// [`VERSION`].
    pub version: u32,
    /// The simulated configuration.
    pub config: String,
    /// The configuration compared with, if any.
    pub against: Option<String>,
    /// What was read.
    pub input: Input,
    /// Requests no route took.
    pub unrouted: u64,
    /// Requests refused before routing (bad target, oversized head).
    pub refused: u64,
    /// The first few reasons for those refusals (`400 …`).
    pub refused_examples: Vec<String>,
    /// Per route, in configuration order.
    pub routes: Vec<RouteReport>,
    /// With `against`: per limit, who changes side.
    pub diff: Vec<LimitDiff>,
}

/// What was read.
#[derive(Debug, Clone, Serialize)]
pub struct Input {
    /// The files.
    pub files: Vec<String>,
    /// `combined`, `tollgate` or `jsonl`.
    pub format: &'static str,
    /// Lines read.
    pub lines: u64,
    /// Lines replayed as requests.
    pub requests: u64,
    /// Blank lines and other events.
    pub skipped: u64,
    /// Lines that could not be read.
    pub bad_lines: u64,
    /// The first few of them.
    pub bad_examples: Vec<BadLine>,
    /// Lines earlier than the line before (replayed at its time).
    pub out_of_order: u64,
    /// First request's time, RFC 3339 minute.
    pub first: Option<String>,
    /// Last request's time.
    pub last: Option<String>,
    /// Replay time in seconds.
    pub seconds: f64,
    /// Lines per second.
    pub lines_per_second: f64,
}

/// One identity among the most limited.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Offender {
    /// The identity as `/admin/top` shows one: every value as its digest.
    pub identity: String,
    /// `ip`, `api_key`, `user`, `header:NAME`, `absent`; parts of a
    /// compound key joined with `+`.
    pub kind: String,
    /// Its requests.
    pub requests: u64,
    /// Of them, limited.
    pub limited: u64,
}

/// A minute of a timeline.
#[derive(Debug, Clone, Serialize)]
pub struct MinuteOut {
    /// `2024-05-01T12:03Z`.
    pub minute: String,
    /// The start of the minute, in ms since the epoch.
    pub ts_ms: u64,
    /// Requests.
    pub requests: u64,
    /// Limited (429 for a route, denied for a limit).
    pub limited: u64,
    /// Routes only: forwarded, but a shadow limit would have denied.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shadow_limited: Option<u64>,
}

/// The busiest minute.
#[derive(Debug, Clone, Serialize)]
pub struct Peak {
    /// `2024-05-01T12:03Z`.
    pub minute: String,
    /// Requests in it.
    pub requests: u64,
    /// Limited in it.
    pub limited: u64,
}

/// One route.
#[derive(Debug, Clone, Serialize)]
pub struct RouteReport {
    /// Name.
    pub name: String,
    /// Requests the route took.
    pub requests: u64,
    /// Answered 429 by an enforced limit.
    pub limited: u64,
    /// `limited / requests` (0 without requests).
    pub limited_share: f64,
    /// Forwarded, but a shadow limit would have denied.
    pub shadow_limited: u64,
    /// Refused for want of a plan (401).
    pub rejected: u64,
    /// Let through uncounted: the caller is exempt.
    pub exempt: u64,
    /// Distinct callers (strongest identity: API key, user, IP).
    pub identities: u64,
    /// Of them, limited (or shadow-limited) at least once.
    pub identities_limited: u64,
    /// The most limited callers.
    pub top_offenders: Vec<Offender>,
    /// The minute with the most requests.
    pub peak_minute: Option<Peak>,
    /// The minute with the most limited requests.
    pub peak_limited_minute: Option<Peak>,
    /// Per limit met.
    pub limits: Vec<LimitReport>,
    /// Per minute with requests.
    pub timeline: Vec<MinuteOut>,
}

/// One limit of a route.
#[derive(Debug, Clone, Serialize)]
pub struct LimitReport {
    /// Name.
    pub name: String,
    /// Whether it is in shadow mode (its denials are would-be).
    pub shadow: bool,
    /// `100 per 1m (sliding_window)`, or `from plans` when plans differ.
    pub quota: String,
    /// Requests it decided.
    pub requests: u64,
    /// Denied (would be, in shadow mode).
    pub limited: u64,
    /// `limited / requests`.
    pub limited_share: f64,
    /// Distinct identities it counted.
    pub identities: u64,
    /// Of them, denied at least once.
    pub identities_limited: u64,
    /// The most denied identities.
    pub top_offenders: Vec<Offender>,
    /// The minute with the most requests.
    pub peak_minute: Option<Peak>,
    /// The minute with the most denials.
    pub peak_limited_minute: Option<Peak>,
    /// Per minute with requests.
    pub timeline: Vec<MinuteOut>,
}

/// One limit compared between the two configurations.
#[derive(Debug, Clone, Serialize)]
pub struct LimitDiff {
    /// Route name.
    pub route: String,
    /// Limit name.
    pub limit: String,
    /// Limited under the simulated configuration, never under `against`.
    pub newly_limited: Changed,
    /// Limited under `against`, never under the simulated configuration.
    pub no_longer_limited: Changed,
}

/// Identities that changed side.
#[derive(Debug, Clone, Serialize, Default)]
pub struct Changed {
    /// How many.
    pub count: u64,
    /// The heaviest of them (by denials on the side that limits them).
    pub identities: Vec<Offender>,
}

/// The kind of an identity from its store-key text.
pub fn kind(id: &str) -> String {
    id.split(',')
        .map(|part| {
            if part == crate::identity::ABSENT {
                "absent".to_owned()
            } else if part.starts_with("ip=") {
                "ip".to_owned()
            } else if part.starts_with("key=") {
                "api_key".to_owned()
            } else if part.starts_with("user=") {
                "user".to_owned()
            } else if let Some(h) = part.strip_prefix("h:") {
                format!("header:{}", h.split('=').next().unwrap_or(h))
            } else {
                "other".to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join("+")
}

fn share(c: RequestCounts) -> f64 {
    if c.requests == 0 {
        0.0
    } else {
        c.limited as f64 / c.requests as f64
    }
}

fn offender(id: &str, c: RequestCounts) -> Offender {
    Offender {
        identity: crate::identity::shown_text(id),
        kind: kind(id),
        requests: c.requests,
        limited: c.limited,
    }
}

/// The `n` identities with the most denials (then requests, then text).
fn top<K>(ids: &IdentityTally<K>, n: usize, text: impl Fn(&K) -> String) -> Vec<Offender> {
    let mut limited: Vec<(&K, RequestCounts)> = ids
        .0
        .iter()
        .filter(|(_, c)| c.limited > 0)
        .map(|(k, c)| (k, *c))
        .collect();
    limited.sort_unstable_by_key(|(_, c)| std::cmp::Reverse((c.limited, c.requests)));
    // Ties at the cut are broken by text, so the report does not depend on
    // the map's order.
    let cut = limited
        .get(n.saturating_sub(1))
        .map(|(_, c)| (c.limited, c.requests));
    let mut shown: Vec<(String, RequestCounts)> = limited
        .into_iter()
        .take_while(|(_, c)| cut.is_none_or(|cut| (c.limited, c.requests) >= cut))
        .map(|(k, c)| (text(k), c))
        .collect();
    shown.sort_by(|a, b| {
        (b.1.limited, b.1.requests)
            .cmp(&(a.1.limited, a.1.requests))
            .then_with(|| a.0.cmp(&b.0))
    });
    shown
        .into_iter()
        .take(n)
        .map(|(id, c)| offender(&id, c))
        .collect()
}

fn peaks(t: &Timeline) -> (Option<Peak>, Option<Peak>) {
    let peak = |m: &super::tally::Minute| Peak {
        minute: minute_label(m.minute * 60_000),
        requests: m.counts.requests,
        limited: m.counts.limited,
    };
    // The earliest of equals: `max_by_key` keeps the last, so walk back.
    let busiest = t.0.iter().rev().max_by_key(|m| m.counts.requests).map(peak);
    let limited =
        t.0.iter()
            .rev()
            .filter(|m| m.counts.limited > 0)
            .max_by_key(|m| m.counts.limited)
            .map(peak);
    (busiest, limited)
}

fn timeline(t: &Timeline, route: bool) -> Vec<MinuteOut> {
    t.0.iter()
        .map(|m| MinuteOut {
            minute: minute_label(m.minute * 60_000),
            ts_ms: m.minute * 60_000,
            requests: m.counts.requests,
            limited: m.counts.limited,
            shadow_limited: route.then_some(m.shadow_limited),
        })
        .collect()
}

fn quota(q: &Quota) -> String {
    match q {
        Quota::Fixed {
            limit,
            window_ms,
            algorithm,
        } => format!("{limit} per {} ({})", window(*window_ms), algorithm.name()),
        Quota::Varies => "from plans".to_owned(),
    }
}

/// `5m`, `1h`, `90s`: the largest unit that divides the window.
pub fn window(ms: u64) -> String {
    for (unit, len) in [
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1000),
    ] {
        if ms.is_multiple_of(len) {
            return format!("{}{unit}", ms / len);
        }
    }
    format!("{ms}ms")
}

fn limit(t: &LimitTally, n: usize) -> LimitReport {
    let (identities, identities_limited) = t.identities.distinct();
    let (peak_minute, peak_limited_minute) = peaks(&t.timeline);
    LimitReport {
        name: t.name.to_string(),
        shadow: t.shadow,
        quota: quota(&t.quota),
        requests: t.counts.requests,
        limited: t.counts.limited,
        limited_share: share(t.counts),
        identities,
        identities_limited,
        top_offenders: top(&t.identities, n, |k| k.to_string()),
        peak_minute,
        peak_limited_minute,
        timeline: timeline(&t.timeline, false),
    }
}

fn route(t: &RouteTally, n: usize) -> RouteReport {
    let (identities, identities_limited) = t.callers.distinct();
    let (peak_minute, peak_limited_minute) = peaks(&t.timeline);
    RouteReport {
        name: t.name.to_string(),
        requests: t.counts.requests,
        limited: t.counts.limited,
        limited_share: share(t.counts),
        shadow_limited: t.shadow_limited,
        rejected: t.rejected,
        exempt: t.exempt,
        identities,
        identities_limited,
        top_offenders: top(&t.callers, n, Strongest::text),
        peak_minute,
        peak_limited_minute,
        limits: t.limits.iter().map(|l| limit(l, n)).collect(),
        timeline: timeline(&t.timeline, true),
    }
}

type Ids = IdentityTally<Box<str>>;

/// Identities limited in `a` and never in `b`.
fn changed(a: &Ids, b: Option<&Ids>, n: usize) -> Changed {
    let mut ids: Vec<(&str, RequestCounts)> =
        a.0.iter()
            .filter(|(id, c)| {
                c.limited > 0
                    && b.and_then(|b| b.0.get(&***id))
                        .is_none_or(|o| o.limited == 0)
            })
            .map(|(k, c)| (&**k, *c))
            .collect();
    ids.sort_unstable_by(|x, y| y.1.limited.cmp(&x.1.limited).then(x.0.cmp(y.0)));
    Changed {
        count: ids.len() as u64,
        identities: ids.iter().take(n).map(|(id, c)| offender(id, *c)).collect(),
    }
}

fn diff(new: &[RouteTally], old: &[RouteTally], n: usize) -> Vec<LimitDiff> {
    fn find<'a>(routes: &'a [RouteTally], r: &str, l: &str) -> Option<&'a Ids> {
        routes
            .iter()
            .find(|t| &*t.name == r)
            .and_then(|t| t.limits.iter().find(|x| &*x.name == l))
            .map(|x| &x.identities)
    }
    let empty = Ids::default();
    let mut names: Vec<(String, String)> = Vec::new();
    for t in new.iter().chain(old) {
        for l in &t.limits {
            let key = (t.name.to_string(), l.name.to_string());
            if !names.contains(&key) {
                names.push(key);
            }
        }
    }
    names
        .into_iter()
        .map(|(r, l)| {
            let a = find(new, &r, &l).unwrap_or(&empty);
            let b = find(old, &r, &l);
            LimitDiff {
                newly_limited: changed(a, b, n),
                no_longer_limited: changed(b.unwrap_or(&empty), Some(a), n),
                route: r,
                limit: l,
            }
        })
        .collect()
}

/// The report of a replay.
pub fn build(config: &str, against: Option<&str>, r: &Replayed, top: usize) -> Report {
    let s: &InputStats = &r.input;
    let seconds = s.elapsed.as_secs_f64();
    Report {
        version: VERSION,
        config: config.to_owned(),
        against: against.map(str::to_owned),
        input: Input {
            files: s.files.clone(),
            format: s.format.map_or("combined", |f| f.name()),
            lines: s.lines,
            requests: s.requests,
            skipped: s.skipped,
            bad_lines: s.bad,
            bad_examples: s.bad_shown.clone(),
            out_of_order: s.out_of_order,
            first: s.first_ms.map(minute_label),
            last: s.last_ms.map(minute_label),
            seconds,
            lines_per_second: if seconds > 0.0 {
                (s.lines as f64 / seconds).round()
            } else {
                0.0
            },
        },
        unrouted: r.tally.unrouted,
        refused: r.tally.refused,
        refused_examples: r.tally.refusals.clone(),
        routes: r.tally.routes.iter().map(|t| route(t, top)).collect(),
        diff: r
            .against
            .as_ref()
            .map(|old| diff(&r.tally.routes, &old.routes, top))
            .unwrap_or_default(),
    }
}
