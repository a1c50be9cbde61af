//! The validated model of what browsers and request ids need: `cors:`,
//! `request_id:` and the header rules.

use http::HeaderName;

/// `request_id:` — every request carries an id: the one a trusted peer
/// sent, else one the gateway makes ([`crate::request_id`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestIdConfig {
    /// The header the id is read from, sent upstream in and answered with.
    pub header: HeaderName,
    /// Whose ids are kept.
    pub keep_from: KeepFrom,
}

impl Default for RequestIdConfig {
    /// `x-request-id`, kept from trusted proxies.
    fn default() -> Self {
        Self {
            header: HeaderName::from_static("x-request-id"),
            keep_from: KeepFrom::Trusted,
        }
    }
}

/// Whose request ids the gateway keeps instead of making its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KeepFrom {
    /// Peers in `client_ip.trusted_proxies`.
    #[default]
    Trusted,
    /// Any peer.
    Any,
    /// Nobody: every request gets a new id.
    None,
}

impl KeepFrom {
    /// Every spelling `request_id.keep_from` accepts.
    pub const SPELLINGS: [(&'static str, Self); 3] = [
        ("trusted", Self::Trusted),
        ("any", Self::Any),
        ("none", Self::None),
    ];
}

/// A CORS policy (`cors:`), its header values rendered at load
/// ([`crate::cors`] applies it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cors {
    /// Which origins are answered with CORS headers.
    pub origins: CorsOrigins,
    /// `allow_credentials: true`: `Access-Control-Allow-Credentials: true`.
    pub allow_credentials: bool,
    /// `Access-Control-Allow-Methods` of a preflight's answer.
    pub allow_methods: http::HeaderValue,
    /// `Access-Control-Allow-Headers` of a preflight's answer; `None`
    /// echoes the headers the preflight asks for.
    pub allow_headers: Option<http::HeaderValue>,
    /// `Access-Control-Expose-Headers` of every other answer: the
    /// rate-limit headers of the configured style, `Retry-After`, the
    /// request-id header and `expose_headers`.
    pub expose_headers: http::HeaderValue,
    /// `Access-Control-Max-Age` of a preflight's answer, in seconds.
    pub max_age: Option<http::HeaderValue>,
}

/// `cors.allow_origins`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CorsOrigins {
    /// `"*"`: every origin, answered `Access-Control-Allow-Origin: *`.
    Any,
    /// These serialized origins (`https://app.example.com`, lower-case),
    /// each answered with itself.
    List(Vec<String>),
}

/// `request_headers:` / `response_headers:` — `set` replaces, `add`
/// appends, `remove` deletes ([`crate::proxy::rules`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HeaderRules {
    /// Headers replaced (or added when absent).
    pub set: Vec<(HeaderName, http::HeaderValue)>,
    /// Headers appended beside any of the same name.
    pub add: Vec<(HeaderName, http::HeaderValue)>,
    /// Headers removed.
    pub remove: Vec<HeaderName>,
}
