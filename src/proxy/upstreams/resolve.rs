//! Names in a pool's targets: resolved to every address, each an endpoint,
//! again every [`RESOLVE_EVERY`] and as soon as a connect to one of them
//! fails, so a Kubernetes headless Service's pods come and go without a
//! restart. The resolver is a trait so tests can swap in their own names.

use std::fmt::Debug;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures_util::future::BoxFuture;
use tracing::{debug, warn};

use super::balancer::Balancer;
use crate::config::TargetScheme;

/// How often names are resolved again.
pub const RESOLVE_EVERY: Duration = Duration::from_secs(30);

/// The shortest time between two lookups a connect failure asks for.
const AT_MOST_EVERY: Duration = Duration::from_secs(1);

/// Resolves a host name to addresses.
pub trait Resolve: Debug + Send + Sync + 'static {
    /// Every address of `host` at `port`.
    fn resolve(&self, host: &str, port: u16) -> BoxFuture<'static, io::Result<Vec<SocketAddr>>>;
}

/// The system's resolver (`getaddrinfo` on a blocking thread).
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemResolver;

impl Resolve for SystemResolver {
    fn resolve(&self, host: &str, port: u16) -> BoxFuture<'static, io::Result<Vec<SocketAddr>>> {
        let host = host.to_owned();
        Box::pin(async move { Ok(tokio::net::lookup_host((host, port)).await?.collect()) })
    }
}

/// Resolves every name of `balancer`'s targets once.
pub async fn resolve_once(balancer: &Balancer, resolver: &dyn Resolve) {
    for (i, t) in balancer.config.targets.iter().enumerate() {
        if t.scheme != TargetScheme::Http || t.host.parse::<std::net::IpAddr>().is_ok() {
            continue;
        }
        match resolver.resolve(&t.host, t.port).await {
            Ok(addrs) if !addrs.is_empty() => balancer.set_addresses(i, addrs),
            // A failed lookup keeps the addresses last known: a resolver
            // hiccup must not empty a pool.
            Ok(_) => {
                warn!(pool = %balancer.name(), target = %t.url, "name resolved to no address; keeping the last known")
            }
            Err(e) => {
                warn!(pool = %balancer.name(), target = %t.url, error = %e, "name did not resolve; keeping the last known addresses")
            }
        }
    }
}

/// Keeps `balancer`'s names resolved while it lives: now, every
/// [`RESOLVE_EVERY`], and when a connect failure asks.
pub fn spawn(balancer: &Arc<Balancer>, resolver: Arc<dyn Resolve>) {
    if !balancer.has_names() || tokio::runtime::Handle::try_current().is_err() {
        return;
    }
    let weak: Weak<Balancer> = Arc::downgrade(balancer);
    tokio::spawn(async move {
        loop {
            let Some(b) = weak.upgrade() else { return };
            resolve_once(&b, resolver.as_ref()).await;
            debug!(pool = %b.name(), endpoints = b.endpoints().list.len(), "names resolved");
            // Held only while waiting, not across the lookup's end: a
            // replaced configuration's balancer is dropped within a period.
            let asked = async {
                b.resolve_now.notified().await;
                tokio::time::sleep(AT_MOST_EVERY).await;
            };
            let _ = tokio::time::timeout(RESOLVE_EVERY, asked).await;
        }
    });
}
