//! Forwarding to upstreams: request rewriting, hop-by-hop removal and the
//! pooled HTTP client.
//!
//! Bodies are never buffered: the client's body is handed to the upstream
//! request and the upstream's ([`Received`]) is handed back to the client,
//! so both directions stream with back-pressure. The request
//! body is wrapped in [`UpstreamBody`], so a body past `server.max_body_size`
//! that was not announced by `Content-Length` is cut off while it streams
//! and answered 413, and a client body that fails on the way (malformed
//! chunks, a client gone mid-upload) is answered and counted as the
//! client's fault, not the upstream's.
//!
//! How an upstream is spoken to follows its URL's scheme ([`Protocol`]):
//! `http://` over HTTP/1.1 on the route's own [`KeepAlive`] connections
//! (hyper's client, or tollgate's own under `server.http1: native`), `h2c://` over
//! cleartext HTTP/2 with prior knowledge (hyper-util's client, one
//! multiplexed connection per upstream), `https://` through hyper-rustls:
//! SNI and certificate checks against the upstream's host name, the webpki
//! roots or the route's `upstream_ca`, and HTTP/2 when the upstream offers
//! it by ALPN. Clients for routes with their own CA are built on first use
//! and cached by the identity of their TLS settings, which a reload
//! replaces.
//!
//! Requests to upstreams that may speak HTTP/2 (`h2c://`, `https://`) keep
//! `te: trailers`, the one `te` an HTTP/2 request may carry (RFC 9113
//! §8.2.2) and the one gRPC servers insist on; trailers pass both ways as
//! frames of the streamed bodies. A gRPC call's deadline
//! ([`Deadline`]) bounds the wait for the response head when it is shorter
//! than the route's timeout.
//!
//! A route naming a pool under `upstreams` forwards through the pool's
//! [`Balancer`]: each try goes to the target it picks, a target that
//! cannot be reached costs nothing but a try elsewhere, and idempotent
//! bodiless requests are retried within the pool's budget (`tries`). The
//! balancer's names are kept resolved (`resolve`) and its targets checked
//! (`health`) by tasks that end with it.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use tokio_rustls::rustls::ClientConfig;

use crate::config::{Http1, TargetScheme, Timeouts, Upstream, UpstreamPool};
use crate::problem::GatewayError;
use http::header::{CONNECTION, Entry, HOST, HeaderName, HeaderValue, PROXY_AUTHORIZATION, TE};
use http::uri::{PathAndQuery, Scheme};
use http::{HeaderMap, Request, Response, Uri, Version};
use http_body_util::Either;

mod body;
mod client;
mod counted;
pub mod dial;
pub mod h1;
pub mod io;
mod keepalive;
mod local;
mod peek;
mod received;
pub mod rules;
pub mod upstreams;
mod watched;
pub use body::{ClientBody, ClientBodyError, UpstreamBody};
use body::{error_chain, failed};
use client::{UpstreamClient, build_client};
pub use counted::BodyBytes;
pub use keepalive::{ConnSettings, KeepAlive};
pub use local::Local;
pub use peek::{PeekBudget, Peekable, Replay, peek};
pub use received::Received;
pub use upstreams::balancer::{Balancer, Endpoint, EndpointState, hash64 as hash_key};
pub use upstreams::tries::Answered;
use upstreams::{health, resolve, tries};
pub use watched::{Watch, Watched};

/// Body of every response the gateway sends: streamed from an upstream
/// (with whatever watches it end, [`Watched`]), or made by the gateway
/// ([`Local`]).
pub type Body = Either<Watched, Local>;

impl crate::http1::text_fields::TextFields for Body {
    fn late(&self) -> Option<&crate::http1::write::LateFields> {
        match self {
            Either::Left(_) => None,
            Either::Right(local) => local.late(),
        }
    }

    fn passed(&self) -> Option<&crate::http1::fields::Passed> {
        match self {
            Either::Left(watched) => watched.get_ref().passed(),
            Either::Right(_) => None,
        }
    }

    fn take_passed(&mut self) -> Option<Box<crate::http1::fields::Passed>> {
        match self {
            Either::Left(watched) => watched.get_mut().take_passed(),
            Either::Right(_) => None,
        }
    }
}

/// Request extension marking a request that arrived over TLS; the
/// forwarder reads it to set `X-Forwarded-Proto: https`.
#[derive(Debug, Clone, Copy)]
pub struct Secure;

/// Request extension: a gRPC call's deadline (its `grpc-timeout`, counted
/// from its arrival). The forwarder waits for the response head at most
/// until then when it comes before the route's timeout, and answers
/// [`GatewayError::DeadlineExceeded`] when it passes.
#[derive(Debug, Clone, Copy)]
pub struct Deadline {
    /// When the deadline passes.
    pub at: Instant,
    /// The `grpc-timeout` the caller sent.
    pub budget: Duration,
}

/// How the gateway speaks to an upstream, by the scheme of its URL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// `http://`: HTTP/1.1.
    Http1,
    /// `https://`: TLS, then HTTP/2 or HTTP/1.1 as ALPN settles.
    Https,
    /// `h2c://`: cleartext HTTP/2 with prior knowledge (RFC 9113 §3.3).
    H2c,
}

impl Protocol {
    /// The protocol of an upstream URL (`http`, `https` or `h2c`, as the
    /// configuration loader admits).
    pub fn of(uri: &Uri) -> Self {
        match uri.scheme() {
            Some(s) if *s == Scheme::HTTPS => Self::Https,
            Some(s) if s.as_str() == "h2c" => Self::H2c,
            _ => Self::Http1,
        }
    }
}

/// Hop-by-hop headers (RFC 9110 §7.6.1) besides those named in `Connection`.
pub static HOP_HEADERS: [HeaderName; 6] = [
    HeaderName::from_static("connection"),
    HeaderName::from_static("proxy-connection"),
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("te"),
    HeaderName::from_static("transfer-encoding"),
    HeaderName::from_static("upgrade"),
];

/// `X-Forwarded-For`.
pub static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
/// `X-Forwarded-Proto`.
pub static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
/// `X-Forwarded-Host`.
pub static X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");

/// The bit of `te` in [`HOP_HEADERS`].
const TE_BIT: u8 = 1 << 3;

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
fn hop_fields(headers: &HeaderMap) -> u8 {
    headers.keys().fold(0, |present, k| present | hop_bit(k))
}

/// The bit of `name` in [`hop_fields`]; 0 for a name not hop-by-hop. A
/// name is matched by its length first, then its bytes.
#[inline]
fn hop_bit(name: &HeaderName) -> u8 {
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
fn strip_present(headers: &mut HeaderMap, present: u8, keep_te_trailers: bool) {
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

/// The forwarding fields of a request that tollgate's own HTTP/1.1 client
/// writes ([`rewrite_for_native`]), kept out of its header map: its
/// writer writes them as text after the map's fields, in the order and
/// with the bytes an insert into the map would have given them, and
/// whatever else sends the request puts them into the map first
/// ([`Forwarding::materialize`]). `X-Forwarded-For` is the peer,
/// `X-Forwarded-Proto` the scheme, `X-Forwarded-Host` the value of the
/// request's one `Host`.
#[derive(Debug, Clone, Copy)]
pub struct Forwarding {
    peer: IpAddr,
    https: bool,
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
    /// map (hyper's client), as [`rewrite`] would have.
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
struct Names {
    /// The [`HOP_HEADERS`] it has, as bits by index.
    hop: u8,
    /// Its `Host` lines, counted up to two.
    hosts: u8,
    /// It has `Proxy-Authorization`.
    proxy_authorization: bool,
    /// It has a field only a trusted proxy may send: a forwarding field,
    /// or the user or plan header.
    claims: bool,
}

impl Names {
    #[inline]
    fn of(headers: &HeaderMap, hop: &Hop<'_>) -> Self {
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

/// A client for one route's own CA, keyed by the TLS settings it was built
/// from.
type CustomClient = (Arc<ClientConfig>, UpstreamClient);

/// The pooled keep-alive client to upstreams.
#[derive(Clone, Debug)]
pub struct Forwarder {
    /// For `http://` upstreams and `https://` ones checked against the
    /// webpki roots.
    client: UpstreamClient,
    /// For `h2c://` upstreams: HTTP/2 only, one multiplexed connection
    /// per upstream.
    h2c: UpstreamClient,
    /// Clients for routes with their own CA file, by their TLS settings.
    custom: Arc<ArcSwap<Vec<CustomClient>>>,
    connect_timeout: Duration,
    idle_timeout: Duration,
    /// Whose client speaks to pools' plain `http://` targets.
    http1: Http1,
}

impl Forwarder {
    /// A client with the connect and idle timeouts of `timeouts`, speaking
    /// to pools' plain `http://` targets with `http1`'s client.
    ///
    /// # Errors
    /// The TLS settings for https upstreams cannot be built.
    pub fn new(timeouts: &Timeouts, http1: Http1) -> Result<Self, crate::tls::TlsError> {
        let tls = crate::tls::client_config(None)?;
        Ok(Self {
            client: build_client(
                &tls,
                timeouts.upstream_connect,
                timeouts.upstream_idle,
                false,
            ),
            h2c: build_client(
                &tls,
                timeouts.upstream_connect,
                timeouts.upstream_idle,
                true,
            ),
            custom: Arc::default(),
            connect_timeout: timeouts.upstream_connect,
            idle_timeout: timeouts.upstream_idle,
            http1,
        })
    }

    /// The client for `upstream`: a shared one borrowed (a clone of the
    /// client is several reference counts, paid per request otherwise), or
    /// the route's own.
    fn client_for(&self, upstream: &Upstream) -> std::borrow::Cow<'_, UpstreamClient> {
        if Protocol::of(&upstream.uri) == Protocol::H2c {
            return std::borrow::Cow::Borrowed(&self.h2c);
        }
        let Some(tls) = &upstream.tls else {
            return std::borrow::Cow::Borrowed(&self.client);
        };
        std::borrow::Cow::Owned(self.custom_client(tls))
    }

    fn custom_client(&self, tls: &Arc<ClientConfig>) -> UpstreamClient {
        if let Some((_, c)) = self.custom.load().iter().find(|(t, _)| Arc::ptr_eq(t, tls)) {
            return c.clone();
        }
        let client = build_client(tls, self.connect_timeout, self.idle_timeout, false);
        self.custom.rcu(|cached| {
            // Settings only this cache still holds belong to a configuration
            // that was replaced: drop their clients.
            let mut next: Vec<_> = cached
                .iter()
                .filter(|(t, _)| Arc::strong_count(t) > 1)
                .cloned()
                .collect();
            next.push((tls.clone(), client.clone()));
            next
        });
        client
    }

    /// Sends the rewritten request to `upstream` and waits at most its
    /// timeout — or the request's [`Deadline`], when that comes first — for
    /// the response head; the body then streams without a deadline. The
    /// request body is cut off past `max_body` bytes.
    ///
    /// # Errors
    /// [`GatewayError::UpstreamConnect`] when no connection could be made,
    /// [`GatewayError::UpstreamTimeout`] past the timeout,
    /// [`GatewayError::DeadlineExceeded`] past the deadline,
    /// [`GatewayError::PayloadTooLarge`] when the body passed `max_body`,
    /// [`GatewayError::BadRequestBody`] and [`GatewayError::ClientAborted`]
    /// when the client's body broke or stopped (see [`ClientBodyError`]),
    /// and [`GatewayError::UpstreamFailed`] when the connection broke.
    ///
    /// With `conns` (a plain `http://` upstream without upgrades, see
    /// [`keep_alive`]) the request goes over its kept-alive HTTP/1.1
    /// connections; otherwise over the general client. `forwarding` are
    /// the forwarding fields [`rewrite_for_native`] left out of the map.
    pub async fn send(
        &self,
        req: Request<ClientBody>,
        upstream: &Upstream,
        conns: Option<&KeepAlive>,
        max_body: Option<u64>,
        forwarding: Option<Forwarding>,
    ) -> Result<Response<Received>, GatewayError> {
        let count = req.extensions().get::<BodyBytes>().cloned();
        let (timeout, deadline) = match req.extensions().get::<Deadline>() {
            None => (upstream.timeout, None),
            Some(d) => {
                let left = d.at.saturating_duration_since(Instant::now());
                if left < upstream.timeout {
                    (left, Some(d.budget))
                } else {
                    (upstream.timeout, None)
                }
            }
        };
        let expired = || match deadline {
            Some(budget) => GatewayError::DeadlineExceeded(budget),
            None => GatewayError::UpstreamTimeout(timeout),
        };
        let mut req = req.map(|b| {
            UpstreamBody::new(b, max_body)
                .counting(count)
                .forwarding(forwarding)
        });
        let sent = match conns {
            Some(conns) => {
                // A connection of its own is told the path, not the URI
                // (which `rewrite_for_native` leaves so).
                if req.uri().authority().is_some() {
                    let pq = req.uri().path_and_query().cloned();
                    let mut parts = http::uri::Parts::default();
                    parts.path_and_query =
                        Some(pq.unwrap_or_else(|| PathAndQuery::from_static("/")));
                    if let Ok(uri) = Uri::from_parts(parts) {
                        *req.uri_mut() = uri;
                    }
                }
                // The forwarding fields as text come with the client's
                // one `Host` in the map.
                if req.body().forwarding_fields().is_none()
                    && !req.headers().contains_key(HOST)
                    && let Ok(h) = HeaderValue::from_str(conns.authority().as_str())
                {
                    req.headers_mut().insert(HOST, h);
                }
                // Pinned where it is made: the timeout holds a pointer to
                // it, and the exchange's future, the largest of a request's,
                // is not copied into the timeout's and then into this one.
                let exchange = std::pin::pin!(conns.send(&mut req, false));
                match tokio::time::timeout(timeout, exchange).await {
                    Err(_) => Err(expired()),
                    Ok(Err(dial::SendError::Connect(e))) => Err(GatewayError::UpstreamConnect(e)),
                    Ok(Err(dial::SendError::Failed(e))) => Err(failed(&*e, None)),
                    Ok(Ok(res)) => Ok(res),
                }
            }
            None => {
                // Over HTTP/2 hyper resets the stream on a body error and
                // keeps the error to itself; the body leaves it here too.
                if let Some(f) = req.body_mut().take_forwarding() {
                    f.materialize(req.headers_mut());
                }
                let fault = req.body_mut().watch();
                let client = self.client_for(upstream);
                // Boxed: https, h2c and upgrade routes only, kept out of the
                // size of every request's future.
                match Box::pin(tokio::time::timeout(timeout, client.request(req))).await {
                    Err(_) => Err(expired()),
                    Ok(Err(e)) if e.is_connect() => {
                        Err(GatewayError::UpstreamConnect(error_chain(&e)))
                    }
                    Ok(Err(e)) => Err(failed(&e, fault.as_deref())),
                    Ok(Ok(res)) => Ok(res.map(Received::hyper)),
                }
            }
        };
        sent.map(|mut res| {
            strip_hop_by_hop(res.headers_mut());
            res
        })
    }
}

impl Forwarder {
    /// Sends the rewritten request to a target of `balancer`'s pool,
    /// trying others as [`tries`] describes, all within `upstream`'s
    /// timeout from `sent` (when the caller sends it); `key` is the
    /// caller's hash for `balance: hash`. Returns the response, and writes
    /// which try answered it to `answered`.
    ///
    /// `forwarding` are the forwarding fields [`rewrite_for_native`] left
    /// out of the map.
    ///
    /// # Errors
    /// As [`Forwarder::send`], for the last try.
    // What a pool's tries need of the request; a struct for this one call
    // would only rename them.
    #[allow(clippy::too_many_arguments)]
    pub async fn send_to_pool(
        &self,
        req: Request<ClientBody>,
        upstream: &Upstream,
        balancer: &Balancer,
        resolver: &dyn resolve::Resolve,
        key: Option<u64>,
        max_body: Option<u64>,
        sent: Instant,
        answered: &mut Option<Answered>,
        forwarding: Option<Forwarding>,
    ) -> Result<Response<Received>, GatewayError> {
        let count = req.extensions().get::<BodyBytes>().cloned();
        let mut req = req.map(|b| {
            UpstreamBody::new(b, max_body)
                .counting(count)
                .forwarding(forwarding)
        });
        let client = self.pool_client(&balancer.config);
        // Not boxed: the first try is the common path, as a request to
        // one URL is; `tries` boxes what only the rest need. Pinned where
        // it is made and awaited through the pin.
        let tries = std::pin::pin!(tries::send(
            &mut req,
            balancer,
            client.as_deref(),
            resolver,
            key,
            upstream.timeout,
            sent,
            answered,
        ));
        let mut res = tries.await?;
        strip_hop_by_hop(res.headers_mut());
        Ok(res)
    }

    /// The client for a pool's `https://` or `h2c://` targets (`None` for
    /// `http://` ones, which use each endpoint's own connections).
    fn pool_client(&self, pool: &UpstreamPool) -> Option<std::borrow::Cow<'_, UpstreamClient>> {
        match pool.targets.first().map(|t| t.scheme) {
            Some(TargetScheme::Https) => {}
            Some(TargetScheme::H2c) => return Some(std::borrow::Cow::Borrowed(&self.h2c)),
            Some(TargetScheme::Http) | None => return None,
        }
        Some(match &pool.tls {
            Some(tls) => std::borrow::Cow::Owned(self.custom_client(tls)),
            None => std::borrow::Cow::Borrowed(&self.client),
        })
    }

    /// The balancer of `pool`, with its background work started: names
    /// resolved through `resolver`, active checks. `previous` is the same
    /// pool's balancer in the configuration being replaced, whose targets'
    /// state carries over.
    pub fn balancer(
        &self,
        pool: Arc<UpstreamPool>,
        previous: Option<&Balancer>,
        resolver: &Arc<dyn resolve::Resolve>,
        metrics: &crate::metrics::Metrics,
    ) -> Arc<Balancer> {
        let b = Arc::new(Balancer::new(
            pool,
            previous,
            ConnSettings {
                connect_timeout: self.connect_timeout,
                idle_timeout: self.idle_timeout,
                http1: self.http1,
            },
            Some(&metrics.targets),
        ));
        let health: std::sync::Weak<dyn crate::metrics::targets::PoolHealth> =
            Arc::downgrade(&b) as _;
        metrics.targets.watch(health);
        resolve::spawn(&b, resolver.clone());
        health::spawn(
            &b,
            self.pool_client(&b.config)
                .map(std::borrow::Cow::into_owned),
        );
        b
    }
}

/// The kept-alive connections for `upstream` when it takes that HTTP/1.1
/// path: a plain `http://` upstream whose route does not pass upgrades,
/// spoken to by `http1`'s client.
pub fn keep_alive(upstream: &Upstream, timeouts: &Timeouts, http1: Http1) -> Option<KeepAlive> {
    if upstream.upgrade || Protocol::of(&upstream.uri) != Protocol::Http1 {
        return None;
    }
    let authority = upstream.uri.authority()?.clone();
    Some(KeepAlive::new(
        authority,
        ConnSettings {
            connect_timeout: timeouts.upstream_connect,
            idle_timeout: timeouts.upstream_idle,
            http1,
        },
    ))
}

#[cfg(test)]
mod tests;
