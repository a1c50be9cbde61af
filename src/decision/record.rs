//! What a decision leaves behind besides its answer: each limit's verdict
//! counted, every denial in the top-offenders view, and each would-be
//! denial of a shadow limit logged.

use std::sync::Arc;

use tracing::info;

use super::Decision;
use crate::config::{KeySource, Limit};
use crate::identity::{self, Caller};
use crate::limit::{LimitRequest, Verdict};
use crate::metrics::RouteMetrics;
use crate::store::keys::KeySuffix;
use crate::top::{Denied, TopOffenders};

/// How a decision's store keys were written, so that a denial's identity
/// is read from its key where the key holds it as text.
#[derive(Debug, Clone, Copy)]
pub struct KeyText<'a> {
    /// Every limit's store key, in route order.
    pub requests: &'a [LimitRequest],
    /// The store's key prefix.
    pub prefix: &'a str,
    /// Every limit's key suffix, in route order.
    pub suffixes: &'a [KeySuffix],
    /// Whether identities are written as digests (a share's always are).
    pub digest: bool,
}

impl KeyText<'_> {
    /// The identity written in limit `i`'s key, `<prefix>{<identity>}<suffix>`;
    /// `None` where the key holds its digest or is no text (an address).
    fn identity(&self, i: usize, limit: &Limit) -> Option<&str> {
        if self.digest || limit.share.is_some() {
            return None;
        }
        let key = self.requests.get(i)?.key.as_text()?;
        let end = key.len().checked_sub(self.suffixes.get(i)?.len() + 1)?;
        key.get(self.prefix.len() + 1..end)
    }
}

/// Counts each limit's verdict, feeds the top-offenders view with every
/// denial, and logs each would-be denial of a shadow limit.
/// The identity of a denial is read from its store key, or written again
/// from `caller` where the key holds only its digest.
#[inline]
pub fn record(
    rd: &Decision,
    route_name: &Arc<str>,
    limits: &[Limit],
    keys: KeyText<'_>,
    caller: &Caller<'_>,
    metrics: Option<&RouteMetrics>,
    top: &TopOffenders,
) {
    // Without metrics (an application's layer), a request no limit
    // denied leaves nothing behind: checked here, without a call.
    if metrics.is_none() && rd.denied().next().is_none() {
        return;
    }
    record_each(rd, route_name, limits, keys, caller, metrics, top);
}

/// [`record`] of a decision that leaves something behind.
fn record_each(
    rd: &Decision,
    route_name: &Arc<str>,
    limits: &[Limit],
    keys: KeyText<'_>,
    caller: &Caller<'_>,
    metrics: Option<&RouteMetrics>,
    top: &TopOffenders,
) {
    if let Some(m) = metrics {
        // Per-limit series exist for the route's configured limits; a plan
        // view (`plan: true` expanded) has other limits and is not counted
        // per limit.
        if m.limits.len() == limits.len() {
            match rd {
                Decision::Decided(d) => {
                    for (lm, v) in m.limits.iter().zip(&d.verdicts) {
                        if let Some(v) = v {
                            lm.count(*v);
                        }
                    }
                }
                // The store could not decide: every limit counts an error.
                Decision::Undecided(_) => {
                    for lm in &m.limits {
                        lm.count(Verdict::Undecided);
                    }
                }
            }
        }
    }
    for (i, shadow) in rd.denied() {
        let Some(limit) = limits.get(i) else {
            continue;
        };
        let written;
        let identity = match keys.identity(i, limit) {
            Some(text) => text,
            None => {
                let mut out = String::with_capacity(48);
                identity::write_key(&mut out, &limit.key, caller);
                written = out;
                &written
            }
        };
        let shown = || {
            let mut out = String::with_capacity(48);
            identity::write_shown(&mut out, &limit.key, caller, true);
            out
        };
        let denied = Denied {
            identity,
            shown: &shown,
            // Kept only where the identity holds it.
            api_key: caller.api_key.filter(|_| {
                limit
                    .key
                    .parts
                    .iter()
                    .flatten()
                    .any(|s| *s == KeySource::ApiKey)
            }),
        };
        top.record(route_name, &limit.name, &denied, shadow);
        if shadow {
            info!(
                route = %route_name,
                limit = %limit.name,
                identity = %shown(),
                "shadow limit would have denied this request"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU64;

    use super::*;
    use crate::config::KeySpec;
    use crate::store::keys::{self, StoreKey};

    fn limit(share: Option<&str>) -> Limit {
        let per_ip = Limit::new(
            "per_ip",
            KeySpec { parts: vec![] },
            NonZeroU64::new(5).unwrap(),
            NonZeroU64::new(1_000).unwrap(),
        );
        Limit {
            share: share.map(Into::into),
            ..per_ip
        }
    }

    #[test]
    fn a_denials_identity_is_read_from_a_text_key_only() {
        let suffixes = [KeySuffix::new("tg:", ":app:per_ip".to_owned(), true)];
        let key = |digest| {
            let mut scratch = String::new();
            keys::counter_key("tg:", digest, &suffixes[0], &mut scratch, |out| {
                out.push_str("ip=192.0.2.7/32");
            })
        };
        let text = [LimitRequest {
            key: key(false).into(),
            ..LimitRequest::default()
        }];
        let keys = KeyText {
            requests: &text,
            prefix: "tg:",
            suffixes: &suffixes,
            digest: false,
        };
        assert_eq!(keys.identity(0, &limit(None)), Some("ip=192.0.2.7/32"));
        // A share's key holds its digest whatever the store says.
        assert_eq!(keys.identity(0, &limit(Some("s"))), None);
        assert_eq!(keys.identity(1, &limit(None)), None);
        let address = [LimitRequest {
            key: StoreKey::Address {
                limit: suffixes[0].id().unwrap(),
                net: "192.0.2.7/32".parse().unwrap(),
            },
            ..LimitRequest::default()
        }];
        assert_eq!(
            address[0].key.text(),
            text[0].key.text(),
            "an address key's text is the text key's"
        );
        let keys_of_address = KeyText {
            requests: &address,
            ..keys
        };
        assert_eq!(keys_of_address.identity(0, &limit(None)), None);
        let digested = [LimitRequest {
            key: key(true).into(),
            ..LimitRequest::default()
        }];
        let keys = KeyText {
            requests: &digested,
            digest: true,
            ..keys
        };
        assert_eq!(keys.identity(0, &limit(None)), None);
    }
}
