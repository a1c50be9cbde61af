//! TLS with rustls: server settings for listeners, client settings for
//! `https://` upstreams.
//!
//! Certificates and keys are read while the configuration is loaded, so a
//! missing file, a file without a certificate, a broken key or a key that
//! does not belong to the certificate is a configuration error that names
//! the file — never a panic at the first handshake (pingora's TLS panic is
//! the counter-example). A reload loads the files again, which is how a
//! renewed certificate is picked up.
//!
//! The crypto provider is *ring*, named explicitly rather than taken from
//! a process-wide default: aws-lc-rs would need cmake and a C toolchain at
//! build time, and an explicit provider cannot be changed behind our back by
//! another crate installing a default.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::crypto::ring;
use tokio_rustls::rustls::{self, ClientConfig, RootCertStore, ServerConfig};

/// ALPN identifiers offered by listeners, most preferred first
/// (RFC 7301; `h2` is RFC 9113 §3.2).
pub const ALPN: [&[u8]; 2] = [b"h2", b"http/1.1"];

/// Why TLS settings could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A file is not PEM, or holds nothing of the expected kind.
    #[error("{}: {what}", path.display())]
    Pem {
        /// The file.
        path: PathBuf,
        /// What is wrong, in words.
        what: String,
    },
    /// rustls refused the certificate chain and key together.
    #[error("{} and {}: {source}", cert.display(), key.display())]
    Rejected {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// rustls' reason.
        source: rustls::Error,
    },
    /// rustls refused a CA certificate.
    #[error("{}: not a usable CA certificate: {source}", path.display())]
    BadCa {
        /// The file.
        path: PathBuf,
        /// rustls' reason.
        source: rustls::Error,
    },
    /// The crypto provider supports no safe protocol version (cannot happen
    /// with ring; kept so it is reported rather than unwrapped).
    #[error("TLS setup: {0}")]
    Provider(rustls::Error),
}

/// PEM files larger than this are refused: a long chain is tens of
/// kilobytes, and a mistaken path must not exhaust memory.
const MAX_PEM_BYTES: u64 = 4 * 1024 * 1024;

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    use std::io::Read as _;
    let failed = |source| TlsError::Read {
        path: path.to_owned(),
        source,
    };
    let file = std::fs::File::open(path).map_err(failed)?;
    // A FIFO or a device (`/dev/stdin`) could block the loader for ever.
    if !file.metadata().map_err(failed)?.is_file() {
        return Err(TlsError::Pem {
            path: path.to_owned(),
            what: "is not a regular file".to_owned(),
        });
    }
    let mut bytes = Vec::new();
    file.take(MAX_PEM_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(failed)?;
    if bytes.len() as u64 > MAX_PEM_BYTES {
        return Err(TlsError::Pem {
            path: path.to_owned(),
            what: format!("is larger than {MAX_PEM_BYTES} bytes; not a PEM file"),
        });
    }
    Ok(bytes)
}

/// Every certificate in the PEM file at `path`, in order (leaf first for a
/// chain).
fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read(path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem {
            path: path.to_owned(),
            what: format!("not a PEM certificate file: {e}"),
        })?;
    if certs.is_empty() {
        return Err(TlsError::Pem {
            path: path.to_owned(),
            what: "holds no PEM certificate (-----BEGIN CERTIFICATE-----)".to_owned(),
        });
    }
    Ok(certs)
}

/// The first private key (PKCS#8, PKCS#1 or SEC1) in the PEM file at `path`.
fn private_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let pem = read(path)?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| TlsError::Pem {
        path: path.to_owned(),
        what: match e {
            rustls_pki_types::pem::Error::NoItemsFound => {
                "holds no PEM private key (-----BEGIN PRIVATE KEY-----)".to_owned()
            }
            other => format!("not a PEM private key file: {other}"),
        },
    })
}

/// Listener settings: the chain in `cert`, the key in `key`, ALPN `h2` and
/// `http/1.1`.
///
/// # Errors
/// A file cannot be read or parsed, or the key does not fit the certificate.
pub fn server_config(cert: &Path, key: &Path) -> Result<Arc<ServerConfig>, TlsError> {
    // Both files are read before either error is returned, so a file that is
    // missing is named even when the other one is broken too.
    let certs = certificates(cert);
    let private = private_key(key);
    let (certs, private) = (certs?, private?);
    let mut config = ServerConfig::builder_with_provider(Arc::new(ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Provider)?
        .with_no_client_auth()
        .with_single_cert(certs, private)
        .map_err(|source| TlsError::Rejected {
            cert: cert.to_owned(),
            key: key.to_owned(),
            source,
        })?;
    config.alpn_protocols = ALPN.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(config))
}

/// Upstream settings: the Mozilla roots of `webpki-roots`, plus every
/// certificate in `ca` when given (a private CA for internal upstreams).
/// ALPN is set by the connector (`h2` when the upstream offers it).
///
/// # Errors
/// `ca` cannot be read or holds no usable certificate.
pub fn client_config(ca: Option<&Path>) -> Result<Arc<ClientConfig>, TlsError> {
    let mut roots = RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    if let Some(path) = ca {
        for cert in certificates(path)? {
            roots.add(cert).map_err(|source| TlsError::BadCa {
                path: path.to_owned(),
                source,
            })?;
        }
    }
    let config = ClientConfig::builder_with_provider(Arc::new(ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Provider)?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_and_empty_files_are_named() {
        let dir = std::env::temp_dir().join(format!("tollgate-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "not pem at all\n").expect("write");
        let missing = dir.join("missing.pem");
        let e = server_config(&missing, &empty).expect_err("missing cert");
        assert!(e.to_string().contains("missing.pem"), "{e}");
        let e = server_config(&empty, &empty).expect_err("no certificate");
        assert!(e.to_string().contains("empty.pem"), "{e}");
        assert!(e.to_string().contains("no PEM certificate"), "{e}");
        let e = client_config(Some(&empty)).expect_err("no CA");
        assert!(e.to_string().contains("empty.pem"), "{e}");
        assert!(client_config(None).is_ok());
        let e = client_config(Some(Path::new("/dev/zero"))).expect_err("a device");
        assert!(e.to_string().contains("not a regular file"), "{e}");
        let big = dir.join("big.pem");
        std::fs::write(&big, vec![b'x'; 4 * 1024 * 1024 + 1]).expect("write");
        let e = client_config(Some(&big)).expect_err("too large");
        assert!(e.to_string().contains("larger than"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
