//! The series of `on_limit: delay`: how many requests waited
//! and were then admitted, how long they waited, and how many are waiting
//! now, by route.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct DelayLabels {
    route: String,
}

type Seconds = Family<DelayLabels, Histogram, fn() -> Histogram>;

/// A wait lasts up to `max_delay` (at most a minute): 5 ms · 2^k, k < 14,
/// reaches 41 s.
fn delay_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.005, 2.0, 14))
}

/// The three families, registered once.
#[derive(Debug)]
pub struct DelayFamilies {
    delayed: Family<DelayLabels, Counter>,
    seconds: Seconds,
    waiting: Family<DelayLabels, Gauge>,
}

impl DelayFamilies {
    /// Registers the families in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let delayed = Family::<DelayLabels, Counter>::default();
        registry.register(
            "tollgate_delayed_requests",
            "Requests an on_limit: delay limit held back and then admitted, by route",
            delayed.clone(),
        );
        let seconds: Seconds = Family::new_with_constructor(delay_histogram);
        registry.register(
            "tollgate_delay_seconds",
            "How long delayed requests waited before they were admitted, by route",
            seconds.clone(),
        );
        let waiting = Family::<DelayLabels, Gauge>::default();
        registry.register(
            "tollgate_delay_waiting",
            "Requests waiting now for an on_limit: delay limit, by route",
            waiting.clone(),
        );
        Self {
            delayed,
            seconds,
            waiting,
        }
    }

    /// The series of route `route`.
    pub fn route(&self, route: &str) -> DelayMetrics {
        let labels = DelayLabels {
            route: route.to_owned(),
        };
        DelayMetrics {
            delayed: self.delayed.get_or_create_owned(&labels),
            seconds: self.seconds.get_or_create_owned(&labels),
            waiting: self.waiting.get_or_create_owned(&labels),
        }
    }
}

/// One route's delay series.
#[derive(Debug, Clone)]
pub struct DelayMetrics {
    delayed: Counter,
    seconds: Histogram,
    /// Requests of the route waiting now.
    pub waiting: Gauge,
}

impl DelayMetrics {
    /// A request admitted after waiting `secs`.
    pub fn admitted_after(&self, secs: f64) {
        self.delayed.inc();
        self.seconds.observe(secs);
    }
}
