//! `exempt:` — callers a route's limits do not count. Checked once the
//! caller is known and before any limit (concurrency slots included) or
//! plan is asked: an exempt request is forwarded as if the route had no
//! limits, and counted as `outcome="exempt"`.
//!
//! The address matched is the client as `client_ip.trusted_proxies`
//! resolves it, before IPv6 grouping: behind a trusted proxy it is the
//! client the forwarding headers name, never the proxy's own address
//! (which would exempt every client behind it).

use std::net::IpAddr;

use http::HeaderMap;

use crate::config::{ClientIpConfig, Exempt};
use crate::identity::{self, Caller};

/// Whether `exempt` lets the request of `caller` (from `peer`, with
/// `headers`) through uncounted. Inlined: most routes have no `exempt:`,
/// and their requests then make no call.
#[inline]
pub fn applies(
    exempt: Option<&Exempt>,
    client_ip: &ClientIpConfig,
    peer: IpAddr,
    headers: &HeaderMap,
    caller: &Caller<'_>,
) -> bool {
    exempt.is_some_and(|e| lets_through(e, client_ip, peer, headers, caller))
}

/// [`applies`] of a route with an `exempt:`.
fn lets_through(
    exempt: &Exempt,
    client_ip: &ClientIpConfig,
    peer: IpAddr,
    headers: &HeaderMap,
    caller: &Caller<'_>,
) -> bool {
    if let Some(key) = caller.api_key {
        if exempt.api_keys.iter().any(|k| **k == *key) {
            return true;
        }
    }
    if exempt.ips.is_empty() {
        return false;
    }
    let client = identity::client_ip(client_ip, peer, headers);
    exempt.ips.iter().any(|net| net.contains(&client))
}
