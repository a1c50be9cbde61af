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

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use http::{HeaderMap, HeaderName, HeaderValue};
use tracing::{debug, warn};

use super::Decision;
use crate::config::Limit;
use crate::identity::BodyFields;
use crate::limit::settle::{BodyUsage, Settlement, Source};
use crate::limit::{Enforcement, LimitRequest, Verdict};
use crate::metrics::RouteMetrics;
use prometheus_client::metrics::counter::Counter;
use store::Settler;

/// The cost limit `l` reserves for a request whose body announces
/// `content_length` bytes and holds `body`'s fields: `route_cost` or the
/// limit's own cost; for `reserve: { json: FIELD, default }` the body's
/// FIELD (at least 1, so an exhausted quota still denies), else the
/// default; for a byte quota counting request bytes the announced length
/// (at least 1).
pub fn reserve(
    l: &Limit,
    route_cost: u64,
    content_length: Option<u64>,
    body: Option<&BodyFields>,
) -> u64 {
    match (&l.settle, &l.reserve_from) {
        (Some(Source::Bytes(b)), _) if b.request() => content_length.unwrap_or(1).max(1),
        (Some(Source::Bytes(_)), _) => 1,
        (_, Some(field)) => body
            .and_then(|b| b.count(&field.name))
            .map(|n| n.max(1))
            .or(l.cost)
            .unwrap_or(route_cost),
        _ => l.cost.unwrap_or(route_cost),
    }
}

/// The reservations of one admitted request, waiting for their amounts.
#[derive(Debug, Clone)]
pub struct Reservations {
    /// The instant of the decision.
    reserved_at_ms: u64,
    /// Each settled limit as decided, with where its amount comes from.
    items: Vec<Reserved>,
}

/// One settled limit's reservation.
#[derive(Debug, Clone)]
struct Reserved {
    /// The limit's request as decided.
    request: LimitRequest,
    /// Where its amount comes from.
    source: Source,
    /// The limit's `tollgate_settled_units`, when the route's limits are
    /// counted per limit.
    units: Option<Counter>,
    /// The limit's name, for the access log.
    name: Arc<str>,
}

/// A settlement due, with the series that counts its amount once it is
/// settled.
#[derive(Debug, Clone)]
pub struct Due {
    settlement: Settlement,
    units: Option<Counter>,
    name: Arc<str>,
    /// Read from the response body (`from_body`).
    from_body: bool,
}

/// The amounts a recorded request's response body reported, by limit
/// name: the access log's `settled` field ([`written`]), which `tollgate
/// simulate` settles a replayed request's reservations with.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reported(pub Vec<(Arc<str>, u64)>);

impl Reported {
    /// Reads `tpm:123,other:45`, or `-` (nothing read).
    ///
    /// # Errors
    /// A part that is not `name:count`.
    pub fn parse(text: &str) -> Result<Self, String> {
        if text == "-" {
            return Ok(Self::default());
        }
        text.split(',')
            .map(|part| {
                part.split_once(':')
                    .and_then(|(name, n)| Some((name.into(), n.parse().ok()?)))
                    .ok_or_else(|| format!("settled part {part:?} is not name:count"))
            })
            .collect::<Result<_, _>>()
            .map(Self)
    }
}

/// The amounts of `due` read from response bodies, as the access log's
/// `settled` field writes them: `tpm:123`, comma-separated; empty when
/// there are none.
pub fn written(due: &[Due]) -> String {
    let mut out = String::new();
    for d in due.iter().filter(|d| d.from_body) {
        if !out.is_empty() {
            out.push(',');
        }
        out.push_str(&d.name);
        out.push(':');
        out.push_str(itoa::Buffer::new().format(d.settlement.actual));
    }
    out
}

/// What a response body's end tells the reservations waiting for it.
#[derive(Debug, Default)]
pub struct BodyEnd<'a> {
    /// The trailers, when the body ended with them.
    pub trailers: Option<&'a HeaderMap>,
    /// Request body bytes forwarded.
    pub request_bytes: u64,
    /// Response body bytes passed to the client.
    pub response_bytes: u64,
    /// Per `from_body` reader (by [`BodyUsage::written`]): the usage the
    /// body reported, or why the reservation stands.
    pub usage: &'a [(Arc<str>, Result<u64, &'static str>)],
}

/// What the settled limits of a request reserved, when some consumed;
/// `None` (and nothing allocated, no call made) on routes without
/// settled limits.
#[inline]
pub fn pending(
    limits: &[Limit],
    requests: &[LimitRequest],
    decision: &Decision,
    now_ms: u64,
    metrics: Option<&RouteMetrics>,
) -> Option<Reservations> {
    if limits.iter().all(|l| l.settle.is_none()) {
        return None;
    }
    reserved(limits, requests, decision, now_ms, metrics)
}

/// [`pending`] of a route with settled limits.
fn reserved(
    limits: &[Limit],
    requests: &[LimitRequest],
    decision: &Decision,
    now_ms: u64,
    metrics: Option<&RouteMetrics>,
) -> Option<Reservations> {
    let Decision::Decided(d) = decision else {
        return None;
    };
    if !d.allowed {
        return None;
    }
    let shadow_denied = decision.shadow_denied();
    // Per-limit series exist for the route's own limits, not a plan's.
    let per_limit = metrics.filter(|m| m.limits.len() == limits.len());
    let items: Vec<_> = limits
        .iter()
        .zip(requests)
        .zip(&d.verdicts)
        .enumerate()
        .filter_map(|(i, ((l, r), v))| {
            let source = l.settle.clone()?;
            let shadow = r.mode.enforcement == Enforcement::Shadow;
            let consumed = *v == Some(Verdict::Allowed) && !(shadow && shadow_denied);
            consumed.then(|| Reserved {
                request: r.clone(),
                source,
                units: per_limit.and_then(|m| m.limits[i].settled_units.clone()),
                name: l.name.clone(),
            })
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
            .any(|r| matches!(&r.source, Source::Bytes(b) if b.request()))
    }

    /// Whether a reservation waits for the response body (a trailer, bytes
    /// or the usage it reports).
    pub fn waits_for_body(&self) -> bool {
        self.items
            .iter()
            .any(|r| !matches!(r.source, Source::Header(_)))
    }

    /// The `from_body` sources of the reservations, each once.
    pub fn body_sources(&self) -> Vec<BodyUsage> {
        let mut out: Vec<BodyUsage> = Vec::new();
        for r in &self.items {
            if let Source::Body(u) = &r.source
                && !out.contains(u)
            {
                out.push(u.clone());
            }
        }
        out
    }

    /// Takes the `from_header` reservations out and settles them from the
    /// response's `headers`; the others stay for [`Self::at_end`].
    pub async fn header(&mut self, settler: &Settler, now_ms: u64, headers: &HeaderMap) {
        if !self
            .items
            .iter()
            .any(|r| matches!(r.source, Source::Header(_)))
        {
            return;
        }
        let mut due = Vec::new();
        let mut rest = Vec::new();
        for r in std::mem::take(&mut self.items) {
            match &r.source {
                Source::Header(name) => match amount(headers, name) {
                    Some(actual) => due.push(self.due(&r, actual)),
                    None => kept(settler, name, headers.get(name)),
                },
                _ => rest.push(r),
            }
        }
        self.items = rest;
        settle(settler, now_ms, due).await;
    }

    /// The settlements of the reservations left once the response body
    /// ended: a trailer's amount (none when the body ended without
    /// trailers), the bytes counted, the usage the body reported. A
    /// reservation whose amount is missing or garbage stands (counted).
    pub fn at_end(self, settler: &Settler, ended: &BodyEnd<'_>) -> Vec<Due> {
        let mut out = Vec::with_capacity(self.items.len());
        for r in &self.items {
            let actual = match &r.source {
                Source::Header(name) | Source::Trailer(name) => {
                    let found = ended.trailers.and_then(|t| amount(t, name));
                    if found.is_none() {
                        kept(settler, name, ended.trailers.and_then(|t| t.get(name)));
                    }
                    found
                }
                Source::Bytes(b) => Some(
                    if b.request() { ended.request_bytes } else { 0 }.saturating_add(
                        if b.response() {
                            ended.response_bytes
                        } else {
                            0
                        },
                    ),
                ),
                Source::Body(u) => {
                    let read = ended.usage.iter().find(|(w, _)| *w == u.written);
                    match read.map(|(_, r)| *r) {
                        Some(Ok(n)) => Some(n),
                        Some(Err(reason)) => {
                            settler.kept(reason);
                            None
                        }
                        None => {
                            settler.kept("no_usage");
                            None
                        }
                    }
                }
            };
            if let Some(actual) = actual {
                out.push(self.due(r, actual));
            }
        }
        out
    }

    /// Keeps every reservation: the request failed before a response
    /// could report its amounts (`reason`), except byte quotas, which
    /// settle the request bytes forwarded.
    pub fn failed(self, settler: &Settler, reason: &'static str, request_bytes: u64) -> Vec<Due> {
        let mut out = Vec::new();
        for r in &self.items {
            match &r.source {
                Source::Bytes(b) => {
                    let n = if b.request() { request_bytes } else { 0 };
                    out.push(self.due(r, n));
                }
                Source::Body(_) => settler.kept(reason),
                Source::Header(name) | Source::Trailer(name) => kept(settler, name, None),
            }
        }
        out
    }

    /// The settlements of a replayed request: each `from_body`
    /// reservation with the amount the log reported for its limit; the
    /// others stand, as they did when nothing was read.
    pub fn replayed(&self, reported: &Reported) -> Vec<Due> {
        self.items
            .iter()
            .filter(|r| matches!(r.source, Source::Body(_)))
            .filter_map(|r| {
                let (_, n) = reported.0.iter().find(|(name, _)| *name == r.name)?;
                Some(self.due(r, *n))
            })
            .collect()
    }

    fn due(&self, r: &Reserved, actual: u64) -> Due {
        Due {
            settlement: Settlement {
                request: r.request.clone(),
                reserved_at_ms: self.reserved_at_ms,
                actual,
            },
            units: r.units.clone(),
            name: r.name.clone(),
            from_body: matches!(r.source, Source::Body(_)),
        }
    }
}

/// Settles `due` at `now_ms` and counts each amount in its limit's
/// series; a failure leaves the reservations standing, counted by the
/// limiter and warned at most once a minute.
pub async fn settle(settler: &Settler, now_ms: u64, due: Vec<Due>) {
    if due.is_empty() {
        return;
    }
    let settlements: Vec<Settlement> = due.iter().map(|d| d.settlement.clone()).collect();
    if settle_now(settler, now_ms, &settlements).await {
        for d in &due {
            if let Some(c) = &d.units {
                c.inc_by(d.settlement.actual);
            }
        }
    }
}

/// Settles `settlements`; false (warned, counted) when the store could not.
async fn settle_now(settler: &Settler, now_ms: u64, settlements: &[Settlement]) -> bool {
    match settler.settle(now_ms, settlements).await {
        Ok(()) => true,
        Err(e) => {
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
            false
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
