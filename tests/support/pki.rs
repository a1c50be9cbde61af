//! A test certificate authority: a CA and a certificate it signed, as PEM
//! files, for TLS on both sides of the gateway and for Redis over TLS.

use std::path::PathBuf;

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};

/// A CA and a certificate it signed for `localhost` and 127.0.0.1, as PEM
/// files in a temporary directory.
pub struct Pki {
    pub dir: tempfile::TempDir,
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca_der: rustls_pki_types::CertificateDer<'static>,
}

/// A fresh CA and a leaf certificate it signed.
pub fn new_pki() -> Pki {
    let dir = tempfile::tempdir().expect("temp dir");
    let ca_key = KeyPair::generate().expect("CA key");
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "tollgate test CA");
    let ca = CertifiedIssuer::self_signed(ca_params, ca_key).expect("CA certificate");
    let leaf_key = KeyPair::generate().expect("leaf key");
    let leaf = CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
        .expect("leaf params")
        .signed_by(&leaf_key, &ca)
        .expect("leaf certificate");
    let write = |name: &str, text: String| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).expect("write PEM");
        path
    };
    Pki {
        ca: write("ca.pem", ca.pem()),
        cert: write("cert.pem", leaf.pem()),
        key: write("key.pem", leaf_key.serialize_pem()),
        ca_der: ca.der().clone(),
        dir,
    }
}
