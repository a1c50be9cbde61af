//! Reaching one plain `http://` upstream: the TCP connection both HTTP/1.1
//! clients open (hyper's, [`super::keepalive`], and tollgate's own,
//! [`super::h1`]), and what they tell their caller when an exchange misses.

use std::net::SocketAddr;
use std::time::Duration;

use http::Request;
use http::uri::Authority;
use http_body::Body as _;
use tokio::net::TcpStream;

use super::body::UpstreamBody;

/// Why a request could not be exchanged.
#[derive(Debug)]
pub enum SendError {
    /// No connection could be made, or a new one failed before a byte of
    /// the request was written: nothing reached the upstream, and the
    /// caller holds the whole request again, to send it elsewhere.
    Connect(String),
    /// The exchange failed after the request was handed to a connection.
    Failed(Box<dyn std::error::Error + Send + Sync>),
    /// The instant the send was bounded by passed before the response
    /// head came. The connection is dropped, never reused.
    Expired,
}

/// Where connections to one upstream go, and how long connecting may take.
#[derive(Debug, Clone)]
pub struct Dial {
    /// The upstream's `host:port`.
    pub authority: Authority,
    /// The address connections go to; `None` resolves the authority's host
    /// on each connect.
    pub addr: Option<SocketAddr>,
    /// How long a connect may take.
    pub timeout: Duration,
}

impl Dial {
    /// A TCP connection to the upstream, with Nagle's algorithm off.
    ///
    /// # Errors
    /// The connect failed or timed out; the message names the upstream.
    pub async fn tcp(&self) -> Result<TcpStream, String> {
        let host = self.authority.host();
        // `[::1]` in a URI is `::1` to the resolver.
        let host = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        let port = self.authority.port_u16().unwrap_or(80);
        let connecting = async {
            match self.addr {
                Some(addr) => TcpStream::connect(addr).await,
                None => TcpStream::connect((host, port)).await,
            }
        };
        let stream = match tokio::time::timeout(self.timeout, connecting).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return Err(format!("{}: {e}", self.describe())),
            Err(_) => {
                return Err(format!(
                    "{}: connect timed out after {:?}",
                    self.describe(),
                    self.timeout
                ));
            }
        };
        let _ = stream.set_nodelay(true);
        Ok(stream)
    }

    /// The authority, and the address when it is pinned to one.
    pub fn describe(&self) -> String {
        match self.addr {
            Some(addr) if addr.to_string() != self.authority.as_str() => {
                format!("{} ({addr})", self.authority)
            }
            _ => self.authority.to_string(),
        }
    }
}

/// Whether `req` may be sent a second time: an idempotent method (GET,
/// HEAD, OPTIONS, TRACE, PUT, DELETE; RFC 9110 §9.2.2) and no body, so
/// there is nothing that was consumed by the first attempt.
pub fn replayable(req: &Request<UpstreamBody>) -> bool {
    req.method().is_idempotent() && req.body().is_end_stream()
}

/// The head of `req` with an empty body, to send again. Extensions are not
/// copied: the HTTP/1.1 clients read none.
pub fn copy_head(req: &Request<UpstreamBody>) -> Request<UpstreamBody> {
    let mut head = Request::new(UpstreamBody::empty());
    *head.method_mut() = req.method().clone();
    *head.uri_mut() = req.uri().clone();
    *head.version_mut() = req.version();
    *head.headers_mut() = req.headers().clone();
    head
}
