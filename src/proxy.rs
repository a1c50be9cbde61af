//! Forwarding to upstreams: request rewriting, hop-by-hop removal and the
//! pooled HTTP client.
//!
//! Bodies are never buffered: the client's `Incoming` body is handed to the
//! upstream request and the upstream's `Incoming` body is handed back to the
//! client, so both directions stream with hyper's back-pressure.

use std::net::IpAddr;
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONNECTION, HOST, HeaderName, HeaderValue};
use http::uri::{PathAndQuery, Scheme};
use http::{HeaderMap, Request, Response, Uri, Version};
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use crate::config::{Timeouts, Upstream};
use crate::problem::GatewayError;

/// Body of every response the gateway sends: streamed from an upstream, or
/// generated locally.
pub type Body = Either<Incoming, Full<Bytes>>;

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

/// Removes hop-by-hop headers, including every header the `Connection`
/// header names.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(CONNECTION)
        .iter()
        .flat_map(|v| v.as_bytes().split(|&b| b == b','))
        .filter_map(|t| HeaderName::from_bytes(t.trim_ascii()).ok())
        .collect();
    for name in named.iter().chain(HOP_HEADERS.iter()) {
        headers.remove(name);
    }
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
}

/// Rewrites a client request into the upstream request: target URI, HTTP
/// version, `Host`, hop-by-hop removal and the `X-Forwarded-*` headers.
///
/// From an untrusted peer the incoming forwarding headers and the user
/// header are dropped, so the upstream cannot be lied to through the gateway;
/// from a trusted proxy `X-Forwarded-For` is appended to.
///
/// # Errors
/// The combined URI is invalid (cannot happen for validated upstreams and a
/// request hyper accepted, but it is not assumed).
pub fn rewrite<B>(
    req: &mut Request<B>,
    upstream: &Upstream,
    hop: Hop<'_>,
) -> Result<(), http::Error> {
    let host = req.headers().get(HOST).cloned().or_else(|| {
        req.uri()
            .authority()
            .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
    });
    let base = upstream.uri.path().trim_end_matches('/');
    let pq = req.uri().path_and_query().map_or("/", PathAndQuery::as_str);
    let pq: PathAndQuery = if base.is_empty() {
        pq.parse()?
    } else {
        format!("{base}{pq}").parse()?
    };
    let mut parts = http::uri::Parts::default();
    parts.scheme = Some(upstream.uri.scheme().cloned().unwrap_or(Scheme::HTTP));
    parts.authority = upstream.uri.authority().cloned();
    parts.path_and_query = Some(pq);
    *req.uri_mut() = Uri::from_parts(parts)?;
    *req.version_mut() = Version::HTTP_11;

    let headers = req.headers_mut();
    strip_hop_by_hop(headers);
    if !hop.trusted {
        headers.remove(&X_FORWARDED_FOR);
        headers.remove(&X_FORWARDED_PROTO);
        headers.remove(&X_FORWARDED_HOST);
        headers.remove(http::header::FORWARDED);
        headers.remove(hop.user_header);
    }
    // Append the peer as the right-most hop (one combined line).
    let peer = hop.peer.to_string();
    let xff = match headers.get_all(&X_FORWARDED_FOR).iter().count() {
        0 => HeaderValue::from_str(&peer).ok(),
        _ => {
            let mut joined = Vec::new();
            for v in headers.get_all(&X_FORWARDED_FOR) {
                joined.extend_from_slice(v.as_bytes());
                joined.extend_from_slice(b", ");
            }
            joined.extend_from_slice(peer.as_bytes());
            HeaderValue::from_bytes(&joined).ok()
        }
    };
    if let Some(v) = xff {
        headers.insert(X_FORWARDED_FOR.clone(), v);
    }
    if !headers.contains_key(&X_FORWARDED_PROTO) {
        headers.insert(
            X_FORWARDED_PROTO.clone(),
            HeaderValue::from_static(hop.scheme_static()),
        );
    }
    if let Some(h) = host {
        if !headers.contains_key(&X_FORWARDED_HOST) {
            headers.insert(X_FORWARDED_HOST.clone(), h.clone());
        }
        // The client's Host is kept (as Envoy and Traefik do); HTTP/2 clients
        // send `:authority` instead, which becomes `Host` here.
        headers.insert(HOST, h);
    }
    Ok(())
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

/// The pooled keep-alive client to upstreams.
#[derive(Clone, Debug)]
pub struct Forwarder {
    client: Client<HttpConnector, Incoming>,
}

impl Forwarder {
    /// A client with the connect timeout of `timeouts`.
    pub fn new(timeouts: &Timeouts) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(timeouts.upstream_connect));
        connector.set_nodelay(true);
        connector.enforce_http(true);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(90))
            .pool_max_idle_per_host(256)
            .build(connector);
        Self { client }
    }

    /// Sends the rewritten request and waits at most `timeout` for the
    /// response head; the body then streams without a deadline.
    ///
    /// # Errors
    /// [`GatewayError::UpstreamConnect`] when no connection could be made,
    /// [`GatewayError::UpstreamTimeout`] past `timeout`, and
    /// [`GatewayError::UpstreamFailed`] when the connection broke.
    pub async fn send(
        &self,
        req: Request<Incoming>,
        timeout: Duration,
    ) -> Result<Response<Incoming>, GatewayError> {
        match tokio::time::timeout(timeout, self.client.request(req)).await {
            Err(_) => Err(GatewayError::UpstreamTimeout(timeout)),
            Ok(Err(e)) if e.is_connect() => Err(GatewayError::UpstreamConnect(error_chain(&e))),
            Ok(Err(e)) => Err(GatewayError::UpstreamFailed(error_chain(&e))),
            Ok(Ok(mut res)) => {
                strip_hop_by_hop(res.headers_mut());
                Ok(res)
            }
        }
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_named_headers_are_removed() {
        let mut h = HeaderMap::new();
        h.insert(CONNECTION, HeaderValue::from_static("keep-alive, X-Secret"));
        h.insert("x-secret", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("x-kept", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1);
        assert!(h.contains_key("x-kept"));
    }

    #[test]
    fn rewrite_sets_forwarding_headers() {
        let up = Upstream {
            uri: "http://127.0.0.1:9000/base/".parse().unwrap(),
            timeout: Duration::from_secs(1),
        };
        let user = HeaderName::from_static("x-user");
        let mut req = Request::builder()
            .uri("/a?b=1")
            .header(HOST, "example.com")
            .header("x-forwarded-for", "6.6.6.6")
            .header("x-user", "admin")
            .body(())
            .unwrap();
        let hop = Hop {
            peer: "1.2.3.4".parse().unwrap(),
            trusted: false,
            scheme: "http",
            user_header: &user,
        };
        rewrite(&mut req, &up, hop).unwrap();
        assert_eq!(req.uri(), "http://127.0.0.1:9000/base/a?b=1");
        assert_eq!(req.headers()["x-forwarded-for"], "1.2.3.4");
        assert_eq!(req.headers()["x-forwarded-host"], "example.com");
        assert_eq!(req.headers()["host"], "example.com");
        assert!(!req.headers().contains_key("x-user"));

        let mut req = Request::builder()
            .uri("/a")
            .header("x-forwarded-for", "6.6.6.6")
            .header("x-forwarded-for", "7.7.7.7")
            .body(())
            .unwrap();
        let hop = Hop {
            trusted: true,
            ..hop
        };
        rewrite(&mut req, &up, hop).unwrap();
        assert_eq!(
            req.headers()["x-forwarded-for"],
            "6.6.6.6, 7.7.7.7, 1.2.3.4"
        );
    }
}
