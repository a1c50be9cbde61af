//! The last phase: count the request and write its access-log line, from
//! what the other phases left in the [`Exchange`] and how the request
//! ended. Outcomes are derived here, in one place, rather than set by the
//! phases as they go.
//!
//! The access log is one `tracing` event per request, target
//! `tollgate::access`, written when the response head is ready. Fields:
//! `route` (or `-` when none matched), `method`, `status`, `identity` — the
//! *kind* of identity the caller presented ([`IdentityKind`]), never its
//! value —, `decision` ([`Outcome::word`]), `latency_ms` (to the response
//! head; a streamed body may take longer) and `request_id` (the id the
//! response carries, [`crate::request_id`]); for routes to a pool also
//! `upstream` (the target that answered, as written), `upstream_addr` and
//! `tries`. The request path is left out on
//! purpose: paths carry tokens and user ids often enough. `main` renders
//! the events as text or JSON (`--log-format`); `RUST_LOG` filters them
//! like any other target (`tollgate::access=off` silences them).
//!
//! A request with a cost read from its response body (`from_body`) has
//! its line written when that body ends, not with the head, and with one
//! more field: `settled`, the amounts read (`tpm:1234`, comma-separated;
//! `-` when none was, and the reservations stand).
//!
//! With `access_log.replay: true` a line also carries what `tollgate
//! simulate` replays it from ([`Recording`](super::exchange::Recording)):
//! `ts` (ms), `peer` and `client` (IPs), `host`, `path` (without the
//! query), `caller` (a digest of the API key or user) and `json` (the
//! request body's fields its limits read: `model=<digest>` for a key,
//! `max_tokens=1000` for a reservation).

use std::time::Instant;

use http::Response;
use tracing::{debug, warn};

use super::exchange::Exchange;
use super::settle::LateLine;
use crate::decision::{Decision, Unanswered};
use crate::logs::{AccessWriter, Event};
use crate::metrics::{Access, ClientErrorKind, Ending, Metrics, Outcome, UpstreamErrorKind};
use crate::problem::GatewayError;
use crate::proxy::Body;
use crate::{access_event, access_key};

/// Whose fault a failed forward was, and its metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForwardFault {
    /// The upstream's: `outcome="error"`, `tollgate_upstream_errors_total`,
    /// logged at WARN (someone may need to look at the upstream).
    Upstream(UpstreamErrorKind),
    /// The client's request body: `outcome="client_error"`,
    /// `tollgate_client_errors_total`, logged at DEBUG (any client can
    /// cause it, so it must not page anyone).
    Client(ClientErrorKind),
}

/// Whose fault the error `e` is when a forward ends with it; `None` for the
/// refusals made before anything is forwarded.
pub fn forward_fault(e: &GatewayError) -> Option<ForwardFault> {
    use ForwardFault::{Client, Upstream};
    match e {
        GatewayError::UpstreamConnect(_) => Some(Upstream(UpstreamErrorKind::Connect)),
        GatewayError::UpstreamTimeout(_) => Some(Upstream(UpstreamErrorKind::Timeout)),
        GatewayError::UpstreamFailed(_) => Some(Upstream(UpstreamErrorKind::Failed)),
        GatewayError::BadRequestBody(_) => Some(Client(ClientErrorKind::BadBody)),
        GatewayError::ClientAborted(_) => Some(Client(ClientErrorKind::Aborted)),
        // After routing, only a streamed body past the cap ends so (an
        // announced one is refused by the guard, before routing).
        GatewayError::PayloadTooLarge(_) => Some(Client(ClientErrorKind::BodyTooLarge)),
        // The deadline is the caller's choice, however short.
        GatewayError::DeadlineExceeded(_) => Some(Client(ClientErrorKind::Deadline)),
        GatewayError::NoRoute { .. }
        | GatewayError::Limited { .. }
        | GatewayError::StoreUnavailable
        | GatewayError::UnknownApiKey
        | GatewayError::BadRequest(_)
        | GatewayError::BadTarget(_)
        | GatewayError::HeaderTooLarge { .. }
        | GatewayError::UriTooLong { .. } => None,
    }
}

/// How a request ended: the response the phases built, or their refusal.
pub type Reply = Result<Response<Body>, GatewayError>;

/// What the request came to: how it ended with `answer`, and what its
/// limits decided (`decided`; none asked when `exempt`). The one place
/// both are worked out.
fn outcome(answer: &Reply, decided: Option<&Decision>, exempt: bool) -> Outcome {
    let ending = match answer {
        Ok(_) if exempt => Ending::Exempt,
        Ok(_) if decided.is_some_and(Decision::shadow_denied) => Ending::ShadowLimited,
        Ok(_) => Ending::Allowed,
        Err(GatewayError::Limited { .. }) => Ending::Limited,
        Err(GatewayError::UnknownApiKey) => Ending::Rejected,
        Err(e) => match forward_fault(e) {
            Some(ForwardFault::Client(_)) => Ending::ClientError,
            Some(ForwardFault::Upstream(_)) | None => Ending::Error,
        },
    };
    let access = match (answer, decided) {
        (_, None) if exempt => Access::Exempt,
        (Err(GatewayError::StoreUnavailable), _) => Access::Unavailable,
        (_, None) => Access::None,
        (_, Some(Decision::Undecided(Unanswered::FailedOpen))) => Access::FailedOpen,
        (_, Some(Decision::Undecided(Unanswered::Unavailable))) => Access::Unavailable,
        (_, Some(d)) if !d.allowed() => Access::Limited,
        (_, Some(d)) if d.shadow_denied() => Access::ShadowLimited,
        (_, Some(Decision::Decided(_))) => Access::Allowed,
    };
    Outcome { ending, access }
}

/// The access log's event, of target `tollgate::access`:
/// `RUST_LOG=info,tollgate::access=off` turns it off like any other.
const ACCESS: Event = access_event!("tollgate::access", "request");

/// The start of a request, when its access-log line will be written: the
/// gateway has an access log and `RUST_LOG` lets it through (it is often
/// filtered out, `RUST_LOG=warn`; then no clock is read).
pub fn started(access_log: Option<&AccessWriter>) -> Option<Instant> {
    logging(access_log).then(Instant::now)
}

/// Which target of a pool answered, and after how many tries: a response
/// extension the access log reads.
#[derive(Debug, Clone)]
pub struct PoolAnswer {
    /// Tries made, the answering one included.
    pub tries: u32,
    /// The answering target, as written.
    pub target: std::sync::Arc<str>,
    /// The address it was reached at (`None` for https targets).
    pub addr: Option<std::net::SocketAddr>,
}

/// Whether access-log lines are written now (an access log, and
/// `RUST_LOG` lets them through): what the forward records only for the
/// line is skipped otherwise.
pub fn logging(access_log: Option<&AccessWriter>) -> bool {
    access_log.is_some() && tracing::enabled!(target: "tollgate::access", tracing::Level::INFO)
}

/// Counts the request, logs a failed forward by whose fault it was,
/// writes the access-log line, and ends the request's span when it is
/// traced.
pub fn record(
    ex: &mut Exchange,
    answer: &Reply,
    metrics: &Metrics,
    access_log: Option<&AccessWriter>,
    started: Option<Instant>,
) {
    let outcome = outcome(answer, ex.decision(), ex.exempt);
    let route = ex.route.as_ref().map(|r| &*r.route.name);
    match &ex.metrics {
        Some(m) => m.count(outcome),
        None => {
            metrics.unmatched.inc();
        }
    }
    if let Err(e) = answer {
        match forward_fault(e) {
            Some(ForwardFault::Upstream(kind)) => {
                warn!(route = route.unwrap_or("-"), error = %e, "upstream error");
                if let Some(m) = &ex.metrics {
                    m.upstream_error(kind);
                }
            }
            Some(ForwardFault::Client(kind)) => {
                debug!(route = route.unwrap_or("-"), error = %e, "client error while forwarding");
                if let Some(m) = &ex.metrics {
                    m.client_error(kind);
                }
            }
            None => {}
        }
    }
    if let (Some(started), Some(log)) = (started, access_log) {
        let status = match answer {
            Ok(res) => res.status(),
            Err(e) => e.status(),
        };
        let ok = answer.as_ref().ok();
        // A cost read from the response body: the line waits for its end.
        let late = ok.and_then(|r| r.extensions().get::<LateLine>());
        // One clock reading ends the latency and stamps the line.
        let now = Instant::now();
        let mut line = log
            .line(ACCESS, now)
            .str(access_key!("route"), route.unwrap_or("-"))
            .str(access_key!("method"), ex.method.as_str())
            .u64(access_key!("status"), u64::from(status.as_u16()))
            .str(access_key!("identity"), ex.identity.as_str())
            .str(access_key!("decision"), outcome.word())
            // Microsecond resolution is plenty for a log line.
            .micros_as_ms(
                access_key!("latency_ms"),
                now.saturating_duration_since(started).as_micros() as u64,
            )
            .opt_str(
                access_key!("request_id"),
                ex.request_id.as_ref().and_then(|v| v.to_str().ok()),
            );
        // Only for routes to a pool: the target that answered and how
        // many tries it took (a retried request is one line).
        if let Some(tried) = ok.and_then(|r| r.extensions().get::<PoolAnswer>()) {
            line = line
                .str(access_key!("upstream"), &tried.target)
                .u64(access_key!("tries"), u64::from(tried.tries));
            if let Some(addr) = tried.addr {
                line = line.addr(access_key!("upstream_addr"), addr);
            }
        }
        // Absent unless `access_log.replay` is on.
        if let Some(r) = &ex.recording {
            line = line
                .u64(access_key!("ts"), r.ts_ms)
                .ip(access_key!("peer"), ex.peer.ip())
                .opt_ip(access_key!("client"), r.client)
                .opt_str(access_key!("host"), r.host.as_deref())
                .str(access_key!("path"), &r.path)
                .opt_str(access_key!("caller"), r.caller.as_deref())
                .opt_str(access_key!("json"), r.json.as_deref());
        }
        match late {
            Some(late) => late.line(line.hold()),
            None => line.write(),
        }
    }
    // Inlined: with tracing off, a check and no call.
    if let Some(span) = ex.span.take() {
        super::traces::end(*span, ex, answer, outcome.word());
    }
}
