//! The validated model of `request_id:`.

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
