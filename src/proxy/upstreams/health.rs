//! Active health checks: each endpoint of a pool with `health:` is asked
//! `GET path` every `interval`; a 2xx or 3xx within `timeout` passes.
//! `unhealthy_after` consecutive failures take it out and `healthy_after`
//! passes bring it back ([`Balancer::checked`]). Checks run from the first
//! moment, so a target that is down at start is out after
//! `unhealthy_after` intervals.

use std::sync::{Arc, Weak};

use http::header::HOST;
use http::{HeaderValue, Method, Request, Uri};
use tracing::{info, warn};

use super::balancer::{Balancer, Endpoint};
use crate::proxy::body::UpstreamBody;
use crate::proxy::client::UpstreamClient;
use crate::proxy::dial::SendError;

/// Checks `balancer`'s endpoints while it lives; `https` is the client for
/// `https://` targets.
pub fn spawn(balancer: &Arc<Balancer>, https: Option<UpstreamClient>) {
    let Some(health) = balancer.config.health.clone() else {
        return;
    };
    if tokio::runtime::Handle::try_current().is_err() {
        return;
    }
    let weak: Weak<Balancer> = Arc::downgrade(balancer);
    tokio::spawn(async move {
        let mut every = tokio::time::interval(health.interval);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            let Some(b) = weak.upgrade() else { return };
            let eps = b.endpoints();
            let (bal, client, timeout) = (&b, https.as_ref(), health.timeout);
            let checks = eps.list.iter().map(|e| async move {
                let until = tokio::time::Instant::now() + timeout;
                let passed = tokio::time::timeout_at(until, check(bal, e, client, until))
                    .await
                    .unwrap_or(false);
                (e, passed)
            });
            for (e, passed) in futures_util::future::join_all(checks).await {
                if let Some(now_healthy) = b.checked(e, passed) {
                    let target = &b.config.targets[e.target].url;
                    if now_healthy {
                        info!(pool = %b.name(), %target, addr = ?e.addr, "target passes its health checks again");
                    } else {
                        warn!(pool = %b.name(), %target, addr = ?e.addr, "target fails its health checks; taken out");
                    }
                }
            }
        }
    });
}

/// One check of `e`, answered by `until`.
async fn check(
    b: &Balancer,
    e: &Endpoint,
    https: Option<&UpstreamClient>,
    until: tokio::time::Instant,
) -> bool {
    let Some(health) = &b.config.health else {
        return true;
    };
    let target = &b.config.targets[e.target];
    let mut req = Request::new(UpstreamBody::empty());
    *req.method_mut() = Method::GET;
    if let Ok(host) = HeaderValue::from_str(target.authority.as_str()) {
        req.headers_mut().insert(HOST, host);
    }
    let status = match (&e.state.conns, https) {
        (Some(conns), _) => {
            *req.uri_mut() = Uri::from(health.path.clone());
            match conns.send(&mut req, false, until).await {
                Ok(res) => res.status(),
                Err(SendError::Connect(_) | SendError::Failed(_) | SendError::Expired) => {
                    return false;
                }
            }
        }
        (None, Some(client)) => {
            let Ok(uri) = format!("https://{}{}", target.authority, health.path).parse::<Uri>()
            else {
                return false;
            };
            *req.uri_mut() = uri;
            match client.request(req).await {
                Ok(res) => res.status(),
                Err(_) => return false,
            }
        }
        (None, None) => return true,
    };
    status.is_success() || status.is_redirection()
}
