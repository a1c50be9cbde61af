//! The series of tracing's export: spans sent to the collector, spans
//! dropped because the export queue was full, and exports that failed.
//! They stay at zero while tracing is off.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;

/// The counters of the span export ([`crate::telemetry`]); clones share
/// the same values.
#[derive(Debug, Clone, Default)]
pub struct SpanMetrics {
    /// Spans the collector accepted.
    pub exported: Counter,
    /// Spans dropped before export: the queue was full, or an export of
    /// them failed.
    pub dropped: Counter,
    /// Exports (batches) that failed.
    pub failed_exports: Counter,
}

impl SpanMetrics {
    /// Registers the counters in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "tollgate_trace_spans_exported",
            "Spans sent to the OTLP collector and accepted",
            m.exported.clone(),
        );
        registry.register(
            "tollgate_trace_spans_dropped",
            "Spans dropped: the export queue was full (the collector is slow or away) or their export failed",
            m.dropped.clone(),
        );
        registry.register(
            "tollgate_trace_exports_failed",
            "Batches of spans the collector did not accept",
            m.failed_exports.clone(),
        );
        m
    }
}
