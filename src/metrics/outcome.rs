//! What one routed request came to ([`Outcome`]), and the one place its
//! words are rendered: the metric label of `tollgate_requests_total`, the
//! access log's `decision` and the span's `tollgate.outcome`.

/// What one routed request came to: how it ended, and what its limits
/// decided as the access log and the trace tell it. The one value the
/// `outcome` label of `tollgate_requests_total` ([`Outcome::label`]), the
/// access log's `decision` and the span's `tollgate.outcome`
/// ([`Outcome::word`]) are rendered from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    /// How the request ended, as `tollgate_requests_total` counts it.
    pub ending: Ending,
    /// What its limits decided, as the access log and the span say it.
    pub access: Access,
}

/// How one routed request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// Admitted (or no limits) and answered by the upstream or the route.
    Allowed,
    /// Denied by an enforced limit: 429.
    Limited,
    /// Would have been denied by a shadow limit; forwarded anyway.
    ShadowLimited,
    /// The gateway answered an error of its own (upstream unreachable, timeout).
    Error,
    /// The client's request body failed while it was forwarded: malformed
    /// (400), cut off by the client (400, or nobody left to answer), or past
    /// `server.max_body_size` (413). Not the upstream's fault, so not `Error`.
    ClientError,
    /// Refused before any limit: an API key without a plan (401).
    Rejected,
    /// Forwarded without asking the route's limits: the caller is exempt.
    Exempt,
}

/// What a request's limits decided, as the access log and the span say it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// No limit was asked.
    None,
    /// Every limit admitted.
    Allowed,
    /// An enforced limit denied: 429.
    Limited,
    /// Only a shadow limit would have denied; forwarded.
    ShadowLimited,
    /// The store failed and `on_error: allow` admitted without deciding.
    FailedOpen,
    /// The store failed and `on_error: deny` refused: 503.
    Unavailable,
    /// The caller is exempt: no limit was asked.
    Exempt,
}

impl Outcome {
    /// The `outcome` label of `tollgate_requests_total`.
    pub fn label(self) -> &'static str {
        label(self.ending)
    }

    /// The access log's `decision` and the span's `tollgate.outcome`.
    pub fn word(self) -> &'static str {
        match self.access {
            Access::None => "none",
            Access::Allowed => "allowed",
            Access::Limited => "limited",
            Access::ShadowLimited => "shadow_limited",
            Access::FailedOpen => "unchecked",
            Access::Unavailable => "unavailable",
            Access::Exempt => "exempt",
        }
    }
}

/// The label value of `ending`; the series are made for each at load.
pub(super) fn label(ending: Ending) -> &'static str {
    match ending {
        Ending::Allowed => "allowed",
        Ending::Limited => "limited",
        Ending::ShadowLimited => "shadow_limited",
        Ending::Error => "error",
        Ending::ClientError => "client_error",
        Ending::Rejected => "rejected",
        Ending::Exempt => "exempt",
    }
}
