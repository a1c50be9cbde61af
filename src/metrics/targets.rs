//! The series of upstream pools, by pool and target as written in the file
//! (a name's addresses are summed under the name, so pods coming and going
//! add no series): tries by outcome, connect errors, ejections and those
//! ended early by passing checks, the response time of answering tries,
//! and how many targets each pool can use now.

use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct TargetLabels {
    pool: String,
    target: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct TryLabels {
    pool: String,
    target: String,
    outcome: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct PoolLabels {
    pool: String,
}

/// How one try on a target ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TryEnd {
    /// A response head other than 502, 503 or 504.
    Answered,
    /// A 502, 503 or 504 from the target.
    Unavailable,
    /// No connection (or reset before a byte was written).
    ConnectError,
    /// No response head within the try's bound.
    Timeout,
    /// The connection broke after the request may have been written.
    Failed,
}

impl TryEnd {
    const ALL: [Self; 5] = [
        Self::Answered,
        Self::Unavailable,
        Self::ConnectError,
        Self::Timeout,
        Self::Failed,
    ];

    /// Each outcome's place in [`Self::ALL`] is its discriminant, which
    /// indexes a target's `tries`.
    const IN_ORDER: () = {
        let mut i = 0;
        while i < Self::ALL.len() {
            assert!(Self::ALL[i] as usize == i);
            i += 1;
        }
    };

    fn as_str(self) -> &'static str {
        match self {
            Self::Answered => "answered",
            Self::Unavailable => "unavailable",
            Self::ConnectError => "connect_error",
            Self::Timeout => "timeout",
            Self::Failed => "failed",
        }
    }
}

/// Asked at each scrape how many of a pool's endpoints take requests.
pub trait PoolHealth: Send + Sync {
    /// The pool's name.
    fn pool(&self) -> &str;
    /// Endpoints neither ejected nor failing their checks.
    fn usable(&self) -> usize;
}

/// The families, registered once.
#[derive(Debug)]
pub struct TargetFamilies {
    tries: Family<TryLabels, Counter>,
    connect_errors: Family<TargetLabels, Counter>,
    ejections: Family<TargetLabels, Counter>,
    ejections_ended: Family<TargetLabels, Counter>,
    seconds: Family<TargetLabels, Histogram, fn() -> Histogram>,
    pools: Pools,
}

/// The pools' balancers, newest last, held weakly: a replaced
/// configuration's pools leave as they are dropped.
#[derive(Clone, Default)]
struct Pools(Arc<Mutex<Vec<Weak<dyn PoolHealth>>>>);

impl std::fmt::Debug for Pools {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pools").finish_non_exhaustive()
    }
}

impl Collector for Pools {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let mut latest: Vec<(String, i64)> = Vec::new();
        {
            let mut pools = self.0.lock().unwrap_or_else(PoisonError::into_inner);
            pools.retain(|p| p.strong_count() > 0);
            for p in pools.iter().filter_map(Weak::upgrade) {
                let usable = i64::try_from(p.usable()).unwrap_or(i64::MAX);
                match latest.iter_mut().find(|(n, _)| n == p.pool()) {
                    Some(slot) => slot.1 = usable,
                    None => latest.push((p.pool().to_owned(), usable)),
                }
            }
        }
        let mut family = encoder.encode_descriptor(
            "tollgate_upstream_healthy_targets",
            "Addresses of each pool that take requests now (not ejected, passing their checks)",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        for (pool, usable) in latest {
            let labels = PoolLabels { pool };
            let series = family.encode_family(&labels)?;
            ConstGauge::new(usable).encode(series)?;
        }
        Ok(())
    }
}

/// Answering tries: 1 ms · 2^k, k < 16, reaches 32 s.
fn try_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}

impl TargetFamilies {
    /// Registers the families in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let tries = Family::<TryLabels, Counter>::default();
        registry.register(
            "tollgate_upstream_target_tries",
            "Tries on each pool target by outcome (answered, unavailable, connect_error, timeout, failed)",
            tries.clone(),
        );
        let connect_errors = Family::<TargetLabels, Counter>::default();
        registry.register(
            "tollgate_upstream_target_connect_errors",
            "Tries on each pool target that could not connect",
            connect_errors.clone(),
        );
        let ejections = Family::<TargetLabels, Counter>::default();
        registry.register(
            "tollgate_upstream_target_ejections",
            "Passive ejections of each pool target's addresses",
            ejections.clone(),
        );
        let ejections_ended = Family::<TargetLabels, Counter>::default();
        registry.register(
            "tollgate_upstream_target_ejections_ended",
            "Ejections of each pool target's addresses ended early by passing active checks",
            ejections_ended.clone(),
        );
        let seconds: Family<TargetLabels, Histogram, fn() -> Histogram> =
            Family::new_with_constructor(try_histogram);
        registry.register(
            "tollgate_upstream_target_duration_seconds",
            "Time from a try on a pool target to its response head",
            seconds.clone(),
        );
        let pools = Pools::default();
        registry.register_collector(Box::new(pools.clone()));
        Self {
            tries,
            connect_errors,
            ejections,
            ejections_ended,
            seconds,
            pools,
        }
    }

    /// The series of `target` (as written) of `pool`.
    pub fn target(&self, pool: &str, target: &str) -> TargetMetrics {
        let labels = TargetLabels {
            pool: pool.to_owned(),
            target: target.to_owned(),
        };
        TargetMetrics {
            tries: TryEnd::ALL.map(|outcome| {
                self.tries.get_or_create_owned(&TryLabels {
                    pool: pool.to_owned(),
                    target: target.to_owned(),
                    outcome: outcome.as_str(),
                })
            }),
            connect_errors: self.connect_errors.get_or_create_owned(&labels),
            ejections: self.ejections.get_or_create_owned(&labels),
            ejections_ended: self.ejections_ended.get_or_create_owned(&labels),
            seconds: self.seconds.get_or_create_owned(&labels),
        }
    }

    /// Reports `pool`'s usable endpoints at each scrape while it lives.
    pub fn watch(&self, pool: Weak<dyn PoolHealth>) {
        self.pools
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(pool);
    }
}

/// One target's series.
#[derive(Debug, Clone)]
pub struct TargetMetrics {
    tries: [Counter; 5],
    connect_errors: Counter,
    ejections: Counter,
    ejections_ended: Counter,
    seconds: Histogram,
}

impl TargetMetrics {
    /// Counts one try; `took` is the wait for an answer's head.
    #[inline]
    pub fn tried(&self, outcome: TryEnd, took: Option<Duration>) {
        let () = TryEnd::IN_ORDER;
        self.tries[outcome as usize].inc();
        if outcome == TryEnd::ConnectError {
            self.connect_errors.inc();
        }
        if let Some(t) = took {
            self.seconds.observe(t.as_secs_f64());
        }
    }

    /// Counts one ejection.
    pub fn ejected(&self) {
        self.ejections.inc();
    }

    /// Counts one ejection ended early by passing active checks.
    pub fn ejection_ended(&self) {
        self.ejections_ended.inc();
    }
}
