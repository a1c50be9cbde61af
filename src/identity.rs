//! Who is calling: client IP, API key, user, headers — the identity part
//! of a store key built from them ([`write_key`]; `store::keys` names the
//! whole key), and how a person is shown an identity ([`write_shown`],
//! with an API key as its one [`digest`]).
//!
//! The client IP is the TCP peer unless the peer is a trusted proxy; then the
//! forwarding headers are walked from the right (docs/design.md#keys-and-identity). Identity values
//! become part of Redis keys, so every part is either a short run of safe
//! characters or a fixed-length digest: a caller cannot grow keys, inject a
//! hash tag, or make two different identities collide through separators.

pub mod forwarded;
mod sources;

pub use forwarded::canonical;
pub use sources::Sources;

use std::borrow::Cow;
use std::fmt::Write as _;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::Arc;

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

/// The address a request's connection came from, as a request extension:
/// the gateway's listener puts it on every request, and the key sources
/// that read the connection (the client IP) take it from there. An
/// application serving with axum or tonic puts its own connection info
/// there, or names where to find it (see `docs/embedding.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer(pub std::net::SocketAddr);

/// The caller an application names itself, as a request extension (an
/// application's `RateLimitLayer` puts it there from its key closure):
/// it stands for the authenticated user, so limits keyed `user` count by
/// it, ahead of any user header or JWT.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppKey(pub Arc<str>);

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
    /// The fields of the request's JSON body its limits read, for
    /// `json:FIELD` sources; `None` when the body is not read.
    pub body: Option<&'a BodyFields>,
}

/// The fields of a request's JSON body that its limits read, taken out
/// once: by the pipeline from the body it peeked, by `simulate` from an
/// access-log line.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BodyFields {
    /// `json:FIELD` key sources: each field's name and its string value
    /// (absent: the field is missing or not a string).
    pub text: Vec<(Arc<str>, Box<[u8]>)>,
    /// `reserve: { json: FIELD }`: each field's name and its count.
    pub counts: Vec<(Arc<str>, u64)>,
}

impl BodyFields {
    /// The string value of field `name`.
    pub fn text(&self, name: &str) -> Option<&[u8]> {
        self.text
            .iter()
            .find(|(n, _)| &**n == name)
            .map(|(_, v)| &v[..])
    }

    /// The count in field `name`.
    pub fn count(&self, name: &str) -> Option<u64> {
        self.counts
            .iter()
            .find(|(n, _)| &**n == name)
            .map(|(_, v)| *v)
    }
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
    caller_reading(cfg, peer, headers, Sources::ALL)
}

/// [`caller`] with only the values `read` names looked up: the others are
/// absent.
pub fn caller_reading<'a>(
    cfg: IdentityConfig<'_>,
    peer: IpAddr,
    headers: &'a HeaderMap,
    read: Sources,
) -> Caller<'a> {
    // Made canonical once (`::ffff:a.b.c.d` is IPv4) for the trust check
    // and the forwarding headers' walk.
    let peer = canonical(peer);
    let trusted = cfg
        .client_ip
        .trusted_proxies
        .iter()
        .any(|n| n.contains(&peer));
    let client = client_of(cfg.client_ip, trusted, peer, headers);
    let ip = group(client, cfg.client_ip.ipv6_prefix);
    if !read.api_key && !read.user {
        return Caller {
            ip,
            api_key: None,
            user: None,
            plan: None,
            headers,
            body: None,
        };
    }
    // With JWTs configured, `Authorization: Bearer` carries the JWT and the
    // API key comes from its own header only.
    let jwt = cfg.users.jwt.as_ref();
    let api_key = read
        .api_key
        .then(|| {
            headers
                .get(&cfg.api_keys.header)
                .map(|v| v.as_bytes())
                .filter(|v| !v.is_empty())
                .or_else(|| if jwt.is_some() { None } else { bearer(headers) })
        })
        .flatten();
    let verified = jwt
        .filter(|_| read.user)
        .and_then(|v| Some((v, bearer(headers)?)))
        .map(|(v, token)| v.verify(token))
        .unwrap_or_default();
    let plan = match cfg.plans_from {
        _ if !read.user => None,
        PlansFrom::ApiKey => None,
        PlansFrom::Claim(_) => verified.plan.map(Cow::Owned),
        PlansFrom::Header(name) if trusted => headers
            .get(name)
            .map(|v| Cow::Borrowed(v.as_bytes()))
            .filter(|v| !v.is_empty()),
        PlansFrom::Header(_) => None,
    };
    let user = verified.user.map(Cow::Owned).or_else(|| {
        if trusted && read.user {
            headers
                .get(&cfg.users.header)
                .map(|v| Cow::Borrowed(v.as_bytes()))
                .filter(|v| !v.is_empty())
        } else {
            None
        }
    });
    Caller {
        ip,
        api_key,
        user,
        plan,
        headers,
        body: None,
    }
}

/// The client's address, ungrouped: `peer` itself, or when `peer` is a
/// trusted proxy the client its forwarding headers name.
pub fn client_ip(cfg: &ClientIpConfig, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
    let peer = canonical(peer);
    client_of(cfg, is_trusted(&cfg.trusted_proxies, peer), peer, headers)
}

/// [`client_ip`] of a canonical `peer`.
fn client_of(cfg: &ClientIpConfig, trusted: bool, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
    if trusted {
        forwarded::client_ip(headers, peer, &cfg.trusted_proxies)
    } else {
        peer
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

/// `net` as `IpNet`'s `Display` writes it (`192.0.2.7/32`): IPv4 a
/// digit at a time, without the formatting machinery, which showed in
/// every limited request's profile.
fn push_net(out: &mut String, net: IpNet) {
    match net.addr() {
        IpAddr::V4(v4) => {
            // `255.255.255.255/32`: 18 bytes.
            out.reserve(18);
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    out.push('.');
                }
                push_decimal(out, octet);
            }
        }
        ip @ IpAddr::V6(_) => {
            let mut buf = [0u8; 48];
            // `render_ip` writes ASCII only.
            out.push_str(std::str::from_utf8(render_ip(ip, &mut buf)).unwrap_or_default());
        }
    }
    out.push('/');
    push_decimal(out, net.prefix_len());
}

/// Every `u8` in decimal, as its number of digits and its three digits
/// (leading zeros unused): looked up, not divided out, for the key of
/// every request limited by IP.
const DECIMALS: [[u8; 4]; 256] = {
    let mut table = [[0u8; 4]; 256];
    let mut n = 0;
    while n < 256 {
        let (h, t, u) = ((n / 100) as u8, (n / 10 % 10) as u8, (n % 10) as u8);
        let len = if h > 0 {
            3
        } else if t > 0 {
            2
        } else {
            1
        };
        table[n] = [len, b'0' + h, b'0' + t, b'0' + u];
        n += 1;
    }
    table
};

/// Appends `n` in decimal.
#[inline]
fn push_decimal(out: &mut String, n: u8) {
    let [len, h, t, u] = DECIMALS[usize::from(n)];
    if len == 3 {
        out.push(char::from(h));
    }
    if len >= 2 {
        out.push(char::from(t));
    }
    out.push(char::from(u));
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
        KeySource::Json(field) => caller
            .body
            .and_then(|b| b.text(&field.name))
            .filter(|v| !v.is_empty())
            .is_some_and(|v| {
                out.push_str("json.");
                out.push_str(&field.name);
                out.push('=');
                push_value(out, v);
                true
            }),
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

/// Hex digits of SHA-256 in a [`digest`].
const DIGEST_HEX: usize = 16;

/// The one digest a person is shown in place of a value kept from them:
/// `sha256:` and the first 16 hex digits of the SHA-256 of the value as
/// the request sent it (`printf %s KEY | sha256sum | cut -c1-16`).
///
/// An API key is shown only so, wherever a person sees one: the support
/// API's answers and the command line's tables, `/admin/top`, audit lines,
/// the access log's `caller`. The support API takes it in place of the
/// key. `/admin/top` shows every value so ([`write_shown`]). Store keys
/// carry digests of their own (`store::keys`), which are not this one.
pub fn digest(value: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let sum = Sha256::digest(value);
    let mut out = String::with_capacity(7 + DIGEST_HEX);
    out.push_str("sha256:");
    for b in &sum[..DIGEST_HEX / 2] {
        out.push(char::from(HEX[usize::from(b >> 4)]));
        out.push(char::from(HEX[usize::from(b & 15)]));
    }
    out
}

/// Whether `text` is written as [`digest`] writes.
pub fn is_digest(text: &str) -> bool {
    text.strip_prefix("sha256:").is_some_and(|h| {
        h.len() == DIGEST_HEX
            && h.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// Appends `caller`'s identity for `spec` as a person is shown it: as
/// [`write_key`] writes it (`source=value` parts joined with `,`, `-` for
/// a part the caller lacks), with an API key as its [`digest`]
/// (`key=sha256:…`). With `every`, every value is its digest
/// (`ip=sha256:…`, `user=sha256:…`): for `/admin/top` and the log lines
/// of shadow denials, which no token guards.
pub fn write_shown(out: &mut String, spec: &KeySpec, caller: &Caller<'_>, every: bool) {
    for (i, chain) in spec.parts.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        if !chain
            .iter()
            .any(|s| write_shown_source(out, s, caller, every))
        {
            out.push_str(ABSENT);
        }
    }
}

/// The parts of `spec` that `caller` lacks, each as its chain is written
/// in the file (`api_key`, `api_key | user`): the shared "absent" bucket
/// it is counted in.
pub fn absent_parts(spec: &KeySpec, caller: &Caller<'_>) -> Vec<String> {
    let mut scratch = String::new();
    spec.parts
        .iter()
        .filter(|chain| !chain.iter().any(|s| write_source(&mut scratch, s, caller)))
        .map(|chain| {
            chain
                .iter()
                .map(source_name)
                .collect::<Vec<_>>()
                .join(" | ")
        })
        .collect()
}

/// An identity's store-key text (as [`write_key`] writes it) shown as
/// `/admin/top` shows one: every value as its [`digest`], a value that is
/// one already (an API key replayed from an access log) as it is.
pub fn shown_text(text: &str) -> String {
    let parts = text.split(',').map(|part| match part.split_once('=') {
        Some((_, value)) if is_digest(value) => part.to_owned(),
        Some((source, value)) => format!("{source}={}", digest(value.as_bytes())),
        None => part.to_owned(),
    });
    parts.collect::<Vec<_>>().join(",")
}

/// `source` as the file spells it.
fn source_name(source: &KeySource) -> String {
    match source {
        KeySource::Ip => "ip".into(),
        KeySource::ApiKey => "api_key".into(),
        KeySource::User => "user".into(),
        KeySource::Header(h) => format!("header:{h}"),
        KeySource::Route => ROUTE.into(),
        KeySource::Json(f) => format!("json:{}", f.name),
    }
}

fn write_shown_source(
    out: &mut String,
    source: &KeySource,
    caller: &Caller<'_>,
    every: bool,
) -> bool {
    let value = |out: &mut String, name: &str, v: &[u8]| {
        out.push_str(name);
        out.push('=');
        out.push_str(&digest(v));
        true
    };
    match source {
        KeySource::ApiKey => caller.api_key.is_some_and(|k| value(out, "key", k)),
        _ if !every => write_source(out, source, caller),
        KeySource::Ip => {
            let mut net = String::new();
            push_net(&mut net, caller.ip);
            value(out, "ip", net.as_bytes())
        }
        KeySource::User => caller.user.as_ref().is_some_and(|u| value(out, "user", u)),
        KeySource::Header(name) => caller
            .headers
            .get(name)
            .filter(|v| !v.is_empty())
            .is_some_and(|v| value(out, &format!("h:{name}"), v.as_bytes())),
        KeySource::Route => write_source(out, source, caller),
        KeySource::Json(field) => caller
            .body
            .and_then(|b| b.text(&field.name))
            .filter(|v| !v.is_empty())
            .is_some_and(|v| value(out, &format!("json.{}", field.name), v)),
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
            "1.22.100.9/24",
            "2001:db8::/64",
            "::ffff:192.0.2.1/128",
            "::1/128",
        ] {
            let net: IpNet = net.parse().unwrap();
            let mut out = String::new();
            push_net(&mut out, net);
            assert_eq!(out, net.to_string());
        }
        for n in 0..=255u8 {
            let net = IpNet::new(IpAddr::from([n, 255 - n, n / 3, n % 7]), n % 33).unwrap();
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
            body: None,
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
    fn an_api_key_is_shown_by_one_digest() {
        // printf %s k1 | sha256sum | cut -c1-16
        assert_eq!(digest(b"k1"), "sha256:6ab9f1eb8f7d3388");
        assert!(is_digest("sha256:6ab9f1eb8f7d3388"));
        for not in [
            "sha256:6AB9F1EB8F7D3388",
            "sha256:6ab9",
            "6ab9f1eb8f7d3388",
            "k1",
        ] {
            assert!(!is_digest(not), "{not}");
        }
        let headers = HeaderMap::new();
        let long = [b'k'; 100];
        let c = Caller {
            ip: group("192.0.2.3".parse().unwrap(), 64),
            api_key: Some(b"k1"),
            user: Some(Cow::Borrowed(b"alice")),
            plan: None,
            headers: &headers,
            body: None,
        };
        let s = spec(vec![vec![KeySource::Ip], vec![KeySource::ApiKey]]);
        let shown = |c: &Caller<'_>, every: bool| {
            let mut out = String::new();
            write_shown(&mut out, &s, c, every);
            out
        };
        assert_eq!(
            shown(&c, false),
            "ip=192.0.2.3/32,key=sha256:6ab9f1eb8f7d3388"
        );
        let every = "ip=sha256:1a66d478ad212d54,key=sha256:6ab9f1eb8f7d3388";
        assert_eq!(shown(&c, true), every);
        assert_eq!(
            shown_text("ip=192.0.2.3/32,key=sha256:6ab9f1eb8f7d3388"),
            every
        );
        // A key too long for a store key is still shown by its own digest.
        let c = Caller {
            api_key: Some(&long),
            ..c
        };
        assert_eq!(
            shown(&c, false),
            format!("ip=192.0.2.3/32,key={}", digest(&long))
        );
        let c = Caller { api_key: None, ..c };
        assert_eq!(shown(&c, false), "ip=192.0.2.3/32,-");
        let chain = spec(vec![vec![
            KeySource::ApiKey,
            KeySource::Header(http::HeaderName::from_static("x-k")),
        ]]);
        assert_eq!(absent_parts(&chain, &c), ["api_key | header:x-k"]);
        assert!(
            absent_parts(
                &s,
                &Caller {
                    api_key: Some(b"k1"),
                    ..c
                }
            )
            .is_empty()
        );
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
            body: None,
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
