//! The forwarding fields the gateway adds to a request it passes on:
//! `X-Forwarded-For`, `X-Forwarded-Proto` and `X-Forwarded-Host`, and
//! how tollgate's own HTTP/1.1 client writes them as text.

use std::net::IpAddr;

use http::HeaderMap;
use http::header::{HOST, HeaderName, HeaderValue};

/// `X-Forwarded-For`.
pub static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
/// `X-Forwarded-Proto`.
pub static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
/// `X-Forwarded-Host`.
pub static X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");

/// The forwarding fields of a request that tollgate's own HTTP/1.1 client
/// writes ([`rewrite_for_native`](super::rewrite_for_native)), kept out
/// of its header map: its writer writes them as text after the map's
/// fields, in the order and with the bytes an insert into the map would
/// have given them, and whatever else sends the request puts them into
/// the map first ([`Forwarding::materialize`]). `X-Forwarded-For` is the
/// peer, `X-Forwarded-Proto` the scheme, `X-Forwarded-Host` the value of
/// the request's one `Host`.
#[derive(Debug, Clone, Copy)]
pub struct Forwarding {
    pub(super) peer: IpAddr,
    pub(super) https: bool,
}

impl Forwarding {
    /// Writes the fields as lines of a head into `out`; `host` is the
    /// request's `Host`, as its map holds it.
    pub fn write(&self, out: &mut Vec<u8>, host: Option<&HeaderValue>) {
        out.extend_from_slice(b"x-forwarded-for: ");
        let mut buf = [0u8; 48];
        out.extend_from_slice(crate::identity::render_ip(self.peer, &mut buf));
        out.extend_from_slice(if self.https {
            b"\r\nx-forwarded-proto: https\r\n"
        } else {
            b"\r\nx-forwarded-proto: http\r\n"
        });
        if let Some(h) = host {
            out.extend_from_slice(b"x-forwarded-host: ");
            out.extend_from_slice(h.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
    }

    /// Puts the fields into `headers`, for a reader that needs the whole
    /// map (hyper's client), as [`rewrite`](super::rewrite) would have.
    pub fn materialize(self, headers: &mut HeaderMap) {
        let mut buf = [0u8; 48];
        let peer = crate::identity::render_ip(self.peer, &mut buf);
        if let Ok(xff) = HeaderValue::from_bytes(peer) {
            headers.append(&X_FORWARDED_FOR, xff);
        }
        let scheme = if self.https { "https" } else { "http" };
        headers.append(&X_FORWARDED_PROTO, HeaderValue::from_static(scheme));
        if let Some(h) = headers.get(HOST).cloned() {
            headers.append(&X_FORWARDED_HOST, h);
        }
    }
}
