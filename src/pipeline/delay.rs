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
use crate::decision::RouteDecision;
use crate::metrics::delay::DelayMetrics;

/// How long a denied request may wait and when to ask again, when it may
/// wait at all: the smallest `max_delay` of the limits that denied it, and
/// its Retry-After in milliseconds.
pub fn budget(decision: &RouteDecision, limits: &[Limit]) -> Option<(Duration, u64)> {
    if decision.allowed() || !matches!(decision, RouteDecision::Decided(_)) {
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

/// Who is waiting on one gateway: the lines by counters, and how many wait
/// per route.
#[derive(Debug, Default)]
pub struct Waiting {
    inner: Mutex<Lines>,
}

#[derive(Debug, Default)]
struct Lines {
    /// One FIFO line per set of counters (the request's store keys).
    lines: HashMap<Box<str>, Arc<tokio::sync::Mutex<()>>>,
    /// Requests waiting per route.
    queued: HashMap<Arc<str>, usize>,
    /// Requests waiting per line, for the admin API.
    in_line: HashMap<Box<str>, usize>,
}

impl Waiting {
    /// A place for a request of `route` waiting on the counters `keys`, or
    /// `None` when `max_queue` requests of the route already wait.
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
        *inner.in_line.entry(keys.clone()).or_insert(0) += 1;
        let line = inner.lines.entry(keys.clone()).or_default().clone();
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
        })
    }
}

impl Waiting {
    /// Requests waiting on this gateway in a line that counts `key`.
    pub fn waiting_on(&self, key: &str) -> usize {
        let inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        inner
            .in_line
            .iter()
            .filter(|(keys, _)| keys.split('\n').any(|k| k == key))
            .map(|(_, n)| n)
            .sum()
    }
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
}

impl Place<'_> {
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
        if let Some(n) = inner.in_line.get_mut(&self.keys) {
            *n -= 1;
            if *n == 0 {
                inner.in_line.remove(&self.keys);
            }
        }
        // A line is cloned only by `enter` (under this lock) and by a live
        // place taking its turn; each place drops both its clones before it
        // looks here, so the last place to look finds the map's alone.
        drop(self.line.take());
        if inner
            .lines
            .get(&self.keys)
            .is_some_and(|l| Arc::strong_count(l) == 1)
        {
            inner.lines.remove(&self.keys);
        }
    }
}
