//! Who is calling: client IP, API key, user, headers — and the identity
//! part of a store key built from them ([`write_key`]; `store::keys`
//! names the whole key).
//!
//! The client IP is the TCP peer unless the peer is a trusted proxy; then the
//! forwarding headers are walked from the right (docs/design.md#keys-and-identity). Identity values
//! become part of Redis keys, so every part is either a short run of safe
//! characters or a fixed-length digest: a caller cannot grow keys, inject a
//! hash tag, or make two different identities collide through separators.

pub mod forwarded;

pub use forwarded::canonical;

use std::borrow::Cow;
use std::fmt::Write as _;
use std::net::{IpAddr, Ipv6Addr};

use http::HeaderMap;
use http::header::AUTHORIZATION;
use ipnet::IpNet;
use sha2::{Digest, Sha256};

use crate::config::{ApiKeyConfig, ClientIpConfig, KeySource, KeySpec, PlansFrom, UserConfig};

/// Values longer than this many bytes are hashed before use in a key.
pub const MAX_RAW_LEN: usize = 64;

/// Written in place of an identity the request does not carry; every such
/// request shares this one bucket so absence never bypasses a limit.
pub const ABSENT: &str = "-";

/// The identity of `key: route`: every caller is this one.
pub const ROUTE: &str = "route";

/// The identity sources of one request, extracted once.
#[derive(Debug, Clone)]
pub struct Caller<'a> {
    /// The client IP, already grouped (IPv6 by prefix).
    pub ip: IpNet,
    /// The API key, if any.
    pub api_key: Option<&'a [u8]>,
    /// The authenticated user, if any: from a verified JWT, or from the
    /// user header of a trusted peer.
    pub user: Option<Cow<'a, [u8]>>,
    /// The plan the request names under `plans_from: claim:NAME` (from the
    /// verified JWT) or `header:NAME` (from a trusted peer); `None` under
    /// `plans_from: api_key`, whose plan is the API key's.
    pub plan: Option<Cow<'a, [u8]>>,
    /// The request headers, for `header:NAME` sources.
    pub headers: &'a HeaderMap,
}

/// Everything identity extraction needs from the configuration.
#[derive(Debug, Clone, Copy)]
pub struct IdentityConfig<'c> {
    /// Client IP rules.
    pub client_ip: &'c ClientIpConfig,
    /// API key source.
    pub api_keys: &'c ApiKeyConfig,
    /// User source.
    pub users: &'c UserConfig,
    /// What names the caller's plan.
    pub plans_from: &'c PlansFrom,
}

/// True when `peer` is one of the trusted proxies.
pub fn is_trusted(trusted: &[IpNet], peer: IpAddr) -> bool {
    let peer = canonical(peer);
    trusted.iter().any(|n| n.contains(&peer))
}

/// Groups an address: IPv4 as a /32, IPv6 by `ipv6_prefix`.
pub fn group(ip: IpAddr, ipv6_prefix: u8) -> IpNet {
    match canonical(ip) {
        IpAddr::V4(v4) => IpNet::from(IpAddr::V4(v4)),
        IpAddr::V6(v6) => {
            let bits = u128::from(v6);
            let p = u32::from(ipv6_prefix.min(128));
            let mask = if p == 0 { 0 } else { u128::MAX << (128 - p) };
            IpNet::new(IpAddr::V6(Ipv6Addr::from(bits & mask)), p as u8)
                .unwrap_or_else(|_| IpNet::from(IpAddr::V6(v6)))
        }
    }
}

/// Extracts the identity sources of a request from `peer`'s headers.
pub fn caller<'a>(cfg: IdentityConfig<'_>, peer: IpAddr, headers: &'a HeaderMap) -> Caller<'a> {
    let trusted = is_trusted(&cfg.client_ip.trusted_proxies, peer);
    let client = client_of(cfg.client_ip, trusted, peer, headers);
    // With JWTs configured, `Authorization: Bearer` carries the JWT and the
    // API key comes from its own header only.
    let jwt = cfg.users.jwt.as_ref();
    let api_key = headers
        .get(&cfg.api_keys.header)
        .map(|v| v.as_bytes())
        .filter(|v| !v.is_empty())
        .or_else(|| if jwt.is_some() { None } else { bearer(headers) });
    let verified = jwt
        .and_then(|v| Some((v, bearer(headers)?)))
        .map(|(v, token)| v.verify(token))
        .unwrap_or_default();
    let plan = match cfg.plans_from {
        PlansFrom::ApiKey => None,
        PlansFrom::Claim(_) => verified.plan.map(Cow::Owned),
        PlansFrom::Header(name) if trusted => headers
            .get(name)
            .map(|v| Cow::Borrowed(v.as_bytes()))
            .filter(|v| !v.is_empty()),
        PlansFrom::Header(_) => None,
    };
    let user = verified.user.map(Cow::Owned).or_else(|| {
        if trusted {
            headers
                .get(&cfg.users.header)
                .map(|v| Cow::Borrowed(v.as_bytes()))
                .filter(|v| !v.is_empty())
        } else {
            None
        }
    });
    Caller {
        ip: group(client, cfg.client_ip.ipv6_prefix),
        api_key,
        user,
        plan,
        headers,
    }
}

/// The client's address, ungrouped: `peer` itself, or when `peer` is a
/// trusted proxy the client its forwarding headers name.
pub fn client_ip(cfg: &ClientIpConfig, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
    client_of(cfg, is_trusted(&cfg.trusted_proxies, peer), peer, headers)
}

fn client_of(cfg: &ClientIpConfig, trusted: bool, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
    if trusted {
        forwarded::client_ip(headers, peer, &cfg.trusted_proxies)
    } else {
        canonical(peer)
    }
}

/// The token of `Authorization: Bearer <token>`.
fn bearer(headers: &HeaderMap) -> Option<&[u8]> {
    let v = headers.get(AUTHORIZATION)?.as_bytes();
    let scheme = v.get(..7)?;
    if !scheme.eq_ignore_ascii_case(b"bearer ") {
        return None;
    }
    let token = v[7..].trim_ascii();
    (!token.is_empty()).then_some(token)
}

/// Writes `ip` as text into `buf` and returns the bytes written; IPv4 by
/// hand, since the formatting machinery showed in the per-request profile.
pub fn render_ip(ip: IpAddr, buf: &mut [u8; 48]) -> &[u8] {
    match ip {
        IpAddr::V4(v4) => {
            let mut n = 0;
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    buf[n] = b'.';
                    n += 1;
                }
                if octet >= 100 {
                    buf[n] = b'0' + octet / 100;
                    n += 1;
                }
                if octet >= 10 {
                    buf[n] = b'0' + octet / 10 % 10;
                    n += 1;
                }
                buf[n] = b'0' + octet % 10;
                n += 1;
            }
            &buf[..n]
        }
        IpAddr::V6(_) => {
            let mut w = &mut buf[..];
            let _ = std::io::Write::write_fmt(&mut w, format_args!("{ip}"));
            let left = w.len();
            &buf[..48 - left]
        }
    }
}

/// `net` as `IpNet`'s `Display` writes it (`192.0.2.7/32`): IPv4 without
/// the formatting machinery, which showed in every limited request's
/// profile.
fn push_net(out: &mut String, net: IpNet) {
    let mut buf = [0u8; 48];
    let addr = render_ip(net.addr(), &mut buf);
    out.push_str(std::str::from_utf8(addr).unwrap_or_default());
    out.push('/');
    out.push_str(itoa::Buffer::new().format(net.prefix_len()));
}

/// Appends the identity part of a store key for `spec` to `out`.
///
/// Each compound part is `<source>=<value>`; parts are joined with `,`. A
/// fallback chain writes the first source that is present, or `-` (the
/// shared "absent" bucket) when none is. Values that are long or contain
/// anything outside `[A-Za-z0-9._~:@/+=-]` are replaced by `#` and 32 hex
/// digits of their SHA-256.
pub fn write_key(out: &mut String, spec: &KeySpec, caller: &Caller<'_>) {
    for (i, chain) in spec.parts.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let mut found = false;
        for source in chain {
            found = write_source(out, source, caller);
            if found {
                break;
            }
        }
        if !found {
            out.push_str(ABSENT);
        }
    }
}

/// One source of a key part, as [`write_key`] writes it; false, with
/// nothing written, when the caller has no such value.
pub fn write_source(out: &mut String, source: &KeySource, caller: &Caller<'_>) -> bool {
    match source {
        KeySource::Ip => {
            out.push_str("ip=");
            push_net(out, caller.ip);
            true
        }
        KeySource::ApiKey => caller.api_key.is_some_and(|v| {
            out.push_str("key=");
            push_value(out, v);
            true
        }),
        KeySource::User => caller.user.as_ref().is_some_and(|v| {
            out.push_str("user=");
            push_value(out, v);
            true
        }),
        // Several lines of one header are one identity only if all of them
        // are the same; take the first, as proxies do.
        KeySource::Header(name) => caller
            .headers
            .get(name)
            .filter(|v| !v.is_empty())
            .is_some_and(|v| {
                out.push_str("h:");
                out.push_str(name.as_str());
                out.push('=');
                push_value(out, v.as_bytes());
                true
            }),
        // One identity for all callers; the key's limit part says which
        // route (or share) it counts.
        KeySource::Route => {
            out.push_str(ROUTE);
            true
        }
    }
}

fn safe(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"._~:@/+=-".contains(&b)
}

fn push_value(out: &mut String, v: &[u8]) {
    if v.len() <= MAX_RAW_LEN && v.iter().all(|&b| safe(b)) {
        // All bytes are ASCII, so this is valid UTF-8.
        out.extend(v.iter().map(|&b| b as char));
    } else {
        out.push('#');
        let digest = Sha256::digest(v);
        for b in &digest[..16] {
            let _ = write!(out, "{b:02x}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn spec(parts: Vec<Vec<KeySource>>) -> KeySpec {
        KeySpec { parts }
    }

    #[test]
    fn networks_are_written_as_their_display() {
        for net in [
            "0.0.0.0/32",
            "192.0.2.7/32",
            "255.255.255.255/32",
            "10.0.0.0/8",
            "2001:db8::/64",
            "::1/128",
        ] {
            let net: IpNet = net.parse().unwrap();
            let mut out = String::new();
            push_net(&mut out, net);
            assert_eq!(out, net.to_string());
        }
    }

    fn key(spec: &KeySpec, c: &Caller<'_>) -> String {
        let mut s = String::new();
        write_key(&mut s, spec, c);
        s
    }

    #[test]
    fn ipv6_grouped_by_prefix() {
        let a: IpAddr = "2001:db8:1:2:aaaa::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:bbbb::2".parse().unwrap();
        assert_eq!(group(a, 64), group(b, 64));
        assert_eq!(group(a, 64).to_string(), "2001:db8:1:2::/64");
        assert_ne!(group(a, 128), group(b, 128));
        let mapped: IpAddr = "::ffff:10.1.2.3".parse().unwrap();
        assert_eq!(group(mapped, 64).to_string(), "10.1.2.3/32");
    }

    #[test]
    fn fallback_chain_and_absent() {
        let headers = HeaderMap::new();
        let c = Caller {
            ip: group("1.2.3.4".parse().unwrap(), 64),
            api_key: None,
            user: Some(Cow::Borrowed(b"alice")),
            plan: None,
            headers: &headers,
        };
        let s = spec(vec![vec![
            KeySource::ApiKey,
            KeySource::User,
            KeySource::Ip,
        ]]);
        assert_eq!(key(&s, &c), "user=alice");
        let s = spec(vec![vec![KeySource::ApiKey]]);
        assert_eq!(key(&s, &c), "-");
        let s = spec(vec![
            vec![KeySource::Ip],
            vec![KeySource::Header(http::HeaderName::from_static(
                "x-username",
            ))],
        ]);
        assert_eq!(key(&s, &c), "ip=1.2.3.4/32,-");
    }

    #[test]
    fn long_and_unsafe_values_are_hashed() {
        let mut headers = HeaderMap::new();
        headers.insert("x-a", HeaderValue::from_static("a,b"));
        let long = vec![b'k'; 65];
        let c = Caller {
            ip: group("1.2.3.4".parse().unwrap(), 64),
            api_key: Some(&long),
            user: None,
            plan: None,
            headers: &headers,
        };
        let k = key(&spec(vec![vec![KeySource::ApiKey]]), &c);
        assert!(k.starts_with("key=#") && k.len() == 4 + 1 + 32, "{k}");
        let h = key(
            &spec(vec![vec![KeySource::Header(
                http::HeaderName::from_static("x-a"),
            )]]),
            &c,
        );
        assert!(h.starts_with("h:x-a=#"), "{h}");
        let exact64 = vec![b'k'; 64];
        let c2 = Caller {
            api_key: Some(&exact64),
            ..c.clone()
        };
        assert_eq!(
            key(&spec(vec![vec![KeySource::ApiKey]]), &c2),
            format!("key={}", "k".repeat(64))
        );
    }

    #[test]
    fn bearer_token() {
        let mut h = HeaderMap::new();
        h.insert(AUTHORIZATION, HeaderValue::from_static("Bearer  abc "));
        assert_eq!(bearer(&h), Some(&b"abc"[..]));
        h.insert(AUTHORIZATION, HeaderValue::from_static("Basic abc"));
        assert_eq!(bearer(&h), None);
    }
}
