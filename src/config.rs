//! Configuration: the validated model the running gateway uses.
//!
//! Loading is two-staged (as in sozu and River): [`file`](mod@file) holds serde
//! structs that mirror the YAML, [`load`] turns them into the types below and
//! collects *every* error with its field path, line and column before
//! failing. The running gateway never sees raw YAML types.

mod cors;
pub mod expand;
pub mod file;
mod header_rules;
pub mod load;
mod position;
mod request_id;
pub mod schema;
mod server;
mod store;

pub use cors::{Cors, CorsOrigins};
pub use header_rules::HeaderRules;
pub use request_id::{KeepFrom, RequestIdConfig};
pub use server::{Http1, ServerSettings};
pub use store::{
    BreakerConfig, ClockSource, OnError, RedisConfig, RedisTls, RedisTopology, StoreConfig,
    without_credentials,
};

use std::net::SocketAddr;
use std::num::NonZeroU64;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, Method, StatusCode, Uri};
use ipnet::IpNet;

/// A whole, validated gateway configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Addresses the proxy listens on, each optionally with TLS.
    pub listen: Vec<Listen>,
    /// Admin listener (`/metrics`, `/healthz`, `/readyz`, `/admin/top`); none when absent.
    pub admin: Option<SocketAddr>,
    /// The bearer token `/admin/callers` and `/admin/overrides` ask for
    /// (`admin.token` or `admin.token_file`, read at every load); without
    /// one they answer 403.
    pub admin_token: Option<Arc<str>>,
    /// The folder of `simulate`'s HTML reports the console lists and
    /// opens (`admin.replays`); none when absent.
    pub admin_replays: Option<std::path::PathBuf>,
    /// Where limiter state lives and what to do when it is unreachable.
    pub store: StoreConfig,
    /// How the client IP is read.
    pub client_ip: ClientIpConfig,
    /// Which rate-limit header set responses carry.
    pub headers: HeaderMode,
    /// Pricing tiers: named sets of limits, chosen per API key.
    pub plans: Vec<Plan>,
    /// Where API keys are read from and which plan each has.
    pub api_keys: ApiKeyConfig,
    /// What names a caller's plan (`plans_from`, default the API key).
    pub plans_from: PlansFrom,
    /// Where the authenticated user is read from.
    pub users: UserConfig,
    /// Timeouts shared by every route.
    pub timeouts: Timeouts,
    /// Named pools of upstream targets (`upstreams:`), in name order.
    pub upstreams: Vec<Arc<UpstreamPool>>,
    /// Routes, in match order (the first match wins).
    pub routes: Vec<Route>,
    /// `limits:` at the top level: what an application's
    /// [`RateLimitLayer`](crate::layer::RateLimitLayer) applies to every
    /// request; empty in a gateway's file (the loader refuses them there).
    pub limits: Vec<Limit>,
    /// Caps on connections, header and body sizes.
    pub server: ServerSettings,
    /// What the access log writes beyond its usual fields.
    pub access_log: AccessLog,
    /// OpenTelemetry traces: where spans go and how many requests are
    /// traced; `None` when tracing is off.
    pub tracing: Option<TracingConfig>,
    /// Where each request's id is read from and sent in, and whose ids are kept.
    pub request_id: RequestIdConfig,
    /// `cors:` at the top level: the policy of responses no route took
    /// (routes have theirs resolved into [`Route::cors`]).
    pub cors: Option<Arc<Cors>>,
    /// `response_headers:` at the top level: the rules of responses no
    /// route took (routes have theirs resolved into
    /// [`Route::response_headers`]).
    pub response_headers: Option<Arc<HeaderRules>>,
    /// `exempt:` at the top level, the default of routes without their own
    /// (resolved into [`Route::exempt`]).
    pub exempt: Option<Arc<Exempt>>,
}

/// `exempt:` — callers whose requests are forwarded without being counted
/// by any limit of the route (`outcome="exempt"`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Exempt {
    /// Client addresses, matched against the client IP as resolved through
    /// `client_ip.trusted_proxies` (never a trusted proxy's own address
    /// standing in for the clients behind it), before IPv6 grouping.
    pub ips: Vec<IpNet>,
    /// API keys, as the caller sends them.
    pub api_keys: Vec<Box<[u8]>>,
}

/// `access_log:` — what each access-log line carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AccessLog {
    /// Also write what `tollgate simulate` needs to replay the request:
    /// the time in milliseconds, the TCP peer and the client IP, the host
    /// and path of the request target (without its query), and a digest of
    /// the caller's API key or user — never the key itself. Off by default:
    /// paths can carry personal data.
    pub replay: bool,
}

/// `tracing:` — a span per request, sent over OTLP/HTTP (protobuf)
/// ([`crate::telemetry`]). Read from the file, else from the standard
/// `OTEL_EXPORTER_OTLP_ENDPOINT` and `OTEL_TRACES_SAMPLER_ARG` variables.
#[derive(Debug, Clone, PartialEq)]
pub struct TracingConfig {
    /// The URL spans are posted to: the collector's `/v1/traces`.
    pub endpoint: Uri,
    /// The share of requests traced, from 0 to 1, decided by trace id, for
    /// requests whose sampling no trusted proxy decided.
    pub sample_ratio: f64,
}

impl TracingConfig {
    /// OpenTelemetry's default sampler records every request.
    pub const DEFAULT_SAMPLE_RATIO: f64 = 1.0;
}

/// One listening address.
#[derive(Debug, Clone)]
pub struct Listen {
    /// The address to bind.
    pub addr: SocketAddr,
    /// TLS termination, read from the PEM files when the file was loaded
    /// (so a reload re-reads certificates).
    pub tls: Option<Arc<tokio_rustls::rustls::ServerConfig>>,
}

impl From<SocketAddr> for Listen {
    fn from(addr: SocketAddr) -> Self {
        Self { addr, tls: None }
    }
}

/// Client IP extraction.
#[derive(Debug, Clone)]
pub struct ClientIpConfig {
    /// Peers whose `X-Forwarded-For` / `Forwarded` headers are believed.
    pub trusted_proxies: Vec<IpNet>,
    /// IPv6 clients are grouped by this prefix length (default 64).
    pub ipv6_prefix: u8,
}

impl Default for ClientIpConfig {
    fn default() -> Self {
        Self {
            trusted_proxies: Vec::new(),
            ipv6_prefix: 64,
        }
    }
}

/// Which header set carries the limiter's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HeaderMode {
    /// `RateLimit-Policy` and `RateLimit` (draft-ietf-httpapi-ratelimit-headers-11).
    #[default]
    Ietf,
    /// GitHub's `X-RateLimit-Limit/Remaining/Used/Reset/Resource` for the
    /// limit closest to exhaustion; `Reset` is in epoch seconds.
    Github,
    /// The older draft's `RateLimit-Limit/Remaining/Reset` (seconds from
    /// now) for the limit closest to exhaustion.
    Legacy,
    /// No rate-limit headers (429 still carries `Retry-After`).
    None,
}

impl HeaderMode {
    /// Every spelling `headers` accepts, with its value; read by the loader
    /// and by `tollgate schema` (whose hand-kept list once left out
    /// `github` and `legacy`).
    pub const SPELLINGS: [(&'static str, Self); 4] = [
        ("ietf", Self::Ietf),
        ("github", Self::Github),
        ("legacy", Self::Legacy),
        ("none", Self::None),
    ];
}

/// API key source.
#[derive(Debug, Clone)]
pub struct ApiKeyConfig {
    /// Header holding the key (`Authorization: Bearer` is also read).
    pub header: HeaderName,
    /// Static key → plan map.
    pub keys: std::collections::HashMap<String, Arc<str>>,
    /// What callers with an unknown (or no) key get on plan routes.
    pub unknown: UnknownKey,
    /// Look keys missing from `keys` up in the Redis hash `<prefix>keys`.
    pub redis_hash: bool,
    /// How long a Redis hash answer is reused in process.
    pub cache: Duration,
}

impl Default for ApiKeyConfig {
    /// `x-api-key`, no static keys, unknown keys refused, no Redis hash.
    fn default() -> Self {
        Self {
            header: HeaderName::from_static("x-api-key"),
            keys: std::collections::HashMap::new(),
            unknown: UnknownKey::Reject,
            redis_hash: false,
            cache: Duration::from_secs(10),
        }
    }
}

/// `plans_from:` — what names a caller's plan.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum PlansFrom {
    /// `api_key`: the plan of the caller's API key (`api_keys.keys`, the
    /// Redis hash).
    #[default]
    ApiKey,
    /// `claim:NAME`: this claim of the verified `users.jwt` token is the
    /// plan's name.
    Claim(Arc<str>),
    /// `header:NAME`: this header is the plan's name, honoured only from
    /// `client_ip.trusted_proxies` (an auth proxy in front sets it).
    Header(HeaderName),
}

/// The plan of callers whose API key is not known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UnknownKey {
    /// This plan.
    Plan(Arc<str>),
    /// `401 Unauthorized` on routes whose limits come from plans.
    Reject,
}

/// A pricing tier.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Name used in `api_keys.keys` and the Redis hash.
    pub name: Arc<str>,
    /// Its limits; a route limit with `plan: true` becomes these.
    pub limits: Vec<PlanLimit>,
}

/// One limit of a plan: numbers without an identity key.
#[derive(Debug, Clone)]
pub struct PlanLimit {
    /// Policy name shown in headers.
    pub name: Arc<str>,
    /// Units per window.
    pub limit: NonZeroU64,
    /// Window length in milliseconds.
    pub window_ms: NonZeroU64,
    /// How the limit counts.
    pub algorithm: crate::limit::Algorithm,
    /// `sync` mode and its interval, as for a route's [`Limit::sync`].
    pub sync: Option<Duration>,
    /// `on_limit: delay` and its `max_delay`, as for [`Limit::delay`].
    pub delay: Option<Duration>,
}

/// Authenticated user source.
#[derive(Debug, Clone)]
pub struct UserConfig {
    /// Header set by a trusted auth layer; ignored from untrusted peers.
    pub header: HeaderName,
    /// Verifier of `Authorization: Bearer` JWTs; the user is one claim.
    pub jwt: Option<crate::jwt::JwtVerifier>,
}

impl Default for UserConfig {
    /// The `x-user` header (from trusted proxies), no JWT.
    fn default() -> Self {
        Self {
            header: HeaderName::from_static("x-user"),
            jwt: None,
        }
    }
}

/// Gateway-wide timeouts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// Reading a request's header block (slowloris bound).
    pub header_read: Duration,
    /// Connecting to an upstream.
    pub upstream_connect: Duration,
    /// Waiting for an upstream's response head.
    pub upstream_response: Duration,
    /// An idle keep-alive connection to an upstream older than this is
    /// closed instead of reused. Kept below the upstreams' own keep-alive
    /// timeouts, so the gateway gives a connection up before the upstream
    /// closes it under a request (see [`DEFAULT_UPSTREAM_IDLE`]).
    pub upstream_idle: Duration,
    /// A connection with no request in flight and no bytes moving for this
    /// long is closed (keep-alive idle).
    pub idle: Duration,
    /// After SIGTERM, how long in-flight requests may take to finish.
    pub drain: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            header_read: Duration::from_secs(10),
            upstream_connect: Duration::from_secs(5),
            upstream_response: Duration::from_secs(30),
            upstream_idle: DEFAULT_UPSTREAM_IDLE,
            idle: Duration::from_secs(60),
            drain: Duration::from_secs(30),
        }
    }
}

/// Default of [`Timeouts::upstream_idle`]: 4 s, under the 5 s keep-alive
/// timeout of Node.js (`server.keepAliveTimeout`), Apache (`KeepAliveTimeout`)
/// and uvicorn, and far under nginx's 75 s. The gateway's clock for a
/// connection starts when the response head arrives, the upstream's when the
/// response ends, so the gateway always gives up first; the second left over
/// covers the network and a busy upstream. The cost is a new connection for
/// an upstream quiet for more than 4 s.
pub const DEFAULT_UPSTREAM_IDLE: Duration = Duration::from_secs(4);

/// One route.
#[derive(Debug, Clone)]
pub struct Route {
    /// Name used in logs and metrics.
    pub name: Arc<str>,
    /// Which requests the route takes.
    pub matcher: RouteMatch,
    /// What the route does with an admitted request.
    pub action: Action,
    /// Units each request consumes from every limit (default 1).
    pub cost: u64,
    /// Limits, all of which must admit.
    pub limits: Vec<Limit>,
    /// Overrides `store.on_error` for this route.
    pub on_error: Option<OnError>,
    /// Every limit of the route only counts and logs what it would deny.
    pub shadow: bool,
    /// At most this many requests of the route wait at once on one
    /// gateway for an `on_limit: delay` limit; more are refused (429).
    pub max_queue: usize,
    /// The route's CORS policy: its own `cors:`, else the top level's.
    pub cors: Option<Arc<Cors>>,
    /// Rules for the forwarded request: the route's own, else the top level's.
    pub request_headers: Option<Arc<HeaderRules>>,
    /// Rules for every response: the route's own, else the top level's.
    pub response_headers: Option<Arc<HeaderRules>>,
    /// Callers the route's limits do not count: the route's own `exempt:`,
    /// else the top level's.
    pub exempt: Option<Arc<Exempt>>,
}

/// Request matching.
#[derive(Debug, Clone, Default)]
pub struct RouteMatch {
    /// Lower-case host without port; `*.example.com` matches subdomains.
    pub host: Option<String>,
    /// The path.
    pub path: PathMatch,
    /// Allowed methods; empty means any.
    pub methods: Vec<Method>,
}

/// How a route matches the request path.
#[derive(Debug, Clone, Default)]
pub enum PathMatch {
    /// Any path.
    #[default]
    Any,
    /// Exactly this path.
    Exact(String),
    /// Any path starting with this string.
    Prefix(String),
}

/// What a route does with an admitted request.
#[derive(Debug, Clone)]
pub enum Action {
    /// Forward to an upstream.
    Upstream(Upstream),
    /// Answer locally.
    Respond(Respond),
}

/// An upstream HTTP server.
#[derive(Debug, Clone)]
pub struct Upstream {
    /// `http://host:port[/base]` as written.
    pub uri: Uri,
    /// Upstream response timeout for this route.
    pub timeout: Duration,
    /// TLS settings for an `https://` upstream with its own CA file;
    /// `None` uses the webpki roots.
    pub tls: Option<Arc<tokio_rustls::rustls::ClientConfig>>,
    /// Whether `Upgrade` requests (WebSocket) are passed through.
    pub upgrade: bool,
    /// Whether the client's `Proxy-Authorization` is passed on. Off by
    /// default: the credentials are meant for a proxy (RFC 9110 §11.7.4),
    /// and the gateway is the last one an upstream should see them from.
    pub forward_proxy_authorization: bool,
    /// The pool of targets the route forwards to, when `upstream:` names
    /// one; `uri` is then its first target's URL, and each try goes to the
    /// target the pool picks.
    pub pool: Option<Arc<UpstreamPool>>,
}

/// `upstreams.NAME`: targets a route forwards to by the pool's name, with
/// how requests are spread over them and how sick targets are left out.
#[derive(Debug, Clone)]
pub struct UpstreamPool {
    /// The pool's name, as routes name it.
    pub name: Arc<str>,
    /// The targets as written (a name stands for every address it resolves to).
    pub targets: Vec<PoolTarget>,
    /// How a target is picked.
    pub balance: Balance,
    /// For `balance: hash`: the caller's key, as limits write keys.
    pub hash_key: Option<KeySpec>,
    /// Active checks, if any.
    pub health: Option<HealthCheck>,
    /// Passive ejection.
    pub eject: Eject,
    /// Tries after the first for a request that may have reached a target
    /// (idempotent and bodiless only).
    pub retries: u32,
    /// The bound of each try; `None` leaves only the route's timeout.
    pub per_try_timeout: Option<Duration>,
    /// TLS settings of `https://` targets with the pool's own CA file.
    pub tls: Option<Arc<tokio_rustls::rustls::ClientConfig>>,
}

/// One target of a pool, as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolTarget {
    /// `scheme://host:port`, as written (the metrics' label).
    pub url: Arc<str>,
    /// Which client talks to it.
    pub scheme: TargetScheme,
    /// `host:port` (with a default port), for `Host` and SNI of https targets.
    pub authority: http::uri::Authority,
    /// The host without brackets: an address, or a name to resolve.
    pub host: String,
    /// The port.
    pub port: u16,
    /// Its share of requests relative to the others (at least 1).
    pub weight: u32,
}

/// The protocol a target is spoken to in; it chooses the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TargetScheme {
    /// `http://`: HTTP/1.1 over the pooled keep-alive connections.
    Http,
    /// `https://`: TLS with SNI and certificate checks, HTTP/2 by ALPN.
    Https,
    /// `h2c://`: cleartext HTTP/2 with prior knowledge (gRPC servers), one
    /// multiplexed connection per target.
    H2c,
}

/// How a pool picks a target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Balance {
    /// Power of two choices over in-flight requests, weighted.
    #[default]
    LeastRequest,
    /// Smooth weighted round robin.
    RoundRobin,
    /// A consistent hash of the caller's `hash_key`.
    Hash,
}

impl Balance {
    /// Every spelling `balance` accepts, with its value.
    pub const SPELLINGS: [(&'static str, Self); 3] = [
        ("least_request", Self::LeastRequest),
        ("round_robin", Self::RoundRobin),
        ("hash", Self::Hash),
    ];
}

/// `health:` — active checks of every target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthCheck {
    /// The path asked with `GET`; a 2xx or 3xx passes.
    pub path: http::uri::PathAndQuery,
    /// Time between checks of a target.
    pub interval: Duration,
    /// How long a check may take.
    pub timeout: Duration,
    /// Consecutive failed checks that take a target out.
    pub unhealthy_after: u32,
    /// Consecutive passed checks that bring it back.
    pub healthy_after: u32,
}

impl HealthCheck {
    /// `interval: 5s`, `timeout: 1s`, `unhealthy_after: 2`, `healthy_after: 1`.
    pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(5);
    /// See [`Self::DEFAULT_INTERVAL`].
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);
}

/// `eject:` — passive ejection of targets that fail requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Eject {
    /// Consecutive failures that take a target out.
    pub after: u32,
    /// How long the first ejection lasts; each repeat doubles it, up to 10×.
    pub duration: Duration,
    /// At most this share of a pool is ejected at once (percent).
    pub max_percent: u32,
    /// Whether `healthy_after` passing active checks end an ejection early
    /// (Envoy's `successful_active_health_check_uneject_host`); false lets
    /// every ejection run its time.
    pub ended_by_checks: bool,
}

impl Default for Eject {
    /// Envoy's outlier detection defaults: 5 failures, 30 s, 10 %; the
    /// share here is 50 %, so a pool of two or three can eject one.
    fn default() -> Self {
        Self {
            after: 5,
            duration: Duration::from_secs(30),
            max_percent: 50,
            ended_by_checks: true,
        }
    }
}

/// A fixed local answer.
#[derive(Debug, Clone)]
pub struct Respond {
    /// Status code.
    pub status: StatusCode,
    /// Body.
    pub body: bytes::Bytes,
    /// `Content-Type` header value, checked at load.
    pub content_type: http::HeaderValue,
}

impl Default for Respond {
    /// `200 OK`, an empty body, `text/plain; charset=utf-8`.
    fn default() -> Self {
        Self {
            status: StatusCode::OK,
            body: bytes::Bytes::new(),
            content_type: http::HeaderValue::from_static("text/plain; charset=utf-8"),
        }
    }
}

/// One limit on a route.
#[derive(Debug, Clone)]
pub struct Limit {
    /// Policy name shown in headers (`"per_minute"`).
    pub name: Arc<str>,
    /// Who is counted.
    pub key: KeySpec,
    /// Requests (cost units) per window.
    pub limit: NonZeroU64,
    /// Window length in milliseconds.
    pub window_ms: NonZeroU64,
    /// Cost override for this limit; `None` uses the route's cost. With
    /// [`Self::settle`], the reservation taken at decision time.
    pub cost: Option<u64>,
    /// Where the final cost comes from when the response settles it
    /// (`cost: { reserve, from_header | from_trailer }`, `bytes:`); `None`
    /// for a cost known at decision time ([`crate::limit::settle`]).
    pub settle: Option<crate::limit::settle::Source>,
    /// `reserve: { json: FIELD, default: N }`: the reservation is the
    /// request body's FIELD (a non-negative integer, at least 1), else
    /// [`Self::cost`], which holds N.
    pub reserve_from: Option<BodyField>,
    /// The limit only counts and logs what it would deny (see [`crate::decision::shadow`]).
    pub shadow: bool,
    /// How the limit counts (`algorithm:`, default `sliding_window`).
    pub algorithm: crate::limit::Algorithm,
    /// `plan: true`: the numbers above are placeholders; each request uses
    /// the limits of its caller's plan, keyed by `key`.
    pub plan: bool,
    /// `sync` mode: decided in process against the last known fleet total
    /// and exchanged with Redis every this often
    /// ([`crate::decision::sync`]); `None` decides in Redis (or in process
    /// without Redis). Resolved at load: the limit's own `sync`, else
    /// `store.redis.sync` for a sliding or fixed window.
    pub sync: Option<Duration>,
    /// `on_limit: delay`: a request this limit denies waits, when the
    /// limit admits it within this long, instead of being refused
    /// (`max_delay`; see [`crate::pipeline::delay`]). `None` refuses at once
    /// (`on_limit: reject`, the default).
    pub delay: Option<Duration>,
    /// `concurrency: N`: a cap on the caller's requests in flight instead
    /// of a rate ([`crate::limit::concurrency`]); `limit` holds
    /// the same number and `window_ms` a placeholder. `None` for a rate.
    pub concurrency: Option<NonZeroU64>,
    /// `share: NAME`: the limit counts on one counter with every limit of
    /// the same share on other routes (the loader checks that they agree
    /// on key, quota, window and algorithm); `None` counts per route.
    pub share: Option<Arc<str>>,
}

/// What a limit does with a request it denies (`on_limit:`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum OnLimit {
    /// Answer 429 at once.
    #[default]
    Reject,
    /// Wait up to `max_delay` for the limit to admit it.
    Delay,
}

impl OnLimit {
    /// Every spelling `on_limit:` accepts.
    pub const SPELLINGS: [(&'static str, Self); 2] =
        [("reject", Self::Reject), ("delay", Self::Delay)];
}

/// An identity key: the parts of a compound key (`[ip, header:x-user]`),
/// each a fallback chain (`api_key | user | ip`, first present wins).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeySpec {
    /// Parts of the compound key, in order.
    pub parts: Vec<Vec<KeySource>>,
}

/// As the file writes it: `api_key | ip`, `[ip, header:x-user]`.
impl std::fmt::Display for KeySpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let chain = |c: &Vec<KeySource>| {
            c.iter()
                .map(|s| match s {
                    KeySource::Ip => "ip".to_owned(),
                    KeySource::ApiKey => "api_key".to_owned(),
                    KeySource::User => "user".to_owned(),
                    KeySource::Header(h) => format!("header:{h}"),
                    KeySource::Route => "route".to_owned(),
                    KeySource::Json(j) => format!("json:{}", j.name),
                })
                .collect::<Vec<_>>()
                .join(" | ")
        };
        match &self.parts[..] {
            [one] => f.write_str(&chain(one)),
            parts => write!(
                f,
                "[{}]",
                parts.iter().map(chain).collect::<Vec<_>>().join(", ")
            ),
        }
    }
}

impl Limit {
    /// `limit` per `window_ms` on `key`, every other setting at the
    /// loader's default (no cost, shadow, settlement, plan, sync, delay,
    /// concurrency or share): a limit built without a file.
    pub fn new(name: &str, key: KeySpec, limit: NonZeroU64, window_ms: NonZeroU64) -> Limit {
        Limit {
            name: name.into(),
            key,
            limit,
            window_ms,
            cost: None,
            shadow: false,
            settle: None,
            reserve_from: None,
            algorithm: Default::default(),
            plan: false,
            sync: None,
            delay: None,
            concurrency: None,
            share: None,
        }
    }

    /// What processes counting on one share must agree on, as text: key,
    /// kind, quota, window and algorithm (the share's fingerprint is its
    /// digest, `store::keys::share_fingerprint`).
    pub fn definition(&self) -> String {
        let kind = self
            .concurrency
            .map_or_else(|| "rate".to_owned(), |n| format!("concurrency {n}"));
        format!(
            "key {}; {kind}; limit {}; window {}ms; algorithm {}",
            self.key,
            self.limit,
            self.window_ms,
            self.algorithm.described()
        )
    }
}

/// One source of an identity value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySource {
    /// The client IP (always present).
    Ip,
    /// The API key.
    ApiKey,
    /// The authenticated user.
    User,
    /// A request header.
    Header(HeaderName),
    /// `key: route`: every caller of the route (or of every route sharing
    /// the limit) is one identity. It stands alone: never in a fallback
    /// chain or a compound key, where it would either hide the sources
    /// after it or add nothing.
    Route,
    /// `json:FIELD`: a string field of the request's JSON body (`json:model`),
    /// read when the body is (docs/limits.md#ai-apis); absent when the body
    /// is not JSON, too large to read, or the field is not a string.
    Json(BodyField),
}

/// A field of the request's JSON body that a limit reads: a key's
/// `json:model`, a reservation's `reserve: { json: max_tokens }`.
#[derive(Debug, Clone)]
pub struct BodyField {
    /// The path as written (`model`, `metadata.user_id`); a key shows the
    /// value as `json.<name>=…`.
    pub name: Arc<str>,
    /// The path, parsed.
    pub path: crate::limit::usage::JsonPath,
}

impl PartialEq for BodyField {
    /// One name is one path: the path is parsed from it.
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
    }
}

impl Eq for BodyField {}
