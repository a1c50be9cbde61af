//! From [`RedisConfig`] to fred's client configuration: which servers
//! (standalone, Cluster seeds, Sentinel), which credentials, and TLS.
//!
//! fred does the topology work itself: a Cluster client learns the slot map
//! from `CLUSTER SLOTS` and follows `MOVED`/`ASK`; a Sentinel client asks
//! the sentinels for the master's address on every (re)connect and checks
//! its role, so a failover is followed by the ordinary reconnect loop.
//!
//! TLS uses rustls with the *ring* provider, chosen explicitly rather than
//! through rustls' process-wide default, so it works whatever other crates
//! in the binary enable. A `ca_file` replaces the system roots: a private CA
//! for Redis should not be trusted for anything else, nor public CAs for
//! Redis.

use std::path::Path;
use std::sync::Arc;

use fred::rustls::crypto::ring;
use fred::rustls::pki_types::CertificateDer;
use fred::rustls::pki_types::pem::PemObject;
use fred::rustls::{ClientConfig, RootCertStore};
use fred::types::config::{Config as FredConfig, ServerConfig, TlsConfig, TlsConnector};

use crate::config::{RedisConfig, RedisTopology};
use crate::store::contract::StoreError;

/// fred's configuration for `cfg`.
///
/// # Errors
/// [`StoreError::Unavailable`] for a malformed URL or an unusable CA file.
/// The URL may hold a password: it is never repeated in the error.
pub fn fred_config(cfg: &RedisConfig) -> Result<FredConfig, StoreError> {
    let invalid = |why: &str| StoreError::Unavailable(format!("invalid Redis URL: {why}"));
    let mut tls = cfg.tls.is_some();
    let mut config = match &cfg.topology {
        RedisTopology::Standalone => {
            let scheme = cfg.url.split_once("://").map(|(scheme, _)| scheme);
            match scheme {
                Some("redis") => {}
                Some("rediss") => tls = true,
                _ => {
                    return Err(invalid(
                        "expected redis:// or rediss://[user:password@]host:port[/db]",
                    ));
                }
            }
            // Parse the plain form: TLS is configured below, from our own
            // roots, not from fred's URL defaults.
            let plain = cfg.url.replacen("rediss://", "redis://", 1);
            FredConfig::from_url_centralized(&plain).map_err(|e| invalid(e.details()))?
        }
        RedisTopology::Cluster { seeds } => FredConfig {
            server: ServerConfig::new_clustered(seeds.clone()),
            ..FredConfig::default()
        },
        RedisTopology::Sentinel {
            service_name,
            nodes,
        } => FredConfig {
            server: ServerConfig::new_sentinel(nodes.clone(), service_name.clone()),
            ..FredConfig::default()
        },
    };
    if let Some(user) = &cfg.username {
        config.username = Some(user.clone());
    }
    if let Some(password) = &cfg.password {
        config.password = Some(password.clone());
    }
    if let Some(db) = cfg.database {
        config.database = Some(db);
    }
    config.tls = if tls {
        let ca_file = cfg.tls.as_ref().and_then(|t| t.ca_file.as_deref());
        Some(tls_config(ca_file)?)
    } else {
        None
    };
    Ok(config)
}

/// A rustls connector trusting `ca_file`'s certificates, or the system's.
fn tls_config(ca_file: Option<&Path>) -> Result<TlsConfig, StoreError> {
    let tls_error = |why: String| StoreError::Unavailable(format!("Redis TLS: {why}"));
    let mut roots = RootCertStore::empty();
    match ca_file {
        Some(path) => {
            let pem = std::fs::read(path)
                .map_err(|e| tls_error(format!("cannot read {}: {e}", path.display())))?;
            for cert in CertificateDer::pem_slice_iter(&pem) {
                let cert =
                    cert.map_err(|e| tls_error(format!("{}: not PEM: {e}", path.display())))?;
                roots
                    .add(cert)
                    .map_err(|e| tls_error(format!("{}: {e}", path.display())))?;
            }
            if roots.is_empty() {
                return Err(tls_error(format!(
                    "{} holds no certificate",
                    path.display()
                )));
            }
        }
        None => {
            // Unreadable system certificates are skipped; with none at all
            // every handshake fails, which the reconnect loop reports.
            let native = fred::rustls_native_certs::load_native_certs();
            for cert in native.certs {
                let _ = roots.add(cert);
            }
        }
    }
    let config = ClientConfig::builder_with_provider(Arc::new(ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| tls_error(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(TlsConnector::from(config).into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn standalone_urls() {
        let cfg = |url: &str| RedisConfig {
            url: url.into(),
            ..RedisConfig::default()
        };
        let c = fred_config(&cfg("redis://u:p@127.0.0.1:7/3")).expect("plain url");
        assert_eq!(c.database, Some(3));
        assert_eq!(c.username.as_deref(), Some("u"));
        assert!(c.tls.is_none());
        let c = fred_config(&cfg("rediss://127.0.0.1:7")).expect("tls url");
        assert!(c.tls.is_some());
        for bad in ["http://x", "localhost:6379", "redis://h:99999"] {
            assert!(fred_config(&cfg(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn unreadable_ca_file_is_an_error() {
        let dir = std::env::temp_dir().join("tollgate-no-such-ca.pem");
        let cfg = RedisConfig {
            url: "rediss://127.0.0.1:7".into(),
            tls: Some(crate::config::RedisTls { ca_file: Some(dir) }),
            ..RedisConfig::default()
        };
        assert!(fred_config(&cfg).is_err());
    }
}
