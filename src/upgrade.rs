//! Protocol upgrades passed through to the upstream (RFC 9110 §7.8), which is
//! how WebSocket starts (RFC 6455 §4).
//!
//! `Upgrade` and `Connection` are hop-by-hop, so [`proxy::rewrite`] removes
//! them like any other; on a route with `upgrade: true` they are put back on
//! the upstream request, and when the upstream answers `101 Switching
//! Protocols` the two upgraded connections are joined byte for byte. The
//! limiter has already decided by then: an upgrade is one request, counted
//! when it is made — the messages that follow on the tunnel are not
//! requests and are not limited.
//!
//! Only HTTP/1.1 upgrades are handled: HTTP/2 forbids `Upgrade` (RFC 9113
//! §8.2.2), and the gateway speaks HTTP/1.1 to the upstream for them.
//! A tunnel outlives the connection bookkeeping of [`listener`]: it is not
//! counted against `server.max_connections` nor closed by `timeouts.idle`.
//!
//! [`proxy::rewrite`]: crate::proxy::rewrite
//! [`listener`]: crate::listener

use http::header::{CONNECTION, UPGRADE};
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use tracing::debug;

/// An upgrade the client asked for, waiting for the upstream's answer.
pub struct Pending {
    client: OnUpgrade,
    protocol: HeaderValue,
    /// Held by the tunnel until it closes (a request's concurrency slots).
    held: Option<Hold>,
}

/// Something a tunnel holds until it closes; dropped then.
pub type Hold = Box<dyn Send + 'static>;

impl std::fmt::Debug for Pending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pending")
            .field("protocol", &self.protocol)
            .field("held", &self.held.is_some())
            .finish_non_exhaustive()
    }
}

/// `Connection: upgrade`.
static CONNECTION_UPGRADE: HeaderValue = HeaderValue::from_static("upgrade");

/// Takes the upgrade `req` asks for, if it asks for one: an `Upgrade` header
/// and `upgrade` among the `Connection` options (RFC 9110 §7.8).
pub fn take<B>(req: &mut Request<B>) -> Option<Pending> {
    let protocol = req.headers().get(UPGRADE)?.clone();
    let asked = req.headers().get_all(CONNECTION).iter().any(|v| {
        v.as_bytes()
            .split(|&b| b == b',')
            .any(|t| t.trim_ascii().eq_ignore_ascii_case(b"upgrade"))
    });
    if !asked {
        return None;
    }
    let client = hyper::upgrade::on(req);
    Some(Pending {
        client,
        protocol,
        held: None,
    })
}

impl Pending {
    /// Puts `Upgrade` and `Connection: upgrade` back on the rewritten
    /// upstream request.
    pub fn restore(&self, headers: &mut HeaderMap) {
        headers.insert(UPGRADE, self.protocol.clone());
        headers.insert(CONNECTION, CONNECTION_UPGRADE.clone());
    }

    /// Makes the tunnel hold `thing` until it closes; dropped with this
    /// upgrade when there is no tunnel.
    pub fn hold(&mut self, thing: Hold) {
        self.held = Some(thing);
    }

    /// When the upstream switched protocols, joins the two connections on a
    /// task of their own and restores the upgrade headers on the `101`
    /// going to the client. Any other answer is passed on as it is.
    pub fn finish<B>(self, res: &mut Response<B>) {
        if res.status() != StatusCode::SWITCHING_PROTOCOLS {
            return;
        }
        let upstream = hyper::upgrade::on(&mut *res);
        res.headers_mut().insert(UPGRADE, self.protocol);
        res.headers_mut()
            .insert(CONNECTION, CONNECTION_UPGRADE.clone());
        let client = self.client;
        let held = self.held;
        tokio::spawn(async move {
            // Dropped when this task ends: the tunnel closed or never opened.
            let _held = held;
            let (client, upstream) = match tokio::try_join!(client, upstream) {
                Ok(pair) => pair,
                Err(e) => {
                    debug!(error = %e, "upgrade did not complete");
                    return;
                }
            };
            let mut client = TokioIo::new(client);
            let mut upstream = TokioIo::new(upstream);
            match tokio::io::copy_bidirectional(&mut client, &mut upstream).await {
                Ok((up, down)) => debug!(up, down, "upgraded connection closed"),
                Err(e) => debug!(error = %e, "upgraded connection failed"),
            }
        });
    }
}
