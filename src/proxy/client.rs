//! The general upstream client: hyper-util's pooled client over rustls,
//! for `https://` upstreams (HTTP/1.1 or HTTP/2 by ALPN), for routes that
//! pass upgrades through, and, speaking HTTP/2 only, for `h2c://`.

use std::time::Duration;

use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio_rustls::rustls::ClientConfig;

use super::body::UpstreamBody;

/// hyper-util's client over the https-or-http connector.
pub type UpstreamClient = Client<HttpsConnector<HttpConnector>, UpstreamBody>;

/// A client checking certificates with `tls`, connecting within
/// `connect_timeout` and keeping idle connections for `idle_timeout`;
/// with `h2c`, HTTP/2 with prior knowledge on every connection.
pub fn build_client(
    tls: &ClientConfig,
    connect_timeout: Duration,
    idle_timeout: Duration,
    h2c: bool,
) -> UpstreamClient {
    let mut http = HttpConnector::new();
    http.set_connect_timeout(Some(connect_timeout));
    http.set_nodelay(true);
    // The https connector wraps this one and needs `https://` passed down.
    http.enforce_http(false);
    let mut config = tls.clone();
    // The connector sets ALPN itself and insists the list is empty.
    config.alpn_protocols.clear();
    let connector = HttpsConnectorBuilder::new()
        .with_tls_config(config)
        .https_or_http()
        .enable_http1()
        .enable_http2()
        .wrap_connector(http);
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(idle_timeout)
        .pool_max_idle_per_host(256)
        .http2_only(h2c)
        .timer(hyper_util::rt::TokioTimer::new())
        .build(connector)
}
