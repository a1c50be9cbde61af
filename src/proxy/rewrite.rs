//! A client request rewritten into the upstream request: target URI,
//! HTTP version, `Host`, hop-by-hop removal and the forwarding fields.

use std::net::IpAddr;

use http::header::{Entry, HOST, HeaderName, HeaderValue, PROXY_AUTHORIZATION};
use http::uri::{PathAndQuery, Scheme};
use http::{HeaderMap, Request, Uri, Version};

use super::forwarding::{Forwarding, X_FORWARDED_FOR, X_FORWARDED_HOST, X_FORWARDED_PROTO};
use super::hop_by_hop::{hop_bit, strip_present};
use super::protocol::Protocol;
use crate::config::Upstream;

/// What the forwarding headers say about the hop into the gateway.
#[derive(Debug, Clone, Copy)]
pub struct Hop<'a> {
    /// The TCP peer.
    pub peer: IpAddr,
    /// Whether the peer is a trusted proxy whose forwarding headers are kept.
    pub trusted: bool,
    /// The scheme the client used to reach the gateway.
    pub scheme: &'a str,
    /// The identity header only a trusted peer may set.
    pub user_header: &'a HeaderName,
    /// The header that names the caller's plan (`plans_from: header:NAME`),
    /// which only a trusted peer may set too.
    pub plan_header: Option<&'a HeaderName>,
}

/// Rewrites a client request into the upstream request: target URI, HTTP
/// version, `Host`, hop-by-hop removal and the `X-Forwarded-*` headers.
///
/// From an untrusted peer the incoming forwarding headers, the user header
/// and the plan header are dropped, so the upstream cannot be lied to
/// through the gateway; from a trusted proxy `X-Forwarded-For` is appended
/// to.
///
/// # Errors
/// The combined URI is invalid (cannot happen for validated upstreams and a
/// request hyper accepted, but it is not assumed).
#[inline]
pub fn rewrite<B>(
    req: &mut Request<B>,
    upstream: &Upstream,
    hop: Hop<'_>,
) -> Result<(), http::Error> {
    rewrite_as(req, upstream, hop, false).map(drop)
}

/// Rewrites a client request as [`rewrite`] does, for one that tollgate's
/// own HTTP/1.1 client writes (a plain `http://` upstream under
/// `server.http1: native`) and that nothing reads or changes the headers
/// of before it is written (no request rules, no upgrade): the target is
/// left in origin form, and the forwarding fields the rewrite adds are
/// returned as a [`Forwarding`] for the writer to write after the map's
/// fields, instead of being inserted into the map, when they can be (an
/// untrusted peer whose one `Host` stays). `None`: they are in the map.
///
/// # Errors
/// As [`rewrite`].
#[inline]
pub fn rewrite_for_native<B>(
    req: &mut Request<B>,
    upstream: &Upstream,
    hop: Hop<'_>,
) -> Result<Option<Forwarding>, http::Error> {
    rewrite_as(req, upstream, hop, true)
}

#[inline]
fn rewrite_as<B>(
    req: &mut Request<B>,
    upstream: &Upstream,
    hop: Hop<'_>,
    native: bool,
) -> Result<Option<Forwarding>, http::Error> {
    let names = Names::of(req.headers(), &hop);
    // The client's one `Host` stays where it is; a host from anywhere else
    // (the URI's authority, or the first of several lines) is written.
    let in_place = names.hosts == 1;
    // As text: every forwarding field is known absent once an untrusted
    // peer's are dropped, and the `Host` in place is `X-Forwarded-Host`'s
    // value — unless a field named in `Connection`, or the user or plan
    // header, was `Host`: then it is written again, as below.
    let text = native && in_place && !hop.trusted;
    let host_may_go = names.hop & 1 != 0 || names.claims;
    let host = if text && !host_may_go {
        None
    } else {
        match req.headers().get(HOST) {
            Some(h) => Some(h.clone()),
            None => req
                .uri()
                .authority()
                .and_then(|a| HeaderValue::from_str(a.as_str()).ok()),
        }
    };
    if native {
        origin_form(req, upstream)?;
    } else {
        *req.uri_mut() = upstream_uri(req.uri(), upstream)?;
    }
    *req.version_mut() = Version::HTTP_11;

    let headers = req.headers_mut();
    // HTTP/1.1 throughout, where gRPC never runs: `te` is the hop's.
    let keep_te_trailers = Protocol::of(&upstream.uri) != Protocol::Http1;
    strip_present(headers, names.hop, keep_te_trailers);
    if names.proxy_authorization && !upstream.forward_proxy_authorization {
        // Credentials for a proxy (RFC 9110 §11.7.4), which the gateway is
        // the last of; a route can opt in to pass them on.
        headers.remove(PROXY_AUTHORIZATION);
    }
    if names.claims && !hop.trusted {
        strip_forwarding(headers, hop.user_header, hop.plan_header);
    }
    if text && (!host_may_go || headers.contains_key(HOST)) {
        return Ok(Some(Forwarding {
            peer: hop.peer,
            https: hop.scheme == "https",
        }));
    }
    append_forwarded_for(headers, hop.peer);
    if let Entry::Vacant(v) = headers.entry(&X_FORWARDED_PROTO) {
        v.insert(HeaderValue::from_static(hop.scheme_static()));
    }
    set_host(headers, host, in_place, upstream);
    Ok(None)
}

/// Sets the request's target to the origin form a connection of its own
/// is told: the upstream's base path, then the request's path and query.
/// A target in origin form under an upstream without a base path is
/// already that, and is left as it is.
fn origin_form<B>(req: &mut Request<B>, upstream: &Upstream) -> Result<(), http::Error> {
    let base = upstream.uri.path().trim_end_matches('/');
    let uri = req.uri();
    if base.is_empty() && uri.authority().is_none() && uri.path_and_query().is_some() {
        return Ok(());
    }
    let pq = join_path(base, uri.path_and_query())?;
    let mut parts = http::uri::Parts::default();
    parts.path_and_query = Some(pq);
    *req.uri_mut() = Uri::from_parts(parts)?;
    Ok(())
}

/// The base path, then the request's path and query (`/` without one).
#[inline]
fn join_path(base: &str, pq: Option<&PathAndQuery>) -> Result<PathAndQuery, http::Error> {
    Ok(match pq {
        // Already validated by hyper: reuse it (a reference-counted clone)
        // instead of parsing it again.
        Some(pq) if base.is_empty() => pq.clone(),
        pq => {
            let pq = pq.map_or("/", PathAndQuery::as_str);
            let mut joined = String::with_capacity(base.len() + pq.len());
            joined.push_str(base);
            joined.push_str(pq);
            PathAndQuery::try_from(joined)?
        }
    })
}

/// The upstream's scheme and authority, its base path, then the request's
/// path and query.
fn upstream_uri(uri: &Uri, upstream: &Upstream) -> Result<Uri, http::Error> {
    let base = upstream.uri.path().trim_end_matches('/');
    let pq = join_path(base, uri.path_and_query())?;
    let mut parts = http::uri::Parts::default();
    // `h2c` names how to connect; on the wire (and as HTTP/2's `:scheme`)
    // the request is `http`.
    parts.scheme = Some(match Protocol::of(&upstream.uri) {
        Protocol::Https => Scheme::HTTPS,
        Protocol::Http1 | Protocol::H2c => Scheme::HTTP,
    });
    parts.authority = upstream.uri.authority().cloned();
    parts.path_and_query = Some(pq);
    Ok(Uri::from_parts(parts)?)
}

/// What a request's field names tell its rewrite, found in one pass over
/// its lines (standard names compare as enum tags, the others by length
/// first).
pub(super) struct Names {
    /// The [`HOP_HEADERS`](super::HOP_HEADERS) it has, as bits by index.
    pub(super) hop: u8,
    /// Its `Host` lines, counted up to two.
    pub(super) hosts: u8,
    /// It has `Proxy-Authorization`.
    pub(super) proxy_authorization: bool,
    /// It has a field only a trusted proxy may send: a forwarding field,
    /// or the user or plan header.
    pub(super) claims: bool,
}

impl Names {
    #[inline]
    pub(super) fn of(headers: &HeaderMap, hop: &Hop<'_>) -> Self {
        let mut names = Self {
            hop: 0,
            hosts: 0,
            proxy_authorization: false,
            claims: false,
        };
        for name in headers.iter().map(|(name, _)| name) {
            if name == hop.user_header || hop.plan_header == Some(name) {
                names.claims = true;
            }
            if name == HOST {
                names.hosts = (names.hosts + 1).min(2);
                continue;
            }
            let bit = hop_bit(name);
            if bit != 0 {
                names.hop |= bit;
                continue;
            }
            match name.as_str() {
                "proxy-authorization" => names.proxy_authorization = true,
                "x-forwarded-for" | "x-forwarded-proto" | "x-forwarded-host" | "forwarded" => {
                    names.claims = true;
                }
                _ => {}
            }
        }
        names
    }
}

/// Drops what an untrusted peer claims about earlier hops: the forwarding
/// headers, and the user and plan headers that only a trusted proxy may
/// set.
fn strip_forwarding(
    headers: &mut HeaderMap,
    user_header: &HeaderName,
    plan_header: Option<&HeaderName>,
) {
    headers.remove(&X_FORWARDED_FOR);
    headers.remove(&X_FORWARDED_PROTO);
    headers.remove(&X_FORWARDED_HOST);
    headers.remove(http::header::FORWARDED);
    headers.remove(user_header);
    if let Some(plan) = plan_header {
        headers.remove(plan);
    }
}

/// Appends the peer as the right-most hop of `X-Forwarded-For`, as one
/// combined line.
fn append_forwarded_for(headers: &mut HeaderMap, peer: IpAddr) {
    // Rendered on the stack: an address is at most 45 bytes.
    let mut buf = [0u8; 48];
    let peer = crate::identity::render_ip(peer, &mut buf);
    // One lookup: the entry is written in place.
    match headers.entry(&X_FORWARDED_FOR) {
        Entry::Vacant(v) => {
            if let Ok(xff) = HeaderValue::from_bytes(peer) {
                v.insert(xff);
            }
        }
        Entry::Occupied(mut o) => {
            let mut joined = Vec::new();
            for v in o.iter() {
                joined.extend_from_slice(v.as_bytes());
                joined.extend_from_slice(b", ");
            }
            joined.extend_from_slice(peer);
            // Replaces every line with the one combined.
            if let Ok(xff) = HeaderValue::from_bytes(&joined) {
                o.insert(xff);
            }
        }
    }
}

/// The client's host goes on as `Host` and `X-Forwarded-Host`; an https
/// or h2c upstream is addressed by its own name instead, in the URI alone.
/// `in_place`: `host` is the one `Host` line `headers` already has.
fn set_host(
    headers: &mut HeaderMap,
    host: Option<HeaderValue>,
    in_place: bool,
    upstream: &Upstream,
) {
    if let Some(h) = host {
        // The client's Host is kept (as Envoy and Traefik do); HTTP/2 clients
        // send `:authority` instead, which becomes `Host` here. A `Host`
        // in place is looked up, not rewritten: it is gone only when the
        // client's `Connection` named it.
        if !in_place {
            headers.insert(HOST, h.clone());
        } else if let Entry::Vacant(v) = headers.entry(HOST) {
            v.insert(h.clone());
        }
        if let Entry::Vacant(v) = headers.entry(&X_FORWARDED_HOST) {
            v.insert(h);
        }
    }
    if Protocol::of(&upstream.uri) != Protocol::Http1 {
        // An https or h2c upstream is addressed by its own name: the
        // certificate and SNI are checked against it. Over HTTP/2 (h2c
        // always) that name is the `:authority` (RFC 9113 §8.3.1), and a
        // `Host` beside it is refused by some servers (nginx: "duplicate
        // host header"), so there is none; over HTTP/1.1 the client sets
        // `Host` from the URI. The client's host travels in
        // X-Forwarded-Host.
        headers.remove(HOST);
    }
}

impl Hop<'_> {
    fn scheme_static(&self) -> &'static str {
        if self.scheme == "https" {
            "https"
        } else {
            "http"
        }
    }
}
