//! The validated model of `cors:`.

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
