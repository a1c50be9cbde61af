//! TLS on both sides of the gateway, with a CA generated in the test.
//!
//! A listener with `tls: { cert, key }` speaks HTTP/2 and HTTP/1.1 chosen by
//! ALPN; an `https://` upstream is checked against the route's
//! `upstream_ca` (and refused without it), gets SNI, and is spoken to over
//! HTTP/2 when it offers it; bad certificate and key files are
//! configuration errors that name the file.

#[path = "support/mod.rs"]
mod support;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls_pki_types::ServerName;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::rustls::{self, ClientConfig, RootCertStore};

use support::gateway::{Gateway, Upstream};
use support::pki::{Pki, new_pki};

/// A client that trusts only the test CA and offers `alpn`.
fn client(pki: &Pki, alpn: &[&[u8]]) -> tokio_rustls::TlsConnector {
    let mut roots = RootCertStore::empty();
    roots.add(pki.ca_der.clone()).expect("add CA");
    let mut config =
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .expect("protocol versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    tokio_rustls::TlsConnector::from(Arc::new(config))
}

async fn tls_gateway(pki: &Pki, up: &Upstream) -> Gateway {
    tls_gateway_with(pki, up, "").await
}

async fn tls_gateway_with(pki: &Pki, up: &Upstream, extra: &str) -> Gateway {
    let yaml = format!(
        r#"
{extra}
listen:
  - {{ addr: 127.0.0.1:0, tls: {{ cert: "{cert}", key: "{key}" }} }}
routes:
  - name: all
    match: {{ path_prefix: / }}
    upstream: {up}
    limits: [ {{ name: per_ip, key: ip, limit: 100, window: 1m }} ]
"#,
        cert = pki.cert.display(),
        key = pki.key.display(),
        up = up.url()
    );
    Gateway::start(&yaml).await
}

async fn connect(
    pki: &Pki,
    addr: SocketAddr,
    alpn: &[&[u8]],
) -> tokio_rustls::client::TlsStream<TcpStream> {
    let tcp = TcpStream::connect(addr).await.expect("connect");
    client(pki, alpn)
        .connect(ServerName::try_from("localhost").expect("name"), tcp)
        .await
        .expect("TLS handshake with the gateway")
}

fn get(path: &str) -> Request<Full<Bytes>> {
    Request::get(format!("https://localhost{path}"))
        .header("host", "localhost")
        .body(Full::new(Bytes::new()))
        .expect("request")
}

#[tokio::test]
async fn https_listener_speaks_h2_and_http11_by_alpn() {
    let pki = new_pki();
    let up = Upstream::start().await;
    let gw = tls_gateway(&pki, &up).await;

    // HTTP/2, chosen by ALPN.
    let tls = connect(&pki, gw.addr, &[b"h2", b"http/1.1"]).await;
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let (mut h2, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
            .await
            .expect("h2 handshake");
    tokio::spawn(conn);
    let res = h2.send_request(get("/over-h2")).await.expect("h2 response");
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.version(), http::Version::HTTP_2);
    assert!(res.headers().contains_key("ratelimit"));
    let body = res.into_body().collect().await.expect("body").to_bytes();
    assert_eq!(&body[..], b"upstream ok");
    let seen = up.last();
    assert_eq!(seen.uri, "/over-h2");
    assert_eq!(seen.headers["x-forwarded-proto"], "https");

    // HTTP/1.1, chosen by ALPN.
    let tls = connect(&pki, gw.addr, &[b"http/1.1"]).await;
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
    let (mut h1, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .expect("h1 handshake");
    tokio::spawn(conn);
    let res = h1.send_request(get("/over-h1")).await.expect("h1 response");
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.version(), http::Version::HTTP_11);
    assert_eq!(up.last().headers["x-forwarded-proto"], "https");

    // A client that does not trust the CA cannot complete the handshake,
    // and the listener keeps serving.
    let other = new_pki();
    let tcp = TcpStream::connect(gw.addr).await.expect("connect");
    let refused = client(&other, &[b"h2"])
        .connect(ServerName::try_from("localhost").expect("name"), tcp)
        .await;
    assert!(refused.is_err(), "a foreign CA was accepted");
    let tls = connect(&pki, gw.addr, &[b"http/1.1"]).await;
    let (mut h1, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .expect("h1 handshake");
    tokio::spawn(conn);
    assert_eq!(
        h1.send_request(get("/again"))
            .await
            .expect("response")
            .status(),
        StatusCode::OK
    );
}

#[tokio::test]
async fn plain_http_on_a_tls_listener_is_dropped_not_served() {
    let pki = new_pki();
    let up = Upstream::start().await;
    let gw = tls_gateway(&pki, &up).await;
    let tcp = TcpStream::connect(gw.addr).await.expect("connect");
    let (mut h1, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .expect("h1 handshake");
    tokio::spawn(conn);
    assert!(h1.send_request(get("/plain")).await.is_err());
    assert_eq!(up.count(), 0);
}

/// An HTTPS upstream with the test certificate, offering h2 and http/1.1.
/// It answers with the HTTP version and the SNI name it saw.
async fn tls_upstream(pki: &Pki) -> SocketAddr {
    let config = tollgate::tls::server_config(&pki.cert, &pki.key).expect("upstream TLS");
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let sni = tls.get_ref().1.server_name().unwrap_or("-").to_owned();
                let svc = service_fn(move |req: Request<Incoming>| {
                    // `Host` over HTTP/1.1, `:authority` over HTTP/2 (which
                    // carries no `Host` beside it).
                    let host = match req.headers().get("host") {
                        Some(h) if req.version() == http::Version::HTTP_2 => {
                            format!("both {h:?} and :authority")
                        }
                        Some(h) => h.to_str().unwrap_or("-").to_owned(),
                        None => req
                            .uri()
                            .authority()
                            .map_or_else(|| "-".to_owned(), ToString::to_string),
                    };
                    let xfh = req
                        .headers()
                        .get("x-forwarded-host")
                        .and_then(|h| h.to_str().ok())
                        .unwrap_or("-")
                        .to_owned();
                    let text = format!(
                        "{:?} sni={sni} path={} host={host} xfh={xfh}",
                        req.version(),
                        req.uri().path()
                    );
                    async move { Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(text)))) }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tls), svc)
                    .await;
            });
        }
    });
    addr
}

#[tokio::test]
async fn https_upstream_with_its_ca_gets_sni_and_h2() {
    let pki = new_pki();
    let up = tls_upstream(&pki).await;
    let yaml = format!(
        r#"
listen: 127.0.0.1:0
routes:
  - name: trusted
    match: {{ path_prefix: /trusted }}
    upstream: https://localhost:{port}
    upstream_ca: "{ca}"
  - name: untrusted
    match: {{ path_prefix: /untrusted }}
    upstream: https://localhost:{port}
"#,
        port = up.port(),
        ca = pki.ca.display()
    );
    let gw = Gateway::start(&yaml).await;
    let r = support::gateway::send(gw.addr, support::gateway::get("/trusted/x", &[])).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    // The authority names the upstream (`:authority` over h2, no `Host`
    // beside it); the client's host is in X-Forwarded-Host.
    assert_eq!(
        r.text(),
        format!(
            "HTTP/2.0 sni=localhost path=/trusted/x host=localhost:{} xfh=gateway.test",
            up.port()
        )
    );
    // Pooled: a second request reuses the h2 connection and still works.
    let r = support::gateway::send(gw.addr, support::gateway::get("/trusted/y", &[])).await;
    assert!(
        r.text()
            .starts_with("HTTP/2.0 sni=localhost path=/trusted/y ")
    );

    // Without the CA the upstream's certificate is not trusted: 502.
    let r = support::gateway::send(gw.addr, support::gateway::get("/untrusted", &[])).await;
    assert_eq!(r.status, StatusCode::BAD_GATEWAY);
    assert_eq!(r.header("content-type"), Some("application/problem+json"));
    let _ = &pki.dir;
}

#[test]
fn bad_key_or_certificate_is_a_config_error_naming_the_file() {
    let pki = new_pki();
    let garbage = pki.dir.path().join("garbage-key.pem");
    std::fs::write(
        &garbage,
        "-----BEGIN PRIVATE KEY-----\nnot base64 at all!\n-----END PRIVATE KEY-----\n",
    )
    .expect("write");
    let config = |cert: &std::path::Path, key: &std::path::Path| {
        format!(
            "listen: {{ addr: 127.0.0.1:0, tls: {{ cert: \"{}\", key: \"{}\" }} }}\nroutes: [{{ name: a, respond: {{}} }}]\n",
            cert.display(),
            key.display()
        )
    };
    let errors = |src: String| match tollgate::config::load::parse_str(&src) {
        Ok(_) => panic!("accepted:\n{src}"),
        Err(e) => e.to_string(),
    };

    let e = errors(config(&pki.cert, &garbage));
    assert!(e.starts_with("listen.tls: "), "{e}");
    assert!(e.contains(&garbage.display().to_string()), "{e}");

    // A key that is well formed but belongs to another certificate.
    let other = new_pki();
    let e = errors(config(&pki.cert, &other.key));
    assert!(e.contains(&other.key.display().to_string()), "{e}");
    assert!(e.contains(&pki.cert.display().to_string()), "{e}");

    // The key where the certificate belongs.
    let e = errors(config(&pki.key, &pki.key));
    assert!(e.contains("no PEM certificate"), "{e}");

    // The binary's `check` reports it and exits 2.
    let file = pki.dir.path().join("gateway.yaml");
    std::fs::write(&file, config(&pki.cert, &garbage)).expect("write");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .arg("check")
        .arg(&file)
        .output()
        .expect("run check");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("garbage-key.pem"), "{stderr}");

    // Relative paths are read next to the file that names them.
    std::fs::write(
        &file,
        "listen: { addr: 127.0.0.1:0, tls: { cert: cert.pem, key: key.pem } }\nroutes: [{ name: a, respond: {} }]\n",
    )
    .expect("write");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .arg("check")
        .arg(&file)
        .output()
        .expect("run check");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn a_stalled_tls_handshake_is_cut_off_at_header_read() {
    use tokio::io::AsyncReadExt;

    let pki = new_pki();
    let up = Upstream::start().await;
    let gw = tls_gateway_with(&pki, &up, "timeouts: { header_read: 1s }").await;
    // Connects and never says hello.
    let mut tcp = TcpStream::connect(gw.addr).await.expect("connect");
    let started = std::time::Instant::now();
    let mut buf = [0u8; 64];
    let closed = tokio::time::timeout(std::time::Duration::from_secs(5), tcp.read(&mut buf)).await;
    assert!(
        matches!(closed, Ok(Ok(0) | Err(_))),
        "a silent TLS client was kept: {closed:?}"
    );
    assert!(started.elapsed() >= std::time::Duration::from_millis(900));
    // The listener still completes real handshakes.
    let tls = connect(&pki, gw.addr, &[b"http/1.1"]).await;
    let (mut h1, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .expect("h1 handshake");
    tokio::spawn(conn);
    assert_eq!(
        h1.send_request(get("/after"))
            .await
            .expect("response")
            .status(),
        StatusCode::OK
    );
}

#[tokio::test]
async fn a_reload_reads_renewed_certificates_for_new_connections() {
    let first = new_pki();
    let path = first.dir.path().join("gateway.yaml");
    // Relative paths: read next to the file, on start and on reload.
    std::fs::write(
        &path,
        "listen: [ { addr: 127.0.0.1:0, tls: { cert: cert.pem, key: key.pem } } ]\nroutes: [ { name: ok, respond: { body: ok } } ]\n",
    )
    .expect("write config");
    let config = tollgate::config::load::load_file(&path).expect("valid config");
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let started = tollgate::server::start(config, tollgate::server::Serve::on(vec![listener]))
        .await
        .expect("gateway");
    let gateway = Arc::clone(started.gateway());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(started.until(async move {
        let _ = stopped.await;
    }));

    let handshake = |pki: &Pki| {
        let connector = client(pki, &[b"http/1.1"]);
        async move {
            let tcp = TcpStream::connect(addr).await.expect("connect");
            connector
                .connect(ServerName::try_from("localhost").expect("name"), tcp)
                .await
                .is_ok()
        }
    };
    assert!(handshake(&first).await, "the first certificate is served");

    // The certificate is renewed under another CA, in the same files.
    let renewed = new_pki();
    std::fs::copy(&renewed.cert, &first.cert).expect("replace cert");
    std::fs::copy(&renewed.key, &first.key).expect("replace key");
    assert!(handshake(&first).await, "nothing changes before the reload");
    tollgate::reload::reload_file(&gateway, &path, &tollgate::reload::Overrides::default())
        .await
        .expect("reload");
    assert!(
        handshake(&renewed).await,
        "the renewed certificate is served"
    );
    assert!(!handshake(&first).await, "the old certificate is gone");

    // A broken key is refused by the reload, naming the file; the running
    // certificate keeps serving.
    std::fs::write(&first.key, "not a key\n").expect("break key");
    let refused =
        tollgate::reload::reload_file(&gateway, &path, &tollgate::reload::Overrides::default())
            .await
            .expect_err("a broken key is refused");
    assert!(refused.to_string().contains("key.pem"), "{refused}");
    assert!(
        handshake(&renewed).await,
        "the running certificate still serves"
    );

    let _ = stop.send(());
    serving.await.expect("serve ends");
}

/// An HTTPS upstream (h2 and http/1.1 by ALPN) that reads each request
/// body to its end, or its failure, before answering with the HTTP version
/// and the bytes it read.
async fn collecting_tls_upstream(pki: &Pki) -> SocketAddr {
    let config = tollgate::tls::server_config(&pki.cert, &pki.key).expect("upstream TLS");
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let svc = service_fn(|req: Request<Incoming>| async move {
                    let version = req.version();
                    let text = match req.into_body().collect().await {
                        Ok(b) => format!("{version:?} read {} bytes", b.to_bytes().len()),
                        Err(e) => format!("{version:?} broken body: {e}"),
                    };
                    Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(text))))
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tls), svc)
                    .await;
            });
        }
    });
    addr
}

#[tokio::test]
async fn a_malformed_body_forwarded_over_h2_is_the_clients_fault() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let pki = new_pki();
    let up = collecting_tls_upstream(&pki).await;
    let yaml = format!(
        r#"
listen: 127.0.0.1:0
admin: 127.0.0.1:0
routes:
  - name: h2
    match: {{ path_prefix: / }}
    upstream: https://localhost:{port}
    upstream_ca: "{ca}"
"#,
        port = up.port(),
        ca = pki.ca.display()
    );
    let gw =
        support::admin::AdminGateway::start(&yaml, Arc::new(tollgate::clock::SystemClock)).await;
    let good = Request::post("/collect")
        .header("host", "gateway.test")
        .body(Full::new(Bytes::from_static(b"hello")))
        .expect("request");
    let r = support::gateway::send(gw.addr, good).await;
    assert_eq!(r.text(), "HTTP/2.0 read 5 bytes");

    // Over HTTP/2 hyper's client resets the stream when the body fails and
    // reports only the reset; the body itself says it was the client.
    let mut stream = TcpStream::connect(gw.addr).await.expect("connect");
    stream
        .write_all(
            b"POST /collect HTTP/1.1\r\nHost: gateway.test\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nzz\r\n",
        )
        .await
        .expect("write");
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(
        std::time::Duration::from_secs(15),
        stream.read_to_end(&mut answer),
    )
    .await
    .expect("the gateway answered and closed within 15 s");
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 400 "), "{answer}");

    let text = gw.scrape().await;
    let series = |s: &str| support::admin::value(&text, s).unwrap_or(-1.0);
    assert_eq!(
        series("tollgate_upstream_errors_total{route=\"h2\",kind=\"failed\"}"),
        0.0
    );
    assert_eq!(
        series("tollgate_client_errors_total{route=\"h2\",kind=\"bad_body\"}"),
        1.0
    );
    assert_eq!(
        series("tollgate_requests_total{route=\"h2\",outcome=\"client_error\"}"),
        1.0
    );
    let _ = &pki.dir;
}
