//! The record of one request: what the phases found that the rate-limit
//! headers and [`observe`](super::observe) read at the end — the limits a
//! caller met ([`CheckedLimits`]), the kind of identity it presented
//! ([`IdentityKind`]), and, when asked, what the access log carries for a
//! replay ([`Recording`]). What one phase needs from another it is handed
//! as a value instead (the decision's
//! [`Holdings`](super::decide::Holdings)); what only a replay needs is
//! the [`Rehearsal`]'s.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use http::{HeaderValue, Method, Request};

use super::gateway::Snapshot;
use crate::config::{KeySource, Limit};
use crate::decision::Decision;
use crate::http1::write::LateFields;
use crate::identity::{self, BodyFields, Caller};
use crate::limit::LimitRequest;
use crate::metrics::RouteMetrics;
use crate::problem::GatewayError;
use crate::routing::{CompiledRoute, LimitView};
use crate::telemetry::ServerSpan;
use ipnet::IpNet;

/// What the phases learnt about one request: filled as they go, read by
/// [`observe`](super::observe) and for the rate-limit headers.
#[derive(Debug)]
pub struct Exchange {
    /// The request method, for the access log.
    pub method: Method,
    /// The TCP peer.
    pub peer: SocketAddr,
    /// The route taken, once one matched.
    pub route: Option<Arc<CompiledRoute>>,
    /// That route's metric handles.
    pub metrics: Option<Arc<RouteMetrics>>,
    /// The kind of identity the caller presented.
    pub identity: IdentityKind,
    /// The limits as this caller sees them and what they decided; `None`
    /// on routes without limits, for requests refused before deciding and
    /// for exempt callers.
    pub checked: Option<CheckedLimits>,
    /// The route's `exempt:`, or an override set through the admin API,
    /// let the caller through without asking its limits.
    pub exempt: bool,
    /// What the access-log line carries for a replay (`access_log.replay`).
    pub recording: Option<Recording>,
    /// The request's id ([`crate::request_id`]), set when it arrives.
    pub request_id: Option<HeaderValue>,
    /// The request's `Origin`, kept when a CORS policy may answer it.
    pub origin: Option<HeaderValue>,
    /// The kind of gRPC call the request is, if it is one: a refusal is
    /// then answered the gRPC way.
    pub grpc: Option<crate::grpc::Kind>,
    /// The request's span, when it is traced ([`crate::telemetry`]).
    pub span: Option<Box<ServerSpan>>,
}

impl Exchange {
    /// The record of one request from `peer`, before any phase.
    pub fn new(method: Method, peer: SocketAddr) -> Self {
        Self {
            method,
            peer,
            route: None,
            metrics: None,
            identity: IdentityKind::None,
            checked: None,
            exempt: false,
            recording: None,
            request_id: None,
            origin: None,
            grpc: None,
            span: None,
        }
    }

    /// Starts the replay fields of the access-log line: the time and the
    /// target as the client sent it (routing makes it canonical again on
    /// replay).
    pub(super) fn record_for_replay<B>(&mut self, req: &Request<B>, now_ms: u64) {
        let host = req
            .uri()
            .authority()
            .map(|a| a.as_str().to_owned())
            .or_else(|| {
                let h = req.headers().get(http::header::HOST)?;
                h.to_str().ok().map(str::to_owned)
            });
        self.recording = Some(Recording {
            ts_ms: now_ms,
            host,
            path: req.uri().path().to_owned(),
            client: None,
            caller: None,
            json: None,
        });
    }

    /// The caller the decision phase found: its kind, and for a replayable
    /// access log its client IP and digest.
    #[inline]
    pub(super) fn identified(&mut self, caller: &Caller<'_>) {
        self.identity = IdentityKind::of(caller);
        if self.recording.is_some() {
            self.recorded(caller);
        }
    }

    /// [`identified`](Self::identified)'s replay fields.
    fn recorded(&mut self, caller: &Caller<'_>) {
        if let Some(r) = &mut self.recording {
            r.client = Some(caller.ip.addr());
            r.caller = caller_digest(caller);
            r.json = caller.body.and_then(json_written);
        }
    }

    pub(super) fn entered(&mut self, route: &Arc<CompiledRoute>, rt: &Snapshot) {
        self.metrics = rt.route_metrics.get(route.index).cloned().flatten();
        self.route = Some(route.clone());
    }

    /// What the limits decided, when they were asked.
    pub fn decision(&self) -> Option<&Decision> {
        self.checked.as_ref().map(|c| &c.decision)
    }
}

/// Who a caller is: for a [`Rehearsal`].
#[derive(Debug, Default)]
pub struct Identities {
    /// The strongest identity the caller presented; `None` on routes
    /// without limits.
    pub caller: Option<Strongest>,
    /// The store key of each decided limit, in limit order; empty when no
    /// limit decided. The identity is between its first `{` and last `}`
    /// ([`keys::counter_key`](crate::store::keys::counter_key)): readable
    /// text with the in-process store, a digest with Redis.
    pub keys: Vec<String>,
}

impl Identities {
    /// The caller the decision phase found.
    pub(super) fn saw(&mut self, caller: &Caller<'_>) {
        self.caller = Some(Strongest::of(caller));
    }

    /// The store key each decided limit counts the caller under.
    pub(super) fn counted_as(&mut self, requests: &[LimitRequest]) {
        self.keys.extend(requests.iter().map(|r| r.key.to_string()));
    }
}

/// A caller's strongest identity — its API key, else its user, else its
/// client IP — kept as found, so that a replay can count callers without
/// writing each one out.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Strongest {
    /// The API key.
    ApiKey(Box<[u8]>),
    /// The user.
    User(Box<[u8]>),
    /// The client IP, grouped.
    Ip(IpNet),
}

impl Strongest {
    fn of(caller: &Caller<'_>) -> Self {
        match (caller.api_key, &caller.user) {
            (Some(k), _) => Self::ApiKey(k.into()),
            (None, Some(u)) => Self::User(u.as_ref().into()),
            (None, None) => Self::Ip(caller.ip),
        }
    }

    /// The identity as a store key writes it (`key=…`, `user=…`, `ip=…`).
    pub fn text(&self) -> String {
        let empty = http::HeaderMap::new();
        let (api_key, user, source) = match self {
            Self::ApiKey(k) => (Some(&k[..]), None, KeySource::ApiKey),
            Self::User(u) => (
                None,
                Some(std::borrow::Cow::Borrowed(&u[..])),
                KeySource::User,
            ),
            Self::Ip(_) => (None, None, KeySource::Ip),
        };
        let ip = match self {
            Self::Ip(ip) => *ip,
            _ => IpNet::from(IpAddr::from([0, 0, 0, 0])),
        };
        let caller = Caller {
            ip,
            api_key,
            user,
            plan: None,
            headers: &empty,
            body: None,
        };
        let mut text = String::with_capacity(48);
        identity::write_source(&mut text, &source, &caller);
        text
    }
}

/// What the phases before `act` made of one request
/// ([`Gateway::decide_only`](super::Gateway::decide_only)).
#[derive(Debug)]
pub struct Rehearsal {
    /// What they found.
    pub exchange: Exchange,
    /// Who the caller is and what each limit counted it as.
    pub identities: Identities,
    /// The refusal that ended the request; `None` where `act` would have
    /// answered or forwarded it.
    pub refusal: Option<GatewayError>,
}

/// The fields an access-log line adds for `tollgate simulate`
/// (`access_log.replay: true`).
#[derive(Debug, Clone)]
pub struct Recording {
    /// When the request arrived, by the gateway's clock (ms since the epoch).
    pub ts_ms: u64,
    /// The authority as sent (absolute form or `Host`).
    pub host: Option<String>,
    /// The path as sent, without the query.
    pub path: String,
    /// The client IP the identity phase found (through trusted proxies;
    /// IPv6 as its group's first address); `None` on routes without limits.
    pub client: Option<IpAddr>,
    /// [`caller_digest`]: the API key's or user's, never the key itself.
    pub caller: Option<String>,
    /// The request body's fields the limits read ([`json_written`]).
    pub json: Option<String>,
}

/// The body's fields as a replayable access log records them: `name=value`,
/// comma-separated, a string (a `json:` key) as its [`identity::digest`]
/// like other identities, a count (a `reserve` read from the body) as it
/// is. `None` when there are none.
pub fn json_written(body: &BodyFields) -> Option<String> {
    let mut out = String::new();
    let texts = body.text.iter().map(|(n, v)| (n, identity::digest(v)));
    let counts = body.counts.iter().map(|(n, v)| (n, v.to_string()));
    for (name, value) in texts.chain(counts) {
        if !out.is_empty() {
            out.push(',');
        }
        out.push_str(name);
        out.push('=');
        out.push_str(&value);
    }
    (!out.is_empty()).then_some(out)
}

/// The body's fields a replayable access log recorded ([`json_written`]):
/// digests as key values, numbers as counts.
///
/// # Errors
/// A part that is neither.
pub fn json_read(text: &str) -> Result<BodyFields, String> {
    let mut body = BodyFields::default();
    for part in text.split(',') {
        let (name, value) = part
            .split_once('=')
            .ok_or_else(|| format!("json part {part:?} is not name=value"))?;
        if identity::is_digest(value) {
            body.text
                .push((name.into(), value.as_bytes().to_vec().into_boxed_slice()));
        } else {
            let n = value
                .parse()
                .map_err(|_| format!("json part {part:?} is neither a digest nor a count"))?;
            body.counts.push((name.into(), n));
        }
    }
    Ok(body)
}

/// The digest that stands for a caller's API key, or else its user, in a
/// replayable access log: [`identity::digest`] of the key or the user, as
/// the support API and `/admin/top` show them. `None` for a caller known
/// only by its IP.
pub fn caller_digest(caller: &Caller<'_>) -> Option<String> {
    match (caller.api_key, &caller.user) {
        (Some(key), _) => Some(identity::digest(key)),
        (None, Some(user)) => Some(identity::digest(user)),
        (None, None) => None,
    }
}

/// The limits one caller met on one route, and what they decided.
#[derive(Debug)]
pub struct CheckedLimits {
    pub(super) route: Arc<CompiledRoute>,
    /// The route's limits as the caller's plan expands them; `None` when
    /// no limit comes from a plan.
    pub(super) view: Option<Arc<LimitView>>,
    /// What the limits said.
    pub decision: Decision,
    /// The instant the decision was made at.
    pub now_ms: u64,
}

impl CheckedLimits {
    /// The limits decided, in order.
    pub fn limits(&self) -> &[Limit] {
        match &self.view {
            Some(v) => &v.limits,
            None => &self.route.route.limits,
        }
    }

    /// The `RateLimit-Policy` value of those limits.
    pub fn policy_header(&self) -> Option<&HeaderValue> {
        match &self.view {
            Some(v) => v.policy_header.as_ref(),
            None => self.route.policy_header.as_ref(),
        }
    }

    /// Writes the rate-limit headers of this decision into `headers`, in
    /// `mode`'s spelling.
    pub fn write_headers(&self, mode: crate::config::HeaderMode, headers: &mut http::HeaderMap) {
        crate::headers::apply(
            mode,
            headers,
            self.policy_header(),
            self.limits(),
            self.decision.allowed(),
            self.decision.outcomes(),
            self.now_ms,
        );
    }

    /// Adds the rate-limit fields of this decision to `late`, as
    /// [`write_headers`](Self::write_headers) would write them into an
    /// empty map; `false`, adding none, for a `mode` whose fields only
    /// `write_headers` writes.
    pub fn write_late(&self, mode: crate::config::HeaderMode, late: &mut LateFields) -> bool {
        crate::headers::apply_text(
            mode,
            self.policy_header(),
            self.limits(),
            self.decision.outcomes(),
            |name, value| late.push_text(name, value),
        )
    }
}

/// The strongest identity a caller presented.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdentityKind {
    /// Not asked: the route has no limits, or the request ended first.
    None,
    /// Only the client IP.
    Ip,
    /// An authenticated user.
    User,
    /// An API key.
    ApiKey,
}

impl IdentityKind {
    /// An API key, else an authenticated user, else only the client IP.
    pub fn of(caller: &Caller<'_>) -> Self {
        if caller.api_key.is_some() {
            Self::ApiKey
        } else if caller.user.is_some() {
            Self::User
        } else {
            Self::Ip
        }
    }

    /// The access-log value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Ip => "ip",
            Self::User => "user",
            Self::ApiKey => "api_key",
        }
    }
}
