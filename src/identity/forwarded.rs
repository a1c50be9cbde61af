//! The client address behind trusted proxies: `X-Forwarded-For` and
//! `Forwarded: for=` (RFC 7239), walked from the right.
//!
//! Every proxy appends the address it received the request from, so only the
//! right-most entries were written by proxies we trust; anything to the left
//! of the first untrusted entry may be forged by the client. The walk
//! therefore starts at the right, skips trusted addresses and stops at the
//! first untrusted one. An entry that does not parse ends the walk and the
//! hop to its right — the last address a trusted proxy vouched for — is used.
//! Never the left-most value.
//!
//! When a request carries `X-Forwarded-For` it is used; `Forwarded` is read
//! only when there is no `X-Forwarded-For` (the de-facto header wins, as in
//! nginx's realip module; a trusted proxy writes one or the other).
//! All lines of a header are combined in order (RFC 9110 §5.3).

use std::net::{IpAddr, SocketAddr};

use http::HeaderMap;
use http::header::FORWARDED;
use ipnet::IpNet;

const X_FORWARDED_FOR: &str = "x-forwarded-for";

/// The client IP for a request that arrived from the trusted proxy `peer`.
pub fn client_ip(headers: &HeaderMap, peer: IpAddr, trusted: &[IpNet]) -> IpAddr {
    let peer = canonical(peer);
    if headers.contains_key(X_FORWARDED_FOR) {
        let entries = headers
            .get_all(X_FORWARDED_FOR)
            .iter()
            .rev()
            .flat_map(|v| v.as_bytes().rsplit(|&b| b == b','));
        walk(entries.map(parse_xff_entry), peer, trusted)
    } else {
        let mut elements: Vec<Option<IpAddr>> = Vec::new();
        for line in headers.get_all(FORWARDED) {
            forwarded_for(line.as_bytes(), &mut elements);
        }
        walk(elements.into_iter().rev(), peer, trusted)
    }
}

/// Walks hops from the right; see the module docs.
fn walk(hops: impl Iterator<Item = Option<IpAddr>>, peer: IpAddr, trusted: &[IpNet]) -> IpAddr {
    let mut last = peer;
    for hop in hops {
        let Some(ip) = hop else { return last };
        let ip = canonical(ip);
        if !trusted.iter().any(|n| n.contains(&ip)) {
            return ip;
        }
        last = ip;
    }
    last
}

/// One `X-Forwarded-For` entry: `1.2.3.4`, `1.2.3.4:5678`, `2001:db8::1`,
/// `[2001:db8::1]:443`.
pub fn parse_xff_entry(raw: &[u8]) -> Option<IpAddr> {
    let s = std::str::from_utf8(raw.trim_ascii()).ok()?;
    parse_node(s)
}

fn parse_node(s: &str) -> Option<IpAddr> {
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Some(ip);
    }
    if let Ok(sa) = s.parse::<SocketAddr>() {
        return Some(sa.ip());
    }
    // `[v6]` without a port.
    s.strip_prefix('[')?
        .strip_suffix(']')?
        .parse::<IpAddr>()
        .ok()
}

/// Appends the `for=` node of every element of one `Forwarded` line to
/// `out` (`None` for elements without a usable `for=`: `unknown`,
/// obfuscated identifiers, garbage). Honours quoted strings, so a comma or
/// semicolon inside quotes does not split.
pub fn forwarded_for(line: &[u8], out: &mut Vec<Option<IpAddr>>) {
    let mut element_for: Option<Option<IpAddr>> = None;
    let mut start = 0;
    let mut elem_start = 0;
    let mut in_quotes = false;
    let mut escaped = false;
    let mut i = 0;
    while i <= line.len() {
        let b = line.get(i).copied();
        if in_quotes {
            match b {
                Some(b'\\') if !escaped => escaped = true,
                Some(b'"') if !escaped => in_quotes = false,
                None => {
                    // Unterminated quote: the rest is garbage.
                    out.push(None);
                    return;
                }
                _ => escaped = false,
            }
        } else {
            match b {
                Some(b'"') => in_quotes = true,
                Some(b';') | Some(b',') | None => {
                    let pair = line[start..i].trim_ascii();
                    if let Some(v) = for_value(pair) {
                        element_for = Some(v);
                    }
                    start = i + 1;
                    if b != Some(b';') {
                        // Empty list elements (`a,,b`) are ignored (RFC 9110 §5.6.1).
                        if !line[elem_start..i].trim_ascii().is_empty() {
                            out.push(element_for.flatten());
                        }
                        element_for = None;
                        elem_start = i + 1;
                    }
                }
                _ => {}
            }
        }
        i += 1;
    }
}

/// `for=<node>` → the parsed node (`Some(None)` when it is not an address).
fn for_value(pair: &[u8]) -> Option<Option<IpAddr>> {
    let eq = pair.iter().position(|&b| b == b'=')?;
    let (name, value) = (pair[..eq].trim_ascii(), pair[eq + 1..].trim_ascii());
    if !name.eq_ignore_ascii_case(b"for") {
        return None;
    }
    let value = match value {
        [b'"', inner @ .., b'"'] => inner,
        v => v,
    };
    Some(std::str::from_utf8(value).ok().and_then(parse_node))
}

/// IPv4-mapped IPv6 addresses (`::ffff:a.b.c.d`) are IPv4 clients.
pub fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn nets(v: &[&str]) -> Vec<IpNet> {
        v.iter().map(|s| s.parse().unwrap()).collect()
    }

    fn xff(lines: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for l in lines {
            h.append(X_FORWARDED_FOR, HeaderValue::from_str(l).unwrap());
        }
        h
    }

    const PEER: &str = "10.0.0.1";

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn rightmost_untrusted_wins() {
        let t = nets(&["10.0.0.0/8"]);
        let h = xff(&["6.6.6.6, 1.2.3.4, 10.0.0.2"]);
        assert_eq!(client_ip(&h, ip(PEER), &t), ip("1.2.3.4"));
    }

    #[test]
    fn lines_are_combined_in_order() {
        let t = nets(&["10.0.0.0/8"]);
        let h = xff(&["6.6.6.6", "1.2.3.4, 10.0.0.9", "10.0.0.2"]);
        assert_eq!(client_ip(&h, ip(PEER), &t), ip("1.2.3.4"));
    }

    #[test]
    fn garbage_ends_the_walk() {
        let t = nets(&["10.0.0.0/8"]);
        let h = xff(&["1.2.3.4, garbage, 10.0.0.7"]);
        assert_eq!(client_ip(&h, ip(PEER), &t), ip("10.0.0.7"));
        let h = xff(&["1.2.3.4, garbage"]);
        assert_eq!(client_ip(&h, ip(PEER), &t), ip(PEER));
        let h = xff(&[""]);
        assert_eq!(client_ip(&h, ip(PEER), &t), ip(PEER));
    }

    #[test]
    fn all_trusted_gives_leftmost() {
        let t = nets(&["10.0.0.0/8"]);
        let h = xff(&["10.0.0.3, 10.0.0.2"]);
        assert_eq!(client_ip(&h, ip(PEER), &t), ip("10.0.0.3"));
    }

    #[test]
    fn ports_and_brackets() {
        let t = nets(&["10.0.0.0/8"]);
        let h = xff(&["[2001:db8::1]:443"]);
        assert_eq!(client_ip(&h, ip(PEER), &t), ip("2001:db8::1"));
        let h = xff(&["1.2.3.4:5678"]);
        assert_eq!(client_ip(&h, ip(PEER), &t), ip("1.2.3.4"));
    }

    #[test]
    fn forwarded_quoted_ipv6() {
        let t = nets(&["10.0.0.0/8"]);
        let mut h = HeaderMap::new();
        h.append(
            FORWARDED,
            HeaderValue::from_static(
                r#"for=6.6.6.6, for="[2001:db8:cafe::17]:4711";proto=https, for=10.0.0.5"#,
            ),
        );
        assert_eq!(client_ip(&h, ip(PEER), &t), ip("2001:db8:cafe::17"));
    }

    #[test]
    fn forwarded_unknown_and_obfuscated_end_the_walk() {
        let t = nets(&["10.0.0.0/8"]);
        let mut h = HeaderMap::new();
        h.append(
            FORWARDED,
            HeaderValue::from_static("for=1.2.3.4, for=_hidden, for=10.0.0.5"),
        );
        assert_eq!(client_ip(&h, ip(PEER), &t), ip("10.0.0.5"));
        let mut h = HeaderMap::new();
        h.append(
            FORWARDED,
            HeaderValue::from_static(r#"for="1.2.3.4, for=10.0.0.5"#),
        );
        assert_eq!(client_ip(&h, ip(PEER), &t), ip(PEER));
    }

    #[test]
    fn forwarded_quotes_do_not_split() {
        let mut out = Vec::new();
        forwarded_for(br#"for="a,b";by=x, for=1.2.3.4"#, &mut out);
        assert_eq!(out, vec![None, Some(ip("1.2.3.4"))]);
    }
}
