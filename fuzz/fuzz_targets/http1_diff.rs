//! The native HTTP/1.1 server's reading of a request against hyper's.
//!
//! The same bytes go to `tollgate::http1`'s head parser and body decoder,
//! and to hyper's HTTP/1.1 server connection over an in-memory stream (on
//! a current-thread runtime), whose service records what it was given. The
//! target fails when one accepts what the other refuses, when they refuse
//! with different statuses, or when they read a different method, target,
//! version, header fields, body or trailers.
//!
//! Inputs both hand elsewhere are left out: a connection opening with
//! HTTP/2's preface (h2c, hyper-util's auto builder) and a request asking
//! for an upgrade or a `CONNECT` (the native server hands those to hyper).
//! The native server has no stricter choice of its own to list: it reads
//! heads and bodies rule for rule as hyper does.
//!
//! A third opinion, for what both accept: the method is a token, the
//! target visible ASCII (or bytes over 0x7F, which both take and the
//! canonical target percent-encodes), each field name a token and each field value
//! field-vchars, spaces and tabs without white space at either end (RFC
//! 9110 §5.5, §5.6.2; RFC 9112 §3).
#![no_main]

use std::cell::RefCell;
use std::convert::Infallible;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, Request, Response};
use http_body_util::{BodyExt, Empty};
use libfuzzer_sys::fuzz_target;
use tollgate::http1::decode_all;
use tollgate::http1::head::{HeadRead, parse};

/// What one side read of the input's first request.
#[derive(Debug)]
enum Reading {
    /// No whole head: the input ends first.
    NoRequest,
    /// Refused with this status.
    Refused(u16),
    /// Read; the body broke or was cut short.
    BadBody(Request<()>),
    /// Read whole.
    Whole(Request<()>, Vec<u8>, Option<HeaderMap>),
}

fuzz_target!(|data: &[u8]| {
    if data.starts_with(b"PRI ") {
        return;
    }
    let native = native(data);
    if let Reading::Whole(req, ..) | Reading::BadBody(req) = &native {
        if req.method() == http::Method::CONNECT || req.headers().contains_key(http::header::UPGRADE) {
            return;
        }
    }
    let hyper = hyper(data);
    assert!(same(&native, &hyper), "native {native:?}\nhyper {hyper:?}");
    if let Reading::Whole(req, ..) | Reading::BadBody(req) = &native {
        grammar(req);
    }
});

fn native(data: &[u8]) -> Reading {
    let mut buf = BytesMut::from(data);
    let head = match parse(&mut buf) {
        HeadRead::Head(h) => h,
        HeadRead::Partial | HeadRead::Preface => return Reading::NoRequest,
        HeadRead::Refused(r) => return Reading::Refused(r.status().as_u16()),
    };
    let mut req = Request::new(());
    *req.method_mut() = head.method;
    *req.uri_mut() = head.uri;
    *req.version_mut() = head.version;
    *req.headers_mut() = head.headers;
    match decode_all(head.framing, &mut buf) {
        Ok((body, trailers)) => Reading::Whole(req, body, trailers),
        Err(_) => Reading::BadBody(req),
    }
}

fn same(a: &Reading, b: &Reading) -> bool {
    let heads = |x: &Request<()>, y: &Request<()>| {
        x.method() == y.method()
            && x.uri() == y.uri()
            && x.version() == y.version()
            && fields(x.headers()) == fields(y.headers())
    };
    match (a, b) {
        (Reading::Whole(x, bx, tx), Reading::Whole(y, by, ty)) => {
            heads(x, y) && bx == by && tx.as_ref().map(fields) == ty.as_ref().map(fields)
        }
        (Reading::BadBody(x), Reading::BadBody(y)) => heads(x, y),
        (Reading::Refused(x), Reading::Refused(y)) => x == y,
        (Reading::NoRequest, Reading::NoRequest) => true,
        _ => false,
    }
}

fn fields(h: &HeaderMap) -> Vec<(String, Vec<u8>)> {
    h.iter()
        .map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec()))
        .collect()
}

thread_local! {
    static RUNTIME: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
}

fn hyper(data: &[u8]) -> Reading {
    let seen: Rc<RefCell<Option<Reading>>> = Rc::default();
    let out: Rc<RefCell<Vec<u8>>> = Rc::default();
    let io = Memory {
        input: Bytes::copy_from_slice(data),
        out: out.clone(),
    };
    let record = seen.clone();
    let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
        let record = record.clone();
        async move {
            let (parts, body) = req.into_parts();
            let head = Request::from_parts(parts, ());
            let reading = match body.collect().await {
                Ok(c) => {
                    let trailers = c.trailers().cloned();
                    Reading::Whole(head, c.to_bytes().to_vec(), trailers)
                }
                Err(_) => Reading::BadBody(head),
            };
            record.borrow_mut().get_or_insert(reading);
            Ok::<_, Infallible>(Response::new(Empty::<Bytes>::new()))
        }
    });
    RUNTIME.with(|rt| {
        let conn = hyper::server::conn::http1::Builder::new()
            .keep_alive(true)
            // The input's end is the client's write side closing: the
            // request read before it is still served (without this hyper
            // drops it, and the target would see no request).
            .half_close(true)
            .max_buf_size(1 << 20)
            .serve_connection(io, service);
        let r = rt.block_on(conn);
        if std::env::var_os("HTTP1_DIFF_DEBUG").is_some() {
            eprintln!("hyper connection: {r:?}");
        }
    });
    let reading = seen.borrow_mut().take();
    match reading {
        Some(r) => r,
        None => {
            let out = out.borrow();
            match out.get(9..12).and_then(|s| std::str::from_utf8(s).ok()) {
                Some(status) if out.starts_with(b"HTTP/1.1 ") => {
                    Reading::Refused(status.parse().expect("a status"))
                }
                _ => Reading::NoRequest,
            }
        }
    }
}

/// The input, then the end; what is written is kept.
struct Memory {
    input: Bytes,
    out: Rc<RefCell<Vec<u8>>>,
}

impl hyper::rt::Read for Memory {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        mut buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        let n = self.input.len().min(buf.remaining());
        let chunk = self.input.split_to(n);
        buf.put_slice(&chunk);
        Poll::Ready(Ok(()))
    }
}

impl hyper::rt::Write for Memory {
    fn poll_write(self: Pin<&mut Self>, _: &mut Context<'_>, b: &[u8]) -> Poll<std::io::Result<usize>> {
        self.out.borrow_mut().extend_from_slice(b);
        Poll::Ready(Ok(b.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// RFC 9110 §5.6.2: a token's characters.
fn tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

fn grammar(req: &Request<()>) {
    let method = req.method().as_str().as_bytes();
    assert!(!method.is_empty() && method.iter().all(|&b| tchar(b)), "method {method:?}");
    // Both servers take bytes over 0x7F in a target (`http`'s `Uri`
    // does); RFC 9112 §3.2 does not, and the canonical target
    // (src/target.rs) percent-encodes them before anything routes on it.
    let target = req.uri().to_string();
    assert!(
        !target.is_empty() && target.bytes().all(|b| (0x21..=0x7e).contains(&b) || b >= 0x80),
        "target {target:?}"
    );
    for (name, value) in req.headers() {
        let n = name.as_str().as_bytes();
        assert!(!n.is_empty() && n.iter().all(|&b| tchar(b)), "name {n:?}");
        let v = value.as_bytes();
        let vchar = |b: u8| b == b'\t' || b == b' ' || (0x21..=0x7e).contains(&b) || b >= 0x80;
        assert!(v.iter().all(|&b| vchar(b)), "value {v:?}");
        let ows = |b: Option<&u8>| matches!(b, Some(b' ' | b'\t'));
        assert!(!ows(v.first()) && !ows(v.last()), "value with white space at an end {v:?}");
    }
}
