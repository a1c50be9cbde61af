//! The validated model of `request_headers:` and `response_headers:`.

use http::HeaderName;

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
