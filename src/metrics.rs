//! Prometheus metrics, served as text on the admin listener (`/metrics`).
//!
//! Every label value comes from the configuration (route and limit names) or
//! from a fixed list (outcomes, status classes, store kinds), so the number
//! of series is bounded by the file, never by traffic. Identity values are
//! never labels: who is hitting a limit is answered by the bounded
//! top-offenders view ([`crate::top`]) instead.
//!
//! The hot path never formats a label set: [`RouteMetrics`] resolves every
//! series a route can touch when the configuration is compiled (at start and
//! on reload), and a request only bumps atomics through those handles.
//! Series survive a reload — `prometheus-client` families keep them — so a
//! reload never resets a counter (Prometheus would read a reset as a restart).
//!
//! Names follow the Prometheus conventions: base units (seconds), `_total`
//! on counters (added by the encoder), one `tollgate_` prefix.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::AtomicI64;
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::config::Config;
use crate::limit::Verdict;
use delay::{DelayFamilies, DelayMetrics};
use outcome::label;
pub use outcome::{Access, Ending, Outcome};

pub mod delay;
pub mod history;
pub mod outcome;
pub mod spans;
pub mod targets;
use crate::store::redis::failovers::FailoverReason;
use crate::store::redis::fault::FaultKind;
use crate::store::redis::nodes::NodeGauges;

/// Media type of the text exposition `prometheus-client` writes (OpenMetrics 1.0).
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    route: String,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DecisionLabels {
    route: String,
    limit: String,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LimitLabels {
    route: String,
    limit: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StoreLabels {
    store: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FaultLabels {
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct UpstreamLabels {
    route: String,
    class: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct UpstreamErrorLabels {
    route: String,
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClientErrorLabels {
    route: String,
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabels {
    route: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// Store calls take microseconds (memory) to tens of milliseconds (Redis
/// near its timeout): 50 µs · 2^k, k < 14, reaches 0.4 s.
fn store_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.000_05, 2.0, 14))
}

/// Upstream answers: 1 ms · 2^k, k < 16, reaches 32 s (the default
/// response timeout is 30 s).
fn upstream_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}

/// The limiter's own series, handed to [`crate::decision::limiter::Limiter`].
#[derive(Debug, Clone)]
pub struct StoreMetrics {
    /// Latency of decisions in Redis.
    pub redis_duration: Histogram,
    /// Latency of decisions in process (no Redis, or its fallback).
    pub memory_duration: Histogram,
    /// Latency of decisions in `sync` mode (in process, against the fleet
    /// totals last read from Redis).
    pub sync_duration: Histogram,
    /// `sync` mode's exchanges with Redis (one per interval with keys to
    /// send; each one call per Cluster slot).
    pub sync_exchanges: Counter,
    /// Keys sent in `sync` mode's exchanges.
    pub sync_keys: Counter,
    /// Redis calls that failed or timed out.
    pub errors: Counter,
    /// 1 while Redis is configured but failing and `on_error` decides.
    pub fallback: Gauge<i64, AtomicI64>,
    /// 1 while the breaker is open (Redis is not called), else 0.
    pub breaker_open: Gauge<i64, AtomicI64>,
    /// In a Cluster, 1 per node while its breaker is open, else 0.
    pub node_breaker_open: NodeGauges,
    /// Requests answered from the deny cache, without a Redis call.
    pub deny_cache_hits: Counter,
    /// 1 while Redis refuses the gateway for that reason, per
    /// [`FaultKind::index`] (auth, permission, tls, sentinel).
    pub faults: [Gauge<i64, AtomicI64>; 4],
    /// Failovers followed, per [`FailoverReason::index`].
    pub failovers: [Counter; 3],
    /// Keys added to Redis after an outage with what the fallback admitted.
    pub backlog_pushed: Counter,
    /// Fallback admissions not recorded for Redis: the backlog was full.
    pub backlog_dropped: Counter,
    /// Shares another process counts on with another definition, found
    /// when the share's fingerprint was checked (start, reload).
    pub share_mismatches: Counter,
    /// Reservations settled by the response.
    pub settled: Counter,
    /// Reservations left standing: the value was missing or not a count.
    pub settle_kept_value: Counter,
    /// Reservations left standing: the store could not settle them.
    pub settle_kept_store: Counter,
    /// Reservations left standing, by the other reasons (a response body's
    /// usage: [`Self::kept`]).
    settle_kept: Family<ReasonLabels, Counter>,
}

impl Default for StoreMetrics {
    fn default() -> Self {
        Self {
            redis_duration: store_histogram(),
            memory_duration: store_histogram(),
            sync_duration: store_histogram(),
            sync_exchanges: Counter::default(),
            sync_keys: Counter::default(),
            errors: Counter::default(),
            fallback: Gauge::default(),
            breaker_open: Gauge::default(),
            node_breaker_open: NodeGauges::default(),
            deny_cache_hits: Counter::default(),
            faults: Default::default(),
            failovers: Default::default(),
            backlog_pushed: Counter::default(),
            backlog_dropped: Counter::default(),
            share_mismatches: Counter::default(),
            settled: Counter::default(),
            settle_kept_value: Counter::default(),
            settle_kept_store: Counter::default(),
            settle_kept: Family::default(),
        }
    }
}

impl StoreMetrics {
    /// The store's series, registered in `registry`: call latency by store,
    /// Redis errors, fallback, breaker and fault gauges, the outage backlog
    /// and the deny cache.
    fn register(registry: &mut Registry) -> Self {
        let store_duration: HistogramFamily<StoreLabels> =
            Family::new_with_constructor(store_histogram);
        registry.register(
            "tollgate_store_call_duration_seconds",
            "Latency of one limiter decision by store (redis, memory, sync)",
            store_duration.clone(),
        );
        let store_errors = Counter::default();
        registry.register(
            "tollgate_store_errors",
            "Redis calls that failed or timed out",
            store_errors.clone(),
        );
        let store_fallback = Gauge::<i64, AtomicI64>::default();
        registry.register(
            "tollgate_store_fallback",
            "1 while Redis is failing and on_error decides, else 0",
            store_fallback.clone(),
        );
        let store_breaker_open = Gauge::<i64, AtomicI64>::default();
        registry.register(
            "tollgate_store_breaker_open",
            "1 while the breaker in front of Redis is open (Redis is not called), else 0",
            store_breaker_open.clone(),
        );
        let store_fault = Family::<FaultLabels, Gauge<i64, AtomicI64>>::default();
        registry.register(
            "tollgate_store_fault",
            "1 while Redis refuses the gateway for this kind of reason (auth: WRONGPASS/NOAUTH, permission: NOPERM, tls: handshake or protocol mismatch), else 0",
            store_fault.clone(),
        );
        let backlog_pushed = Counter::default();
        registry.register(
            "tollgate_store_backlog_pushed",
            "Keys added to Redis when it returned, with what on_error: local admitted during the outage",
            backlog_pushed.clone(),
        );
        let backlog_dropped = Counter::default();
        registry.register(
            "tollgate_store_backlog_dropped",
            "Admissions on_error: local made during an outage that were not kept for Redis (the backlog was full)",
            backlog_dropped.clone(),
        );
        let sync_exchanges = Counter::default();
        registry.register(
            "tollgate_store_sync_exchanges",
            "sync mode: exchanges with Redis (each adds this instance's admissions and reads the fleet's totals)",
            sync_exchanges.clone(),
        );
        let sync_keys = Counter::default();
        registry.register(
            "tollgate_store_sync_keys",
            "sync mode: keys sent in exchanges with Redis",
            sync_keys.clone(),
        );
        let deny_cache_hits = Counter::default();
        registry.register(
            "tollgate_deny_cache_hits",
            "Requests denied from the local deny cache, without a Redis call",
            deny_cache_hits.clone(),
        );
        let settled = Counter::default();
        registry.register(
            "tollgate_settled",
            "Reserved costs settled by the response (a header, a trailer or body bytes)",
            settled.clone(),
        );
        let settle_kept: Family<ReasonLabels, Counter> = Family::default();
        registry.register(
            "tollgate_settle_kept",
            "Reserved costs left standing: the header or trailer was missing or not a count (value), the store could not settle (store), or a response body's usage was missing or unreadable (no_usage, not_json, bad_number, too_large, encoded, content_type, upstream_error, aborted)",
            settle_kept.clone(),
        );
        Self {
            share_mismatches: register_share_mismatches(registry),
            settled,
            settle_kept_value: settle_kept.get_or_create_owned(&ReasonLabels { reason: "value" }),
            settle_kept_store: settle_kept.get_or_create_owned(&ReasonLabels { reason: "store" }),
            settle_kept,
            redis_duration: store_duration.get_or_create_owned(&StoreLabels { store: "redis" }),
            memory_duration: store_duration.get_or_create_owned(&StoreLabels { store: "memory" }),
            sync_duration: store_duration.get_or_create_owned(&StoreLabels { store: "sync" }),
            sync_exchanges,
            sync_keys,
            errors: store_errors,
            fallback: store_fallback,
            breaker_open: store_breaker_open,
            node_breaker_open: register_node_breakers(registry),
            deny_cache_hits,
            faults: FaultKind::ALL
                .map(|kind| store_fault.get_or_create_owned(&FaultLabels { kind: kind.label() })),
            failovers: register_failovers(registry),
            backlog_pushed,
            backlog_dropped,
        }
    }
}

/// `tollgate_share_mismatches_total`.
fn register_share_mismatches(registry: &mut Registry) -> Counter {
    let share_mismatches = Counter::default();
    registry.register(
        "tollgate_share_mismatches",
        "Shares another process counts on with another definition (key, limit, window, algorithm or kind), found when their fingerprints were checked",
        share_mismatches.clone(),
    );
    share_mismatches
}

/// `tollgate_store_node_breaker_open{node}`, one gauge per Cluster node.
fn register_node_breakers(registry: &mut Registry) -> NodeGauges {
    let gauges = NodeGauges::default();
    registry.register(
        "tollgate_store_node_breaker_open",
        "Redis Cluster: 1 while the breaker of this node is open (calls for its slots are decided by on_error), else 0",
        gauges.clone(),
    );
    gauges
}

impl StoreMetrics {
    /// Counts one reservation left standing for `reason`; a lookup in the
    /// family, as these are rare next to settlements.
    pub fn kept(&self, reason: &'static str) {
        self.settle_kept
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }
}

/// `tollgate_store_failovers_total{reason}`, one counter per
/// [`FailoverReason`].
fn register_failovers(registry: &mut Registry) -> [Counter; 3] {
    let family: Family<ReasonLabels, Counter> = Family::default();
    registry.register(
        "tollgate_store_failovers",
        "Times the gateway left a Redis server for another, or for the same one anew: the sentinels announced a new master (switch), the server gave no reply within the bound (no_reply), or its connection closed (closed)",
        family.clone(),
    );
    FailoverReason::ALL.map(|reason| {
        family.get_or_create_owned(&ReasonLabels {
            reason: reason.label(),
        })
    })
}

/// Every series of one limit of one route.
#[derive(Debug, Clone)]
pub struct LimitMetrics {
    allowed: Counter,
    limited: Counter,
    shadow_limited: Counter,
    error: Counter,
    /// For a settled limit, the units its settlements charged.
    pub settled_units: Option<Counter>,
}

impl LimitMetrics {
    /// Counts one decision of this limit.
    pub fn count(&self, verdict: Verdict) {
        match verdict {
            Verdict::Allowed => self.allowed.inc(),
            Verdict::Limited => self.limited.inc(),
            Verdict::ShadowLimited => self.shadow_limited.inc(),
            Verdict::Undecided => self.error.inc(),
        };
    }
}

/// Every series one route can touch, resolved once per configuration.
#[derive(Debug, Clone)]
pub struct RouteMetrics {
    allowed: Counter,
    limited: Counter,
    shadow_limited: Counter,
    error: Counter,
    client_error: Counter,
    rejected: Counter,
    exempt: Counter,
    /// Per limit, in the route's limit order.
    pub limits: Vec<LimitMetrics>,
    classes: [Counter; 5],
    upstream_connect: Counter,
    upstream_timeout: Counter,
    upstream_failed: Counter,
    upstream_duration: Histogram,
    client_bad_body: Counter,
    client_aborted: Counter,
    client_body_too_large: Counter,
    client_deadline: Counter,
    /// The `on_limit: delay` series.
    pub delay: DelayMetrics,
}

/// Why forwarding failed, for `tollgate_upstream_errors_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamErrorKind {
    /// No connection could be made.
    Connect,
    /// No response head within the route's timeout.
    Timeout,
    /// The connection broke, or the request could not be built.
    Failed,
}

/// How the client's request failed while it was forwarded, for
/// `tollgate_client_errors_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientErrorKind {
    /// The body broke its framing (a malformed chunk): 400.
    BadBody,
    /// The client went away before its body was complete.
    Aborted,
    /// The body passed `server.max_body_size` as it streamed: 413.
    BodyTooLarge,
    /// A gRPC call's own deadline (`grpc-timeout`) passed before the
    /// upstream answered: DEADLINE_EXCEEDED (504). The client chose the
    /// deadline, so it must not page anyone as an upstream timeout would.
    Deadline,
}

impl RouteMetrics {
    /// Counts one request's outcome.
    pub fn count(&self, outcome: Outcome) {
        match outcome.ending {
            Ending::Allowed => self.allowed.inc(),
            Ending::Limited => self.limited.inc(),
            Ending::ShadowLimited => self.shadow_limited.inc(),
            Ending::Error => self.error.inc(),
            Ending::ClientError => self.client_error.inc(),
            Ending::Rejected => self.rejected.inc(),
            Ending::Exempt => self.exempt.inc(),
        };
    }

    /// Records an upstream response head: its status class and how long it took.
    pub fn upstream_response(&self, status: http::StatusCode, took: Duration) {
        let class = usize::from(status.as_u16() / 100).clamp(1, 5) - 1;
        self.classes[class].inc();
        self.upstream_duration.observe(took.as_secs_f64());
    }

    /// Records a failed forward.
    pub fn upstream_error(&self, kind: UpstreamErrorKind) {
        match kind {
            UpstreamErrorKind::Connect => self.upstream_connect.inc(),
            UpstreamErrorKind::Timeout => self.upstream_timeout.inc(),
            UpstreamErrorKind::Failed => self.upstream_failed.inc(),
        };
    }

    /// Records a forward ended by the client's request body.
    pub fn client_error(&self, kind: ClientErrorKind) {
        match kind {
            ClientErrorKind::BadBody => self.client_bad_body.inc(),
            ClientErrorKind::Aborted => self.client_aborted.inc(),
            ClientErrorKind::BodyTooLarge => self.client_body_too_large.inc(),
            ClientErrorKind::Deadline => self.client_deadline.inc(),
        };
    }
}

/// The registry and every family in it.
pub struct Metrics {
    registry: Registry,
    /// The limiter's series; clones share the same values.
    pub store: StoreMetrics,
    requests: Family<RequestLabels, Counter>,
    /// Requests no route takes (404); no route label exists for them.
    pub unmatched: Counter,
    decisions: Family<DecisionLabels, Counter>,
    settled_units: Family<LimitLabels, Counter>,
    upstream_responses: Family<UpstreamLabels, Counter>,
    upstream_errors: Family<UpstreamErrorLabels, Counter>,
    upstream_duration: HistogramFamily<RouteLabels>,
    client_errors: Family<ClientErrorLabels, Counter>,
    delay: DelayFamilies,
    reloads: Family<ResultLabels, Counter>,
    /// The series of upstream pools' targets.
    pub targets: targets::TargetFamilies,
    /// The series of the span export (tracing).
    pub spans: spans::SpanMetrics,
    /// What the operators' console remembers of these series.
    pub history: history::History,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Metrics {
    /// A registry with every family.
    pub fn new() -> Self {
        // `/metrics` lists the families in the order they are registered.
        let mut registry = Registry::default();
        registry.register_collector(Box::new(LogLinesDropped));
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "tollgate_requests",
            "Routed requests by route and outcome (allowed, limited, shadow_limited, error, client_error, rejected, exempt)",
            requests.clone(),
        );
        let unmatched = Counter::default();
        registry.register(
            "tollgate_unmatched_requests",
            "Requests no route takes (answered 404)",
            unmatched.clone(),
        );
        let decisions = Family::<DecisionLabels, Counter>::default();
        registry.register(
            "tollgate_decisions",
            "Limit decisions by route, limit and outcome (allowed, limited, shadow_limited, error)",
            decisions.clone(),
        );
        let store = StoreMetrics::register(&mut registry);
        let settled_units = Family::<LimitLabels, Counter>::default();
        registry.register(
            "tollgate_settled_units",
            "Units settled limits charged by route and limit: the amounts the responses reported (tokens, for a cost read from the body), summed as settled",
            settled_units.clone(),
        );
        let upstream_responses = Family::<UpstreamLabels, Counter>::default();
        registry.register(
            "tollgate_upstream_responses",
            "Upstream response heads by route and status class (1xx..5xx)",
            upstream_responses.clone(),
        );
        let upstream_errors = Family::<UpstreamErrorLabels, Counter>::default();
        registry.register(
            "tollgate_upstream_errors",
            "Forwards that got no response by route and kind (connect, timeout, failed)",
            upstream_errors.clone(),
        );
        let upstream_duration: HistogramFamily<RouteLabels> =
            Family::new_with_constructor(upstream_histogram);
        registry.register(
            "tollgate_upstream_duration_seconds",
            "Time from forwarding a request to the upstream's response head",
            upstream_duration.clone(),
        );
        let client_errors = Family::<ClientErrorLabels, Counter>::default();
        registry.register(
            "tollgate_client_errors",
            "Forwards ended by the client's request body or deadline by route and kind (bad_body, aborted, body_too_large, deadline)",
            client_errors.clone(),
        );
        let delay = DelayFamilies::register(&mut registry);
        let reloads = Family::<ResultLabels, Counter>::default();
        registry.register(
            "tollgate_config_reloads",
            "Configuration reloads by result (success, failure)",
            reloads.clone(),
        );
        let targets = targets::TargetFamilies::register(&mut registry);
        let spans = spans::SpanMetrics::register(&mut registry);
        let history = history::History::register(&mut registry);
        Self {
            history,
            registry,
            targets,
            spans,
            store,
            requests,
            unmatched,
            decisions,
            settled_units,
            upstream_responses,
            upstream_errors,
            upstream_duration,
            client_errors,
            delay,
            reloads,
        }
    }

    /// The series of limit `l` of route `route`.
    fn limit(&self, route: &str, l: &crate::config::Limit) -> LimitMetrics {
        let dec = |verdict: Verdict| {
            self.decisions.get_or_create_owned(&DecisionLabels {
                route: route.to_owned(),
                limit: l.name.to_string(),
                outcome: verdict.as_str(),
            })
        };
        LimitMetrics {
            allowed: dec(Verdict::Allowed),
            limited: dec(Verdict::Limited),
            shadow_limited: dec(Verdict::ShadowLimited),
            error: dec(Verdict::Undecided),
            settled_units: l.settle.is_some().then(|| {
                self.settled_units.get_or_create_owned(&LimitLabels {
                    route: route.to_owned(),
                    limit: l.name.to_string(),
                })
            }),
        }
    }

    /// Resolves every series of every route of `config`.
    pub fn routes(&self, config: &Config) -> HashMap<Arc<str>, RouteMetrics> {
        config
            .routes
            .iter()
            .map(|r| {
                let route = r.name.to_string();
                let req = |ending: Ending| {
                    self.requests.get_or_create_owned(&RequestLabels {
                        route: route.clone(),
                        outcome: label(ending),
                    })
                };
                let limits = r.limits.iter().map(|l| self.limit(&route, l)).collect();
                let class = |class: &'static str| {
                    self.upstream_responses
                        .get_or_create_owned(&UpstreamLabels {
                            route: route.clone(),
                            class,
                        })
                };
                let uerr = |kind: &'static str| {
                    self.upstream_errors
                        .get_or_create_owned(&UpstreamErrorLabels {
                            route: route.clone(),
                            kind,
                        })
                };
                let cerr = |kind: &'static str| {
                    self.client_errors.get_or_create_owned(&ClientErrorLabels {
                        route: route.clone(),
                        kind,
                    })
                };
                let metrics = RouteMetrics {
                    allowed: req(Ending::Allowed),
                    limited: req(Ending::Limited),
                    shadow_limited: req(Ending::ShadowLimited),
                    error: req(Ending::Error),
                    client_error: req(Ending::ClientError),
                    rejected: req(Ending::Rejected),
                    exempt: req(Ending::Exempt),
                    limits,
                    classes: [
                        class("1xx"),
                        class("2xx"),
                        class("3xx"),
                        class("4xx"),
                        class("5xx"),
                    ],
                    upstream_connect: uerr("connect"),
                    upstream_timeout: uerr("timeout"),
                    upstream_failed: uerr("failed"),
                    upstream_duration: self.upstream_duration.get_or_create_owned(&RouteLabels {
                        route: route.clone(),
                    }),
                    client_bad_body: cerr("bad_body"),
                    client_aborted: cerr("aborted"),
                    client_body_too_large: cerr("body_too_large"),
                    client_deadline: cerr("deadline"),
                    delay: self.delay.route(&route),
                };
                (r.name.clone(), metrics)
            })
            .collect()
    }

    /// Counts one reload attempt.
    pub fn reloaded(&self, ok: bool) {
        let result = if ok { "success" } else { "failure" };
        self.reloads.get_or_create(&ResultLabels { result }).inc();
    }

    /// The text exposition of every series.
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(16 * 1024);
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// `tollgate_log_lines_dropped_total`, read from the log queue at each
/// scrape (see [`crate::logs`]).
#[derive(Debug)]
struct LogLinesDropped;

impl Collector for LogLinesDropped {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let dropped = ConstCounter::new(crate::logs::dropped_lines());
        let series = encoder.encode_descriptor(
            "tollgate_log_lines_dropped",
            "Log lines (access log included) dropped because stderr did not keep up",
            None,
            dropped.metric_type(),
        )?;
        dropped.encode(series)
    }
}

#[cfg(test)]
mod tests;
