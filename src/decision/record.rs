//! What a decision leaves behind besides its answer: each limit's verdict
//! counted, every denial in the top-offenders view, and each would-be
//! denial of a shadow limit logged.

use std::sync::Arc;

use tracing::info;

use super::Decision;
use crate::config::{KeySource, Limit};
use crate::identity::{self, Caller};
use crate::limit::Verdict;
use crate::metrics::RouteMetrics;
use crate::top::{Denied, TopOffenders};

/// Counts each limit's verdict, feeds the top-offenders view with every
/// denial, and logs each would-be denial of a shadow limit.
/// The identity of a denial is written again from `caller` rather than
/// read from the store key, which may hold only its digest.
pub fn record(
    rd: &Decision,
    route_name: &Arc<str>,
    limits: &[Limit],
    caller: &Caller<'_>,
    metrics: Option<&RouteMetrics>,
    top: &TopOffenders,
) {
    if let Some(m) = metrics {
        // Per-limit series exist for the route's configured limits; a plan
        // view (`plan: true` expanded) has other limits and is not counted
        // per limit.
        if m.limits.len() == limits.len() {
            match rd {
                Decision::Decided(d) => {
                    for (lm, v) in m.limits.iter().zip(&d.verdicts) {
                        if let Some(v) = v {
                            lm.count(*v);
                        }
                    }
                }
                // The store could not decide: every limit counts an error.
                Decision::Undecided(_) => {
                    for lm in &m.limits {
                        lm.count(Verdict::Undecided);
                    }
                }
            }
        }
    }
    for (i, shadow) in rd.denied() {
        let Some(limit) = limits.get(i) else {
            continue;
        };
        let mut identity = String::with_capacity(48);
        identity::write_key(&mut identity, &limit.key, caller);
        let shown = || {
            let mut out = String::with_capacity(48);
            identity::write_shown(&mut out, &limit.key, caller, true);
            out
        };
        let denied = Denied {
            identity: &identity,
            shown: &shown,
            // Kept only where the identity holds it.
            api_key: caller.api_key.filter(|_| {
                limit
                    .key
                    .parts
                    .iter()
                    .flatten()
                    .any(|s| *s == KeySource::ApiKey)
            }),
        };
        top.record(route_name, &limit.name, &denied, shadow);
        if shadow {
            info!(
                route = %route_name,
                limit = %limit.name,
                identity = %shown(),
                "shadow limit would have denied this request"
            );
        }
    }
}
