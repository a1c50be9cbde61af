//! Hop-by-hop fields (RFC 9110 §7.6.1): the connection's own, removed
//! from what is passed on in either direction.

use http::HeaderMap;
use http::header::{CONNECTION, HeaderName, HeaderValue, TE};

/// Hop-by-hop headers (RFC 9110 §7.6.1) besides those named in `Connection`.
pub static HOP_HEADERS: [HeaderName; 6] = [
    HeaderName::from_static("connection"),
    HeaderName::from_static("proxy-connection"),
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("te"),
    HeaderName::from_static("transfer-encoding"),
    HeaderName::from_static("upgrade"),
];

/// The bit of `te` in [`HOP_HEADERS`].
pub(super) const TE_BIT: u8 = 1 << 3;

/// Removes hop-by-hop headers, including every header the `Connection`
/// header names.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    strip(headers, false);
}

/// Removes a request's hop-by-hop headers as [`strip_hop_by_hop`] does,
/// except that a `te` naming `trailers` stays, as `te: trailers`: the
/// client accepts trailers (gRPC servers refuse calls without it), and it is
/// the only `te` value HTTP/2 allows (RFC 9113 §8.2.2). Transfer codings
/// are the hop's own business, so any other `te` is removed.
pub fn strip_request_hop_by_hop(headers: &mut HeaderMap) {
    strip(headers, true);
}

#[inline]
fn strip(headers: &mut HeaderMap, keep_te_trailers: bool) {
    let present = hop_fields(headers);
    strip_present(headers, present, keep_te_trailers);
}

/// Which of [`HOP_HEADERS`] `headers` holds, as bits by index: one pass
/// over the names.
#[inline]
pub(super) fn hop_fields(headers: &HeaderMap) -> u8 {
    headers.keys().fold(0, |present, k| present | hop_bit(k))
}

/// The bit of `name` in [`hop_fields`]; 0 for a name not hop-by-hop. A
/// name is matched by its length first, then its bytes.
#[inline]
pub(super) fn hop_bit(name: &HeaderName) -> u8 {
    match name.as_str() {
        "connection" => 1,
        "proxy-connection" => 1 << 1,
        "keep-alive" => 1 << 2,
        "te" => TE_BIT,
        "transfer-encoding" => 1 << 4,
        "upgrade" => 1 << 5,
        _ => 0,
    }
}

/// Removes the hop-by-hop headers `present` ([`hop_fields`]) says are
/// there, and those `Connection` names.
#[inline]
pub(super) fn strip_present(headers: &mut HeaderMap, present: u8, keep_te_trailers: bool) {
    // Only the headers found are removed, each removal being a hashed
    // lookup. Most requests carry none and most responses only
    // `Connection: keep-alive`.
    if present == 0 {
        return;
    }
    let te_trailers = keep_te_trailers && present & TE_BIT != 0 && asks_for_trailers(headers);
    if present & 1 != 0 {
        // Names in `Connection` that are hop-by-hop anyway were found above;
        // `close` is the connection option (RFC 9112 §9.6), not a field.
        let named: Vec<HeaderName> = headers
            .get_all(CONNECTION)
            .iter()
            .flat_map(|v| v.as_bytes().split(|&b| b == b','))
            .map(<[u8]>::trim_ascii)
            .filter(|t| {
                !t.is_empty()
                    && !t.eq_ignore_ascii_case(b"close")
                    && !HOP_HEADERS
                        .iter()
                        .any(|h| t.eq_ignore_ascii_case(h.as_str().as_bytes()))
            })
            .filter_map(|t| HeaderName::from_bytes(t).ok())
            .collect();
        for name in &named {
            headers.remove(name);
        }
    }
    for (i, name) in HOP_HEADERS.iter().enumerate() {
        if present & (1 << i) != 0 {
            headers.remove(name);
        }
    }
    if te_trailers {
        headers.insert(TE, HeaderValue::from_static("trailers"));
    }
}

/// Whether a `te` line names `trailers` (RFC 9110 §10.1.4: a list of
/// codings with parameters, `trailers` among them).
fn asks_for_trailers(headers: &HeaderMap) -> bool {
    headers
        .get_all(TE)
        .iter()
        .flat_map(|v| v.as_bytes().split(|&b| b == b','))
        .map(|t| {
            t.split(|&b| b == b';')
                .next()
                .unwrap_or_default()
                .trim_ascii()
        })
        .any(|t| t.eq_ignore_ascii_case(b"trailers"))
}
