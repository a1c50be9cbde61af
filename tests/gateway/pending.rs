//! A connection whose answer is on its way: bytes the client sends then
//! (its next request) are kept and served after the answer, in order,
//! by either HTTP/1.1 server. A client that leaves then is the limits
//! tests' (its concurrency slot and its place in a delay are given back).

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};

use crate::parked::read_answers;
use crate::support::gateway::Gateway;

/// An upstream that answers each request with its path, holding the
/// answer to `/held` until `release` says so; `arrived` tells each path
/// as it comes.
async fn holding_upstream() -> (String, mpsc::UnboundedReceiver<String>, watch::Sender<bool>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let (arrived, paths) = mpsc::unbounded_channel();
    let (release, released) = watch::channel(false);
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            tokio::spawn(answer_paths(s, arrived.clone(), released.clone()));
        }
    });
    (url, paths, release)
}

async fn answer_paths(
    mut s: TcpStream,
    arrived: mpsc::UnboundedSender<String>,
    mut released: watch::Receiver<bool>,
) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 2048];
    loop {
        let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
            match s.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
            continue;
        };
        let head = String::from_utf8_lossy(&buf[..end]).into_owned();
        buf.drain(..end + 4);
        let path = head.split(' ').nth(1).unwrap_or_default().to_owned();
        let _ = arrived.send(path.clone());
        if path == "/held" {
            let _ = released.wait_for(|r| *r).await;
        }
        let answer = format!(
            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{path}",
            path.len()
        );
        if s.write_all(answer.as_bytes()).await.is_err() {
            return;
        }
    }
}

#[tokio::test]
async fn a_request_sent_while_the_answer_before_it_waits_is_served_after_it() {
    for http1 in ["hyper", "native"] {
        let (url, mut paths, release) = holding_upstream().await;
        let gw = Gateway::start(&format!(
            r#"
listen: 127.0.0.1:0
server: {{ http1: {http1} }}
routes:
  - name: all
    match: {{ path_prefix: / }}
    upstream: {url}
"#
        ))
        .await;
        let mut s = TcpStream::connect(gw.addr).await.expect("connect");
        s.write_all(b"GET /held HTTP/1.1\r\nhost: gateway.test\r\n\r\n")
            .await
            .expect("write");
        assert_eq!(paths.recv().await.as_deref(), Some("/held"), "{http1}");
        // The first answer is held upstream: the next request comes while
        // the gateway waits for it, and must neither end the connection
        // nor be lost.
        s.write_all(b"GET /next HTTP/1.1\r\nhost: gateway.test\r\n\r\n")
            .await
            .expect("write");
        // Time passing is what is tested: the gateway reads the next
        // request while the first answer is still held.
        tokio::time::sleep(Duration::from_millis(50)).await;
        release.send(true).expect("upstream waiting");
        let answers = read_answers(&mut s, 2).await;
        let bodies: Vec<&str> = answers.iter().map(|(_, body)| body.as_str()).collect();
        assert_eq!(bodies, ["/held", "/next"], "{http1}");
    }
}
