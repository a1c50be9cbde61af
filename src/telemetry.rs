//! OpenTelemetry traces: one server span per request, sent to a collector
//! over OTLP/HTTP (protobuf), and W3C Trace Context passed upstream.
//!
//! When a request arrives, [`Tracer::begin`] reads its `traceparent` (the
//! SDK's `TraceContextPropagator`), keeps its trace id, and writes a new
//! `traceparent` in its place naming the gateway's span as the parent, so
//! the upstream's spans hang under the gateway's. Whether the request is
//! traced is decided here, once:
//!
//! - a peer in `client_ip.trusted_proxies` that sent a valid `traceparent`
//!   decides: its sampled flag is kept (a mesh or an edge proxy that traces
//!   a request gets it traced through the gateway, and one that does not,
//!   does not);
//! - anyone else is sampled at `sample_ratio`, by a draw of the gateway's
//!   own. A client's sampled flag is ignored, and so is its trace id for
//!   the draw: OpenTelemetry's ratio sampler reads the trace id's low
//!   bits, which a client picks, so deciding on them would let the
//!   internet choose to be traced. The trace id itself is still continued.
//!
//! The flag the upstream receives is that decision. A request that is not
//! traced costs an id and a header; a traced one keeps a [`ServerSpan`] in
//! the request's record, and [`ServerSpan::end`] turns it into the span's
//! data once the response head is known.
//!
//! Export never waits on the request path: finished spans go into a bounded
//! queue ([`QUEUE`] spans) with `try_send`, and when it is full the span is
//! dropped and counted (`tollgate_trace_spans_dropped_total`). A thread of
//! its own (`tollgate-otlp`, with a one-thread runtime) takes spans off the
//! queue in batches (up to 512, or what came within a second of the
//! first) and posts them with the `opentelemetry-otlp` exporter,
//! so a slow, silent or unreachable collector only ever fills that queue.
//! The exporter posts through `hyper-util`'s client (the one the proxy
//! uses, through `opentelemetry-http`'s `HyperClient`), with the gateway's
//! rustls settings for `https://` collectors, rather than a second HTTP
//! stack.
//!
//! With tracing off the gateway holds no [`Tracer`], and a request pays one
//! `Option` check to learn it.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http::{HeaderMap, HeaderName, HeaderValue};
use opentelemetry::propagation::Extractor;
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{
    SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceFlags, TraceId, TraceState,
};
use opentelemetry::{Array, Context, InstrumentationScope, KeyValue, StringValue, Value};
#[cfg(feature = "gateway")]
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
#[cfg(feature = "gateway")]
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
#[cfg(feature = "gateway")]
use opentelemetry_sdk::trace::SpanExporter as _;
use opentelemetry_sdk::trace::{
    IdGenerator, RandomIdGenerator, Sampler, SamplingDecision, ShouldSample, SpanData, SpanEvents,
    SpanLinks,
};
use tokio::sync::mpsc;
#[cfg(feature = "gateway")]
use tracing::{info, warn};

use crate::config::TracingConfig;
use crate::metrics::spans::SpanMetrics;

/// Spans that wait for export at most; past it they are dropped and
/// counted. OpenTelemetry's batch processor holds as many by default.
pub const QUEUE: usize = 2048;

/// Spans posted in one export at most (OpenTelemetry's default batch).
#[cfg(feature = "gateway")]
const BATCH: usize = 512;

/// How long a batch waits for more spans after its first, unless it fills
/// first: a busy gateway posts full batches, a quiet one at most one
/// batch a second. Posting each span alone would cost an HTTP request per
/// traced request. (OpenTelemetry's batch processor waits up to 5 s.)
#[cfg(feature = "gateway")]
const LINGER: Duration = Duration::from_secs(1);

/// How long one export may take, retries included, before its spans are
/// given up (OpenTelemetry's default OTLP timeout).
#[cfg(feature = "gateway")]
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long connecting to the collector may take.
#[cfg(feature = "gateway")]
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// The W3C Trace Context header.
pub const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");

/// Why tracing cannot start.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// The exporter refused its settings.
    #[error("OTLP exporter: {0}")]
    Exporter(String),
    /// The rustls settings for `https://` collectors.
    #[error(transparent)]
    Tls(#[from] crate::tls::TlsError),
    /// The export thread or its runtime could not start.
    #[error("OTLP export thread: {0}")]
    Thread(#[from] std::io::Error),
}

/// Decides which requests are traced, and queues their spans for export.
pub struct Tracer {
    ratio: Sampler,
    ids: RandomIdGenerator,
    queue: mpsc::Sender<SpanData>,
    dropped: prometheus_client::metrics::counter::Counter,
    scope: InstrumentationScope,
}

impl std::fmt::Debug for Tracer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tracer")
            .field("ratio", &self.ratio)
            .finish_non_exhaustive()
    }
}

/// The span of one traced request, from its arrival to its response head.
#[derive(Debug)]
pub struct ServerSpan {
    /// Where the span goes when it ends.
    tracer: Arc<Tracer>,
    context: SpanContext,
    /// The span of the peer that sent `traceparent`, if one did.
    parent: SpanId,
    started: SystemTime,
    /// Time the limits took to decide, store calls included; `None` when
    /// no limit was asked.
    pub store_time: Option<Duration>,
}

/// How a traced request ended: what its span says.
#[derive(Debug)]
pub struct Ended<'a> {
    /// The request method.
    pub method: &'a str,
    /// The route taken, if one matched.
    pub route: Option<&'a str>,
    /// The status answered to the client.
    pub status: u16,
    /// What the limits said, as the access log names it.
    pub outcome: &'static str,
    /// The enforced limits that refused the request.
    pub refused_by: Vec<&'a str>,
    /// The shadow limits that would have refused it.
    pub shadow_refused_by: Vec<&'a str>,
    /// The upstream's status, when the request was forwarded and answered.
    pub upstream_status: Option<u16>,
    /// The request's id.
    pub request_id: Option<&'a str>,
    /// The costs its response body settled (`tpm:1234`, `-` when none was
    /// read), for a cost read from the body; the span then ends with the
    /// body.
    pub settled: Option<&'a str>,
}

impl Tracer {
    /// Builds the exporter for `config` and starts its thread; the spans'
    /// fate is counted in `metrics`.
    ///
    /// # Errors
    /// The exporter, its TLS settings or its thread cannot be set up.
    #[cfg(feature = "gateway")]
    pub fn start(config: &TracingConfig, metrics: SpanMetrics) -> Result<Self, TelemetryError> {
        let mut exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(config.endpoint.to_string())
            .with_timeout(EXPORT_TIMEOUT)
            .with_http_client(http_client()?)
            .build()
            .map_err(|e| TelemetryError::Exporter(e.to_string()))?;
        exporter.set_resource(&resource());
        let (queue, spans) = mpsc::channel(QUEUE);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let endpoint = config.endpoint.to_string();
        let counted = metrics.clone();
        std::thread::Builder::new()
            .name("tollgate-otlp".into())
            .spawn(move || runtime.block_on(export(spans, exporter, counted, endpoint)))?;
        Ok(Self {
            ratio: Sampler::TraceIdRatioBased(config.sample_ratio),
            ids: RandomIdGenerator::default(),
            queue,
            dropped: metrics.dropped,
            scope: InstrumentationScope::builder("tollgate")
                .with_version(env!("CARGO_PKG_VERSION"))
                .build(),
        })
    }

    /// Without the `gateway` feature nothing exports spans: tracing is
    /// refused at start.
    ///
    /// # Errors
    /// Always ([`TelemetryError::Exporter`]).
    #[cfg(not(feature = "gateway"))]
    pub fn start(_: &TracingConfig, _: SpanMetrics) -> Result<Self, TelemetryError> {
        Err(TelemetryError::Exporter(
            "this build exports no spans (the `gateway` feature is off)".into(),
        ))
    }

    /// A request arrives from a peer that `trusted` says is a trusted
    /// proxy: decides whether it is traced, and puts the `traceparent` the
    /// upstream is to receive in `headers`. Returns the request's span when
    /// it is traced.
    pub fn begin(
        self: &Arc<Self>,
        headers: &mut HeaderMap,
        trusted: bool,
    ) -> Option<Box<ServerSpan>> {
        let sent = headers.contains_key(TRACEPARENT).then(|| {
            let cx = TraceContextPropagator::new()
                .extract_with_context(&Context::new(), &Carrier(headers));
            cx.span().span_context().clone()
        });
        let (trace_id, parent_id, state, sampled) = match sent.filter(SpanContext::is_valid) {
            Some(p) => {
                let sampled = if trusted {
                    p.is_sampled()
                } else {
                    self.draw(self.ids.new_trace_id())
                };
                (p.trace_id(), p.span_id(), p.trace_state().clone(), sampled)
            }
            // A new trace: its id is the gateway's own draw.
            None => {
                let id = self.ids.new_trace_id();
                (id, SpanId::INVALID, TraceState::NONE, self.draw(id))
            }
        };
        let span_id = self.ids.new_span_id();
        let flags = if sampled {
            TraceFlags::SAMPLED
        } else {
            TraceFlags::default()
        };
        headers.insert(TRACEPARENT, traceparent(trace_id, span_id, flags));
        sampled.then(|| {
            Box::new(ServerSpan {
                tracer: Arc::clone(self),
                context: SpanContext::new(trace_id, span_id, flags, false, state),
                parent: parent_id,
                started: SystemTime::now(),
                store_time: None,
            })
        })
    }

    /// The ratio sampler's answer for `id`, a trace id the gateway drew:
    /// a draw the client cannot steer.
    fn draw(&self, id: TraceId) -> bool {
        let result = self
            .ratio
            .should_sample(None, id, "", &SpanKind::Server, &[], &[]);
        result.decision == SamplingDecision::RecordAndSample
    }
}

impl ServerSpan {
    /// Ends the span as `ended` says and queues it for export; a full
    /// queue drops it and counts the drop.
    pub fn end(self, ended: &Ended<'_>) {
        let ServerSpan {
            tracer,
            context,
            parent,
            started,
            store_time,
        } = self;
        let mut attributes = Vec::with_capacity(10);
        attributes.push(KeyValue::new(
            "http.request.method",
            ended.method.to_owned(),
        ));
        if let Some(route) = ended.route {
            attributes.push(KeyValue::new("tollgate.route", route.to_owned()));
        }
        attributes.push(KeyValue::new(
            "http.response.status_code",
            i64::from(ended.status),
        ));
        attributes.push(KeyValue::new("tollgate.outcome", ended.outcome));
        if !ended.refused_by.is_empty() {
            attributes.push(KeyValue::new("tollgate.limit", names(&ended.refused_by)));
        }
        if !ended.shadow_refused_by.is_empty() {
            attributes.push(KeyValue::new(
                "tollgate.shadow_limit",
                names(&ended.shadow_refused_by),
            ));
        }
        if let Some(t) = store_time {
            attributes.push(KeyValue::new(
                "tollgate.store.duration_ms",
                t.as_secs_f64() * 1000.0,
            ));
        }
        if let Some(s) = ended.upstream_status {
            attributes.push(KeyValue::new("tollgate.upstream.status_code", i64::from(s)));
        }
        if let Some(id) = ended.request_id {
            attributes.push(KeyValue::new("tollgate.request_id", id.to_owned()));
        }
        if let Some(settled) = ended.settled {
            attributes.push(KeyValue::new("tollgate.settled", settled.to_owned()));
        }
        // OpenTelemetry's HTTP conventions: `{method} {route}`, and a
        // server span is an error only for a 5xx.
        let name = match ended.route {
            Some(r) => format!("{} {r}", ended.method),
            None => ended.method.to_owned(),
        };
        let status = if ended.status >= 500 {
            Status::error("")
        } else {
            Status::Unset
        };
        let data = SpanData {
            span_context: context,
            parent_span_id: parent,
            parent_span_is_remote: parent != SpanId::INVALID,
            span_kind: SpanKind::Server,
            name: Cow::Owned(name),
            start_time: started,
            end_time: SystemTime::now(),
            attributes,
            dropped_attributes_count: 0,
            events: SpanEvents::default(),
            links: SpanLinks::default(),
            status,
            instrumentation_scope: tracer.scope.clone(),
        };
        if tracer.queue.try_send(data).is_err() {
            tracer.dropped.inc();
        }
    }
}

/// `00-<trace id>-<span id>-<flags>` (W3C Trace Context, version 00), in
/// lower-case hex. Written byte by byte: every request of a traced
/// gateway pays for it, and `fmt`'s padded hex of a `u128` costs several
/// times as much.
fn traceparent(trace_id: TraceId, span_id: SpanId, flags: TraceFlags) -> HeaderValue {
    let mut out = *b"00-00000000000000000000000000000000-0000000000000000-00";
    hex_into(&mut out[3..35], &trace_id.to_bytes());
    hex_into(&mut out[36..52], &span_id.to_bytes());
    hex_into(&mut out[53..55], &[flags.to_u8()]);
    // Only hex digits and dashes: always a valid header value.
    HeaderValue::from_bytes(&out).unwrap_or_else(|_| HeaderValue::from_static("00"))
}

/// `bytes` in lower-case hex into `out`, two digits a byte.
fn hex_into(out: &mut [u8], bytes: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for (pair, b) in out.chunks_exact_mut(2).zip(bytes) {
        pair[0] = HEX[usize::from(b >> 4)];
        pair[1] = HEX[usize::from(b & 0xf)];
    }
}

fn names(names: &[&str]) -> Value {
    let list: Vec<StringValue> = names.iter().map(|n| (*n).to_owned().into()).collect();
    Value::Array(Array::String(list))
}

/// `service.name` is `tollgate` unless `OTEL_SERVICE_NAME` names another
/// (the SDK reads it, and `OTEL_RESOURCE_ATTRIBUTES`, when it builds the
/// resource).
#[cfg(feature = "gateway")]
fn resource() -> Resource {
    let builder = Resource::builder();
    if std::env::var_os("OTEL_SERVICE_NAME").is_some() {
        builder.build()
    } else {
        builder.with_service_name("tollgate").build()
    }
}

/// A request's headers, read for its trace context.
struct Carrier<'a>(&'a HeaderMap);

impl Extractor for Carrier<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(HeaderName::as_str).collect()
    }
}

/// The collector's HTTP client: `hyper-util`'s, over the gateway's rustls
/// settings (the Mozilla roots), for `http://` and `https://` alike.
#[cfg(feature = "gateway")]
fn http_client() -> Result<opentelemetry_http::hyper::HyperClient<Connector>, TelemetryError> {
    let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
    http.set_connect_timeout(Some(CONNECT_TIMEOUT));
    http.set_nodelay(true);
    http.enforce_http(false);
    let tls = crate::tls::client_config(None)?;
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(Arc::unwrap_or_clone(tls))
        .https_or_http()
        .enable_http1()
        .wrap_connector(http);
    Ok(opentelemetry_http::hyper::HyperClient::new(
        connector,
        EXPORT_TIMEOUT,
        None,
    ))
}

#[cfg(feature = "gateway")]
type Connector = hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>;

/// The export thread's loop: a batch ([`BATCH`] spans, or what came
/// within [`LINGER`] of its first), posted, counted; until every
/// [`Tracer`] is gone and the queue is empty. A failing collector is
/// logged when it starts failing and when it recovers, not at every batch.
#[cfg(feature = "gateway")]
async fn export(
    mut spans: mpsc::Receiver<SpanData>,
    exporter: opentelemetry_otlp::SpanExporter,
    metrics: SpanMetrics,
    endpoint: String,
) {
    let mut failing = false;
    let mut batch = Vec::with_capacity(BATCH);
    while spans.recv_many(&mut batch, BATCH).await > 0 {
        let until = tokio::time::Instant::now() + LINGER;
        while batch.len() < BATCH {
            let room = BATCH - batch.len();
            match tokio::time::timeout_at(until, spans.recv_many(&mut batch, room)).await {
                Ok(n) if n > 0 => {}
                // Every tracer is gone, or the batch has waited long enough.
                Ok(_) | Err(_) => break,
            }
        }
        let n = batch.len() as u64;
        match exporter.export(std::mem::take(&mut batch)).await {
            Ok(()) => {
                metrics.exported.inc_by(n);
                if failing {
                    failing = false;
                    info!(collector = %endpoint, "span export recovered");
                }
            }
            Err(e) => {
                metrics.failed_exports.inc();
                metrics.dropped.inc_by(n);
                if !failing {
                    failing = true;
                    warn!(collector = %endpoint, error = %e, "span export failed; spans are dropped until the collector answers");
                }
            }
        }
        batch.reserve(BATCH);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tracer(sample_ratio: f64) -> Arc<Tracer> {
        let config = TracingConfig {
            // Nothing is exported in these tests.
            endpoint: "http://127.0.0.1:9/v1/traces".parse().unwrap(),
            sample_ratio,
        };
        Arc::new(Tracer::start(&config, SpanMetrics::default()).expect("tracer"))
    }

    fn with_parent(tp: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(TRACEPARENT, HeaderValue::from_str(tp).unwrap());
        h
    }

    /// A trace id whose low bits OpenTelemetry's ratio sampler admits at
    /// any ratio above 0: a client cannot use it to be traced.
    const STEERING: &str = "00-ffffffffffffffff0000000000000000-00000000000000aa-01";

    #[test]
    fn an_untrusted_client_neither_decides_nor_steers_the_draw() {
        let t = tracer(0.5);
        let traced = (0..200)
            .filter(|_| {
                let mut h = with_parent(STEERING);
                t.begin(&mut h, false).is_some()
            })
            .count();
        // Each is a fair coin: 200 heads (or tails) would be 2^-200.
        assert!(0 < traced && traced < 200, "{traced} of 200 traced");
    }

    #[test]
    fn traceparent_is_written_as_the_w3c_format() {
        let v = traceparent(
            TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap(),
            SpanId::from_hex("00f067aa0ba902b7").unwrap(),
            TraceFlags::SAMPLED,
        );
        assert_eq!(v, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
        let v = traceparent(TraceId::from(1), SpanId::from(2), TraceFlags::default());
        assert_eq!(v, "00-00000000000000000000000000000001-0000000000000002-00");
    }

    #[test]
    fn a_trusted_proxy_decides_and_the_trace_goes_on() {
        let t = tracer(0.0);
        let mut h = with_parent(STEERING);
        let span = t
            .begin(&mut h, true)
            .expect("a trusted sampled parent is traced");
        let sent = h[TRACEPARENT].to_str().unwrap().to_owned();
        assert_eq!(
            sent,
            format!(
                "00-ffffffffffffffff0000000000000000-{}-01",
                span.context.span_id()
            )
        );
        assert_eq!(span.parent, SpanId::from_hex("00000000000000aa").unwrap());
        let mut h = with_parent("00-ffffffffffffffff0000000000000000-00000000000000aa-00");
        assert!(t.begin(&mut h, true).is_none());
        assert!(h[TRACEPARENT].to_str().unwrap().ends_with("-00"));
        // No parent, or a malformed one: a new trace, at the ratio (0).
        for mut h in [HeaderMap::new(), with_parent("00-zz-01")] {
            assert!(t.begin(&mut h, true).is_none());
            let sent = h[TRACEPARENT].to_str().unwrap();
            assert_eq!((sent.len(), &sent[53..]), (55, "00"), "{sent}");
            assert!(!sent.contains("ffffffffffffffff0000000000000000"));
        }
    }
}
