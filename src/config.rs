//! Configuration: the validated model the running gateway uses.
//!
//! Loading is two-staged (as in sozu and River): [`file`] holds serde
//! structs that mirror the YAML, [`load`] turns them into the types below and
//! collects *every* error with its field path, line and column before
//! failing. The running gateway never sees raw YAML types.

pub mod file;
pub mod load;
mod position;

use std::net::SocketAddr;
use std::num::NonZeroU64;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, Method, StatusCode, Uri};
use ipnet::IpNet;

pub use load::{ConfigError, ConfigErrors, load_file, parse_str};

/// A whole, validated gateway configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Addresses the proxy listens on.
    pub listen: Vec<SocketAddr>,
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
    /// Where the authenticated user is read from.
    pub users: UserConfig,
    /// Timeouts shared by every route.
    pub timeouts: Timeouts,
    /// Routes, in match order (the first match wins).
    pub routes: Vec<Route>,
}

/// The limiter store.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// Redis; `None` keeps all state in process.
    pub redis: Option<RedisConfig>,
    /// What to do when Redis cannot answer.
    pub on_error: OnError,
    /// Prefix of every Redis key tollgate writes.
    pub prefix: String,
    /// Denied requests remembered in process (entries; 0 turns it off).
    pub deny_cache: usize,
}

/// A standalone Redis server.
#[derive(Debug, Clone)]
pub struct RedisConfig {
    /// `redis://[user:password@]host:port[/db]`.
    pub url: String,
    /// Bound on one limiter call; past it the `on_error` policy decides.
    pub timeout: Duration,
}

/// Policy when the store fails or times out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnError {
    /// Fail open: admit the request.
    Allow,
    /// Enforce the limits in process until Redis is back.
    Local,
}

/// Client IP extraction.
#[derive(Debug, Clone)]
pub struct ClientIpConfig {
    /// Peers whose `X-Forwarded-For` / `Forwarded` headers are believed.
    pub trusted_proxies: Vec<IpNet>,
    /// IPv6 clients are grouped by this prefix length (default 64).
    pub ipv6_prefix: u8,
}

/// Which header set carries the limiter's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeaderMode {
    /// `RateLimit-Policy` and `RateLimit` (draft-ietf-httpapi-ratelimit-headers-11).
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
}

/// Authenticated user source.
#[derive(Debug, Clone)]
pub struct UserConfig {
    /// Header set by a trusted auth layer; ignored from untrusted peers.
    pub header: HeaderName,
    /// Verifier of `Authorization: Bearer` JWTs; the user is one claim.
    pub jwt: Option<crate::identity::jwt::JwtVerifier>,
}

/// Gateway-wide timeouts.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    /// Reading a request's header block (slowloris bound).
    pub header_read: Duration,
    /// Connecting to an upstream.
    pub upstream_connect: Duration,
    /// Waiting for an upstream's response head.
    pub upstream_response: Duration,
}

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
}

/// A fixed local answer.
#[derive(Debug, Clone)]
pub struct Respond {
    /// Status code.
    pub status: StatusCode,
    /// Body.
    pub body: bytes::Bytes,
    /// `Content-Type` header value.
    pub content_type: String,
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
    /// Cost override for this limit; `None` uses the route's cost.
    pub cost: Option<u64>,
    /// How the limit counts (`algorithm:`, default `sliding_window`).
    pub algorithm: crate::limit::Algorithm,
    /// `plan: true`: the numbers above are placeholders; each request uses
    /// the limits of its caller's plan, keyed by `key`.
    pub plan: bool,
}

/// An identity key: the parts of a compound key (`[ip, header:x-user]`),
/// each a fallback chain (`api_key | user | ip`, first present wins).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeySpec {
    /// Parts of the compound key, in order.
    pub parts: Vec<Vec<KeySource>>,
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
}

impl Default for ClientIpConfig {
    fn default() -> Self {
        Self {
            trusted_proxies: Vec::new(),
            ipv6_prefix: 64,
        }
    }
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            header_read: Duration::from_secs(10),
            upstream_connect: Duration::from_secs(5),
            upstream_response: Duration::from_secs(30),
        }
    }
}
