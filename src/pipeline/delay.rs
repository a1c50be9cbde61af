//! `on_limit: delay` (docs/limits.md#delay-instead-of-reject): a request a limit denies waits, when the
//! limit will admit it within `max_delay`, and then goes through.
//!
//! - **Who waits.** A denied request waits when every enforced limit that
//!   denied it has `on_limit: delay`, and the longest of their waits (the
//!   request's Retry-After, in milliseconds) is within the smallest of
//!   their `max_delay`s. A limit that can never admit it (cost above the
//!   limit), a store that cannot decide, or a plain `on_limit: reject`
//!   limit among the deniers answers at once.
//! - **Counted when admitted.** Waiting consumes nothing. When its wait is
//!   over the request is decided again, and it is counted then — by the
//!   same atomic store decision as any request — so requests that wait
//!   never push a limit over: a fleet of gateways delaying the same
//!   caller admits exactly what the limit admits. Denied again (someone
//!   else took the capacity first), it waits for the new Retry-After if
//!   that still ends within `max_delay` of its arrival, and is refused
//!   (429) otherwise.
//! - **Holding its place.** On one gateway, requests waiting on the same
//!   counters (the same route, limits and caller) form a line and are
//!   decided again in their order of arrival: a later request does not
//!   take the capacity an earlier one is waiting for. Across gateways
//!   there is no order, only the limit.
//! - **Refused at arrival when its place is too far back.** The requests
//!   ahead in its line are admitted first, and a limit admits at most its
//!   rate ([`earliest_ms`]); a request that cannot be admitted within
//!   `max_delay` even so is refused at once (429) instead of waiting the
//!   whole `max_delay` for the refusal.
//! - **Bounded.** At most the route's `max_queue` requests wait at once on
//!   one gateway (default 100); more are refused at once (429).
//! - **Cancelled cleanly.** A client that goes away while its request
//!   waits drops the request's future: its place in the queue and in its
//!   line are given back, nothing was counted, nothing reaches the
//!   upstream.
//!
//! Metrics: `tollgate_delayed_requests_total`, `tollgate_delay_seconds`
//! and `tollgate_delay_waiting`, by route ([`crate::metrics::delay`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::OwnedMutexGuard;
use tokio::time::Instant;

use crate::config::Limit;
use crate::decision::Decision;
use crate::limit::LimitRequest;
use crate::metrics::delay::DelayMetrics;

/// How long a denied request may wait and when to ask again, when it may
/// wait at all: the smallest `max_delay` of the limits that denied it, and
/// its Retry-After in milliseconds.
pub fn budget(decision: &Decision, limits: &[Limit]) -> Option<(Duration, u64)> {
    if decision.allowed() || !matches!(decision, Decision::Decided(_)) {
        return None;
    }
    let mut max: Option<Duration> = None;
    for (i, _) in decision.denied().filter(|&(_, shadow)| !shadow) {
        let limit_max = limits.get(i)?.delay?;
        max = Some(max.map_or(limit_max, |m| m.min(limit_max)));
    }
    let max = max?;
    let retry = decision.retry_after_ms()?;
    (Duration::from_millis(retry) <= max).then_some((max, retry))
}

/// The earliest a request denied at `now_ms` with Retry-After `retry` (ms)
/// can be admitted, in ms from `now_ms`, when `ahead` requests waiting
/// before it on the same counters are admitted first: a lower bound, by
/// what each enforced limit that denied it can admit at most.
///
/// With `k = ⌈(ahead + 1)·c / L⌉` windows' worth of units to admit from
/// `now + retry` on (`c` the request's cost on the limit, `L` its limit,
/// `w` its window):
/// - `sliding_log` admits at most `L` in any span of one window, so the
///   last of them comes no sooner than `retry + (k − 1)·w`;
/// - `fixed_window` and `sliding_window` admit at most `L` per window
///   index (a sliding window's current count never passes `L`), so no
///   sooner than the start of the `(k − 1)`th window after the one
///   `now + retry` falls in;
/// - `gcra` frees one unit every `w/L`, and at `now + retry` had room for
///   `c` (and less than one unit more): no sooner than
///   `retry + (ahead·c − 1)·w/L`.
///
/// A calendar month's windows differ in length; it counts `retry` alone.
pub fn earliest_ms(
    decision: &Decision,
    requests: &[LimitRequest],
    now_ms: u64,
    (retry, ahead): (u64, u64),
) -> u64 {
    let at = now_ms.saturating_add(retry);
    let mut earliest = at;
    for (i, _) in decision.denied().filter(|&(_, shadow)| !shadow) {
        let Some(req) = requests.get(i) else {
            continue;
        };
        let bound = req
            .algorithm
            .earliest_ms(at, (req.limit, req.window_ms, req.cost), ahead);
        earliest = earliest.max(bound);
    }
    earliest - now_ms
}

/// Who is waiting on one gateway: the lines by counters, and how many wait
/// per route.
#[derive(Debug, Default)]
pub struct Waiting {
    inner: Mutex<Lines>,
}

#[derive(Debug, Default)]
struct Lines {
    /// One FIFO line per set of counters (the request's store keys).
    lines: HashMap<Box<str>, Line>,
    /// Requests waiting per route.
    queued: HashMap<Arc<str>, usize>,
}

impl Waiting {
    /// A place for a request of `route` waiting on the counters `keys`, or
    /// `None` when `max_queue` requests of the route already wait. The
    /// place knows how many wait ahead of it ([`Place::ahead`]).
    pub fn enter(
        &self,
        route: &Arc<str>,
        max_queue: usize,
        keys: Box<str>,
        metrics: Option<DelayMetrics>,
    ) -> Option<Place<'_>> {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let queued = inner.queued.entry(route.clone()).or_insert(0);
        if *queued >= max_queue {
            return None;
        }
        *queued += 1;
        let line = inner.lines.entry(keys.clone()).or_default();
        let ahead = line.waiting;
        line.waiting += 1;
        let line = line.turns.clone();
        drop(inner);
        if let Some(m) = &metrics {
            m.waiting.inc();
        }
        Some(Place {
            waiting: self,
            route: route.clone(),
            keys,
            line: Some(line),
            turn: None,
            metrics,
            arrived: Instant::now(),
            ahead,
        })
    }
}

impl Waiting {
    /// Requests waiting on this gateway in a line that counts `key`.
    pub fn waiting_on(&self, key: &str) -> u64 {
        let inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        inner
            .lines
            .iter()
            .filter(|(keys, _)| keys.split('\n').any(|k| k == key))
            .map(|(_, line)| line.waiting)
            .sum()
    }
}

/// One line: whose turn it is, and how many wait in it.
#[derive(Debug, Default)]
struct Line {
    /// Held by the request at the head.
    turns: Arc<tokio::sync::Mutex<()>>,
    /// Requests in the line, the head included.
    waiting: u64,
}

/// A waiting request's place: its route's queue slot and its line. Given
/// back when dropped — admitted, refused, or the client gone.
pub struct Place<'a> {
    waiting: &'a Waiting,
    route: Arc<str>,
    keys: Box<str>,
    line: Option<Arc<tokio::sync::Mutex<()>>>,
    /// The head of the line, once reached.
    turn: Option<OwnedMutexGuard<()>>,
    metrics: Option<DelayMetrics>,
    arrived: Instant,
    ahead: u64,
}

impl Place<'_> {
    /// How many requests waited in the line when this one entered it.
    pub fn ahead(&self) -> u64 {
        self.ahead
    }

    /// When the request arrived (its `max_delay` counts from here).
    pub fn arrived(&self) -> Instant {
        self.arrived
    }

    /// Waits until every request ahead in the line has gone, or until
    /// `deadline`; false when the deadline came first.
    pub async fn reach_head(&mut self, deadline: Instant) -> bool {
        let Some(line) = self.line.clone() else {
            return false;
        };
        let turn = tokio::time::timeout_at(deadline, line.lock_owned()).await;
        self.turn = turn.ok();
        self.turn.is_some()
    }

    /// The request is admitted after its wait: counted in the metrics.
    pub fn admitted(&self) {
        if let Some(m) = &self.metrics {
            m.admitted_after(self.arrived.elapsed().as_secs_f64());
        }
    }
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        // Leave the head first, so the next in line goes on.
        self.turn = None;
        if let Some(m) = &self.metrics {
            m.waiting.dec();
        }
        let mut inner = self
            .waiting
            .inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(q) = inner.queued.get_mut(&self.route) {
            *q -= 1;
            if *q == 0 {
                inner.queued.remove(&self.route);
            }
        }
        drop(self.line.take());
        // Counted up by `enter` and down here, both under this lock: the
        // last place to leave removes the line.
        if let Some(line) = inner.lines.get_mut(&self.keys) {
            line.waiting = line.waiting.saturating_sub(1);
            if line.waiting == 0 {
                inner.lines.remove(&self.keys);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::PerLimit;
    use crate::limit::Verdict;

    /// The one limit of a route, `spec` a YAML flow mapping's fields after
    /// its name and key.
    fn limit(spec: &str) -> Limit {
        let src = format!(
            "listen: 127.0.0.1:0\nroutes:\n  - name: r\n    respond: {{}}\n    limits: [ {{ name: l, key: ip, {spec} }} ]\n"
        );
        let config = crate::config::load::parse_str(&src).expect("a valid limit");
        config.routes[0].limits[0].clone()
    }

    fn denied() -> Decision {
        Decision::Decided(PerLimit {
            allowed: false,
            outcomes: None,
            verdicts: smallvec::smallvec![Some(Verdict::Limited)],
        })
    }

    fn request(l: &Limit, cost: u64) -> LimitRequest {
        LimitRequest {
            key: "k".into(),
            limit: l.limit.get(),
            window_ms: l.window_ms.get(),
            cost,
            algorithm: l.algorithm,
            mode: Default::default(),
        }
    }

    /// `earliest_ms` of one denied limit at `now` with Retry-After `retry`
    /// and `ahead` waiting, cost `cost`.
    fn earliest(spec: &str, now: u64, retry: u64, ahead: u64, cost: u64) -> u64 {
        let l = limit(spec);
        let r = request(&l, cost);
        earliest_ms(&denied(), &[r], now, (retry, ahead))
    }

    #[test]
    fn a_place_in_line_waits_a_window_per_quota_ahead() {
        let log = "limit: 10, window: 1s, algorithm: sliding_log";
        // Ten ahead fill the first second after the wait; twenty, two.
        assert_eq!(earliest(log, 5_000, 1_000, 0, 1), 1_000);
        assert_eq!(earliest(log, 5_000, 1_000, 9, 1), 1_000);
        assert_eq!(earliest(log, 5_000, 1_000, 10, 1), 2_000);
        assert_eq!(earliest(log, 5_000, 1_000, 20, 1), 3_000);
        // Costs count in units.
        assert_eq!(earliest(log, 5_000, 1_000, 4, 2), 1_000);
        assert_eq!(earliest(log, 5_000, 1_000, 5, 2), 2_000);
    }

    #[test]
    fn counted_windows_wait_for_the_window_starts() {
        for alg in ["fixed_window", "sliding_window"] {
            let spec = format!("limit: 10, window: 1s, algorithm: {alg}");
            // Now 5.3 s; the wait ends at 6.0 s, in window 6.
            assert_eq!(earliest(&spec, 5_300, 700, 9, 1), 700, "{alg}");
            assert_eq!(earliest(&spec, 5_300, 700, 10, 1), 1_700, "{alg}");
            // A wait that ends mid-window: the rest of that window takes
            // ten, the next window's start the eleventh.
            assert_eq!(earliest(&spec, 5_300, 200, 10, 1), 700, "{alg}");
            assert_eq!(earliest(&spec, 5_300, 200, 20, 1), 1_700, "{alg}");
            assert_eq!(earliest(&spec, 5_300, 200, 0, 1), 200, "{alg}");
        }
    }

    #[test]
    fn a_bucket_frees_one_unit_per_interval() {
        let gcra = "limit: 10, window: 1s, algorithm: gcra, burst: 1";
        assert_eq!(earliest(gcra, 5_000, 100, 0, 1), 100);
        assert_eq!(earliest(gcra, 5_000, 100, 1, 1), 100);
        assert_eq!(earliest(gcra, 5_000, 100, 5, 1), 500);
    }

    #[test]
    fn a_shadow_or_admitting_limit_bounds_nothing() {
        let l = limit("limit: 1, window: 1s, algorithm: sliding_log");
        let r = request(&l, 1);
        let shadow = Decision::Decided(PerLimit {
            allowed: false,
            outcomes: None,
            verdicts: smallvec::smallvec![Some(Verdict::ShadowLimited)],
        });
        assert_eq!(earliest_ms(&shadow, &[r], 0, (300, 50)), 300);
    }
}
