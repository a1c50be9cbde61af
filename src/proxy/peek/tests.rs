//! Reading ahead on bodies held in memory and on real connections: what
//! the caller gets, and that the body forwarded is the client's, byte for
//! byte, whatever stopped the reading.

use std::convert::Infallible;

use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

use super::*;
use crate::proxy::{ClientBody, UpstreamBody};

const CAP: usize = 1 << 20;

async fn forwarded(req: Request<ClientBody>) -> Bytes {
    let body = UpstreamBody::new(req.into_body(), None);
    match body.collect().await {
        Ok(c) => c.to_bytes(),
        Err(e) => panic!("body failed: {e}"),
    }
}

fn whole(bytes: &'static [u8]) -> Request<ClientBody> {
    Request::new(ClientBody::Whole(Full::new(Bytes::from_static(bytes))))
}

#[tokio::test]
async fn a_small_body_is_read_and_replayed() {
    let budget = PeekBudget::new(1000);
    let body = br#"{"model":"m","max_tokens":5}"#;
    let (req, got) = peek(whole(body), CAP, &budget, Duration::from_secs(5)).await;
    assert_eq!(got.as_deref(), Some(&body[..]));
    assert!(
        budget.available() < 1000,
        "the bytes held take from the budget"
    );
    assert_eq!(forwarded(req).await, &body[..]);
    assert_eq!(
        budget.available(),
        1000,
        "handed on, the bytes are given back"
    );
}

#[tokio::test]
async fn an_empty_or_announced_large_body_is_not_read() {
    let budget = PeekBudget::new(1000);
    let (req, got) = peek(whole(b""), CAP, &budget, Duration::from_secs(5)).await;
    assert_eq!(got, None);
    assert!(matches!(req.body(), ClientBody::Whole(_)));
    let (req, got) = peek(whole(b"0123456789"), 9, &budget, Duration::from_secs(5)).await;
    assert_eq!(got, None);
    assert!(matches!(req.body(), ClientBody::Whole(_)));
    assert_eq!(forwarded(req).await, &b"0123456789"[..]);
}

#[tokio::test]
async fn past_the_budget_nothing_is_read_for_the_caller() {
    let budget = PeekBudget::new(4);
    let (req, got) = peek(whole(b"0123456789"), CAP, &budget, Duration::from_secs(5)).await;
    assert_eq!(got, None);
    assert_eq!(budget.available(), 4);
    assert_eq!(forwarded(req).await, &b"0123456789"[..]);
}

/// A gateway-side server whose handler peeks at each request's body,
/// reports what it got, then reads the forwarded body and answers it.
async fn server(
    cap: usize,
    budget: PeekBudget,
    wait: Duration,
) -> (std::net::SocketAddr, mpsc::UnboundedReceiver<Option<Bytes>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("address");
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (tx, budget) = (tx.clone(), budget.clone());
            let svc = service_fn(move |req: Request<hyper::body::Incoming>| {
                let (tx, budget) = (tx.clone(), budget.clone());
                async move {
                    let req = req.map(ClientBody::from);
                    let (req, got) = peek(req, cap, &budget, wait).await;
                    let _ = tx.send(got);
                    let body = UpstreamBody::new(req.into_body(), None);
                    let answer = match body.collect().await {
                        Ok(c) => c.to_bytes(),
                        Err(e) => Bytes::from(format!("failed: {e}")),
                    };
                    Ok::<_, Infallible>(hyper::Response::new(Full::new(answer)))
                }
            });
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc),
            );
        }
    });
    (addr, rx)
}

async fn answer_body(stream: &mut TcpStream) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = [0u8; 65536];
    loop {
        let n = stream.read(&mut buf).await.expect("read");
        out.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&out);
        if let Some(end) = text.find("\r\n\r\n") {
            let len: usize = text[..end]
                .lines()
                .find_map(|l| l.strip_prefix("content-length: "))
                .and_then(|v| v.trim().parse().ok())
                .expect("a content-length");
            if out.len() >= end + 4 + len {
                return out[end + 4..end + 4 + len].to_vec();
            }
        }
        assert!(n > 0, "connection closed early");
    }
}

#[tokio::test]
async fn a_body_in_pieces_on_a_connection_is_read_whole() {
    let (addr, mut got) = server(CAP, PeekBudget::new(1 << 26), Duration::from_secs(10)).await;
    let mut s = TcpStream::connect(addr).await.expect("connect");
    let body = br#"{"model":"gpt","max_tokens":77}"#;
    s.write_all(
        format!(
            "POST / HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\n\r\n",
            body.len()
        )
        .as_bytes(),
    )
    .await
    .expect("write");
    for piece in body.chunks(5) {
        s.write_all(piece).await.expect("write");
        s.flush().await.expect("flush");
    }
    assert_eq!(got.recv().await.flatten().as_deref(), Some(&body[..]));
    assert_eq!(answer_body(&mut s).await, body);
}

#[tokio::test]
async fn a_client_that_stalls_mid_body_is_given_up_on_and_forwarded() {
    let (addr, mut got) = server(CAP, PeekBudget::new(1 << 26), Duration::from_millis(300)).await;
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 10\r\n\r\n0123")
        .await
        .expect("write");
    // The peek gives up without the rest: the caller gets nothing.
    assert_eq!(got.recv().await, Some(None));
    s.write_all(b"456789").await.expect("write");
    assert_eq!(answer_body(&mut s).await, b"0123456789");
}

#[tokio::test]
async fn a_chunked_body_past_the_cap_is_forwarded_whole() {
    let (addr, mut got) = server(1000, PeekBudget::new(1 << 26), Duration::from_secs(10)).await;
    let mut s = TcpStream::connect(addr).await.expect("connect");
    let body: Vec<u8> = (0..5000u32).map(|i| b'a' + (i % 26) as u8).collect();
    let mut wire = b"POST / HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
    for c in body.chunks(700) {
        wire.extend_from_slice(format!("{:x}\r\n", c.len()).as_bytes());
        wire.extend_from_slice(c);
        wire.extend_from_slice(b"\r\n");
    }
    wire.extend_from_slice(b"0\r\n\r\n");
    s.write_all(&wire).await.expect("write");
    assert_eq!(got.recv().await, Some(None));
    assert_eq!(answer_body(&mut s).await, body);
}

#[tokio::test]
async fn a_body_that_breaks_while_read_fails_when_forwarded() {
    let (addr, mut got) = server(CAP, PeekBudget::new(1 << 26), Duration::from_secs(10)).await;
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(
        b"POST / HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n4\r\nabcd\r\nzz\r\n",
    )
    .await
    .expect("write");
    assert_eq!(got.recv().await, Some(None));
    let answer = answer_body(&mut s).await;
    assert!(
        answer.starts_with(b"failed: malformed request body"),
        "{}",
        String::from_utf8_lossy(&answer)
    );
}
