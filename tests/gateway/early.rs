//! An upstream that answers a request before it has read the request's
//! body. The answer reaches the client at once; an answer still streaming
//! has the rest of the body written to its connection as it is read,
//! which then carries the next request; one that ends first, or that the
//! upstream closes, is not waited on.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::support::gateway::Gateway;

/// (connection, request body bytes read) per request.
type Heard = Arc<Mutex<Vec<(usize, usize)>>>;

fn find(buf: &[u8], what: &[u8]) -> Option<usize> {
    buf.windows(what.len()).position(|w| w == what)
}

/// Reads from `s` into `buf` until it holds `at_least` bytes; false at the
/// end of the stream.
async fn fill(s: &mut TcpStream, buf: &mut Vec<u8>, at_least: usize) -> bool {
    let mut chunk = [0u8; 16 * 1024];
    while buf.len() < at_least {
        match s.read(&mut chunk).await {
            Ok(0) | Err(_) => return false,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    true
}

/// Reads a head into `buf`; its length and `Content-Length`.
async fn head(s: &mut TcpStream, buf: &mut Vec<u8>) -> Option<(usize, usize, String)> {
    loop {
        if let Some(i) = find(buf, b"\r\n\r\n") {
            let text = String::from_utf8_lossy(&buf[..i + 4]).to_ascii_lowercase();
            let length = text
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            return Some((i + 4, length, text));
        }
        let want = buf.len() + 1;
        if !fill(s, buf, want).await {
            return None;
        }
    }
}

/// How [`early_upstream`] answers.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Answer {
    /// `early` of a 10-byte body, then the request's body is read, then
    /// `-done`.
    Split,
    /// A whole 5-byte `early`, then the request's body is read.
    Whole,
    /// A whole `early` with `connection: close`; the body is not read.
    Close,
}

/// An upstream that answers each request as soon as its head is in, as
/// `how` says (`x-conn` numbers the connection).
async fn early_upstream(how: Answer) -> (SocketAddr, Heard) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let heard = Heard::default();
    let log = heard.clone();
    tokio::spawn(async move {
        let mut n = 0;
        while let Ok((mut s, _)) = listener.accept().await {
            n += 1;
            let log = log.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                while let Some((end, length, _)) = head(&mut s, &mut buf).await {
                    buf.drain(..end);
                    let fields = match how {
                        Answer::Split => "content-length: 10\r\n",
                        Answer::Whole => "content-length: 5\r\n",
                        Answer::Close => "connection: close\r\ncontent-length: 5\r\n",
                    };
                    let answer = format!("HTTP/1.1 200 OK\r\nx-conn: {n}\r\n{fields}\r\nearly");
                    if s.write_all(answer.as_bytes()).await.is_err() {
                        return;
                    }
                    if how == Answer::Close {
                        log.lock().unwrap().push((n, 0));
                        return;
                    }
                    if !fill(&mut s, &mut buf, length).await {
                        return;
                    }
                    buf.drain(..length);
                    log.lock().unwrap().push((n, length));
                    if how == Answer::Split && s.write_all(b"-done").await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, heard)
}

async fn gateway(upstream: SocketAddr) -> Gateway {
    let yaml = format!(
        "listen: 127.0.0.1:0
routes:
  - name: early
    upstream: http://{upstream}
    timeout: 5s
"
    );
    Gateway::start(&yaml).await
}

/// A response's head (lower-cased) and body, read off `s`.
async fn reply(s: &mut TcpStream) -> (String, Vec<u8>) {
    let mut buf = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), async {
        let (end, length, text) = head(s, &mut buf).await.expect("a response head");
        assert!(fill(s, &mut buf, end + length).await, "the response body");
        (text, buf[end..end + length].to_vec())
    });
    read.await.expect("a response within 5s")
}

const HALF: usize = 100_000;

fn post_head() -> String {
    format!(
        "POST /up HTTP/1.1\r\nhost: gateway.test\r\ncontent-length: {}\r\n\r\n",
        2 * HALF
    )
}

#[tokio::test]
async fn a_body_still_streaming_when_the_answer_starts_goes_on_as_the_answer_is_read() {
    let (upstream, heard) = early_upstream(Answer::Split).await;
    let gw = gateway(upstream).await;
    let mut c = TcpStream::connect(gw.addr).await.expect("connect");
    c.write_all(post_head().as_bytes()).await.expect("head");
    c.write_all(&[b'x'; HALF]).await.expect("first half");
    // The answer starts while half of the body is still to come.
    let mut buf = Vec::new();
    let started = tokio::time::timeout(Duration::from_secs(5), async {
        let (end, _, text) = head(&mut c, &mut buf).await.expect("a response head");
        assert!(fill(&mut c, &mut buf, end + 5).await, "the answer's start");
        (end, text)
    });
    let (end, text) = started.await.expect("the answer's start within 5s");
    assert!(text.starts_with("http/1.1 200"), "{text}");
    assert!(text.contains("x-conn: 1\r\n"), "{text}");
    c.write_all(&[b'y'; HALF]).await.expect("second half");
    let rest = tokio::time::timeout(Duration::from_secs(5), fill(&mut c, &mut buf, end + 10));
    assert!(
        rest.await.expect("the answer's end within 5s"),
        "the answer's end"
    );
    assert_eq!(&buf[end..], b"early-done");
    assert_eq!(heard.lock().unwrap().as_slice(), [(1, 2 * HALF)]);
    // The connection, its exchange done both ways, carries the next one.
    c.write_all(b"GET /next HTTP/1.1\r\nhost: gateway.test\r\n\r\n")
        .await
        .expect("next");
    let (head, body) = reply(&mut c).await;
    assert!(head.contains("x-conn: 1\r\n"), "{head}");
    assert_eq!(body, b"early-done");
}

#[tokio::test]
async fn an_answer_that_ends_before_the_body_reaches_the_client_at_once() {
    let (upstream, _) = early_upstream(Answer::Whole).await;
    let gw = gateway(upstream).await;
    let mut c = TcpStream::connect(gw.addr).await.expect("connect");
    c.write_all(post_head().as_bytes()).await.expect("head");
    c.write_all(&[b'x'; HALF]).await.expect("first half");
    let (head, body) = reply(&mut c).await;
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert_eq!(body, b"early");
    // Whether the server reads the rest of the body is its own choice; the
    // gateway serves on either way.
    let _ = c.write_all(&[b'y'; HALF]).await;
    let mut c = TcpStream::connect(gw.addr).await.expect("connect");
    c.write_all(b"GET /next HTTP/1.1\r\nhost: gateway.test\r\n\r\n")
        .await
        .expect("next");
    let (head, body) = reply(&mut c).await;
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert_eq!(body, b"early");
}

#[tokio::test]
async fn an_answer_that_closes_before_the_body_ends_reaches_the_client_and_ends_the_connection() {
    let (upstream, heard) = early_upstream(Answer::Close).await;
    let gw = gateway(upstream).await;
    let mut c = TcpStream::connect(gw.addr).await.expect("connect");
    c.write_all(post_head().as_bytes()).await.expect("head");
    c.write_all(&[b'x'; HALF]).await.expect("first half");
    let (head, body) = reply(&mut c).await;
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert!(head.contains("x-conn: 1\r\n"), "{head}");
    assert_eq!(body, b"early");
    // The next request goes on a new upstream connection.
    let mut c = TcpStream::connect(gw.addr).await.expect("connect");
    c.write_all(b"GET /next HTTP/1.1\r\nhost: gateway.test\r\n\r\n")
        .await
        .expect("next");
    let (head, _) = reply(&mut c).await;
    assert!(head.contains("x-conn: 2\r\n"), "{head}");
    assert_eq!(heard.lock().unwrap().as_slice(), [(1, 0), (2, 0)]);
}
