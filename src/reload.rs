//! Hot reload: on SIGHUP the file is read and validated again; a good file
//! is swapped in for new requests, a bad one is logged with every error and
//! the running configuration keeps serving.
//!
//! The swap is one `ArcSwap` store ([`Gateway::reload`]): a request holds
//! the configuration it started with until it ends, so nothing in flight is
//! dropped or changes route halfway. Counters live in the store, which a
//! reload never rebuilds, so no count is reset: a changed `limit` applies to
//! the counts already there (raising 5 to 10 after 5 requests leaves 5).
//!
//! Some settings belong to things built once at start and are kept from the
//! running configuration, with a warning saying a restart applies them:
//! `listen` and `admin` (bound sockets), the whole `store` section (the
//! Redis connection and the key prefix — a new prefix would silently start
//! every counter from zero), `tracing` (the span exporter and its thread),
//! `timeouts.header_read`, `timeouts.idle`,
//! `timeouts.drain`, `server.max_connections`, `server.backlog` and
//! `server.max_header_size` and `server.http1` (the listener's settings) and
//! `timeouts.upstream_connect` and `timeouts.upstream_idle` (the upstream
//! client). Everything else — routes, limits, shadow flags, identity
//! sources, header mode, per-route timeouts, `server.max_uri_size`,
//! `server.max_body_size`, `server.path`, and the TLS certificates and keys
//! of the listeners and upstreams, which the load
//! reads again — takes effect on the next request or connection.
//!
//! Loading reads files — the configuration, and the certificates, keys, CA
//! files and JWT public keys it names — with blocking calls, so
//! [`reload_file`] runs the whole load on Tokio's blocking pool
//! (`spawn_blocking`) and only swaps the result in on the runtime: a slow
//! disk or network file system never stalls the requests being served.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tracing::{error, info, warn};

use crate::config::Config;
use crate::config::load::{ConfigError, ConfigErrors, load_file};
use crate::pipeline::Gateway;

/// What the command line put in place of the file's values (`--listen`,
/// `--admin`); applied to every reloaded file as at start.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// `--listen`; empty keeps the file's.
    pub listen: Vec<SocketAddr>,
    /// `--admin`.
    pub admin: Option<SocketAddr>,
}

impl Overrides {
    /// Puts the command line's values over the file's: at start and on
    /// every reload.
    pub fn apply(&self, config: &mut Config) {
        if !self.listen.is_empty() {
            // Plain listeners: TLS settings belong to the file's entries.
            config.listen = self.listen.iter().copied().map(Into::into).collect();
        }
        if self.admin.is_some() {
            config.admin = self.admin;
        }
    }
}

/// Where reloads come from: SIGHUP, and the file read again.
#[derive(Debug)]
pub struct Reload {
    /// The configuration file.
    pub path: PathBuf,
    /// The command line's values, applied to every reloaded file.
    pub overrides: Overrides,
    /// The SIGHUP stream, caught before anything was bound.
    pub hangups: Hangups,
}

impl Reload {
    /// Reloads the file into `gw` on every SIGHUP, forever.
    pub async fn on_each(self, gw: Arc<Gateway>) {
        self.hangups
            .reload_on_each(gw, self.path, self.overrides)
            .await;
    }
}

/// Reads `path` and, when it is valid, serves it with `overrides` applied.
///
/// The file and the files it names are read on a blocking thread
/// (`spawn_blocking`), off the runtime's workers.
///
/// # Errors
/// Every problem in the file; the running configuration is unchanged then.
///
/// # Panics
/// Only if loading itself panics (a bug): the panic is passed on.
pub async fn reload_file(
    gw: &Gateway,
    path: &Path,
    overrides: &Overrides,
) -> Result<(), ConfigErrors> {
    let owned = path.to_owned();
    let loaded = match tokio::task::spawn_blocking(move || load_file(&owned)).await {
        Ok(loaded) => loaded,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        // The runtime is shutting down; nothing is left to reload.
        Err(e) => Err(ConfigErrors(vec![ConfigError {
            path: String::new(),
            message: format!("reload of {} abandoned: {e}", path.display()),
            line: None,
            column: None,
        }])),
    };
    serve(gw, path, loaded, overrides)
}

/// Swaps in `loaded` when it is a valid configuration; logs every error
/// and keeps the running one otherwise.
fn serve(
    gw: &Gateway,
    path: &Path,
    loaded: Result<Config, ConfigErrors>,
    overrides: &Overrides,
) -> Result<(), ConfigErrors> {
    let mut new = match loaded {
        Ok(c) => c,
        Err(errors) => {
            error!(
                file = %path.display(),
                errors = errors.0.len(),
                "configuration reload refused; the running configuration keeps serving"
            );
            for e in &errors.0 {
                error!(file = %path.display(), "{e}");
            }
            gw.metrics().reloaded(false);
            return Err(errors);
        }
    };
    overrides.apply(&mut new);
    let old = gw.config();
    keep_fixed(&old, &mut new);
    let routes = new.routes.len();
    gw.reload(new);
    gw.metrics().reloaded(true);
    info!(file = %path.display(), routes, "configuration reloaded");
    Ok(())
}

/// Puts back the settings a reload cannot change, warning about each that differs.
fn keep_fixed(old: &Config, new: &mut Config) {
    let restart = |what: &str| {
        warn!("{what} changed; it takes effect on restart, the running value is kept");
    };
    // Addresses are bound sockets; a listener's TLS settings are read at
    // every handshake, so renewed certificates (re-read by the load) apply.
    if !new
        .listen
        .iter()
        .map(|l| l.addr)
        .eq(old.listen.iter().map(|l| l.addr))
    {
        restart("listen");
        new.listen = old.listen.clone();
    }
    if new.admin != old.admin {
        restart("admin");
        new.admin = old.admin;
    }
    if new.store != old.store {
        restart("store");
        new.store = old.store.clone();
    }
    // The tracer and its export thread are built once, at start.
    if new.tracing != old.tracing {
        restart("tracing");
        new.tracing = old.tracing.clone();
    }
    if new.timeouts.header_read != old.timeouts.header_read {
        restart("timeouts.header_read");
        new.timeouts.header_read = old.timeouts.header_read;
    }
    if new.timeouts.upstream_connect != old.timeouts.upstream_connect {
        restart("timeouts.upstream_connect");
        new.timeouts.upstream_connect = old.timeouts.upstream_connect;
    }
    // The general client's connections are built once; the routes' are
    // rebuilt, but one value for both keeps them alike.
    if new.timeouts.upstream_idle != old.timeouts.upstream_idle {
        restart("timeouts.upstream_idle");
        new.timeouts.upstream_idle = old.timeouts.upstream_idle;
    }
    // The listener's caps and connection timeouts (`listener::Shared`).
    if new.timeouts.idle != old.timeouts.idle {
        restart("timeouts.idle");
        new.timeouts.idle = old.timeouts.idle;
    }
    if new.timeouts.drain != old.timeouts.drain {
        restart("timeouts.drain");
        new.timeouts.drain = old.timeouts.drain;
    }
    if new.server.max_connections != old.server.max_connections {
        restart("server.max_connections");
        new.server.max_connections = old.server.max_connections;
    }
    if new.server.backlog != old.server.backlog {
        restart("server.backlog");
        new.server.backlog = old.server.backlog;
    }
    if new.server.max_header_size != old.server.max_header_size {
        restart("server.max_header_size");
        new.server.max_header_size = old.server.max_header_size;
    }
    if new.server.http1 != old.server.http1 {
        restart("server.http1");
        new.server.http1 = old.server.http1;
    }
}

/// SIGHUP, caught from the moment [`Hangups::catch`] returns: until then
/// the default action of SIGHUP ends the process, so `main` calls it before
/// anything slow (binding, connecting to Redis).
#[derive(Debug)]
pub struct Hangups {
    #[cfg(unix)]
    signal: Option<tokio::signal::unix::Signal>,
}

impl Hangups {
    /// Starts catching SIGHUP. Must be called inside a Tokio runtime.
    pub fn catch() -> Self {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            let signal = match signal(SignalKind::hangup()) {
                Ok(s) => Some(s),
                Err(e) => {
                    warn!(error = %e, "cannot catch SIGHUP; hot reload is off");
                    None
                }
            };
            Self { signal }
        }
        #[cfg(not(unix))]
        Self {}
    }

    /// Reloads `path` on every SIGHUP, forever (never completes).
    pub async fn reload_on_each(self, gw: Arc<Gateway>, path: PathBuf, overrides: Overrides) {
        #[cfg(unix)]
        if let Some(mut hup) = self.signal {
            while hup.recv().await.is_some() {
                info!(file = %path.display(), "SIGHUP: reloading configuration");
                let _ = reload_file(&gw, &path, &overrides).await;
            }
        }
        let _ = (gw, path, overrides);
        std::future::pending::<()>().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_settings_are_kept() {
        let old = crate::config::load::parse_str(
            "listen: 127.0.0.1:1\nstore: { prefix: a }\nroutes: [ { name: r, respond: {} } ]\n",
        )
        .expect("valid");
        let mut new = crate::config::load::parse_str(
            "listen: 127.0.0.1:2\nadmin: 127.0.0.1:3\nstore: { prefix: b }\ntimeouts: { header_read: 1s, upstream_response: 1s, idle: 2s, drain: 3s }\nserver: { max_connections: 4, backlog: 6, max_header_size: 16KiB, max_uri_size: 2KiB, max_body_size: 5 }\nroutes: [ { name: s, respond: {} } ]\n",
        )
        .expect("valid");
        keep_fixed(&old, &mut new);
        let addrs = |c: &Config| c.listen.iter().map(|l| l.addr).collect::<Vec<_>>();
        assert_eq!(addrs(&new), addrs(&old));
        assert_eq!(new.timeouts.idle, old.timeouts.idle);
        assert_eq!(new.timeouts.drain, old.timeouts.drain);
        assert_eq!(new.server.max_connections, old.server.max_connections);
        assert_eq!(new.server.max_header_size, old.server.max_header_size);
        assert_eq!(new.server.backlog, old.server.backlog);
        assert_eq!(new.server.max_body_size, Some(5));
        // The guard reads the URI cap per request, so it follows a reload.
        assert_eq!(new.server.max_uri_size, 2048);
        assert_eq!(new.admin, None);
        assert_eq!(new.store.prefix, "a");
        assert_eq!(new.timeouts.header_read, old.timeouts.header_read);
        // Reloadable settings are the new ones.
        assert_eq!(new.timeouts.upstream_response.as_secs(), 1);
        assert_eq!(&*new.routes[0].name, "s");
    }
}
