//! What a line of any format becomes ([`Line`], [`Parsed`]), and the
//! pieces more than one format reads the same way: an IP field, and the
//! request parts the two JSON formats name alike ([`Parts`]).

use std::borrow::Cow;
use std::net::{IpAddr, SocketAddr};

use http::header::HOST;
use http::{Extensions, HeaderMap, HeaderValue, Method, Request, Uri};

/// One recorded request, ready for the pipeline.
#[derive(Debug)]
pub struct Line {
    /// When it happened, in ms since the epoch.
    pub ts_ms: u64,
    /// The TCP peer (port 0).
    pub peer: SocketAddr,
    /// The request head.
    pub req: Request<()>,
}

impl Line {
    /// The line of a request made of these parts.
    pub(super) fn new(
        ts_ms: u64,
        peer: SocketAddr,
        method: Method,
        uri: Uri,
        headers: HeaderMap,
    ) -> Self {
        let mut req = Request::new(());
        *req.method_mut() = method;
        *req.uri_mut() = uri;
        *req.headers_mut() = headers;
        Self { ts_ms, peer, req }
    }
}

/// What a line turned out to be.
// Made and taken apart at once, never stored: boxing the request would
// cost an allocation per line for nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Parsed {
    /// A request.
    Request(Line),
    /// Not a request: blank, or another event in a tollgate log.
    Skip,
}

/// A request as the JSON formats record it, each part as its line
/// spells it.
pub(super) struct Parts<'a> {
    /// When, in ms since the epoch.
    pub ts_ms: u64,
    /// The TCP peer.
    pub peer: SocketAddr,
    /// The method; GET when the line names none.
    pub method: Option<Cow<'a, str>>,
    /// The host; the parser's `--host` when the line names none and no
    /// header gives one.
    pub host: Option<Cow<'a, str>>,
    /// The request target.
    pub path: Cow<'a, str>,
    /// The other headers.
    pub headers: HeaderMap,
    /// What the decision reads beside the head: the body's fields, the
    /// amounts its response reported (a tollgate log's `json` and
    /// `settled`).
    pub extensions: Extensions,
}

impl Parts<'_> {
    /// The request these parts describe, `host` standing in for a host the
    /// line does not name.
    ///
    /// # Errors
    /// A part is not valid in a request head.
    pub(super) fn into_line(self, host: Option<&HeaderValue>) -> Result<Line, String> {
        let Self {
            ts_ms,
            peer,
            method,
            host: named,
            path,
            mut headers,
            extensions,
        } = self;
        let method = match method.as_deref() {
            Some(m) => Method::from_bytes(m.as_bytes()).map_err(|_| format!("method {m:?}"))?,
            None => Method::GET,
        };
        let uri = Uri::try_from(&*path).map_err(|e| format!("path {path:?}: {e}"))?;
        match named.as_deref() {
            Some(h) => {
                let v = HeaderValue::from_str(h).map_err(|_| format!("host {h:?}"))?;
                headers.insert(HOST, v);
            }
            None => {
                if let Some(h) = host
                    && !headers.contains_key(HOST)
                {
                    headers.insert(HOST, h.clone());
                }
            }
        }
        let mut line = Line::new(ts_ms, peer, method, uri, headers);
        *line.req.extensions_mut() = extensions;
        Ok(line)
    }
}

/// An IP address written as text.
pub(super) fn ip(b: &[u8]) -> Result<IpAddr, String> {
    std::str::from_utf8(b)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("{:?} is not an IP address", String::from_utf8_lossy(b)))
}
