//! How the gateway speaks to an upstream, by the scheme of its URL.

use http::Uri;
use http::uri::Scheme;

/// How the gateway speaks to an upstream, by the scheme of its URL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// `http://`: HTTP/1.1.
    Http1,
    /// `https://`: TLS, then HTTP/2 or HTTP/1.1 as ALPN settles.
    Https,
    /// `h2c://`: cleartext HTTP/2 with prior knowledge (RFC 9113 §3.3).
    H2c,
}

impl Protocol {
    /// The protocol of an upstream URL (`http`, `https` or `h2c`, as the
    /// configuration loader admits).
    pub fn of(uri: &Uri) -> Self {
        match uri.scheme() {
            Some(s) if *s == Scheme::HTTPS => Self::Https,
            Some(s) if s.as_str() == "h2c" => Self::H2c,
            _ => Self::Http1,
        }
    }
}
