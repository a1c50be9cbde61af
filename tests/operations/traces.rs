//! OpenTelemetry traces, received by an OTLP/HTTP collector inside the
//! test (a hyper server on 127.0.0.1:0 decoding the protobuf with the
//! `opentelemetry-proto` definitions): the attributes of each request's
//! span, the trace continued from a trusted proxy and passed upstream, an
//! untrusted client's sampled flag ignored, and a collector that never
//! answers holding no request.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use prost::Message as _;
use tokio::net::TcpListener;
use tokio::sync::mpsc;

use super::support::admin::{AdminGateway, value};
use super::support::gateway::{Upstream, get, send, send_from};
use super::support::wait::until;

/// One span as the collector received it.
#[derive(Debug, Clone)]
struct Received {
    service: String,
    trace_id: String,
    span_id: String,
    parent_span_id: String,
    name: String,
    kind: i32,
    attributes: HashMap<String, Value>,
}

impl Received {
    fn text(&self, key: &str) -> Option<&str> {
        match self.attributes.get(key)? {
            Value::StringValue(s) => Some(s),
            _ => None,
        }
    }

    fn int(&self, key: &str) -> Option<i64> {
        match self.attributes.get(key)? {
            Value::IntValue(i) => Some(*i),
            _ => None,
        }
    }

    fn list(&self, key: &str) -> Option<Vec<String>> {
        match self.attributes.get(key)? {
            Value::ArrayValue(a) => Some(
                a.values
                    .iter()
                    .filter_map(|v| match &v.value {
                        Some(Value::StringValue(s)) => Some(s.clone()),
                        _ => None,
                    })
                    .collect(),
            ),
            _ => None,
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// An OTLP/HTTP collector on 127.0.0.1:0: every span posted to
/// `/v1/traces` comes out of the receiver, in the order received.
async fn collector() -> (SocketAddr, mpsc::UnboundedReceiver<Received>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let tx = tx.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req: Request<Incoming>| {
                    let tx = tx.clone();
                    async move {
                        assert_eq!(req.uri().path(), "/v1/traces");
                        assert_eq!(
                            req.headers()
                                .get("content-type")
                                .and_then(|v| v.to_str().ok()),
                            Some("application/x-protobuf")
                        );
                        let body = req.into_body().collect().await.unwrap().to_bytes();
                        let export =
                            ExportTraceServiceRequest::decode(body).expect("OTLP protobuf");
                        for rs in export.resource_spans {
                            let service = rs
                                .resource
                                .iter()
                                .flat_map(|r| &r.attributes)
                                .find(|a| a.key == "service.name")
                                .and_then(|a| match a.value.as_ref()?.value.as_ref()? {
                                    Value::StringValue(s) => Some(s.clone()),
                                    _ => None,
                                })
                                .unwrap_or_default();
                            for span in rs.scope_spans.into_iter().flat_map(|s| s.spans) {
                                let _ = tx.send(Received {
                                    service: service.clone(),
                                    trace_id: hex(&span.trace_id),
                                    span_id: hex(&span.span_id),
                                    parent_span_id: hex(&span.parent_span_id),
                                    name: span.name,
                                    kind: span.kind,
                                    attributes: span
                                        .attributes
                                        .into_iter()
                                        .filter_map(|a| Some((a.key, a.value?.value?)))
                                        .collect(),
                                });
                            }
                        }
                        // An empty ExportTraceServiceResponse: full success.
                        let mut res = Response::new(Full::new(Bytes::new()));
                        res.headers_mut()
                            .insert("content-type", "application/x-protobuf".parse().unwrap());
                        Ok::<_, Infallible>(res)
                    }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    (addr, rx)
}

/// The next span the collector receives.
async fn next(spans: &mut mpsc::UnboundedReceiver<Received>) -> Received {
    tokio::time::timeout(Duration::from_secs(20), spans.recv())
        .await
        .expect("a span within 20 s")
        .expect("the collector is running")
}

const TRUSTED: &str = "127.0.0.2";

/// A `traceparent` with trace id `trace` (32 hex digits), parent span id
/// `0000000000000abc` and the sampled flag.
fn traceparent(trace: &str) -> String {
    format!("00-{trace}-0000000000000abc-01")
}

/// The trace id, parent id and flags of a `traceparent` value.
fn parts(tp: &str) -> (String, String, String) {
    let p: Vec<&str> = tp.split('-').collect();
    assert_eq!(p.len(), 4, "{tp}");
    (p[1].to_owned(), p[2].to_owned(), p[3].to_owned())
}

/// Every request is sent first and the spans read after: the exporter
/// waits up to a second to fill a batch, so they arrive together, in the
/// order the requests ended.
#[tokio::test]
async fn spans_name_the_route_outcome_limit_store_time_and_upstream_status() {
    let (otlp, mut spans) = collector().await;
    let up = Upstream::start().await;
    // Ratio 0: only a trusted proxy's sampled flag gets a request traced.
    let yaml = format!(
        r#"
listen: 127.0.0.1:0
client_ip: {{ trusted_proxies: [{TRUSTED}/32] }}
tracing: {{ otlp_endpoint: "http://{otlp}", sample_ratio: 0 }}
routes:
  - name: api
    match: {{ path_prefix: /api }}
    upstream: {up}
    limits: [ {{ name: per_ip, key: ip, limit: 1, window: 1h }} ]
  - name: trial
    match: {{ path_prefix: /trial }}
    upstream: {up}
    limits: [ {{ name: soft, key: ip, limit: 1, window: 1h, shadow: true }} ]
  - name: hello
    match: {{ path_prefix: /hello }}
    respond: {{ body: "hi" }}
"#,
        up = up.url()
    );
    let gw = AdminGateway::start(&yaml, std::sync::Arc::new(tollgate::clock::SystemClock)).await;
    let trusted: IpAddr = TRUSTED.parse().unwrap();
    let traced = |trace: &str, path: &str| get(path, &[("traceparent", &traceparent(trace))]);

    // An untrusted client's sampled flag: its trace id goes on upstream,
    // its flag does not, and no span is made (the ratio is 0).
    let outsider = "4bf92f3577b34da6a3ce929d0e0e4736";
    let r = send(gw.addr, traced(outsider, "/api/x")).await;
    assert_eq!(r.status, StatusCode::OK);
    let (trace, parent, flags) = parts(up.last().headers["traceparent"].to_str().unwrap());
    assert_eq!(trace, outsider, "the client's trace id is continued");
    assert_ne!(
        parent, "0000000000000abc",
        "the gateway's span is the parent"
    );
    assert_eq!(flags, "00", "an untrusted client cannot ask to be traced");

    // A trusted proxy's sampled flag: traced, and the upstream hears of
    // the gateway's span as its parent.
    let t1 = "11111111111111111111111111111111";
    let r = send_from(trusted, gw.addr, traced(t1, "/api/x")).await;
    assert_eq!(r.status, StatusCode::OK);
    let (trace, upstream_parent, flags) = parts(up.last().headers["traceparent"].to_str().unwrap());
    assert_eq!((trace.as_str(), flags.as_str()), (t1, "01"));
    // Refused by a limit.
    let t2 = "22222222222222222222222222222222";
    let r = send_from(trusted, gw.addr, traced(t2, "/api/x")).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    // A shadow limit: under, then over (forwarded both times).
    let (t3, t4) = ("3".repeat(32), "4".repeat(32));
    for t in [&t3, &t4] {
        let r = send_from(trusted, gw.addr, traced(t, "/trial")).await;
        assert_eq!(r.status, StatusCode::OK);
    }
    // A trusted proxy that does not sample: not traced, and its decision
    // goes upstream.
    let t5 = "55555555555555555555555555555555";
    let unsampled = format!("00-{t5}-0000000000000abc-00");
    send_from(
        trusted,
        gw.addr,
        get("/trial", &[("traceparent", &unsampled)]),
    )
    .await;
    assert_eq!(
        parts(up.last().headers["traceparent"].to_str().unwrap()).2,
        "00"
    );
    // A route without limits or upstream.
    let t6 = "66666666666666666666666666666666";
    let r = send_from(trusted, gw.addr, traced(t6, "/hello")).await;
    assert_eq!(r.status, StatusCode::OK);

    // The spans, in the order the requests ended: the outsider's and the
    // unsampled request's, had they been made, would be among them.
    let s = next(&mut spans).await;
    assert_eq!(s.trace_id, t1, "no span for the untrusted client's request");
    assert_eq!(s.service, "tollgate");
    assert_eq!(s.kind, SpanKind::Server as i32);
    assert_eq!(s.name, "GET api");
    assert_eq!(s.parent_span_id, "0000000000000abc");
    assert_eq!(s.span_id, upstream_parent);
    assert_eq!(s.text("tollgate.route"), Some("api"));
    assert_eq!(s.text("tollgate.outcome"), Some("allowed"));
    assert_eq!(s.int("http.response.status_code"), Some(200));
    assert_eq!(s.int("tollgate.upstream.status_code"), Some(200));
    assert_eq!(s.text("http.request.method"), Some("GET"));
    assert!(s.text("tollgate.request_id").is_some());
    assert_eq!(s.list("tollgate.limit"), None);
    match s.attributes.get("tollgate.store.duration_ms") {
        Some(Value::DoubleValue(ms)) => assert!(*ms >= 0.0),
        other => panic!("store time: {other:?}"),
    }

    let s = next(&mut spans).await;
    assert_eq!(s.trace_id, t2);
    assert_eq!(s.text("tollgate.outcome"), Some("limited"));
    assert_eq!(s.list("tollgate.limit"), Some(vec!["per_ip".to_owned()]));
    assert_eq!(s.int("http.response.status_code"), Some(429));
    assert_eq!(
        s.int("tollgate.upstream.status_code"),
        None,
        "nothing went upstream"
    );

    for (t, want) in [(&t3, "allowed"), (&t4, "shadow_limited")] {
        let s = next(&mut spans).await;
        assert_eq!(&s.trace_id, t);
        assert_eq!(s.text("tollgate.outcome"), Some(want));
        assert_eq!(s.int("tollgate.upstream.status_code"), Some(200));
        let shadow = (want == "shadow_limited").then(|| vec!["soft".to_owned()]);
        assert_eq!(s.list("tollgate.shadow_limit"), shadow);
    }

    let s = next(&mut spans).await;
    assert_eq!(s.trace_id, t6, "no span for the unsampled request");
    assert_eq!(s.name, "GET hello");
    assert_eq!(s.text("tollgate.outcome"), Some("none"));
    assert_eq!(s.attributes.get("tollgate.store.duration_ms"), None);
    assert_eq!(s.int("tollgate.upstream.status_code"), None);

    // Counted once the collector's answer is back, which may be after the
    // spans were seen.
    until(
        "5 spans counted as exported",
        Duration::from_secs(10),
        || async { value(&gw.scrape().await, "tollgate_trace_spans_exported_total") == Some(5.0) },
    )
    .await;
    let text = gw.scrape().await;
    assert_eq!(
        value(&text, "tollgate_trace_spans_dropped_total"),
        Some(0.0)
    );
    assert_eq!(
        value(&text, "tollgate_trace_exports_failed_total"),
        Some(0.0)
    );
}

/// Sampling everything, against a collector that accepts connections and
/// never answers: every request is answered while the first export hangs,
/// the queue fills, and what does not fit is dropped and counted. Were a
/// request to wait for the export, the loop would not finish within its
/// bound (the export waits 10 s for each batch).
#[tokio::test]
async fn a_collector_that_never_answers_holds_no_request() {
    let silent = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = silent.local_addr().unwrap();
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((stream, _)) = silent.accept().await {
            open.push(stream);
        }
    });
    let yaml = format!(
        "listen: 127.0.0.1:0\ntracing: {{ otlp_endpoint: \"http://{addr}\", sample_ratio: 1 }}\nroutes: [ {{ name: hello, respond: {{ body: hi }} }} ]\n"
    );
    let config = tollgate::config::load::parse_str(&yaml).expect("valid");
    let gw = tollgate::Gateway::new(config).await.expect("gateway");
    let peer: SocketAddr = "127.0.0.1:40000".parse().unwrap();
    let queue = tollgate::telemetry::QUEUE;
    let n = queue + 1000;
    let all = async {
        for _ in 0..n {
            let res = gw.handle(get("/", &[]), peer).await;
            assert_eq!(res.status(), StatusCode::OK);
        }
    };
    tokio::time::timeout(Duration::from_secs(60), all)
        .await
        .expect("every request answered while the collector is silent");
    let text = gw.metrics().render();
    let dropped = value(&text, "tollgate_trace_spans_dropped_total").unwrap();
    // At most the queue and one batch in the hanging export were kept.
    assert!(
        dropped >= (n - queue - 512) as f64,
        "dropped {dropped} of {n}"
    );
    assert_eq!(
        value(&text, "tollgate_trace_spans_exported_total"),
        Some(0.0)
    );
    held.abort();
}

/// A cost read from the response body: the span ends with the body and
/// carries what it settled, as the access-log line does.
#[tokio::test]
async fn a_cost_read_from_the_body_is_on_the_span() {
    let (otlp, mut spans) = collector().await;
    let up = Upstream::start().await;
    let yaml = format!(
        r#"
listen: 127.0.0.1:0
tracing: {{ otlp_endpoint: "http://{otlp}", sample_ratio: 1 }}
routes:
  - name: chat
    match: {{ path_prefix: /usage }}
    upstream: {up}
    limits:
      - {{ name: tpm, key: ip, limit: 1000, window: 1h, algorithm: fixed_window,
           cost: {{ reserve: 100, from_body: openai }} }}
"#,
        up = up.url()
    );
    let gw = AdminGateway::start(&yaml, std::sync::Arc::new(tollgate::clock::SystemClock)).await;
    let r = send(gw.addr, get("/usage?used=42", &[])).await;
    assert_eq!(r.status, StatusCode::OK);
    let s = next(&mut spans).await;
    assert_eq!(s.text("tollgate.route"), Some("chat"));
    assert_eq!(s.text("tollgate.settled"), Some("tpm:42"));
}
