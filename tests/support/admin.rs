//! A gateway with its admin listener, both on free loopback ports, through
//! the library API; and helpers to read `/metrics`.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::oneshot;

use super::gateway::{Reply, get, send};

/// A gateway serving a proxy and an admin listener.
pub struct AdminGateway {
    pub addr: SocketAddr,
    pub admin: SocketAddr,
    pub gateway: Arc<tollgate::Gateway>,
    stop: Option<oneshot::Sender<()>>,
}

impl AdminGateway {
    /// Starts `yaml` (its `listen` and `admin` are ignored: both are bound on
    /// 127.0.0.1:0) with the limiter reading `clock`.
    pub async fn start(yaml: &str, clock: Arc<dyn tollgate::clock::Clock>) -> AdminGateway {
        let config = tollgate::config::load::parse_str(yaml)
            .unwrap_or_else(|e| panic!("test config is invalid:\n{e}"));
        let proxy = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let admin = TcpListener::bind("127.0.0.1:0").await.expect("bind admin");
        let addr = proxy.local_addr().unwrap();
        let admin_addr = admin.local_addr().unwrap();
        let (tx, rx) = oneshot::channel::<()>();
        let serve = tollgate::server::Serve {
            admin: Some(admin),
            clock,
            ..tollgate::server::Serve::on(vec![proxy])
        };
        let started = super::gateway::start_connected(config, serve).await;
        let gateway = Arc::clone(started.gateway());
        tokio::spawn(started.until(async {
            let _ = rx.await;
        }));
        AdminGateway {
            addr,
            admin: admin_addr,
            gateway,
            stop: Some(tx),
        }
    }

    /// Begins the shutdown: no new proxy connections, in-flight requests drain.
    pub fn shut_down(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }

    /// GET on the admin listener.
    pub async fn admin_get(&self, path: &str) -> Reply {
        send(self.admin, get(path, &[])).await
    }

    /// The `/metrics` text.
    pub async fn scrape(&self) -> String {
        let r = self.admin_get("/metrics").await;
        assert_eq!(r.status, http::StatusCode::OK);
        r.text()
    }
}

impl Drop for AdminGateway {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }
}

/// The value of the series written exactly `series` (name and labels as
/// the exposition prints them), or `None` when it is not there.
pub fn value(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        let rest = l.strip_prefix(series)?.strip_prefix(' ')?;
        rest.split(' ').next()?.parse().ok()
    })
}
