//! What the operators' console remembers: the last 15 minutes of each
//! route's outcomes, second by second, for this gateway and for the fleet,
//! and snapshots of the top-offender summaries to tell the last 1, 5 and 15
//! minutes' denials apart from older ones.
//!
//! Nothing here is touched by a request. The console's sampler (in
//! `admin::console`) reads the counters the metrics already keep once a
//! second and pushes what they moved by; the console's endpoints read it.
//! Every ring is bounded: [`SECONDS`] seconds (local and fleet) and
//! [`TOPS_KEPT`] snapshots, whatever the traffic; a route's entry is a few
//! dozen bytes and a snapshot holds at most `top::CAPACITY` entries per
//! limit.

use std::collections::VecDeque;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;
use serde::{Deserialize, Serialize};

use crate::top::LimitTop;

/// Seconds of history kept: 15 minutes.
pub const SECONDS: usize = 900;
/// How often the top-offender summaries are snapshotted.
pub const TOPS_EVERY: Duration = Duration::from_secs(15);
/// Snapshots kept: 15 minutes of them and one more, so a 15-minute window
/// always has a snapshot at least that old once the gateway has run so
/// long.
pub const TOPS_KEPT: usize = 61;

/// One route's outcomes in one second.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RouteSecond {
    /// Route name.
    pub route: String,
    /// Requests admitted by every limit.
    pub allowed: u64,
    /// Requests denied by an enforced limit.
    pub limited: u64,
    /// Requests a shadow limit would have denied (admitted).
    pub shadow_limited: u64,
    /// Requests from exempt callers.
    pub exempt: u64,
    /// Requests the limiter could not decide, or the upstream failed.
    pub errors: u64,
    /// Upstream response time in ms, median over the second (the bucket's
    /// upper bound), if any response came.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p50_ms: Option<f64>,
    /// The same at the 99th percentile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p99_ms: Option<f64>,
}

/// Every route's outcomes in one second.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Second {
    /// The second's end, ms since the epoch.
    pub at: u64,
    /// Gateways counted in it (1 for this gateway's own).
    pub gateways: u32,
    /// Per route, in the configuration's order.
    pub routes: Vec<RouteSecond>,
}

/// The callers one limit denied most over the last `minutes`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DeniedCallers {
    /// Route name.
    pub route: String,
    /// Limit name.
    pub limit: String,
    /// The window: 1, 5 or 15 minutes.
    pub minutes: u32,
    /// Every denial of the limit in the window.
    pub denied: u64,
    /// Identities as `/admin/top` shows them, with their denials in the
    /// window, most denied first.
    pub top: Vec<(String, u64)>,
}

/// The console's rings, and the counts of its publications to Redis.
#[derive(Debug, Default)]
pub struct History {
    local: Mutex<VecDeque<Second>>,
    fleet: Mutex<VecDeque<Second>>,
    tops: Mutex<VecDeque<(u64, Vec<LimitTop>)>>,
    /// The fleet's denials as last merged, and the gateways merged.
    fleet_denied: Mutex<(Vec<DeniedCallers>, u32)>,
    /// Summaries published to Redis.
    pub published: Counter,
    /// Publications that failed (Redis down, refused, or a bad reply).
    pub publish_failures: Counter,
}

fn push_bounded<T>(ring: &Mutex<VecDeque<T>>, item: T, cap: usize) {
    let mut ring = ring.lock().unwrap_or_else(PoisonError::into_inner);
    while ring.len() >= cap {
        ring.pop_front();
    }
    ring.push_back(item);
}

impl History {
    /// A history whose publication counters are registered in `registry`.
    pub(super) fn register(registry: &mut Registry) -> Self {
        let history = Self::default();
        registry.register(
            "tollgate_console_published",
            "Summaries the console published to Redis for the fleet's view (at most one a second)",
            history.published.clone(),
        );
        registry.register(
            "tollgate_console_publish_failures",
            "Console summaries that could not be published to Redis (down, refused, or a bad reply); /readyz ignores them",
            history.publish_failures.clone(),
        );
        history
    }

    /// Adds this gateway's `second`, dropping the oldest past [`SECONDS`].
    pub fn push_local(&self, second: Second) {
        push_bounded(&self.local, second, SECONDS);
    }

    /// Adds the fleet's `second`, dropping the oldest past [`SECONDS`].
    pub fn push_fleet(&self, second: Second) {
        push_bounded(&self.fleet, second, SECONDS);
    }

    /// Adds a snapshot of the top offenders taken at `at` (ms).
    pub fn push_tops(&self, at: u64, tops: Vec<LimitTop>) {
        push_bounded(&self.tops, (at, tops), TOPS_KEPT);
    }

    /// Keeps the fleet's denials as merged from `gateways` gateways.
    pub fn set_fleet_denied(&self, denied: Vec<DeniedCallers>, gateways: u32) {
        *self
            .fleet_denied
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = (denied, gateways);
    }

    /// The fleet's denials as last merged, and how many gateways they
    /// came from (0 before the first merge, or without Redis).
    pub fn fleet_denied(&self) -> (Vec<DeniedCallers>, u32) {
        self.fleet_denied
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// This gateway's seconds since `after` (ms), oldest first.
    pub fn local_since(&self, after: u64) -> Vec<Second> {
        since(&self.local, after)
    }

    /// The fleet's seconds since `after` (ms), oldest first.
    pub fn fleet_since(&self, after: u64) -> Vec<Second> {
        since(&self.fleet, after)
    }

    /// Seconds held (local, fleet): never over [`SECONDS`] each.
    pub fn len(&self) -> (usize, usize) {
        let n =
            |r: &Mutex<VecDeque<Second>>| r.lock().unwrap_or_else(PoisonError::into_inner).len();
        (n(&self.local), n(&self.fleet))
    }

    /// Whether nothing was sampled yet.
    pub fn is_empty(&self) -> bool {
        self.len() == (0, 0)
    }

    /// The newest snapshot taken at or before `at` (ms), if any.
    pub fn tops_at_or_before(&self, at: u64) -> Option<Vec<LimitTop>> {
        let tops = self.tops.lock().unwrap_or_else(PoisonError::into_inner);
        tops.iter()
            .rev()
            .find(|(t, _)| *t <= at)
            .map(|(_, s)| s.clone())
    }

    /// When the newest snapshot was taken (ms), if any was.
    pub fn last_tops(&self) -> Option<u64> {
        let tops = self.tops.lock().unwrap_or_else(PoisonError::into_inner);
        tops.back().map(|(t, _)| *t)
    }
}

fn since(ring: &Mutex<VecDeque<Second>>, after: u64) -> Vec<Second> {
    let ring = ring.lock().unwrap_or_else(PoisonError::into_inner);
    ring.iter().filter(|s| s.at > after).cloned().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rings_stay_bounded() {
        let h = History::default();
        for at in 0..(SECONDS as u64 * 2) {
            h.push_local(Second {
                at,
                gateways: 1,
                routes: Vec::new(),
            });
            h.push_tops(at, Vec::new());
        }
        assert_eq!(h.len(), (SECONDS, 0));
        assert_eq!(h.local_since(0).len(), SECONDS);
        assert_eq!(h.local_since(0)[0].at, SECONDS as u64);
        assert_eq!(h.tops.lock().unwrap().len(), TOPS_KEPT);
        assert_eq!(h.last_tops(), Some(SECONDS as u64 * 2 - 1));
        assert!(h.tops_at_or_before(3).is_none());
    }
}
