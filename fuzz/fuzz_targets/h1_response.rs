//! The native HTTP/1.1 client's response reading against hyper's client,
//! on the same upstream bytes.
//!
//! The first byte picks the request's method (GET, HEAD, POST) and the
//! size of the pieces the bytes arrive in; the rest is what the upstream
//! sends before it closes. tollgate's head parser and body decoder read
//! it piece by piece; hyper's client reads it over an in-memory duplex
//! after sending the request. Both must accept it with the same status,
//! version, reason phrase, header fields as forwarded (the hop-by-hop
//! ones left out; in order within a name), body bytes and
//! trailers, or both refuse it — but where tollgate refuses, on purpose,
//! what hyper takes: a head with both `Transfer-Encoding` and
//! `Content-Length`, and a switch of protocols (`101`).
#![no_main]

use std::sync::OnceLock;

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, Method, Request};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use libfuzzer_sys::fuzz_target;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tollgate::http1::chunked::Step;
use tollgate::proxy::h1::decode::Decoder;
use tollgate::proxy::h1::head::{self, HeadError};

/// What a client made of the bytes.
#[derive(Debug, PartialEq, Eq)]
struct Read {
    status: u16,
    version: http::Version,
    reason: Option<Vec<u8>>,
    fields: Vec<(String, Vec<u8>)>,
    body: Vec<u8>,
    trailers: Option<Vec<(String, Vec<u8>)>>,
}

fn fields(map: &HeaderMap) -> Vec<(String, Vec<u8>)> {
    map.iter()
        .map(|(k, v)| (k.as_str().to_owned(), v.as_bytes().to_vec()))
        .collect()
}

/// An answer's fields as the gateway forwards them: the hop-by-hop ones
/// left out, and in order within each name (the native client passes the
/// rest as they came, a map groups them by name).
fn forwarded(map: &HeaderMap) -> Vec<(String, Vec<u8>)> {
    let mut map = map.clone();
    tollgate::proxy::strip_hop_by_hop(&mut map);
    let mut fields = fields(&map);
    fields.sort_by(|a, b| a.0.cmp(&b.0));
    fields
}

/// Why tollgate refused, when it is a listed stricter choice.
fn stricter(e: &str) -> bool {
    e == HeadError::LengthAndChunked.to_string() || e == HeadError::Upgrade.to_string()
}

fn native(method: &Method, input: &[u8], step: usize) -> Result<Read, String> {
    let mut pieces = input.chunks(step);
    let mut buf = BytesMut::new();
    let head = loop {
        if !buf.is_empty()
            && let Some(h) = head::parse(&mut buf, method).map_err(|e| e.to_string())?
        {
            break h;
        }
        match pieces.next() {
            Some(p) => buf.extend_from_slice(p),
            None => return Err("closed within the head".into()),
        }
    };
    let mut decoder = Decoder::new(head.framing);
    let mut body = Vec::new();
    let mut trailers = None;
    loop {
        match decoder.decode(&mut buf).map_err(|e| e.to_string())? {
            Step::Data(d) => body.extend_from_slice(&d),
            Step::Trailers(t) => {
                trailers = Some(fields(&t));
                break;
            }
            Step::End => break,
            Step::More => match pieces.next() {
                Some(p) => buf.extend_from_slice(p),
                None => match decoder.eof().map_err(|e| e.to_string())? {
                    Step::End => break,
                    other => return Err(format!("after the end: {other:?}")),
                },
            },
        }
    }
    let mut r = head.response;
    if let Some(passed) = &head.passed {
        tollgate::http1::fields::read_into(r.headers_mut(), passed);
    }
    Ok(Read {
        status: r.status().as_u16(),
        version: r.version(),
        reason: r
            .extensions()
            .get::<hyper::ext::ReasonPhrase>()
            .map(|p| p.as_bytes().to_vec()),
        fields: forwarded(r.headers()),
        body,
        trailers,
    })
}

async fn hyper_reads(method: Method, input: Vec<u8>, step: usize) -> Result<Read, String> {
    let (client, mut upstream) = tokio::io::duplex(1 << 20);
    tokio::spawn(async move {
        // The request first, then the answer, as an upstream would.
        let mut seen = Vec::new();
        let mut chunk = [0u8; 1024];
        while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
            match upstream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => seen.extend_from_slice(&chunk[..n]),
            }
        }
        for piece in input.chunks(step) {
            if upstream.write_all(piece).await.is_err() {
                return;
            }
        }
    });
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake::<_, Empty<Bytes>>(TokioIo::new(client))
            .await
            .map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let req = Request::builder()
        .method(method)
        .uri("/")
        .header("host", "upstream.test")
        .body(Empty::new())
        .map_err(|e| e.to_string())?;
    let res = sender.send_request(req).await.map_err(|e| e.to_string())?;
    let status = res.status().as_u16();
    let version = res.version();
    let reason = res
        .extensions()
        .get::<hyper::ext::ReasonPhrase>()
        .map(|p| p.as_bytes().to_vec());
    let fields = forwarded(res.headers());
    let collected = res
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?;
    let trailers = collected.trailers().map(fields_of);
    Ok(Read {
        status,
        version,
        reason,
        fields,
        body: collected.to_bytes().to_vec(),
        trailers,
    })
}

fn fields_of(map: &HeaderMap) -> Vec<(String, Vec<u8>)> {
    fields(map)
}

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime")
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, input)) = data.split_first() else {
        return;
    };
    let method = match pick % 3 {
        0 => Method::GET,
        1 => Method::HEAD,
        _ => Method::POST,
    };
    let step = match pick / 3 % 4 {
        0 => input.len().max(1),
        1 => 1,
        2 => 7,
        _ => 64,
    };
    let ours = native(&method, input, step);
    let theirs = runtime().block_on(hyper_reads(method, input.to_vec(), step));
    match (&ours, &theirs) {
        (Ok(a), Ok(b)) => assert_eq!(a, b, "both accepted, and read differently"),
        (Err(_), Err(_)) => {}
        (Err(e), Ok(b)) => assert!(stricter(e), "tollgate refused ({e}) what hyper read: {b:?}"),
        (Ok(a), Err(e)) => panic!("hyper refused ({e}) what tollgate read: {a:?}"),
    }
});
