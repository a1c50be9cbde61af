//! The console's sampler: once a second, off the request path, it reads the
//! counters the metrics already keep (their own text exposition, as a
//! scraper would), records what each route's outcomes moved by, snapshots
//! the top offenders every [`TOPS_EVERY`], and with Redis publishes this
//! gateway's summary and merges the live gateways' ([`fleet`](super::fleet)).
//! A request pays nothing for any of it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::metrics::history::{RouteSecond, Second, TOPS_EVERY};
use crate::pipeline::Gateway;
use crate::top::CAPACITY;

/// How often the sampler runs.
pub const INTERVAL: Duration = Duration::from_secs(1);

/// One route's counters as last read: outcomes (allowed, limited,
/// shadow_limited, exempt, error) and the upstream latency histogram's
/// cumulative buckets (upper bound in seconds, count).
#[derive(Debug, Clone, Default)]
pub struct RouteTotals {
    outcomes: [u64; 5],
    buckets: Vec<(f64, u64)>,
}

const OUTCOMES: [&str; 5] = ["allowed", "limited", "shadow_limited", "exempt", "error"];

/// Now, in ms since the epoch.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Samples `gw` every [`INTERVAL`] until aborted.
pub async fn run(gw: Arc<Gateway>) {
    let mut tick = tokio::time::interval(INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last = read_totals(&gw.metrics().render());
    let mut publisher = super::fleet::Publisher::default();
    loop {
        tick.tick().await;
        let now = now_ms();
        let totals = read_totals(&gw.metrics().render());
        let second = second_of(&gw, now, &last, &totals);
        last = totals;
        let history = &gw.metrics().history;
        history.push_local(second.clone());
        if history
            .last_tops()
            .is_none_or(|t| now.saturating_sub(t) >= millis(TOPS_EVERY))
        {
            history.push_tops(now, gw.top().snapshot(CAPACITY));
        }
        let denied = super::fleet::denied_windows(&gw, now);
        publisher.publish(&gw, second, denied).await;
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// What every route's counters moved by since `last`.
fn second_of(
    gw: &Gateway,
    at: u64,
    last: &HashMap<String, RouteTotals>,
    now: &HashMap<String, RouteTotals>,
) -> Second {
    let names: Vec<String> =
        gw.with_config(|c| c.routes.iter().map(|r| r.name.to_string()).collect());
    let empty = RouteTotals::default();
    let routes = names
        .into_iter()
        .map(|route| {
            let n = now.get(&route).unwrap_or(&empty);
            let l = last.get(&route).unwrap_or(&empty);
            let d = |i: usize| n.outcomes[i].saturating_sub(l.outcomes[i]);
            let (p50_ms, p99_ms) = percentiles(&l.buckets, &n.buckets);
            RouteSecond {
                route,
                allowed: d(0),
                limited: d(1),
                shadow_limited: d(2),
                exempt: d(3),
                errors: d(4),
                p50_ms,
                p99_ms,
            }
        })
        .collect();
    Second {
        at,
        gateways: 1,
        routes,
    }
}

/// The median and 99th percentile, in ms, of what a cumulative histogram
/// gained between `before` and `after`: the upper bound of the first
/// bucket reaching the rank (the largest finite bound past it).
pub fn percentiles(before: &[(f64, u64)], after: &[(f64, u64)]) -> (Option<f64>, Option<f64>) {
    let gained: Vec<(f64, u64)> = after
        .iter()
        .map(|&(le, n)| {
            let was = before.iter().find(|(b, _)| *b == le).map_or(0, |(_, c)| *c);
            (le, n.saturating_sub(was))
        })
        .collect();
    let total = gained.iter().map(|(_, n)| *n).max().unwrap_or(0);
    if total == 0 {
        return (None, None);
    }
    let finite_max = gained
        .iter()
        .map(|(le, _)| *le)
        .filter(|le| le.is_finite())
        .fold(0.0_f64, f64::max);
    let at = |q: f64| {
        #[allow(clippy::cast_precision_loss)]
        let rank = (q * total as f64).ceil();
        gained
            .iter()
            .find(|(_, n)| {
                #[allow(clippy::cast_precision_loss)]
                let n = *n as f64;
                n >= rank
            })
            .map(|(le, _)| if le.is_finite() { *le } else { finite_max } * 1000.0)
    };
    (at(0.5), at(0.99))
}

/// Every route's totals in the text exposition `text`.
pub fn read_totals(text: &str) -> HashMap<String, RouteTotals> {
    let mut out: HashMap<String, RouteTotals> = HashMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("tollgate_requests_total{") {
            let Some((labels, value)) = split_sample(rest) else {
                continue;
            };
            let (Some(route), Some(outcome)) = (label(&labels, "route"), label(&labels, "outcome"))
            else {
                continue;
            };
            if let Some(i) = OUTCOMES.iter().position(|o| *o == outcome) {
                out.entry(route).or_default().outcomes[i] = value;
            }
        } else if let Some(rest) = line.strip_prefix("tollgate_upstream_duration_seconds_bucket{") {
            let Some((labels, value)) = split_sample(rest) else {
                continue;
            };
            let (Some(route), Some(le)) = (label(&labels, "route"), label(&labels, "le")) else {
                continue;
            };
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().unwrap_or(f64::NAN)
            };
            if !le.is_nan() {
                out.entry(route).or_default().buckets.push((le, value));
            }
        }
    }
    out
}

/// `labels} value` split into the labels' text and the value.
fn split_sample(rest: &str) -> Option<(String, u64)> {
    let end = rest.rfind("} ")?;
    let value = rest[end + 2..].split(' ').next()?.parse().ok()?;
    Some((rest[..end].to_owned(), value))
}

/// The value of label `name` in `labels` (`a="x",b="y"`), unescaped.
fn label(labels: &str, name: &str) -> Option<String> {
    let mut chars = labels.chars().peekable();
    loop {
        let key: String = chars.by_ref().take_while(|c| *c != '=').collect();
        if chars.next() != Some('"') {
            return None;
        }
        let mut value = String::new();
        while let Some(c) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some('n') => value.push('\n'),
                    Some(other) => value.push(other),
                    None => return None,
                },
                '"' => break,
                other => value.push(other),
            }
        }
        if key.trim_start_matches(',') == name {
            return Some(value);
        }
        if chars.peek() == Some(&',') {
            chars.next();
        }
        chars.peek()?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_outcomes_and_buckets_from_the_exposition() {
        let text = "tollgate_requests_total{route=\"a \\\"b\\\"\",outcome=\"limited\"} 7\n\
                    tollgate_requests_total{route=\"x\",outcome=\"rejected\"} 9\n\
                    tollgate_upstream_duration_seconds_bucket{le=\"0.001\",route=\"x\"} 2\n\
                    tollgate_upstream_duration_seconds_bucket{le=\"+Inf\",route=\"x\"} 5\n";
        let t = read_totals(text);
        assert_eq!(t["a \"b\""].outcomes, [0, 7, 0, 0, 0]);
        assert_eq!(t["x"].outcomes, [0; 5]);
        assert_eq!(t["x"].buckets, vec![(0.001, 2), (f64::INFINITY, 5)]);
    }

    #[test]
    fn percentiles_of_what_the_histogram_gained() {
        let before = [(0.001, 10), (0.002, 10), (0.004, 10), (f64::INFINITY, 10)];
        let after = [
            (0.001, 10),
            (0.002, 108),
            (0.004, 110),
            (f64::INFINITY, 110),
        ];
        assert_eq!(percentiles(&before, &after), (Some(2.0), Some(4.0)));
        assert_eq!(percentiles(&after, &after), (None, None));
    }
}
