//! Serving: accept on the listeners, hand each request to the pipeline,
//! and drain on shutdown.
//!
//! [`run`] builds the gateway, accepts on the given listeners (HTTP/1.1 and h2c on the same
//! port, or TLS with ALPN), serves each connection with hyper-util under the
//! caps of [`listener`](crate::listener), and on shutdown stops accepting
//! and lets in-flight requests finish. The per-request work is the
//! [`Gateway`] as a tower service
//! ([`Gateway::handle`](crate::pipeline::Gateway::handle)); the admin
//! listener is served by the same accept loop.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tracing::{info, warn};

use crate::admin;
use crate::clock::{Clock, SystemClock};
use crate::config::Config;
use crate::listener;
use crate::logs::AccessWriter;
use crate::pipeline::{Gateway, StartError};
use crate::reload::Reload;

/// What [`run`] serves with besides the configuration.
pub struct Serve {
    /// Proxy listeners, bound by the caller: `listeners[i]` serves with the
    /// TLS settings of the configuration's `listen[i]`.
    pub listeners: Vec<TcpListener>,
    /// The admin listener (`/metrics`, `/readyz`, …), if any.
    pub admin: Option<TcpListener>,
    /// Where reloads come from (SIGHUP and the file), if anywhere.
    pub reload: Option<Reload>,
    /// The clock the limiter reads.
    pub clock: Arc<dyn Clock>,
    /// Where each request's access-log line goes; none without it.
    pub access_log: Option<AccessWriter>,
    /// Resolves the names of pools' targets; the system's without it.
    pub resolver: Option<Arc<dyn crate::proxy::upstreams::resolve::Resolve>>,
}

impl Serve {
    /// Serving `listeners` on the system clock, without admin or reload.
    pub fn on(listeners: Vec<TcpListener>) -> Self {
        Self {
            listeners,
            admin: None,
            reload: None,
            clock: Arc::new(SystemClock),
            access_log: None,
            resolver: None,
        }
    }
}

/// A gateway built and ready to serve; [`Started::until`] serves it.
pub struct Started {
    gateway: Arc<Gateway>,
    serve: Serve,
}

impl Started {
    /// The gateway, for its getters (metrics, breaker state, …).
    pub fn gateway(&self) -> &Arc<Gateway> {
        &self.gateway
    }

    /// Serves until `shutdown` completes, then drains; `/readyz` answers
    /// 503 while the proxy drains, and the admin listener stops once the
    /// drain is over.
    pub async fn until(self, shutdown: impl Future<Output = ()> + Send) {
        let Self { gateway, serve } = self;
        if let Some(r) = serve.reload {
            tokio::spawn(r.on_each(gateway.clone()));
        }
        let draining = Arc::new(AtomicBool::new(false));
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let console = serve
            .admin
            .is_some()
            .then(|| admin::console::start(gateway.clone()));
        let admin_task = serve.admin.map(|l| {
            tokio::spawn(admin::serve_admin(
                gateway.clone(),
                l,
                draining.clone(),
                stop_rx,
            ))
        });
        let flag = draining.clone();
        self::serve(gateway, serve.listeners, async move {
            shutdown.await;
            flag.store(true, Ordering::Relaxed);
        })
        .await;
        let _ = stop_tx.send(true);
        if let Some(task) = admin_task {
            let _ = task.await;
        }
        if let Some(task) = console {
            task.abort();
        }
    }
}

/// Waits, before the listeners accept, until the store has answered (Redis
/// connected, its script loaded) or `store.redis.startup_wait` has passed,
/// whichever comes first. The listeners are bound already, so clients wait
/// in the accept queue rather than being refused, and no request is
/// decided by `on_error` only because the gateway has just started.
async fn warm_up(gateway: &Gateway) {
    let Some(wait) = gateway.with_config(|c| c.store.redis.as_ref().map(|r| r.startup_wait)) else {
        return;
    };
    if !gateway.limiter().health().wait_ready(wait).await {
        warn!(
            startup_wait = ?wait,
            "redis has not answered within store.redis.startup_wait; accepting, deciding by on_error until it does"
        );
    }
}

/// Builds the gateway for `config` (the store connects in the background).
///
/// # Errors
/// The gateway cannot be built (see [`Gateway::with_clock`]).
pub async fn start(config: Config, mut serve: Serve) -> Result<Started, StartError> {
    let mut gateway = Gateway::with_clock(config, serve.clock.clone())
        .await?
        .with_access_log(serve.access_log.take());
    if let Some(resolver) = serve.resolver.take() {
        gateway = gateway.with_resolver(resolver);
    }
    gateway.check_shares();
    let gateway = Arc::new(gateway);
    Ok(Started { gateway, serve })
}

/// The gateway's one entry point: builds it for `config` and serves until
/// `shutdown` completes, then drains. The binary calls this; the tests
/// call [`start`] and [`Started::until`], which it is made of, to keep the
/// gateway's handle.
///
/// # Errors
/// The gateway cannot be built (see [`Gateway::with_clock`]).
pub async fn run(
    config: Config,
    serve: Serve,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), StartError> {
    start(config, serve).await?.until(shutdown).await;
    Ok(())
}

/// Serves an existing gateway on `listeners` until `shutdown` completes.
///
/// `listeners[i]` serves with the TLS settings of the configuration's
/// `listen[i]` (plain when there is none). On shutdown the listeners are
/// closed at once — new connections are refused — and in-flight requests get
/// `timeouts.drain` to finish; see [`listener`] for the per-connection caps.
async fn serve(
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

    // Bound, and said so; accepting once the store has answered.
    for l in &listeners {
        if let Ok(addr) = l.local_addr() {
            info!(%addr, "listening");
        }
    }
    warm_up(&gateway).await;
    let mut tasks = Vec::new();
    for (index, l) in listeners.into_iter().enumerate() {
        let tls_of = gateway.clone();
        let tls: listener::TlsNow = Arc::new(move || {
            tls_of.with_config(|c| c.listen.get(index).and_then(|l| l.tls.clone()))
        });
        tasks.push(tokio::spawn(listener::accept_loop(
            l,
            gateway.clone(),
            tls,
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
