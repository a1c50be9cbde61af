//! Serving: accept on the listeners, hand each request to the pipeline,
//! and drain on shutdown.
//!
//! [`run`] accepts on the given listeners (HTTP/1.1 and h2c on the same
//! port, or TLS with ALPN), serves each connection with hyper-util under the
//! caps of [`listener`](crate::listener), and on shutdown stops accepting
//! and lets in-flight requests finish. The per-request work is
//! [`Gateway::handle`](crate::pipeline::Gateway::handle).

use std::future::Future;
use std::sync::Arc;

use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tracing::{info, warn};

use crate::config::Config;
use crate::listener;
use crate::pipeline::{Gateway, StartError};

/// Serves `config` on `listeners` until `shutdown` completes, then drains.
/// Without an admin listener and without reload; the binary uses
/// [`Gateway::new`], [`crate::admin::serve_with_admin`] and
/// [`crate::reload::Hangups`] for those.
///
/// # Errors
/// The gateway cannot be built (see [`Gateway::new`]).
pub async fn run(
    listeners: Vec<TcpListener>,
    config: Config,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), StartError> {
    let gateway = Arc::new(Gateway::new(config).await?);
    serve(gateway, listeners, shutdown).await;
    Ok(())
}

/// Serves an existing gateway on `listeners` until `shutdown` completes.
///
/// `listeners[i]` serves with the TLS settings of the configuration's
/// `listen[i]` (plain when there is none). On shutdown the listeners are
/// closed at once — new connections are refused — and in-flight requests get
/// `timeouts.drain` to finish; see [`listener`] for the per-connection caps.
pub async fn serve(
    gateway: Arc<Gateway>,
    listeners: Vec<TcpListener>,
    shutdown: impl Future<Output = ()> + Send,
) {
    let (shared, drain) = gateway.with_config(|c| {
        (
            Arc::new(listener::Shared::new(&c.server, &c.timeouts)),
            c.timeouts.drain,
        )
    });
    let graceful = Arc::new(GracefulShutdown::new());
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);

    let mut tasks = Vec::new();
    for (index, l) in listeners.into_iter().enumerate() {
        if let Ok(addr) = l.local_addr() {
            info!(%addr, "listening");
        }
        tasks.push(tokio::spawn(listener::accept_loop(
            index,
            l,
            gateway.clone(),
            shared.clone(),
            graceful.clone(),
            stop_rx.clone(),
        )));
    }

    shutdown.await;
    let _ = stop_tx.send(true);
    for t in tasks {
        let _ = t.await;
    }
    // Logged once the accept loops have ended and dropped their listeners,
    // so it is true when read.
    info!("shutting down: no new connections, draining in-flight requests");
    let graceful = Arc::try_unwrap(graceful).unwrap_or_else(|g| {
        // Listener tasks have ended, so this is the only reference left;
        // fall back to a fresh watcher if not, which drains nothing.
        drop(g);
        GracefulShutdown::new()
    });
    if tokio::time::timeout(drain, graceful.shutdown())
        .await
        .is_err()
    {
        warn!("drain deadline passed; closing remaining connections");
    }
}
