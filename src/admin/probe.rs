//! The client side of `/healthz` and `/readyz`: what `tollgate health`
//! asks a running gateway, so that a container health check needs no curl
//! or wget in the image; and [`call`], the support API's client behind
//! `tollgate callers` and `tollgate overrides`.
//!
//! One plain HTTP/1.1 `GET` over a fresh connection, bounded by a timeout
//! as a whole (resolve, connect, request, body). The answer is healthy
//! only when it is `200`; anything else — no connection, no answer in
//! time, another status — is a [`ProbeError`] that says why in one line.

use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode, Uri};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::rt::TokioIo;

/// The admin address a probe asks when none is given: the address the
/// container image serves the admin listener on.
pub const DEFAULT_ADMIN: &str = "http://127.0.0.1:9090";

/// The most of an answer's body a probe reads: the admin listener's
/// health answers are a few lines.
const MAX_BODY: usize = 4096;

/// Which question a probe asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    /// `/healthz`: the process is up (liveness).
    Live,
    /// `/readyz`: the gateway takes traffic (readiness).
    Ready,
}

impl Check {
    fn path(self) -> &'static str {
        match self {
            Check::Live => "/healthz",
            Check::Ready => "/readyz",
        }
    }
}

/// Why a probe did not find the gateway healthy.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// The admin address is not one a probe can ask.
    #[error("--admin {given:?}: {why}")]
    Address { given: String, why: &'static str },
    /// No TCP connection (nothing listening, a name that does not resolve).
    #[error("cannot connect to {authority}: {source}")]
    Connect {
        authority: String,
        source: std::io::Error,
    },
    /// The connection failed before a whole answer came.
    #[error("{url}: {source}")]
    Http { url: String, source: hyper::Error },
    /// The answer's body failed or was longer than a health answer is.
    #[error("{url}: the answer's body could not be read")]
    Body { url: String },
    /// No whole answer within the timeout.
    #[error("{url}: no answer within {timeout:?}")]
    Timeout { url: String, timeout: Duration },
    /// An answer other than `200`.
    #[error("{url} answered {status}: {body}")]
    Status {
        url: String,
        status: StatusCode,
        body: String,
    },
}

/// A healthy answer: the URL asked and its body, on one line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Healthy {
    pub url: String,
    pub body: String,
}

/// The URL of `check` on the admin listener at `admin`: `http://HOST:PORT`
/// or just `HOST:PORT` (an IPv6 host in brackets), with no path.
///
/// # Errors
/// [`ProbeError::Address`] for another scheme, a missing port, or a path.
pub fn url(admin: &str, check: Check) -> Result<Uri, ProbeError> {
    at(admin, check.path())
}

/// The URL of `path_and_query` on the admin listener at `admin`, checked
/// as [`url`] checks it.
fn at(admin: &str, path_and_query: &str) -> Result<Uri, ProbeError> {
    let bad = |why| ProbeError::Address {
        given: admin.to_owned(),
        why,
    };
    let with_scheme = if admin.contains("://") {
        admin.to_owned()
    } else {
        format!("http://{admin}")
    };
    let uri: Uri = with_scheme
        .parse()
        .map_err(|_| bad("not a URL; write http://HOST:PORT"))?;
    if uri.scheme_str() != Some("http") {
        return Err(bad(
            "the admin listener speaks plain http; write http://HOST:PORT",
        ));
    }
    let Some(authority) = uri.authority() else {
        return Err(bad("no host; write http://HOST:PORT"));
    };
    if authority.port_u16().is_none() {
        return Err(bad("no port; write http://HOST:PORT"));
    }
    if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
        return Err(bad(
            "give the admin listener's address without a path; --ready chooses /readyz",
        ));
    }
    Uri::builder()
        .scheme("http")
        .authority(authority.as_str())
        .path_and_query(path_and_query)
        .build()
        .map_err(|_| bad("not a URL; write http://HOST:PORT"))
}

/// Asks the admin listener at `admin` for `check`, within `timeout`.
///
/// # Errors
/// Every way the answer is not a `200`; see [`ProbeError`].
pub async fn probe(admin: &str, check: Check, timeout: Duration) -> Result<Healthy, ProbeError> {
    let uri = url(admin, check)?;
    let shown = uri.to_string();
    match tokio::time::timeout(timeout, ask(&uri, &shown)).await {
        Ok(answer) => answer,
        Err(_) => Err(ProbeError::Timeout {
            url: shown,
            timeout,
        }),
    }
}

async fn ask(uri: &Uri, shown: &str) -> Result<Healthy, ProbeError> {
    let asked = Asked {
        method: http::Method::GET,
        token: None,
        body: Bytes::new(),
        max_body: MAX_BODY,
        agent: "tollgate-health",
    };
    let (status, body) = exchange(uri, shown, asked).await?;
    let body = one_line(&body);
    if status == StatusCode::OK {
        Ok(Healthy {
            url: shown.to_owned(),
            body,
        })
    } else {
        Err(ProbeError::Status {
            url: shown.to_owned(),
            status,
            body,
        })
    }
}

/// What one request to the admin listener sends.
struct Asked<'a> {
    method: http::Method,
    /// Sent as `Authorization: Bearer`.
    token: Option<&'a str>,
    body: Bytes,
    /// The most of the answer's body read.
    max_body: usize,
    /// `User-Agent`.
    agent: &'static str,
}

/// The most of an answer's body [`call`] reads.
const MAX_API_BODY: usize = 16 * 1024 * 1024;

/// One request of the support API (`tollgate callers`, `tollgate
/// overrides`): `method` on `path_and_query` of the admin listener at
/// `admin`, with `token` as the bearer and `body`, within `timeout`. The
/// status and body, whatever the status.
///
/// # Errors
/// No answer: a bad address, no connection, a failed exchange, a timeout.
pub async fn call(
    admin: &str,
    method: http::Method,
    path_and_query: &str,
    token: Option<&str>,
    body: Bytes,
    timeout: Duration,
) -> Result<(StatusCode, Bytes), ProbeError> {
    let uri = at(admin, path_and_query)?;
    let shown = uri.to_string();
    let asked = Asked {
        method,
        token,
        body,
        max_body: MAX_API_BODY,
        agent: "tollgate-admin",
    };
    match tokio::time::timeout(timeout, exchange(&uri, &shown, asked)).await {
        Ok(answer) => answer,
        Err(_) => Err(ProbeError::Timeout {
            url: shown,
            timeout,
        }),
    }
}

/// One request over a fresh connection; the status and body.
async fn exchange(
    uri: &Uri,
    shown: &str,
    asked: Asked<'_>,
) -> Result<(StatusCode, Bytes), ProbeError> {
    let Some(authority) = uri.authority() else {
        return Err(ProbeError::Address {
            given: shown.to_owned(),
            why: "no host",
        });
    };
    // `url` made sure of the port; an IPv6 host comes in brackets.
    let host = authority
        .host()
        .trim_start_matches('[')
        .trim_end_matches(']');
    let port = authority.port_u16().unwrap_or(80);
    let stream = tokio::net::TcpStream::connect((host, port))
        .await
        .map_err(|source| ProbeError::Connect {
            authority: authority.to_string(),
            source,
        })?;
    let http = |source| ProbeError::Http {
        url: shown.to_owned(),
        source,
    };
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(http)?;
    // The connection task ends with the exchange: the request asks for
    // `Connection: close`, and dropping `sender` closes it otherwise.
    tokio::spawn(conn);
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    let mut request = Request::builder()
        .method(asked.method)
        .uri(path)
        .header(http::header::HOST, authority.as_str())
        .header(http::header::CONNECTION, "close")
        .header(http::header::USER_AGENT, asked.agent);
    if let Some(t) = asked.token {
        request = request.header(http::header::AUTHORIZATION, format!("Bearer {t}"));
    }
    if !asked.body.is_empty() {
        request = request.header(http::header::CONTENT_TYPE, "application/json");
    }
    let request = request
        .body(Full::new(asked.body))
        .map_err(|_| ProbeError::Address {
            given: shown.to_owned(),
            why: "not a request target",
        })?;
    let response = sender.send_request(request).await.map_err(http)?;
    let status = response.status();
    let body = Limited::new(response.into_body(), asked.max_body)
        .collect()
        .await
        .map_err(|_| ProbeError::Body {
            url: shown.to_owned(),
        })?
        .to_bytes();
    Ok((status, body))
}

/// A body's lines joined by `; `, for a one-line report.
fn one_line(body: &[u8]) -> String {
    String::from_utf8_lossy(body)
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admin_addresses() {
        let ok = |s: &str, check| {
            url(s, check)
                .map(|u| u.to_string())
                .map_err(|e| e.to_string())
        };
        assert_eq!(
            ok("http://127.0.0.1:9090", Check::Ready).as_deref(),
            Ok("http://127.0.0.1:9090/readyz")
        );
        assert_eq!(
            ok("127.0.0.1:9090", Check::Live).as_deref(),
            Ok("http://127.0.0.1:9090/healthz")
        );
        assert_eq!(
            ok("http://[::1]:9090/", Check::Live).as_deref(),
            Ok("http://[::1]:9090/healthz")
        );
        assert_eq!(
            ok("localhost:9", Check::Live).as_deref(),
            Ok("http://localhost:9/healthz")
        );
        for (bad, says) in [
            ("https://127.0.0.1:9090", "plain http"),
            ("http://127.0.0.1", "no port"),
            ("http://127.0.0.1:9090/readyz", "without a path"),
            ("http://127.0.0.1:9090/?x=1", "without a path"),
            ("not a url", "not a URL"),
        ] {
            let e = ok(bad, Check::Live).expect_err(bad);
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn bodies_become_one_line() {
        assert_eq!(
            one_line(b"not ready: draining\nstore: memory\n"),
            "not ready: draining; store: memory"
        );
        assert_eq!(one_line(b""), "");
    }
}
