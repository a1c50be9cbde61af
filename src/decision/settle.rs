//! Costs settled by the response (docs/limits.md#costs-settled-by-the-response): what the pipeline calls.
//!
//! At decision time a settled limit reserves its cost like any other
//! ([`reserve`]: the `reserve` of `cost: { reserve, … }`, or for a byte
//! quota the request's `Content-Length` when it counts request bytes, at
//! least 1, so an exhausted quota still denies). When the request is
//! admitted, [`pending`] keeps what each settled limit reserved, and where
//! the final amount will come from. Then:
//!
//! - a `from_header` amount is settled when the upstream's response head
//!   arrives, before the response goes to the client, so the caller's next
//!   request sees it ([`Reservations::header`]);
//! - a `from_trailer` amount and body bytes are settled when the response
//!   body ends ([`Reservations::at_end`]), complete or not (bytes as counted: a
//!   client that goes away pays for what was sent).
//!
//! A value that is missing, not a decimal integer, negative or past `u64`
//! keeps the reservation, and is counted (`tollgate_settle_kept{reason="value"}`).
//! A store that cannot settle keeps it too (`reason="store"`), warned at
//! most once a minute: never a panic, never a wait past the store's timeout.
//!
//! Only limits that consumed are settled: every enforced limit of an
//! admitted request, and the shadow limits when none of them would have
//! denied (a shadow decision that denies consumes nothing, see
//! [`super::stages`]).

pub mod store;

use std::sync::atomic::{AtomicU64, Ordering};

use http::{HeaderMap, HeaderName, HeaderValue};
use tracing::{debug, warn};

use super::Decision;
use crate::config::Limit;
use crate::limit::settle::{Settlement, Source};
use crate::limit::{Enforcement, LimitRequest, Verdict};
use store::Settler;

/// The cost limit `l` reserves for a request whose body announces
/// `content_length` bytes: `route_cost` or the limit's own cost, or for a
/// byte quota counting request bytes the announced length (at least 1).
pub fn reserve(l: &Limit, route_cost: u64, content_length: Option<u64>) -> u64 {
    match &l.settle {
        Some(Source::Bytes(b)) if b.request() => content_length.unwrap_or(1).max(1),
        Some(Source::Bytes(_)) => 1,
        _ => l.cost.unwrap_or(route_cost),
    }
}

/// The reservations of one admitted request, waiting for their amounts.
#[derive(Debug, Clone)]
pub struct Reservations {
    /// The instant of the decision.
    reserved_at_ms: u64,
    /// Each settled limit as decided, with where its amount comes from.
    items: Vec<(LimitRequest, Source)>,
}

/// What the settled limits of a request reserved, when some consumed;
/// `None` (and nothing allocated) on routes without settled limits.
pub fn pending(
    limits: &[Limit],
    requests: &[LimitRequest],
    decision: &Decision,
    now_ms: u64,
) -> Option<Reservations> {
    if limits.iter().all(|l| l.settle.is_none()) {
        return None;
    }
    let Decision::Decided(d) = decision else {
        return None;
    };
    if !d.allowed {
        return None;
    }
    let shadow_denied = decision.shadow_denied();
    let items: Vec<_> = limits
        .iter()
        .zip(requests)
        .zip(&d.verdicts)
        .filter_map(|((l, r), v)| {
            let source = l.settle.clone()?;
            let shadow = r.mode.enforcement == Enforcement::Shadow;
            let consumed = *v == Some(Verdict::Allowed) && !(shadow && shadow_denied);
            consumed.then(|| (r.clone(), source))
        })
        .collect();
    (!items.is_empty()).then_some(Reservations {
        reserved_at_ms: now_ms,
        items,
    })
}

impl Reservations {
    /// Whether a reservation counts the request's body bytes.
    pub fn counts_request(&self) -> bool {
        self.items
            .iter()
            .any(|(_, s)| matches!(s, Source::Bytes(b) if b.request()))
    }

    /// Whether a reservation waits for the response body (a trailer or
    /// bytes).
    pub fn waits_for_body(&self) -> bool {
        self.items
            .iter()
            .any(|(_, s)| !matches!(s, Source::Header(_)))
    }

    /// Takes the `from_header` reservations out and settles them from the
    /// response's `headers`; the others stay for [`Self::at_end`].
    pub async fn header(&mut self, settler: &Settler, now_ms: u64, headers: &HeaderMap) {
        if !self
            .items
            .iter()
            .any(|(_, s)| matches!(s, Source::Header(_)))
        {
            return;
        }
        let mut settlements = Vec::new();
        let mut rest = Vec::new();
        for (request, source) in std::mem::take(&mut self.items) {
            match &source {
                Source::Header(name) => match amount(headers, name) {
                    Some(actual) => settlements.push(self.settlement(request, actual)),
                    None => kept(settler, name, headers.get(name)),
                },
                _ => rest.push((request, source)),
            }
        }
        self.items = rest;
        settle(settler, now_ms, &settlements).await;
    }

    /// The settlements of the reservations left once the response body
    /// ended: a trailer's amount from `trailers` (none when the body ended
    /// without them), and the bytes counted. A reservation whose trailer
    /// is missing or garbage stands (counted).
    pub fn at_end(
        self,
        settler: &Settler,
        trailers: Option<&HeaderMap>,
        request_bytes: u64,
        response_bytes: u64,
    ) -> Vec<Settlement> {
        let mut out = Vec::with_capacity(self.items.len());
        for (request, source) in &self.items {
            let actual =
                match source {
                    Source::Header(name) | Source::Trailer(name) => {
                        let found = trailers.and_then(|t| amount(t, name));
                        if found.is_none() {
                            kept(settler, name, trailers.and_then(|t| t.get(name)));
                        }
                        found
                    }
                    Source::Bytes(b) => Some(
                        if b.request() { request_bytes } else { 0 }
                            .saturating_add(if b.response() { response_bytes } else { 0 }),
                    ),
                };
            if let Some(actual) = actual {
                out.push(self.settlement(request.clone(), actual));
            }
        }
        out
    }

    fn settlement(&self, request: LimitRequest, actual: u64) -> Settlement {
        Settlement {
            request,
            reserved_at_ms: self.reserved_at_ms,
            actual,
        }
    }
}

/// Settles `settlements` at `now_ms`; a failure leaves the reservations
/// standing, counted by the limiter and warned at most once a minute.
pub async fn settle(settler: &Settler, now_ms: u64, settlements: &[Settlement]) {
    if settlements.is_empty() {
        return;
    }
    if let Err(e) = settler.settle(now_ms, settlements).await {
        static LAST_WARNED_MS: AtomicU64 = AtomicU64::new(0);
        let last = LAST_WARNED_MS.load(Ordering::Relaxed);
        if (last == 0 || now_ms.saturating_sub(last) >= 60_000)
            && LAST_WARNED_MS
                .compare_exchange(last, now_ms.max(1), Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            warn!(error = %e, "could not settle reserved costs; those reservations stand (tollgate_settle_kept counts them)");
        } else {
            debug!(error = %e, "could not settle reserved costs; the reservations stand");
        }
    }
}

/// A reservation kept because its value was missing or not a count.
fn kept(settler: &Settler, name: &HeaderName, value: Option<&HeaderValue>) {
    settler.kept_value(1);
    debug!(header = %name, ?value, "no usable settled cost; the reservation stands");
}

/// The amount in `name`: one field of ASCII digits (surrounding blanks
/// allowed) that fits a `u64`; anything else is `None`.
pub fn amount(headers: &HeaderMap, name: &HeaderName) -> Option<u64> {
    let mut values = headers.get_all(name).iter();
    let value = values.next()?;
    if values.next().is_some() {
        return None;
    }
    let text = value.to_str().ok()?.trim_matches([' ', '\t']);
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn amounts_are_plain_counts() {
        let name = HeaderName::from_static("x-tokens-used");
        let with = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert(&name, HeaderValue::from_str(v).unwrap());
            amount(&h, &name)
        };
        assert_eq!(with("42"), Some(42));
        assert_eq!(with(" 7 "), Some(7));
        assert_eq!(with("0"), Some(0));
        for bad in [
            "",
            "-3",
            "+3",
            "1.5",
            "abc",
            "99999999999999999999999",
            "1 2",
        ] {
            assert_eq!(with(bad), None, "{bad:?}");
        }
        assert_eq!(amount(&HeaderMap::new(), &name), None);
        let mut two = HeaderMap::new();
        two.append(&name, HeaderValue::from_static("1"));
        two.append(&name, HeaderValue::from_static("2"));
        assert_eq!(amount(&two, &name), None);
    }
}
