//! The request target made canonical: one path and one authority per
//! request, computed once before routing and used for everything after it —
//! route matching, the forwarded request and the answers the gateway writes.
//!
//! An upstream decodes and normalises the path it receives (nginx, Express,
//! Spring and Django all do, each a little differently). If the gateway
//! routed on the raw bytes and forwarded them, `/api/auth/%6Cogin` or
//! `/api/x/../auth/login` would reach the login handler without the login
//! route's limits. So the gateway normalises first and forwards what it
//! routed on:
//!
//! 1. **Percent-encoding** (RFC 3986 §6.2.2.2): encoded unreserved
//!    characters (`A-Z a-z 0-9 - . _ ~`) are decoded; every other escape is
//!    kept with upper-case hex. A `%` not followed by two hex digits, and a
//!    NUL — encoded as `%00` or raw — are refused (400): a raw NUL would
//!    otherwise be encoded as the `%00` that is refused.
//! 2. **Characters a URI may not hold raw** (bytes ≥ 0x80, `"`, `{`, `|`, …)
//!    are percent-encoded, so each resource has one spelling.
//! 3. **Encoded slashes** (`%2F`, `%5C`) and a raw backslash are refused by
//!    default: upstreams disagree on whether they separate segments.
//!    [`EscapedSlashes::Keep`] forwards them as `%2F`/`%5C` (not a
//!    separator for routing); [`EscapedSlashes::Decode`] turns them into
//!    `/` before the steps below (as WHATWG URL parsers treat `\`).
//! 4. **Doubled slashes** are merged (`//a///b` is `/a/b`), as nginx's
//!    `merge_slashes on` does; can be turned off.
//! 5. **Dot segments** are removed (RFC 3986 §5.2.4), after decoding, so
//!    `%2e%2e` counts. A dot segment carrying parameters (`..;x`, `.;x`) is
//!    refused: servlet containers strip the parameter and then resolve it.
//!
//! Routes match the canonical path with `;parameters` removed from each
//! segment ([`Target::match_path`]): servlet containers (Tomcat, Jetty)
//! drop them before dispatching, so `/login;x=1` reaches the login
//! handler and must carry its limits. The forwarded path keeps them.
//!
//! The authority is the request-target's for absolute-form and HTTP/2
//! requests (RFC 9112 §3.2.2, RFC 9113 §8.3.1), else the `Host` header;
//! lower-cased, one trailing dot of the host dropped. HTTP/2 requests whose
//! `host` header names another authority than `:authority` are refused
//! (RFC 9113 §8.3.1 calls them malformed); an HTTP/1.1 absolute-form
//! request's `Host` is ignored and replaced, as RFC 9112 §3.2.2 requires.

use std::borrow::Cow;

use http::header::HOST;
use http::uri::PathAndQuery;
use http::{HeaderMap, HeaderValue, Request, Uri, Version};

/// What to do with `%2F`, `%5C` and a raw `\` in a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EscapedSlashes {
    /// Answer 400.
    #[default]
    Reject,
    /// Keep them encoded; they are not segment separators.
    Keep,
    /// Decode them to `/`, a separator like any other.
    Decode,
}

impl EscapedSlashes {
    /// Every spelling the configuration accepts, with its value.
    pub const SPELLINGS: [(&'static str, Self); 3] = [
        ("reject", Self::Reject),
        ("keep", Self::Keep),
        ("decode", Self::Decode),
    ];
}

/// How request paths are made canonical (`server.path`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PathRules {
    /// Normalise at all; `false` routes on and forwards the raw path.
    pub normalize: bool,
    /// Merge runs of `/` into one.
    pub merge_slashes: bool,
    /// Encoded slashes and backslashes.
    pub escaped_slashes: EscapedSlashes,
}

impl Default for PathRules {
    fn default() -> Self {
        Self {
            normalize: true,
            merge_slashes: true,
            escaped_slashes: EscapedSlashes::Reject,
        }
    }
}

/// Why a request target was refused (each is a 400).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    /// `%` not followed by two hex digits.
    #[error("invalid percent-encoding in the path")]
    BadPercent,
    /// `%00`, or a raw NUL byte.
    #[error("a NUL (%00) in the path")]
    Nul,
    /// `%2F` or `%5C` under [`EscapedSlashes::Reject`].
    #[error("an encoded slash or backslash (%2F, %5C) in the path")]
    EscapedSlash,
    /// A raw `\` under [`EscapedSlashes::Reject`].
    #[error("a backslash in the path")]
    Backslash,
    /// `..;x` or `.;x` as a segment.
    #[error("a dot segment with parameters (such as ..;x) in the path")]
    DotParameters,
    /// A `Host` that is not a host with an optional port.
    #[error("the Host is not a valid host[:port]")]
    BadHost,
    /// HTTP/2 `:authority` and `host` name different authorities.
    #[error("the host header and :authority disagree")]
    HostMismatch,
}

/// The canonical target of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target<'a> {
    /// The canonical path (no query), forwarded upstream.
    pub path: Cow<'a, str>,
    /// The path routes match: [`Target::path`] without `;parameters`.
    pub match_path: Cow<'a, str>,
    /// The canonical authority (`host[:port]`, lower case), when the
    /// request names one.
    pub authority: Option<Cow<'a, str>>,
    /// The request's `Host` field as sent, when it has one (read once
    /// here, so that [`Rewrite::of`] need not look it up again).
    pub host_header: Option<&'a [u8]>,
}

impl Target<'_> {
    /// The host routes match: the authority without its port.
    pub fn host(&self) -> Option<&str> {
        self.authority.as_deref().map(strip_port)
    }
}

/// What of a request must change for it to carry its canonical target:
/// owned copies, taken while the [`Target`] still borrows the request.
#[derive(Debug, Default)]
pub struct Rewrite {
    path: Option<String>,
    host: Option<HeaderValue>,
}

impl Rewrite {
    /// The changes that make the request `target` was read from carry it
    /// (taken whole, so a rewritten path moves instead of being copied):
    /// nothing in the common case of a canonical path and `Host`.
    pub fn of(target: Target<'_>) -> Self {
        let path = match target.path {
            Cow::Owned(p) => Some(p),
            Cow::Borrowed(_) => None,
        };
        let host = target.authority.as_deref().and_then(|a| {
            let same = target.host_header == Some(a.as_bytes());
            if same {
                None
            } else {
                HeaderValue::from_str(a).ok()
            }
        });
        Self { path, host }
    }

    /// Puts the canonical path (the query kept as sent) and `Host` on `req`.
    ///
    /// # Errors
    /// The URI cannot be rebuilt (the canonical path is ASCII `pchar`s, so
    /// this is not expected); the request must then not be forwarded.
    pub fn apply<B>(self, req: &mut Request<B>) -> Result<(), http::Error> {
        if let Some(path) = self.path {
            let pq = match req.uri().query() {
                Some(q) => format!("{path}?{q}"),
                None => path,
            };
            let mut parts = req.uri().clone().into_parts();
            parts.path_and_query = Some(PathAndQuery::try_from(pq)?);
            *req.uri_mut() = Uri::from_parts(parts)?;
        }
        if let Some(host) = self.host {
            req.headers_mut().insert(HOST, host);
        }
        Ok(())
    }
}

/// The canonical target of a request with this URI, version and headers.
///
/// # Errors
/// A [`TargetError`] for a path or authority that has no canonical form.
pub fn canonical<'a>(
    uri: &'a Uri,
    version: Version,
    headers: &'a HeaderMap,
    rules: &PathRules,
) -> Result<Target<'a>, TargetError> {
    let path = if rules.normalize {
        canonical_path(uri.path(), rules)?
    } else {
        Cow::Borrowed(uri.path())
    };
    let match_path = match &path {
        Cow::Borrowed(p) => without_parameters(p, rules.merge_slashes),
        Cow::Owned(p) => Cow::Owned(without_parameters(p, rules.merge_slashes).into_owned()),
    };
    let host_header = headers.get(HOST);
    Ok(Target {
        path,
        match_path,
        authority: authority(uri, version, host_header)?,
        host_header: host_header.map(HeaderValue::as_bytes),
    })
}

/// The canonical form of `path` (see the module docs); borrowed when
/// `path` is canonical already, which is the common case.
///
/// # Errors
/// A [`TargetError`] for a path that has no canonical form.
pub fn canonical_path<'a>(path: &'a str, rules: &PathRules) -> Result<Cow<'a, str>, TargetError> {
    if !path.starts_with('/') {
        // `*` (OPTIONS) and other non-path forms are matched as they are.
        return Ok(Cow::Borrowed(path));
    }
    if is_canonical(path.as_bytes(), rules) {
        return Ok(Cow::Borrowed(path));
    }
    let decoded = decode(path.as_bytes(), rules.escaped_slashes)?;
    Ok(Cow::Owned(remove_dots(&decoded, rules.merge_slashes)?))
}

/// Whether `path` is already canonical: a cheap scan that gives up on
/// anything the slow path would have to look at.
fn is_canonical(path: &[u8], rules: &PathRules) -> bool {
    let mut prev = 0u8;
    let mut i = 0;
    while i < path.len() {
        let b = path[i];
        if b == b'%' {
            // Only an escape the slow path would write the same way.
            let hex = |j: usize| {
                path.get(j)
                    .copied()
                    .filter(|c| c.is_ascii_digit() || (b'A'..=b'F').contains(c))
                    .and_then(hex_value)
            };
            let (Some(hi), Some(lo)) = (hex(i + 1), hex(i + 2)) else {
                return false;
            };
            let v = hi << 4 | lo;
            let kept_slash =
                matches!(v, b'/' | b'\\') && rules.escaped_slashes == EscapedSlashes::Keep;
            if v == 0 || is_unreserved(v) || (matches!(v, b'/' | b'\\') && !kept_slash) {
                return false;
            }
            prev = b'%';
            i += 3;
            continue;
        }
        if !is_path_char(b) {
            return false;
        }
        if prev == b'/' {
            if b == b'.' {
                // `/.well-known` is fine, but finding out costs a look at
                // the segment; the slow path does it.
                let seg = &path[i..];
                let end = seg.iter().position(|&c| c == b'/').unwrap_or(seg.len());
                let seg = &seg[..end];
                if seg == b"." || seg == b".." || seg.starts_with(b".;") || seg.starts_with(b"..;")
                {
                    return false;
                }
            }
            if b == b'/' && rules.merge_slashes {
                return false;
            }
        }
        prev = b;
        i += 1;
    }
    true
}

/// RFC 3986 `pchar` and `/`, escapes aside: unreserved, sub-delims, `:`,
/// `@` and `/`.
fn is_path_char(b: u8) -> bool {
    is_unreserved(b)
        || matches!(
            b,
            b'!' | b'$'
                | b'&'
                | b'\''
                | b'('
                | b')'
                | b'*'
                | b'+'
                | b','
                | b';'
                | b'='
                | b':'
                | b'@'
                | b'/'
        )
}

fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

fn hex_value(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

const HEX: &[u8; 16] = b"0123456789ABCDEF";

fn push_escaped(out: &mut Vec<u8>, b: u8) {
    out.extend_from_slice(&[b'%', HEX[usize::from(b >> 4)], HEX[usize::from(b & 15)]]);
}

/// Steps 1–3: escapes decoded or upper-cased, raw bytes that need it
/// encoded, slashes by `policy`. The result is ASCII.
fn decode(path: &[u8], policy: EscapedSlashes) -> Result<Vec<u8>, TargetError> {
    let mut out = Vec::with_capacity(path.len() + 8);
    let mut i = 0;
    while i < path.len() {
        let b = path[i];
        i += 1;
        let slash = match b {
            b'%' => {
                let (Some(hi), Some(lo)) = (
                    path.get(i).copied().and_then(hex_value),
                    path.get(i + 1).copied().and_then(hex_value),
                ) else {
                    return Err(TargetError::BadPercent);
                };
                i += 2;
                let v = hi << 4 | lo;
                match v {
                    0 => return Err(TargetError::Nul),
                    b'/' | b'\\' => match policy {
                        EscapedSlashes::Reject => return Err(TargetError::EscapedSlash),
                        EscapedSlashes::Keep => {
                            push_escaped(&mut out, v);
                            continue;
                        }
                        EscapedSlashes::Decode => true,
                    },
                    v if is_unreserved(v) => {
                        out.push(v);
                        continue;
                    }
                    v => {
                        push_escaped(&mut out, v);
                        continue;
                    }
                }
            }
            b'\\' => match policy {
                EscapedSlashes::Reject => return Err(TargetError::Backslash),
                EscapedSlashes::Keep => {
                    push_escaped(&mut out, b);
                    continue;
                }
                EscapedSlashes::Decode => true,
            },
            b if is_path_char(b) => {
                out.push(b);
                continue;
            }
            // Refused here rather than written as the `%00` that is refused,
            // so a canonical path is one the normaliser accepts again.
            0 => return Err(TargetError::Nul),
            b => {
                push_escaped(&mut out, b);
                continue;
            }
        };
        if slash {
            out.push(b'/');
        }
    }
    Ok(out)
}

/// Steps 4–5 on a decoded path (ASCII, starts with `/`): slashes merged,
/// dot segments removed (RFC 3986 §5.2.4), so `/a/b/..` is `/a/` and
/// `/..` is `/`.
fn remove_dots(path: &[u8], merge_slashes: bool) -> Result<String, TargetError> {
    let mut kept: Vec<&[u8]> = Vec::new();
    let mut segments = path[1..].split(|&b| b == b'/').peekable();
    let mut trailing = false;
    while let Some(seg) = segments.next() {
        let last = segments.peek().is_none();
        trailing = false;
        match seg {
            b"" if merge_slashes || last => trailing = last,
            b"." => trailing = last,
            b".." => {
                kept.pop();
                trailing = last;
            }
            s if s.starts_with(b".;") || s.starts_with(b"..;") => {
                return Err(TargetError::DotParameters);
            }
            s => kept.push(s),
        }
    }
    let mut out = String::with_capacity(path.len());
    for seg in &kept {
        out.push('/');
        // `decode` emits ASCII only.
        out.push_str(std::str::from_utf8(seg).unwrap_or_default());
    }
    if trailing || out.is_empty() {
        out.push('/');
    }
    Ok(out)
}

/// `path` with the `;parameters` of each segment removed; with
/// `merge_slashes`, segments left empty by that are merged too.
pub fn without_parameters(path: &str, merge_slashes: bool) -> Cow<'_, str> {
    if !path.contains(';') {
        return Cow::Borrowed(path);
    }
    let mut out = String::with_capacity(path.len());
    let mut segments = path.split('/');
    // The part before the first `/` (empty for a path).
    if let Some(first) = segments.next() {
        out.push_str(first.split(';').next().unwrap_or_default());
    }
    let mut segments = segments.peekable();
    while let Some(seg) = segments.next() {
        let seg = seg.split(';').next().unwrap_or_default();
        if seg.is_empty() && merge_slashes && segments.peek().is_some() {
            continue;
        }
        out.push('/');
        out.push_str(seg);
    }
    if out.is_empty() {
        out.push('/');
    }
    Cow::Owned(out)
}

/// The request's authority, canonical: the URI's (absolute-form, HTTP/2)
/// or the `Host` header's.
fn authority<'a>(
    uri: &'a Uri,
    version: Version,
    host: Option<&'a HeaderValue>,
) -> Result<Option<Cow<'a, str>>, TargetError> {
    let host_header = match host {
        Some(v) => {
            let v = v.to_str().map_err(|_| TargetError::BadHost)?.trim();
            if v.is_empty() { None } else { Some(v) }
        }
        None => None,
    };
    let Some(from_uri) = uri.authority() else {
        return host_header.map(canonical_authority).transpose();
    };
    let chosen = canonical_authority(from_uri.as_str())?;
    if version == Version::HTTP_2
        && let Some(h) = host_header
        && canonical_authority(h)? != chosen
    {
        return Err(TargetError::HostMismatch);
    }
    Ok(Some(chosen))
}

/// `host[:port]` lower-cased, with one trailing dot of the host removed;
/// borrowed when it is canonical already.
///
/// # Errors
/// [`TargetError::BadHost`] when `raw` is not a host with an optional port
/// (user info, a path, an empty host, a bad port).
pub fn canonical_authority(raw: &str) -> Result<Cow<'_, str>, TargetError> {
    if is_canonical_authority(raw.as_bytes()) {
        return Ok(Cow::Borrowed(raw));
    }
    let parsed: http::uri::Authority = raw.parse().map_err(|_| TargetError::BadHost)?;
    if raw.contains('@') || parsed.host().is_empty() {
        return Err(TargetError::BadHost);
    }
    let (host, port) = match raw.strip_prefix('[') {
        Some(_) => {
            let end = raw.find(']').ok_or(TargetError::BadHost)? + 1;
            // An IP literal holds an IPv6 address or an IPvFuture (RFC 3986
            // §3.2.2), and only a `:port` may follow it.
            if !is_ip_literal(&raw[1..end - 1])
                || !matches!(raw.as_bytes().get(end), None | Some(b':'))
            {
                return Err(TargetError::BadHost);
            }
            (&raw[..end], &raw[end..])
        }
        None => match raw.rfind(':') {
            Some(i) => (&raw[..i], &raw[i..]),
            None => (raw, ""),
        },
    };
    if !port.is_empty() && (port.len() == 1 || !port[1..].bytes().all(|b| b.is_ascii_digit())) {
        return Err(TargetError::BadHost);
    }
    let trimmed = host.strip_suffix('.').unwrap_or(host);
    if trimmed.is_empty() || trimmed.ends_with('.') {
        return Err(TargetError::BadHost);
    }
    if trimmed.len() == host.len() && !host.bytes().any(|b| b.is_ascii_uppercase()) {
        return Ok(Cow::Borrowed(raw));
    }
    let mut out = String::with_capacity(raw.len());
    out.push_str(trimmed);
    out.make_ascii_lowercase();
    out.push_str(port);
    Ok(Cow::Owned(out))
}

/// Whether `raw` is a lower-case DNS name or IPv4 address with an optional
/// port, already canonical: the `Host` of almost every request, checked in
/// one pass instead of a full parse.
fn is_canonical_authority(raw: &[u8]) -> bool {
    // One pass: labels of `a-z 0-9 -` joined by single dots, up to the
    // first `:`.
    let mut after_dot = true;
    let mut end = raw.len();
    for (i, &b) in raw.iter().enumerate() {
        match b {
            b'a'..=b'z' | b'0'..=b'9' | b'-' => after_dot = false,
            b'.' if !after_dot => after_dot = true,
            b':' => {
                end = i;
                break;
            }
            _ => return false,
        }
    }
    // An empty host, an empty label or a trailing dot.
    if after_dot {
        return false;
    }
    match raw[end..].split_first() {
        None => true,
        Some((_, port)) => (1..=5).contains(&port.len()) && port.iter().all(u8::is_ascii_digit),
    }
}

/// The inside of an IP literal (RFC 3986 §3.2.2): an IPv6 address, or
/// an IPvFuture (`v` 1*HEXDIG `.` 1*( unreserved / sub-delims / `:` )).
fn is_ip_literal(inside: &str) -> bool {
    if inside.parse::<std::net::Ipv6Addr>().is_ok() {
        return true;
    }
    let Some(rest) = inside.strip_prefix(['v', 'V']) else {
        return false;
    };
    let Some((version, address)) = rest.split_once('.') else {
        return false;
    };
    !version.is_empty()
        && version.bytes().all(|b| b.is_ascii_hexdigit())
        && !address.is_empty()
        && address
            .bytes()
            .all(|b| is_path_char(b) && !matches!(b, b'@' | b'/'))
}

/// `host` without its port (`[v6]:port` gives `v6`).
pub fn strip_port(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match host.bytes().rposition(|b| b == b':') {
        Some(i) if host.as_bytes()[i + 1..].iter().all(u8::is_ascii_digit) => &host[..i],
        _ => host,
    }
}

#[cfg(test)]
mod tests;
