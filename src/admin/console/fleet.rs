//! The fleet's view: this gateway's summary (its last seconds and its
//! denials over 1, 5 and 15 minutes) published to Redis at most once a
//! second, and the live gateways' summaries merged
//! ([`store::redis::console`](crate::store::redis::console) holds the
//! script). Each gateway publishes and merges on its own timer, so a merge
//! may come after a peer has published twice: a summary carries its
//! last [`KEPT`] seconds, and a merge counts each peer's seconds it has not
//! counted yet, so a late merge shifts a peer's second into the next one
//! rather than losing it. A failed publication is logged (a warning when publishing
//! stops working, then quietly) and counted
//! (`tollgate_console_publish_failures_total`); it never touches `/readyz`.

use std::collections::{HashMap, VecDeque};

use serde::{Deserialize, Serialize};
use tracing::{debug, info, warn};

use crate::metrics::history::{DeniedCallers, Second};
use crate::pipeline::Gateway;
use crate::store::redis::console::exchange;
use crate::top::LimitTop;

/// The windows of "who is limited", in minutes.
pub const WINDOWS: [u32; 3] = [1, 5, 15];
/// Identities kept per limit and window.
pub const SHOWN: usize = 10;
/// Seconds a summary carries: a peer's merge may miss this many less one
/// of its publications and still count every second.
pub const KEPT: usize = 3;

/// What one gateway publishes.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Summary {
    /// The gateway's instance id (empty from a gateway that sends none:
    /// its `second` alone is merged).
    #[serde(default)]
    pub instance: String,
    /// Its last second.
    pub second: Second,
    /// The seconds before it, oldest first: at most [`KEPT`] less one.
    #[serde(default)]
    pub earlier: Vec<Second>,
    /// Its denials per limit and window.
    pub denied: Vec<DeniedCallers>,
}

/// Publishes, remembers whether the last publication worked (so a broken
/// one warns once rather than every second), this gateway's last seconds,
/// and the last second of each peer it has merged.
#[derive(Debug, Default)]
pub struct Publisher {
    failing: bool,
    recent: VecDeque<Second>,
    merged: HashMap<String, u64>,
}

impl Publisher {
    /// Publishes `second` and `denied`, then records the fleet's merged
    /// view; without Redis, or when publishing fails, the fleet's view is
    /// this gateway's alone.
    pub async fn publish(&mut self, gw: &Gateway, second: Second, denied: Vec<DeniedCallers>) {
        let history = &gw.metrics().history;
        let Some(store) = gw.limiter().admin().redis() else {
            history.push_fleet(second);
            history.set_fleet_denied(denied, 0);
            return;
        };
        let prefix = gw.with_config(|c| c.store.prefix.clone());
        let earlier: Vec<Second> = self.recent.iter().cloned().collect();
        self.recent.push_back(second.clone());
        if self.recent.len() >= KEPT {
            self.recent.pop_front();
        }
        let mine = Summary {
            instance: store.instance_id().to_owned(),
            second,
            earlier,
            denied,
        };
        let text = match serde_json::to_string(&mine) {
            Ok(t) => t,
            Err(e) => {
                debug!(error = %e, "console summary not serialisable");
                return;
            }
        };
        match exchange(store, &prefix, text).await {
            Ok(all) => {
                history.published.inc();
                if self.failing {
                    info!("console: publishing to redis works again");
                    self.failing = false;
                }
                let mut summaries: Vec<Summary> = all
                    .iter()
                    .filter_map(|s| serde_json::from_str(s).ok())
                    .collect();
                if summaries.is_empty() {
                    // This gateway's heartbeat is not counted yet.
                    summaries.push(mine);
                }
                let (second, denied) = merge(&summaries, &mut self.merged);
                let n = second.gateways;
                history.push_fleet(second);
                history.set_fleet_denied(denied, n);
            }
            Err(e) => {
                history.publish_failures.inc();
                if self.failing {
                    debug!(error = %e, "console: publishing to redis failed");
                } else {
                    warn!(error = %e, "console: publishing to redis failed; the console shows this gateway only until it works");
                    self.failing = true;
                }
                history.push_fleet(mine.second);
                history.set_fleet_denied(mine.denied, 1);
            }
        }
    }
}

/// This gateway's denials per limit over each of [`WINDOWS`], from the top
/// offenders now and the snapshot taken at least that long ago (none: the
/// gateway is younger, and everything since its start counts). Within
/// [`TOPS_EVERY`](crate::metrics::history::TOPS_EVERY) of the window.
pub fn denied_windows(gw: &Gateway, now: u64) -> Vec<DeniedCallers> {
    let current = gw.top().snapshot(crate::top::CAPACITY);
    let history = &gw.metrics().history;
    let mut out = Vec::new();
    for minutes in WINDOWS {
        let base = history
            .tops_at_or_before(now.saturating_sub(u64::from(minutes) * 60_000))
            .unwrap_or_default();
        for limit in &current {
            let before = base
                .iter()
                .find(|b| b.route == limit.route && b.limit == limit.limit);
            if let Some(d) = window(limit, before, minutes) {
                out.push(d);
            }
        }
    }
    out
}

fn window(now: &LimitTop, before: Option<&LimitTop>, minutes: u32) -> Option<DeniedCallers> {
    let denied = now.denied - before.map_or(0, |b| b.denied.min(now.denied));
    if denied == 0 {
        return None;
    }
    let was: HashMap<&str, u64> = before.map(|b| b.counts().collect()).unwrap_or_default();
    let mut top: Vec<(String, u64)> = now
        .counts()
        .map(|(id, n)| {
            (
                id.to_owned(),
                n.saturating_sub(was.get(id).copied().unwrap_or(0)),
            )
        })
        .filter(|(_, n)| *n > 0)
        .collect();
    top.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    top.truncate(SHOWN);
    Some(DeniedCallers {
        route: now.route.clone(),
        limit: now.limit.clone(),
        minutes,
        denied,
        top,
    })
}

/// The fleet's second and denials: counts summed per route, latency the
/// slowest gateway's, identities' denials summed per limit and window.
/// `merged` holds the last second counted of each peer: a peer's seconds
/// after it are counted (the newest alone for a peer not seen before),
/// and it is kept for the peers in `summaries` only.
pub fn merge(
    summaries: &[Summary],
    merged: &mut HashMap<String, u64>,
) -> (Second, Vec<DeniedCallers>) {
    let mut second = Second {
        at: summaries.iter().map(|s| s.second.at).max().unwrap_or(0),
        gateways: u32::try_from(summaries.len()).unwrap_or(u32::MAX),
        routes: Vec::new(),
    };
    let mut counted = HashMap::with_capacity(summaries.len());
    let uncounted = summaries.iter().flat_map(|s| {
        let after = if s.instance.is_empty() {
            None
        } else {
            counted.insert(s.instance.clone(), s.second.at);
            merged.get(&s.instance).copied()
        };
        let earlier = s
            .earlier
            .iter()
            .filter(move |e| after.is_some_and(|a| e.at > a));
        earlier.chain(std::iter::once(&s.second).filter(move |n| after.is_none_or(|a| n.at > a)))
    });
    for s in uncounted.collect::<Vec<_>>() {
        for r in &s.routes {
            let Some(m) = second.routes.iter_mut().find(|m| m.route == r.route) else {
                second.routes.push(r.clone());
                continue;
            };
            m.allowed += r.allowed;
            m.limited += r.limited;
            m.shadow_limited += r.shadow_limited;
            m.exempt += r.exempt;
            m.errors += r.errors;
            m.p50_ms = max(m.p50_ms, r.p50_ms);
            m.p99_ms = max(m.p99_ms, r.p99_ms);
        }
    }
    *merged = counted;
    let mut denied: Vec<DeniedCallers> = Vec::new();
    for d in summaries.iter().flat_map(|s| &s.denied) {
        let Some(m) = denied
            .iter_mut()
            .find(|m| m.route == d.route && m.limit == d.limit && m.minutes == d.minutes)
        else {
            denied.push(d.clone());
            continue;
        };
        m.denied += d.denied;
        for (id, n) in &d.top {
            match m.top.iter_mut().find(|(i, _)| i == id) {
                Some(e) => e.1 += n,
                None => m.top.push((id.clone(), *n)),
            }
        }
    }
    for d in &mut denied {
        d.top
            .sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        d.top.truncate(SHOWN);
    }
    (second, denied)
}

fn max(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::history::RouteSecond;

    fn second(at: u64, limited: u64) -> Second {
        Second {
            at,
            gateways: 1,
            routes: vec![RouteSecond {
                route: "r".into(),
                limited,
                p99_ms: Some(limited as f64),
                ..RouteSecond::default()
            }],
        }
    }

    fn summary(limited: u64, who: &str) -> Summary {
        Summary {
            instance: String::new(),
            second: second(1, limited),
            earlier: Vec::new(),
            denied: vec![DeniedCallers {
                route: "r".into(),
                limit: "l".into(),
                minutes: 1,
                denied: limited,
                top: vec![(who.into(), limited)],
            }],
        }
    }

    #[test]
    fn merges_counts_and_callers_across_gateways() {
        let (second, denied) = merge(
            &[
                summary(3, "key=a"),
                summary(4, "key=a"),
                summary(2, "key=b"),
            ],
            &mut HashMap::new(),
        );
        assert_eq!(second.gateways, 3);
        assert_eq!(second.routes[0].limited, 9);
        assert_eq!(second.routes[0].p99_ms, Some(4.0));
        assert_eq!(denied.len(), 1);
        assert_eq!(denied[0].denied, 9);
        assert_eq!(
            denied[0].top,
            vec![("key=a".into(), 7), ("key=b".into(), 2)]
        );
    }

    /// A peer's summary as published at second `at`: its seconds so far,
    /// `limited[i]` in second `i + 1`, the last [`KEPT`] of them.
    fn published(at: usize, limited: &[u64]) -> Summary {
        let all: Vec<Second> = (1..=at).map(|s| second(s as u64, limited[s - 1])).collect();
        let kept = &all[at.saturating_sub(KEPT)..];
        Summary {
            instance: "peer".into(),
            second: kept[kept.len() - 1].clone(),
            earlier: kept[..kept.len() - 1].to_vec(),
            denied: Vec::new(),
        }
    }

    #[test]
    fn a_late_merge_counts_a_missed_second_once_and_a_repeat_not_at_all() {
        let limited = [1, 7, 2, 4];
        let mut merged = HashMap::new();
        let limited_in = |s: &Summary, merged: &mut HashMap<String, u64>| {
            merge(std::slice::from_ref(s), merged)
                .0
                .routes
                .first()
                .map_or(0, |r| r.limited)
        };
        // First seen: its newest second alone.
        assert_eq!(limited_in(&published(1, &limited), &mut merged), 1);
        // The merge after second 2 came late: seconds 2 and 3 at once.
        assert_eq!(limited_in(&published(3, &limited), &mut merged), 9);
        // A merge before the peer published again: nothing new.
        assert_eq!(limited_in(&published(3, &limited), &mut merged), 0);
        assert_eq!(limited_in(&published(4, &limited), &mut merged), 4);
        // A summary of a gateway that sends no instance: its second.
        assert_eq!(limited_in(&summary(5, "key=a"), &mut merged), 5);
    }
}
