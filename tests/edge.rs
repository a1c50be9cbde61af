//! The edge: hostile input on raw sockets, connection caps and timeouts,
//! identity hygiene, TLS on both sides, upgrades and graceful shutdown.
//!
//! Every hostile case asserts the status the gateway answers *and* that the
//! same gateway then serves a normal request: an attack that is refused but
//! leaves the gateway wedged has still succeeded. Malformed HTTP is written
//! byte for byte on a raw TCP socket, because a well-behaved client library
//! cannot send it.

#[path = "support/mod.rs"]
mod support;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::Full;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use support::admin::{AdminGateway, value};
use support::gateway::{Gateway, Upstream, get, h2c, send, send_from};

/// What came back on a raw connection.
#[derive(Debug)]
struct RawReply {
    /// Status code of the first response; 0 when the gateway closed the
    /// connection without answering.
    status: u16,
    /// The response head as text.
    head: String,
    /// The body (as far as it came).
    body: Vec<u8>,
}

impl RawReply {
    fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().skip(1).find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }
}

/// Reads one response from `stream`: the head, then a `Content-Length`
/// body, or everything until the peer closes.
async fn read_reply(stream: &mut TcpStream) -> RawReply {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let work = async {
        let head_end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break Some(i + 4);
            }
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => break None,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        let Some(head_end) = head_end else {
            return RawReply {
                status: 0,
                head: String::from_utf8_lossy(&buf).into_owned(),
                body: Vec::new(),
            };
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let mut reply = RawReply {
            status,
            head,
            body: buf[head_end..].to_vec(),
        };
        let length: Option<usize> = reply.header("content-length").and_then(|v| v.parse().ok());
        if status == 101 {
            return reply;
        }
        loop {
            if length.is_some_and(|n| reply.body.len() >= n) {
                break;
            }
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => reply.body.extend_from_slice(&chunk[..n]),
            }
        }
        reply
    };
    tokio::time::timeout(Duration::from_secs(15), work)
        .await
        .expect("the gateway answered or closed within 15 s")
}

/// Writes `request` on a new connection and reads the answer.
async fn raw(addr: SocketAddr, request: &[u8]) -> RawReply {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    // The gateway may answer and close before everything is written (an
    // oversized head); that is an answer, not a test failure.
    let _ = stream.write_all(request).await;
    read_reply(&mut stream).await
}

/// Whether the peer closed `stream` (EOF or reset) within `within`.
async fn closed_within(stream: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 1024];
    let until = async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    };
    tokio::time::timeout(within, until).await.is_ok()
}

/// The gateway still serves a normal request.
async fn still_serves(gw: &Gateway) {
    let r = send(gw.addr, get("/ok", &[])).await;
    assert_eq!(r.status, StatusCode::OK, "the gateway stopped serving");
    assert_eq!(r.text(), "fine\n");
}

/// A gateway in front of `up` with a local `/ok`, a route limited to one
/// request per hour per API key, one per client IP, and everything else
/// forwarded. `extra` is added at the top level.
async fn edge_gateway(up: &Upstream, extra: &str) -> Gateway {
    let yaml = format!(
        r#"
listen: 127.0.0.1:0
{extra}
routes:
  - name: ok
    match: {{ path: /ok }}
    respond: {{ body: "fine\n" }}
  - name: per_key
    match: {{ path_prefix: /key }}
    upstream: {up}
    limits: [ {{ name: key, key: api_key, limit: 1, window: 1h }} ]
  - name: per_ip
    match: {{ path_prefix: /ip }}
    upstream: {up}
    limits: [ {{ name: ip, key: ip, limit: 1, window: 1h }} ]
  - name: forward
    match: {{ path_prefix: / }}
    upstream: {up}
"#,
        up = up.url()
    );
    Gateway::start(&yaml).await
}

fn request(head: &str) -> Vec<u8> {
    head.replace('\n', "\r\n").into_bytes()
}

// ---------------------------------------------------------------------------
// Hostile input
// ---------------------------------------------------------------------------

#[tokio::test]
async fn spoofed_forwarded_for_from_an_untrusted_peer_buys_no_new_bucket() {
    let up = Upstream::start().await;
    let gw = edge_gateway(&up, "").await;
    let first = send(gw.addr, get("/ip", &[("x-forwarded-for", "1.1.1.1")])).await;
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(up.last().headers["x-forwarded-for"], "127.0.0.1");
    let spoofed = send(gw.addr, get("/ip", &[("x-forwarded-for", "2.2.2.2")])).await;
    assert_eq!(spoofed.status, StatusCode::TOO_MANY_REQUESTS);
    still_serves(&gw).await;
}

#[tokio::test]
async fn thousand_entry_forwarded_for_line_from_a_trusted_proxy() {
    let up = Upstream::start().await;
    let gw = edge_gateway(&up, "client_ip: { trusted_proxies: [127.0.0.0/8] }").await;
    // 999 forged entries on the left, then the real client.
    let mut xff: Vec<String> = (0..999)
        .map(|i| format!("10.{}.{}.1", i / 250, i % 250))
        .collect();
    xff.push("203.0.113.9".to_owned());
    let line = xff.join(", ");
    let r = send(gw.addr, get("/ip", &[("x-forwarded-for", &line)])).await;
    assert_eq!(r.status, StatusCode::OK);
    // The walk stopped at the right-most untrusted hop: the same client with
    // a different forged left part is the same bucket.
    let r = send(
        gw.addr,
        get("/ip", &[("x-forwarded-for", "6.6.6.6, 203.0.113.9")]),
    )
    .await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    still_serves(&gw).await;
}

#[tokio::test]
async fn thousand_forwarded_for_header_lines_are_431() {
    let up = Upstream::start().await;
    let gw = edge_gateway(&up, "").await;
    let mut head = String::from("GET /x HTTP/1.1\nHost: gateway.test\n");
    for i in 0..1000 {
        head.push_str(&format!("X-Forwarded-For: 10.0.{}.{}\n", i / 250, i % 250));
    }
    head.push('\n');
    let r = raw(gw.addr, &request(&head)).await;
    assert_eq!(r.status, 431, "{}", r.head);
    assert_eq!(up.count(), 0);
    still_serves(&gw).await;
}

#[tokio::test]
async fn sixty_four_kilobyte_api_key_is_431_under_a_64_kib_cap() {
    let up = Upstream::start().await;
    let gw = edge_gateway(&up, "server: { max_header_size: 64KiB }").await;
    let key = "k".repeat(64 * 1024);
    let head = format!("GET /key HTTP/1.1\nHost: gateway.test\nX-Api-Key: {key}\n\n");
    let r = raw(gw.addr, &request(&head)).await;
    assert_eq!(r.status, 431, "{}", r.head);
    assert_eq!(up.count(), 0);
    still_serves(&gw).await;
}

#[tokio::test]
async fn sixty_four_kilobyte_api_key_under_the_default_cap_is_one_hashed_bucket() {
    let up = Upstream::start().await;
    let gw = edge_gateway(&up, "").await;
    let key = "k".repeat(64 * 1024);
    let r = send(gw.addr, get("/key", &[("x-api-key", &key)])).await;
    assert_eq!(r.status, StatusCode::OK);
    let r = send(gw.addr, get("/key", &[("x-api-key", &key)])).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    // A different long key is a different bucket.
    let other = format!("{}j", "k".repeat(64 * 1024 - 1));
    let r = send(gw.addr, get("/key", &[("x-api-key", &other)])).await;
    assert_eq!(r.status, StatusCode::OK);
    still_serves(&gw).await;
}

#[tokio::test]
async fn invalid_utf8_in_an_api_key_is_one_bucket_not_a_crash() {
    let up = Upstream::start().await;
    let gw = edge_gateway(&up, "").await;
    let mut req =
        b"GET /key HTTP/1.1\r\nHost: gateway.test\r\nX-Api-Key: \xff\xfe\xc3\x28\r\n\r\n".to_vec();
    let r = raw(gw.addr, &req).await;
    assert_eq!(r.status, 200, "{}", r.head);
    let r = raw(gw.addr, &req).await;
    assert_eq!(r.status, 429, "{}", r.head);
    // One different byte: another caller.
    let first = req.iter().position(|&b| b == 0xff).expect("the key byte");
    req[first] = 0xfd;
    let r = raw(gw.addr, &req).await;
    assert_eq!(r.status, 200, "{}", r.head);
    still_serves(&gw).await;
}

#[tokio::test]
async fn control_characters_in_header_values_are_400() {
    let up = Upstream::start().await;
    let gw = edge_gateway(&up, "").await;
    for bad in [&b"\x01"[..], b"\x00", b"\x7f", b"a\rb", b"\x1b[31m"] {
        let mut req = b"GET /x HTTP/1.1\r\nHost: gateway.test\r\nX-Thing: a".to_vec();
        req.extend_from_slice(bad);
        req.extend_from_slice(b"z\r\n\r\n");
        let r = raw(gw.addr, &req).await;
        assert_eq!(r.status, 400, "{bad:?}: {}", r.head);
    }
    assert_eq!(up.count(), 0);
    still_serves(&gw).await;
}

#[tokio::test]
async fn duplicate_host_is_400_problem_and_closes() {
    let up = Upstream::start().await;
    let gw = edge_gateway(&up, "").await;
    let mut stream = TcpStream::connect(gw.addr).await.expect("connect");
    stream
        .write_all(&request(
            "GET /x HTTP/1.1\nHost: a.example\nHost: b.example\n\n",
        ))
        .await
        .expect("write");
    let r = read_reply(&mut stream).await;
    assert_eq!(r.status, 400, "{}", r.head);
    assert_eq!(r.header("content-type"), Some("application/problem+json"));
    assert!(String::from_utf8_lossy(&r.body).contains("more than one Host"));
    assert!(closed_within(&mut stream, Duration::from_secs(5)).await);
    assert_eq!(up.count(), 0);
    still_serves(&gw).await;
}

#[tokio::test]
async fn missing_host_on_http11_is_400() {
    let up = Upstream::start().await;
    let gw = edge_gateway(&up, "").await;
    let r = raw(gw.addr, &request("GET /x HTTP/1.1\n\n")).await;
    assert_eq!(r.status, 400, "{}", r.head);
    assert_eq!(up.count(), 0);
    still_serves(&gw).await;
}

#[tokio::test]
async fn content_length_with_transfer_encoding_is_read_as_chunked_and_closed() {
    let up = Upstream::start().await;
    let gw = edge_gateway(&up, "").await;
    // The classic CL.TE smuggling shape: a proxy that trusts Content-Length
    // would forward "0\r\n\r\nGET /smuggled" as a second request.
    let mut stream = TcpStream::connect(gw.addr).await.expect("connect");
    stream
        .write_all(&request(
            "POST /echo HTTP/1.1\nHost: gateway.test\nContent-Length: 30\nTransfer-Encoding: chunked\n\n0\n\nGET /smuggled HTTP/1.1\n\n",
        ))
        .await
        .expect("write");
    // RFC 9112 §6.1: Transfer-Encoding wins and the connection is closed
    // after the response (hyper does both before the request reaches the
    // pipeline), so the tail is never read as a second request.
    let r = read_reply(&mut stream).await;
    assert_eq!(r.status, 200, "{}", r.head);
    // The echo of an empty body: the last-chunk marker and nothing else.
    assert_eq!(r.header("transfer-encoding"), Some("chunked"));
    assert_eq!(r.body, b"0\r\n\r\n");
    assert!(!up.last().headers.contains_key("content-length"));
    assert_eq!(r.header("connection"), Some("close"));
    assert!(closed_within(&mut stream, Duration::from_secs(5)).await);
    assert!(
        up.seen
            .lock()
            .unwrap()
            .iter()
            .all(|s| s.uri.path() != "/smuggled"),
        "a smuggled request reached the upstream"
    );
    still_serves(&gw).await;
}

#[tokio::test]
async fn conflicting_content_lengths_are_400() {
    let up = Upstream::start().await;
    let gw = edge_gateway(&up, "").await;
    let r = raw(
        gw.addr,
        &request("POST /echo HTTP/1.1\nHost: gateway.test\nContent-Length: 3\nContent-Length: 5\n\nabcde"),
    )
    .await;
    assert_eq!(r.status, 400, "{}", r.head);
    let r = raw(
        gw.addr,
        &request(
            "POST /echo HTTP/1.1\nHost: gateway.test\nContent-Length: 99999999999999999999999\n\n",
        ),
    )
    .await;
    assert_eq!(r.status, 400, "{}", r.head);
    assert_eq!(up.count(), 0);
    still_serves(&gw).await;
}

#[tokio::test]
async fn oversized_header_block_is_431() {
    let up = Upstream::start().await;
    let gw = edge_gateway(&up, "server: { max_header_size: 16KiB }").await;
    let big = "v".repeat(20 * 1024);
    let r = raw(
        gw.addr,
        &request(&format!(
            "GET /x HTTP/1.1\nHost: gateway.test\nX-Big: {big}\n\n"
        )),
    )
    .await;
    assert_eq!(r.status, 431, "{}", r.head);
    // Many small headers that add up past the cap too.
    let mut head = String::from("GET /x HTTP/1.1\nHost: gateway.test\n");
    for i in 0..90 {
        head.push_str(&format!("X-H{i}: {}\n", "v".repeat(250)));
    }
    head.push('\n');
    let r = raw(gw.addr, &request(&head)).await;
    assert_eq!(r.status, 431, "{}", r.head);
    assert_eq!(up.count(), 0);
    still_serves(&gw).await;
}

#[tokio::test]
async fn overlong_uri_is_refused() {
    let up = Upstream::start().await;
    let gw = edge_gateway(&up, "server: { max_header_size: 1MiB }").await;
    let path = format!("/{}", "a".repeat(70_000));
    let r = raw(
        gw.addr,
        &request(&format!("GET {path} HTTP/1.1\nHost: gateway.test\n\n")),
    )
    .await;
    assert_eq!(r.status, 414, "{}", r.head);
    still_serves(&gw).await;
}

#[tokio::test]
async fn garbage_request_lines_are_400() {
    let up = Upstream::start().await;
    let gw = edge_gateway(&up, "").await;
    for bad in [
        &b"HELLO\r\n\r\n"[..],
        b"GET /x HTTP/9.9\r\nHost: a\r\n\r\n",
        b"GET\t/x\tHTTP/1.1\r\nHost: a\r\n\r\n",
        b"G@T /x HTTP/1.1\r\nHost: a\r\n\r\n",
        b"GET /x HTTP/1.1\r\nHost a\r\n\r\n",
        b"GET /x HTTP/1.1\r\n Host: a\r\n\r\n",
    ] {
        let r = raw(gw.addr, bad).await;
        assert!(
            r.status == 400 || r.status == 505,
            "{:?}: {}",
            String::from_utf8_lossy(bad),
            r.head
        );
    }
    assert_eq!(up.count(), 0);
    still_serves(&gw).await;
}

#[tokio::test]
async fn broken_h2_preface_is_dropped() {
    let up = Upstream::start().await;
    let gw = edge_gateway(&up, "").await;
    let mut stream = TcpStream::connect(gw.addr).await.expect("connect");
    stream
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x12\x04\x00\x00\x00\x00\x00garbage-garbage-garbage")
        .await
        .expect("write");
    assert!(closed_within(&mut stream, Duration::from_secs(5)).await);
    still_serves(&gw).await;
}

#[tokio::test]
async fn slowloris_one_byte_a_second_is_cut_off_at_header_read() {
    let up = Upstream::start().await;
    let gw = edge_gateway(&up, "timeouts: { header_read: 2s }").await;
    let mut stream = TcpStream::connect(gw.addr).await.expect("connect");
    let started = Instant::now();
    let head = b"GET /x HTTP/1.1\r\nHost: gateway.test\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    let mut cut_after = None;
    for &b in head {
        if stream.write_all(&[b]).await.is_err() {
            cut_after = Some(started.elapsed());
            break;
        }
        // One byte a second, but stop writing as soon as the gateway hangs up.
        if closed_within(&mut stream, Duration::from_secs(1)).await {
            cut_after = Some(started.elapsed());
            break;
        }
    }
    let cut_after = cut_after.expect("the gateway kept a slowloris connection open");
    assert!(
        cut_after >= Duration::from_millis(1900) && cut_after < Duration::from_secs(6),
        "cut after {cut_after:?}, header_read is 2s"
    );
    assert_eq!(up.count(), 0);
    still_serves(&gw).await;
}

#[tokio::test]
async fn client_disconnecting_mid_body() {
    let up = Upstream::start().await;
    let gw = edge_gateway(&up, "").await;
    for _ in 0..5 {
        let mut stream = TcpStream::connect(gw.addr).await.expect("connect");
        stream
            .write_all(&request(
                "POST /echo HTTP/1.1\nHost: gateway.test\nContent-Length: 100000\n\nonly-a-little",
            ))
            .await
            .expect("write");
        drop(stream);
    }
    still_serves(&gw).await;
    let r = send(gw.addr, get("/plain", &[])).await;
    assert_eq!(r.status, StatusCode::OK);
}

/// An upstream that announces 1000 bytes, sends 10 and hangs up.
async fn truncating_upstream() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let mut seen = Vec::new();
                while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => seen.extend_from_slice(&buf[..n]),
                    }
                }
                let _ = s
                    .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n0123456789")
                    .await;
            });
        }
    });
    addr
}

#[tokio::test]
async fn upstream_closing_mid_response() {
    let up = Upstream::start().await;
    let cut = truncating_upstream().await;
    let yaml = format!(
        r#"
listen: 127.0.0.1:0
routes:
  - name: ok
    match: {{ path: /ok }}
    respond: {{ body: "fine\n" }}
  - name: cut
    match: {{ path_prefix: /cut }}
    upstream: http://{cut}
  - name: rest
    match: {{ path_prefix: / }}
    upstream: {up}
"#,
        up = up.url()
    );
    let gw = Gateway::start(&yaml).await;
    let r = raw(
        gw.addr,
        &request("GET /cut HTTP/1.1\nHost: gateway.test\n\n"),
    )
    .await;
    // The head was already on its way: the client sees 200 and a body that
    // ends early, never a complete-looking response.
    assert_eq!(r.status, 200, "{}", r.head);
    assert_eq!(r.header("content-length"), Some("1000"));
    assert!(r.body.len() < 1000, "the truncated body was padded");
    still_serves(&gw).await;
}

#[tokio::test]
async fn unmatched_route_is_404_problem_json() {
    let yaml = r#"
listen: 127.0.0.1:0
routes:
  - name: ok
    match: { path: /ok }
    respond: { body: "fine\n" }
"#;
    let gw = Gateway::start(yaml).await;
    let r = raw(
        gw.addr,
        &request("DELETE /nowhere HTTP/1.1\nHost: gateway.test\n\n"),
    )
    .await;
    assert_eq!(r.status, 404);
    assert_eq!(r.header("content-type"), Some("application/problem+json"));
    let body = String::from_utf8_lossy(&r.body);
    assert!(body.contains("\"status\":404"), "{body}");
    still_serves(&gw).await;
}

#[tokio::test]
async fn body_over_the_cap_is_413_whether_announced_or_chunked() {
    let up = Upstream::start().await;
    let gw = edge_gateway(&up, "server: { max_body_size: 1KiB }").await;
    let announced = Request::post("/echo")
        .header("host", "gateway.test")
        .body(Full::new(Bytes::from(vec![b'x'; 2048])))
        .expect("request");
    let r = send(gw.addr, announced).await;
    assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(r.header("content-type"), Some("application/problem+json"));
    assert_eq!(
        up.count(),
        0,
        "an announced oversized body is never forwarded"
    );

    let mut chunked =
        String::from("POST /echo HTTP/1.1\nHost: gateway.test\nTransfer-Encoding: chunked\n\n");
    for _ in 0..4 {
        chunked.push_str(&format!("200\n{}\n", "y".repeat(512)));
    }
    chunked.push_str("0\n\n");
    let r = raw(gw.addr, &request(&chunked)).await;
    assert_eq!(r.status, 413, "{}", r.head);

    let fits = Request::post("/echo")
        .header("host", "gateway.test")
        .body(Full::new(Bytes::from(vec![b'x'; 1024])))
        .expect("request");
    let r = send(gw.addr, fits).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body.len(), 1024);
    still_serves(&gw).await;
}

// ---------------------------------------------------------------------------
// Connection caps and timeouts
// ---------------------------------------------------------------------------

#[tokio::test]
async fn connections_beyond_the_cap_wait_for_a_free_slot() {
    let up = Upstream::start().await;
    let gw = edge_gateway(&up, "server: { max_connections: 2 }").await;
    // Two connections that each complete a request and stay open.
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut s = TcpStream::connect(gw.addr).await.expect("connect");
        s.write_all(&request("GET /ok HTTP/1.1\nHost: gateway.test\n\n"))
            .await
            .expect("write");
        assert_eq!(read_reply(&mut s).await.status, 200);
        held.push(s);
    }
    // A third connection is accepted by the kernel but not served.
    let mut third = TcpStream::connect(gw.addr).await.expect("connect");
    third
        .write_all(&request("GET /ok HTTP/1.1\nHost: gateway.test\n\n"))
        .await
        .expect("write");
    let mut byte = [0u8; 1];
    assert!(
        tokio::time::timeout(Duration::from_millis(500), third.read(&mut byte))
            .await
            .is_err(),
        "a third connection was served past max_connections: 2"
    );
    // Closing one frees its slot, and the waiting request is answered.
    drop(held.pop());
    let r = read_reply(&mut third).await;
    assert_eq!(r.status, 200, "{}", r.head);
}

#[tokio::test]
async fn idle_keep_alive_connections_are_closed_but_slow_requests_are_not() {
    let up = Upstream::start().await;
    let gw = edge_gateway(&up, "timeouts: { idle: 1s }").await;
    let mut s = TcpStream::connect(gw.addr).await.expect("connect");
    // A request waiting 2.5 s on its upstream is not idle.
    s.write_all(&request(
        "GET /slow?ms=2500 HTTP/1.1\nHost: gateway.test\n\n",
    ))
    .await
    .expect("write");
    let r = read_reply(&mut s).await;
    assert_eq!(r.status, 200, "{}", r.head);
    assert_eq!(r.body, b"slow ok");
    // Then nothing moves: closed after about a second.
    let started = Instant::now();
    assert!(closed_within(&mut s, Duration::from_secs(5)).await);
    let after = started.elapsed();
    assert!(
        after >= Duration::from_millis(900),
        "closed after {after:?}, idle is 1s"
    );
    still_serves(&gw).await;
}

// ---------------------------------------------------------------------------
// Identity hygiene
// ---------------------------------------------------------------------------

#[tokio::test]
async fn identity_headers_from_untrusted_peers_never_reach_the_upstream() {
    let up = Upstream::start().await;
    let gw = edge_gateway(
        &up,
        "client_ip: { trusted_proxies: [127.0.0.2] }\nusers: { header: x-user }",
    )
    .await;
    let lies = [
        ("x-forwarded-for", "1.1.1.1"),
        ("x-forwarded-proto", "https"),
        ("x-forwarded-host", "bank.example"),
        ("forwarded", "for=1.1.1.1;proto=https"),
        ("x-user", "admin"),
    ];
    // 127.0.0.1 is not trusted: every lie is dropped or overwritten.
    let r = send_from(
        "127.0.0.1".parse().expect("ip"),
        gw.addr,
        get("/who", &lies),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    let seen = up.last();
    assert_eq!(seen.headers["x-forwarded-for"], "127.0.0.1");
    assert_eq!(seen.headers["x-forwarded-proto"], "http");
    assert_eq!(seen.headers["x-forwarded-host"], "gateway.test");
    assert!(!seen.headers.contains_key("forwarded"));
    assert!(!seen.headers.contains_key("x-user"));

    // 127.0.0.2 is a trusted proxy: its headers are kept and appended to.
    let r = send_from(
        "127.0.0.2".parse().expect("ip"),
        gw.addr,
        get("/who", &lies),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    let seen = up.last();
    assert_eq!(seen.headers["x-forwarded-for"], "1.1.1.1, 127.0.0.2");
    assert_eq!(seen.headers["x-forwarded-proto"], "https");
    assert_eq!(seen.headers["x-forwarded-host"], "bank.example");
    assert_eq!(seen.headers["x-user"], "admin");
    still_serves(&gw).await;
}

#[tokio::test]
async fn connection_header_cannot_strip_the_forwarding_headers() {
    // `Connection: X-Forwarded-For` asks a proxy to drop the header it just
    // set; the gateway strips what Connection names *before* adding its own.
    let up = Upstream::start().await;
    let gw = edge_gateway(&up, "").await;
    let r = send(
        gw.addr,
        get(
            "/who",
            &[
                ("connection", "x-forwarded-for, x-forwarded-proto"),
                ("x-forwarded-for", "9.9.9.9"),
            ],
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    let seen = up.last();
    assert_eq!(seen.headers["x-forwarded-for"], "127.0.0.1");
    assert_eq!(seen.headers["x-forwarded-proto"], "http");
    still_serves(&gw).await;
}

/// An upstream that answers every request with `answer` (read to the end
/// of each request head), on one kept-alive connection each.
async fn scripted_upstream(answer: &'static [u8]) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let mut seen = Vec::new();
                loop {
                    while let Some(end) = seen.windows(4).position(|w| w == b"\r\n\r\n") {
                        seen.drain(..end + 4);
                        if s.write_all(answer).await.is_err() {
                            return;
                        }
                    }
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => seen.extend_from_slice(&buf[..n]),
                    }
                }
            });
        }
    });
    addr
}

/// The fields of a response head, names lower-cased, values as bytes.
fn head_fields(head: &[u8]) -> Vec<(String, Vec<u8>)> {
    head.split(|&b| b == b'\n')
        .skip(1)
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l))
        .filter(|l| !l.is_empty())
        .filter_map(|l| {
            let colon = l.iter().position(|&b| b == b':')?;
            let name = String::from_utf8_lossy(&l[..colon]).to_ascii_lowercase();
            Some((name, l[colon + 1..].trim_ascii().to_vec()))
        })
        .collect()
}

#[tokio::test]
async fn an_answers_fields_reach_the_client_as_the_upstream_wrote_them() {
    // Repeated fields, odd casing, a field `Connection` names, obs-text,
    // an empty value, a tab inside a value, the upstream's own `Date` and
    // request id: under either server the client gets each field the
    // upstream meant for it, values byte for byte and in order within a
    // name, and none that was the hop's.
    const ANSWER: &[u8] = b"HTTP/1.1 200 OK\r\n\
X-Rep: one\r\n\
content-TYPE: text/plain\r\n\
Date: Tue, 01 Jan 2030 00:00:00 GMT\r\n\
x-rep: two\r\n\
Connection: keep-alive, X-Gone\r\n\
X-Gone: secret\r\n\
X-Obs: caf\xe9 \x80\xff\r\n\
X-Empty:\r\n\
X-Tab: a\tb  \r\n\
Keep-Alive: timeout=5\r\n\
X-Request-Id: made-upstream\r\n\
X-REP: three\r\n\
Content-Length: 2\r\n\
\r\nok";
    let answers = scripted_upstream(ANSWER).await;
    let yaml = format!(
        r#"
listen: 127.0.0.1:0
routes:
  - name: scripted
    match: {{ path_prefix: / }}
    upstream: http://{answers}
"#
    );
    let gw = Gateway::start(&yaml).await;
    let mut stream = TcpStream::connect(gw.addr).await.expect("connect");
    for _ in 0..2 {
        stream
            .write_all(b"GET /fields HTTP/1.1\r\nHost: gateway.test\r\n\r\n")
            .await
            .expect("write");
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        let read = async {
            while !buf.ends_with(b"\r\n\r\nok") {
                match stream.read(&mut chunk).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(10), read)
            .await
            .expect("an answer within 10 s");
        let end = buf
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .expect("a whole head");
        assert!(buf.starts_with(b"HTTP/1.1 200 OK\r\n"));
        let fields = head_fields(&buf[..end + 2]);
        let values = |name: &str| -> Vec<&[u8]> {
            fields
                .iter()
                .filter(|(n, _)| n == name)
                .map(|(_, v)| &v[..])
                .collect()
        };
        assert_eq!(values("x-rep"), [&b"one"[..], b"two", b"three"]);
        assert_eq!(values("content-type"), [&b"text/plain"[..]]);
        assert_eq!(values("date"), [&b"Tue, 01 Jan 2030 00:00:00 GMT"[..]]);
        assert_eq!(values("x-obs"), [&b"caf\xe9 \x80\xff"[..]]);
        assert_eq!(values("x-empty"), [&b""[..]]);
        assert_eq!(values("x-tab"), [&b"a\tb"[..]]);
        assert_eq!(values("content-length"), [&b"2"[..]]);
        // The gateway's request id replaces the upstream's.
        let ids = values("x-request-id");
        assert_eq!(ids.len(), 1, "{fields:?}");
        assert_ne!(ids[0], b"made-upstream");
        // The hop's fields stay with the hop.
        for hop in ["x-gone", "keep-alive", "connection", "transfer-encoding"] {
            assert!(values(hop).is_empty(), "{hop} passed: {fields:?}");
        }
        let names: std::collections::BTreeSet<&str> =
            fields.iter().map(|(n, _)| n.as_str()).collect();
        let expected = [
            "content-length",
            "content-type",
            "date",
            "x-empty",
            "x-obs",
            "x-rep",
            "x-request-id",
            "x-tab",
        ];
        assert_eq!(names.into_iter().collect::<Vec<_>>(), expected);
    }
}

// ---------------------------------------------------------------------------
// Graceful shutdown of the built binary
// ---------------------------------------------------------------------------

/// Kills the child on drop, so a failed assertion leaves no process behind.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn sigterm_drains_a_slow_response_refuses_new_connections_and_exits_0() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("gateway.yaml");
    std::fs::write(
        &path,
        format!(
            "listen: 127.0.0.1:0\ntimeouts: {{ drain: 20s }}\nroutes:\n  - {{ name: all, upstream: {} }}\n",
            up.url()
        ),
    )
    .expect("write config");
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"));
    cmd.arg("--config")
        .arg(&path)
        .arg("--listen")
        .arg("127.0.0.1:0");
    let mut started = support::binary::spawn_listening(cmd, 1, None);
    let addr: SocketAddr = started.proxy[0];
    let pid = started.child.id();

    // A request the upstream answers only after 3 s.
    let slow = tokio::spawn(send(addr, get("/slow?ms=3000", &[])));
    up.wait_for(1, Duration::from_secs(10)).await;
    let status = std::process::Command::new("kill")
        .arg("-TERM")
        .arg(pid.to_string())
        .status()
        .expect("run kill");
    assert!(status.success());

    // New connections are refused while the slow one drains: the binary
    // says so once its listeners are closed.
    assert!(
        started
            .wait_for_line("no new connections", Duration::from_secs(5))
            .await,
        "no shutdown line after SIGTERM"
    );
    let refused = TcpStream::connect(addr).await;
    assert!(
        matches!(&refused, Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused),
        "still accepting after SIGTERM: {refused:?}"
    );
    assert!(
        !slow.is_finished(),
        "the slow response ended before the listener closed"
    );

    let r = slow.await.expect("slow request task");
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.text(), "slow ok");

    // The exit, waited for on a blocking thread; the guard kills the
    // process if the wait gives up.
    let mut child = Child(started.child);
    let exit = tokio::task::spawn_blocking(move || {
        let status = child.0.wait();
        (status, child)
    });
    let (exit, _child) = tokio::time::timeout(Duration::from_secs(10), exit)
        .await
        .expect("tollgate did not exit after draining")
        .expect("wait task");
    assert_eq!(exit.expect("wait").code(), Some(0));
}

// ---------------------------------------------------------------------------
// Upgrade (WebSocket) passthrough
// ---------------------------------------------------------------------------

/// An upstream that accepts `Upgrade: websocket` with a 101 and then echoes
/// every byte; a request without an upgrade gets `200 no upgrade`.
async fn upgrading_upstream() -> SocketAddr {
    use hyper::service::service_fn;
    use hyper_util::rt::TokioIo;

    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            tokio::spawn(async move {
                let svc = service_fn(|mut req: Request<hyper::body::Incoming>| async move {
                    let wants = req
                        .headers()
                        .get("upgrade")
                        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"websocket"));
                    if !wants {
                        return Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(
                            Bytes::from_static(b"no upgrade"),
                        )));
                    }
                    let on = hyper::upgrade::on(&mut req);
                    tokio::spawn(async move {
                        let Ok(upgraded) = on.await else { return };
                        let mut io = TokioIo::new(upgraded);
                        let mut buf = [0u8; 1024];
                        loop {
                            match io.read(&mut buf).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => {
                                    if io.write_all(&buf[..n]).await.is_err() {
                                        return;
                                    }
                                }
                            }
                        }
                    });
                    let res = http::Response::builder()
                        .status(StatusCode::SWITCHING_PROTOCOLS)
                        .header("connection", "upgrade")
                        .header("upgrade", "websocket")
                        .body(Full::new(Bytes::new()))
                        .expect("101");
                    Ok(res)
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tcp), svc)
                    .with_upgrades()
                    .await;
            });
        }
    });
    addr
}

const UPGRADE_REQUEST: &str = "GET /ws HTTP/1.1\nHost: gateway.test\nConnection: Upgrade\nUpgrade: websocket\nSec-WebSocket-Version: 13\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\n\n";

#[tokio::test]
async fn websocket_upgrade_passes_through_and_the_limiter_decides_at_the_upgrade() {
    let up = upgrading_upstream().await;
    let yaml = format!(
        r#"
listen: 127.0.0.1:0
routes:
  - name: ok
    match: {{ path: /ok }}
    respond: {{ body: "fine\n" }}
  - name: ws
    match: {{ path: /ws, host: gateway.test }}
    upstream: http://{up}
    upgrade: true
    limits: [ {{ name: ws, key: ip, limit: 1, window: 1h }} ]
  - name: plain
    match: {{ path: /ws }}
    upstream: http://{up}
"#
    );
    let gw = Gateway::start(&yaml).await;

    let mut s = TcpStream::connect(gw.addr).await.expect("connect");
    s.write_all(&request(UPGRADE_REQUEST)).await.expect("write");
    let r = read_reply(&mut s).await;
    assert_eq!(r.status, 101, "{}", r.head);
    assert!(
        r.header("upgrade")
            .is_some_and(|v| v.eq_ignore_ascii_case("websocket"))
    );
    assert!(r.header("ratelimit").is_some());
    // Bytes flow both ways through the tunnel.
    for msg in [&b"ping"[..], b"\x81\x05hello", &[0u8; 3000][..]] {
        s.write_all(msg).await.expect("write through tunnel");
        let mut back = vec![0u8; msg.len()];
        tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut back))
            .await
            .expect("echo in time")
            .expect("echo");
        assert_eq!(back, msg);
    }

    // The second upgrade from the same client is over the limit.
    let r = raw(gw.addr, &request(UPGRADE_REQUEST)).await;
    assert_eq!(r.status, 429, "{}", r.head);
    drop(s);

    // A route without `upgrade: true` forwards the request without the
    // upgrade headers: the upstream answers it as a plain request.
    let plain = UPGRADE_REQUEST.replace("gateway.test", "other.test");
    let r = raw(gw.addr, &request(&plain)).await;
    assert_eq!(r.status, 200, "{}", r.head);
    assert_eq!(r.body, b"no upgrade");
    still_serves(&gw).await;
}

#[tokio::test]
async fn the_drain_deadline_bounds_shutdown() {
    let up = Upstream::start().await;
    let gw = edge_gateway(&up, "timeouts: { drain: 500ms }").await;
    let addr = gw.addr;
    let slow = tokio::spawn(async move {
        let mut s = TcpStream::connect(addr).await.expect("connect");
        s.write_all(&request(
            "GET /slow?ms=10000 HTTP/1.1\nHost: gateway.test\n\n",
        ))
        .await
        .expect("write");
        read_reply(&mut s).await
    });
    up.wait_for(1, Duration::from_secs(10)).await;
    let started = Instant::now();
    gw.stop().await;
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(450) && took < Duration::from_secs(5),
        "shutdown took {took:?} with drain: 500ms and a 10 s response in flight"
    );
    drop(slow);
}

#[tokio::test]
async fn oversized_h2_header_list_is_refused_and_the_connection_survives() {
    let up = Upstream::start().await;
    let gw = edge_gateway(&up, "server: { max_header_size: 16KiB }").await;
    let (mut h2, conn) = h2c(gw.addr).await;
    tokio::spawn(conn);
    let big = "v".repeat(32 * 1024);
    let req = Request::get(format!("http://{}/x", gw.addr))
        .header("x-big", big.as_str())
        .body(Full::new(Bytes::new()))
        .expect("request");
    let refused = h2.send_request(req).await.expect("an answer, not a reset");
    assert_eq!(
        refused.status(),
        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE
    );
    assert_eq!(up.count(), 0);
    // The same h2 connection carries the next request.
    let req = Request::get(format!("http://{}/ok", gw.addr))
        .body(Full::new(Bytes::new()))
        .expect("request");
    let ok = h2
        .send_request(req)
        .await
        .expect("next request on the connection");
    assert_eq!(ok.status(), StatusCode::OK);
    still_serves(&gw).await;
}

#[tokio::test]
async fn http11_keep_alive_waits_for_the_next_head_at_most_header_read() {
    // hyper starts the header-read clock when it starts waiting for a head,
    // which on a keep-alive connection is right after the last response:
    // for HTTP/1.1 the shorter of header_read and idle closes the connection.
    let up = Upstream::start().await;
    let gw = edge_gateway(&up, "timeouts: { header_read: 1s, idle: 60s }").await;
    let mut s = TcpStream::connect(gw.addr).await.expect("connect");
    s.write_all(&request("GET /ok HTTP/1.1\nHost: gateway.test\n\n"))
        .await
        .expect("write");
    assert_eq!(read_reply(&mut s).await.status, 200);
    let started = Instant::now();
    assert!(closed_within(&mut s, Duration::from_secs(5)).await);
    assert!(started.elapsed() >= Duration::from_millis(900));
    still_serves(&gw).await;
}

#[tokio::test]
async fn idle_h2_connections_are_closed() {
    let up = Upstream::start().await;
    let gw = edge_gateway(&up, "timeouts: { idle: 1s }").await;
    let (mut h2, conn) = h2c(gw.addr).await;
    let conn = tokio::spawn(conn);
    let req = Request::get(format!("http://{}/ok", gw.addr))
        .body(Full::new(Bytes::new()))
        .expect("request");
    assert_eq!(
        h2.send_request(req).await.expect("response").status(),
        StatusCode::OK
    );
    // With nothing in flight the gateway drops the connection after ~1 s;
    // the client's connection task then ends.
    let started = Instant::now();
    let ended = tokio::time::timeout(Duration::from_secs(5), conn)
        .await
        .expect("the idle h2 connection was closed within 5 s")
        .expect("connection task");
    // A close without GOAWAY may end the client's task with an error; either
    // way the connection is gone.
    drop(ended);
    assert!(started.elapsed() >= Duration::from_millis(900));
    still_serves(&gw).await;
}

#[tokio::test]
async fn absolute_form_and_connect_never_make_an_open_proxy() {
    let up = Upstream::start().await;
    let gw = edge_gateway(&up, "").await;
    // An absolute-form target names another host: the request still goes
    // to the configured upstream only, with the path it asked for.
    let r = raw(
        gw.addr,
        &request("GET http://evil.example/x?q=1 HTTP/1.1\nHost: gateway.test\n\n"),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.head);
    assert_eq!(r.body, b"upstream ok");
    assert_eq!(up.last().uri, "/x?q=1");
    // CONNECT (authority-form) and OPTIONS * (asterisk-form) match no route.
    for target in [
        "CONNECT evil.example:443 HTTP/1.1\nHost: evil.example:443\n\n",
        "OPTIONS * HTTP/1.1\nHost: gateway.test\n\n",
    ] {
        let r = raw(gw.addr, &request(target)).await;
        assert_eq!(r.status, 404, "{target}: {}", r.head);
    }
    assert_eq!(up.count(), 1);
    still_serves(&gw).await;
}

#[tokio::test]
async fn expect_continue_with_an_oversized_body_gets_413_without_100() {
    let up = Upstream::start().await;
    let gw = edge_gateway(&up, "server: { max_body_size: 1MiB }").await;
    let r = raw(
        gw.addr,
        &request("POST /echo HTTP/1.1\nHost: gateway.test\nContent-Length: 1073741824\nExpect: 100-continue\n\n"),
    )
    .await;
    // The first (and only) answer is the refusal: the client is never
    // invited to send its gigabyte.
    assert_eq!(r.status, 413, "{}", r.head);
    assert_eq!(up.count(), 0);
    still_serves(&gw).await;
}

// ---------------------------------------------------------------------------
// Whose fault a failed forward is: the client's body or the upstream
// ---------------------------------------------------------------------------

/// `edge_gateway`'s configuration behind an admin listener, for `/metrics`.
async fn edge_admin_gateway(up: &Upstream, extra: &str) -> AdminGateway {
    let yaml = format!(
        r#"
listen: 127.0.0.1:0
admin: 127.0.0.1:0
{extra}
routes:
  - name: ok
    match: {{ path: /ok }}
    respond: {{ body: "fine\n" }}
  - name: forward
    match: {{ path_prefix: / }}
    upstream: {up}
"#,
        up = up.url()
    );
    AdminGateway::start(&yaml, Arc::new(tollgate::clock::SystemClock)).await
}

/// The value of one series of the route `forward`, e.g.
/// `forward_series(&text, "tollgate_requests_total", "outcome", "error")`.
fn forward_series(text: &str, metric: &str, label: &str, v: &str) -> f64 {
    let series = format!("{metric}{{route=\"forward\",{label}=\"{v}\"}}");
    value(text, &series).unwrap_or_else(|| panic!("{series} missing from\n{text}"))
}

/// Asserts that `route=forward` saw exactly one request, a client error of
/// `kind`, and nothing the upstream is blamed for.
fn assert_one_client_error(text: &str, kind: &str) {
    let m = |metric, label, v| forward_series(text, metric, label, v);
    for upstream_kind in ["connect", "timeout", "failed"] {
        assert_eq!(
            m("tollgate_upstream_errors_total", "kind", upstream_kind),
            0.0,
            "upstream blamed ({upstream_kind})"
        );
    }
    assert_eq!(m("tollgate_requests_total", "outcome", "error"), 0.0);
    assert_eq!(m("tollgate_requests_total", "outcome", "allowed"), 0.0);
    assert_eq!(m("tollgate_requests_total", "outcome", "client_error"), 1.0);
    for k in ["bad_body", "aborted", "body_too_large"] {
        let want = if k == kind { 1.0 } else { 0.0 };
        assert_eq!(m("tollgate_client_errors_total", "kind", k), want, "{k}");
    }
}

/// The gateway still serves a normal request.
async fn admin_gateway_still_serves(gw: &AdminGateway) {
    let r = send(gw.addr, get("/ok", &[])).await;
    assert_eq!(r.status, StatusCode::OK, "the gateway stopped serving");
}

#[tokio::test]
async fn malformed_chunked_body_is_400_and_not_an_upstream_error() {
    let up = Upstream::start().await;
    let gw = edge_admin_gateway(&up, "").await;
    // A good chunk, then a chunk size line that is not hex.
    let r = raw(
        gw.addr,
        &request(
            "POST /collect HTTP/1.1\nHost: gateway.test\nTransfer-Encoding: chunked\n\n5\nhello\nzz\nnot a chunk\n0\n\n",
        ),
    )
    .await;
    assert_eq!(r.status, 400, "{}", r.head);
    assert_eq!(r.header("content-type"), Some("application/problem+json"));
    assert_eq!(r.header("connection"), Some("close"));
    let body = String::from_utf8_lossy(&r.body);
    assert!(body.contains("The request body is malformed"), "{body}");
    assert_one_client_error(&gw.scrape().await, "bad_body");
    admin_gateway_still_serves(&gw).await;
}

#[tokio::test]
async fn client_abandoning_a_chunked_upload_is_not_an_upstream_error() {
    let up = Upstream::start().await;
    let gw = edge_admin_gateway(&up, "").await;
    let mut stream = TcpStream::connect(gw.addr).await.expect("connect");
    stream
        .write_all(&request(
            "POST /collect HTTP/1.1\nHost: gateway.test\nTransfer-Encoding: chunked\n\n5\nhello\n",
        ))
        .await
        .expect("write");
    // The request reached the upstream, whose body is now waiting.
    up.wait_for(1, Duration::from_secs(5)).await;
    // The client stops sending: its side of the connection is closed.
    stream.shutdown().await.expect("shutdown");
    // A client that only stopped sending still reads the answer (one that
    // closed both ways looks the same to the gateway until it writes).
    let r = read_reply(&mut stream).await;
    assert_eq!(r.status, 400, "{}", r.head);
    let body = String::from_utf8_lossy(&r.body);
    assert!(
        body.contains("The request body ended before it was complete"),
        "{body}"
    );
    assert_one_client_error(&gw.scrape().await, "aborted");
    admin_gateway_still_serves(&gw).await;
}

#[tokio::test]
async fn chunked_body_over_the_cap_is_413_and_a_client_error() {
    let up = Upstream::start().await;
    let gw = edge_admin_gateway(&up, "server: { max_body_size: 1KiB }").await;
    let mut chunked =
        String::from("POST /collect HTTP/1.1\nHost: gateway.test\nTransfer-Encoding: chunked\n\n");
    for _ in 0..4 {
        chunked.push_str(&format!("200\n{}\n", "y".repeat(512)));
    }
    chunked.push_str("0\n\n");
    let r = raw(gw.addr, &request(&chunked)).await;
    assert_eq!(r.status, 413, "{}", r.head);
    assert_eq!(r.header("content-type"), Some("application/problem+json"));
    assert_one_client_error(&gw.scrape().await, "body_too_large");
    admin_gateway_still_serves(&gw).await;
}

/// What [`answer_once_upstream`] read: connection number (from 1), method
/// and path of each request, in order.
type Heard = Arc<Mutex<Vec<(usize, String, String)>>>;

/// An upstream that, on every connection, answers the first request with
/// an empty keep-alive `200` carrying `x-conn: N`, then reads the second
/// request in full (head and `Content-Length` body) and closes without
/// answering — an upstream whose keep-alive timeout fired just as the
/// request arrived.
async fn answer_once_upstream() -> (SocketAddr, Heard) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let heard: Heard = Arc::default();
    let log = heard.clone();
    tokio::spawn(async move {
        let mut n = 0;
        while let Ok((mut s, _)) = listener.accept().await {
            n += 1;
            let log = log.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                for i in 0..2 {
                    let head_end = loop {
                        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            break p + 4;
                        }
                        match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(k) => buf.extend_from_slice(&chunk[..k]),
                        }
                    };
                    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
                    let length: usize = head
                        .lines()
                        .find_map(|l| {
                            let (k, v) = l.split_once(':')?;
                            k.eq_ignore_ascii_case("content-length")
                                .then(|| v.trim().parse().ok())?
                        })
                        .unwrap_or(0);
                    while buf.len() < head_end + length {
                        match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(k) => buf.extend_from_slice(&chunk[..k]),
                        }
                    }
                    buf.drain(..head_end + length);
                    let mut words = head.split_whitespace();
                    let method = words.next().unwrap_or_default().to_owned();
                    let path = words.next().unwrap_or_default().to_owned();
                    log.lock().unwrap().push((n, method, path));
                    if i == 0 {
                        let answer =
                            format!("HTTP/1.1 200 OK\r\nx-conn: {n}\r\ncontent-length: 0\r\n\r\n");
                        if s.write_all(answer.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                }
                // The second request was read; the connection closes unanswered.
            });
        }
    });
    (addr, heard)
}

#[tokio::test]
async fn a_pooled_connection_closed_under_a_request_retries_only_what_is_safe() {
    let (upstream, heard) = answer_once_upstream().await;
    let yaml = format!(
        r#"
listen: 127.0.0.1:0
routes:
  - name: race
    match: {{ path_prefix: / }}
    upstream: http://{upstream}
"#
    );
    let gw = Gateway::start(&yaml).await;
    let with_body = |method: &str, path: &str| {
        Request::builder()
            .method(method)
            .uri(path)
            .header("host", "gateway.test")
            .body(Full::new(Bytes::from_static(b"payload")))
            .expect("request")
    };

    let r = send(gw.addr, get("/one", &[])).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.header("x-conn"), Some("1"));
    // Sent on the pooled connection 1, which the upstream closes after
    // reading it: a GET without a body goes again on a new connection.
    let r = send(gw.addr, get("/two", &[])).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.header("x-conn"), Some("2"));
    // A POST is not idempotent: the upstream may have acted on it.
    let r = send(gw.addr, with_body("POST", "/three")).await;
    assert_eq!(r.status, StatusCode::BAD_GATEWAY);
    let r = send(gw.addr, get("/four", &[])).await;
    assert_eq!(r.header("x-conn"), Some("3"));
    // A PUT is idempotent, but its body has been consumed.
    let r = send(gw.addr, with_body("PUT", "/five")).await;
    assert_eq!(r.status, StatusCode::BAD_GATEWAY);

    let heard: Vec<(usize, String, String)> = heard.lock().unwrap().clone();
    let want: Vec<(usize, String, String)> = [
        (1, "GET", "/one"),
        (1, "GET", "/two"),
        (2, "GET", "/two"),
        (2, "POST", "/three"),
        (3, "GET", "/four"),
        (3, "PUT", "/five"),
    ]
    .into_iter()
    .map(|(n, m, p)| (n, m.to_owned(), p.to_owned()))
    .collect();
    assert_eq!(heard, want, "each request went out once, /two twice");
}

// ---------------------------------------------------------------------------
// Size refusals as problem+json, and the listen backlog
// ---------------------------------------------------------------------------

/// The problem+json body of a refusal, checked for its content type and
/// `status` member.
fn problem(r: &RawReply, status: u16) -> serde_json::Value {
    assert_eq!(r.status, status, "{}", r.head);
    assert_eq!(
        r.header("content-type"),
        Some("application/problem+json"),
        "{}",
        r.head
    );
    let body: serde_json::Value = serde_json::from_slice(&r.body).unwrap_or_else(|e| {
        panic!(
            "{e}: a JSON body, got {:?}",
            String::from_utf8_lossy(&r.body)
        )
    });
    assert_eq!(body["status"], status, "{body}");
    body
}

#[tokio::test]
async fn oversized_head_is_a_431_problem_json_and_closes() {
    let up = Upstream::start().await;
    let gw = edge_gateway(&up, "server: { max_header_size: 16KiB }").await;
    // One large header (a grown cookie), then many small ones adding up.
    let big = "v".repeat(20 * 1024);
    let mut stream = TcpStream::connect(gw.addr).await.expect("connect");
    stream
        .write_all(&request(&format!(
            "GET /x HTTP/1.1\nHost: gateway.test\nCookie: {big}\n\n"
        )))
        .await
        .expect("write");
    let r = read_reply(&mut stream).await;
    let body = problem(&r, 431);
    assert_eq!(body["title"], "Request Header Fields Too Large");
    let detail = body["detail"].as_str().expect("a detail");
    assert!(detail.contains("at most 16384"), "{detail}");
    assert_eq!(r.header("connection"), Some("close"));
    assert!(closed_within(&mut stream, Duration::from_secs(5)).await);
    let mut head = String::from("GET /x HTTP/1.1\nHost: gateway.test\n");
    for i in 0..90 {
        head.push_str(&format!("X-H{i}: {}\n", "v".repeat(250)));
    }
    head.push('\n');
    problem(&raw(gw.addr, &request(&head)).await, 431);
    // A head just inside the cap is forwarded.
    let fits = format!(
        "GET /x HTTP/1.1\nHost: gateway.test\nCookie: {}\n\n",
        "v".repeat(15 * 1024)
    );
    assert_eq!(raw(gw.addr, &request(&fits)).await.status, 200);
    assert_eq!(up.count(), 1);
    still_serves(&gw).await;
}

#[tokio::test]
async fn oversized_h2_header_list_under_hypers_bound_is_a_431_problem_json() {
    use http_body_util::BodyExt;

    let up = Upstream::start().await;
    let gw = edge_gateway(&up, "server: { max_header_size: 16KiB }").await;
    let (mut h2, conn) = h2c(gw.addr).await;
    tokio::spawn(conn);
    let req = Request::get(format!("http://{}/x", gw.addr))
        .header("x-big", "v".repeat(20 * 1024))
        .body(Full::new(Bytes::new()))
        .expect("request");
    let res = h2.send_request(req).await.expect("an answer");
    assert_eq!(res.status(), StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
    assert_eq!(
        res.headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok()),
        Some("application/problem+json")
    );
    let body = res.into_body().collect().await.expect("body").to_bytes();
    let body: serde_json::Value = serde_json::from_slice(&body).expect("JSON body");
    assert_eq!(body["status"], 431);
    assert_eq!(up.count(), 0);
    still_serves(&gw).await;
}

#[tokio::test]
async fn overlong_target_is_a_414_problem_json() {
    let up = Upstream::start().await;
    let gw = edge_gateway(&up, "").await;
    // Over the default 16 KiB, well inside hyper's 64 KiB stop.
    let path = format!("/x?q={}", "a".repeat(20_000));
    let r = raw(
        gw.addr,
        &request(&format!("GET {path} HTTP/1.1\nHost: gateway.test\n\n")),
    )
    .await;
    let body = problem(&r, 414);
    assert_eq!(body["title"], "URI Too Long");
    // Exactly at the cap is forwarded.
    let path = format!("/x?q={}", "a".repeat(16 * 1024 - "/x?q=".len()));
    let r = raw(
        gw.addr,
        &request(&format!("GET {path} HTTP/1.1\nHost: gateway.test\n\n")),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.head);
    assert_eq!(up.count(), 1);

    // A lower cap from the file.
    let gw = edge_gateway(&up, "server: { max_uri_size: 2KiB }").await;
    let path = format!("/{}", "b".repeat(3000));
    let r = raw(
        gw.addr,
        &request(&format!("GET {path} HTTP/1.1\nHost: gateway.test\n\n")),
    )
    .await;
    let body = problem(&r, 414);
    let detail = body["detail"].as_str().expect("a detail");
    assert!(
        detail.contains("3001 bytes") && detail.contains("2048"),
        "{detail}"
    );
    assert_eq!(up.count(), 1);
    still_serves(&gw).await;
}

/// Whether `ss` (iproute2) is installed.
fn have_ss() -> bool {
    match std::process::Command::new("ss").arg("-V").output() {
        Ok(out) => out.status.success(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
        Err(e) => panic!("ss: {e}"),
    }
}

/// The accept queue the kernel keeps for the listening socket on `addr`:
/// the Send-Q column `ss -ltn` shows for a socket in LISTEN state.
fn listen_queue(addr: SocketAddr) -> u32 {
    let out = std::process::Command::new("ss")
        .args(["-ltnH", &format!("sport = :{}", addr.port())])
        .output()
        .expect("run ss");
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|line| {
            let cols: Vec<&str> = line.split_whitespace().collect();
            // State, Recv-Q, Send-Q, local address, peer address.
            (cols.len() >= 4 && cols[0] == "LISTEN" && cols[3] == addr.to_string())
                .then(|| cols[2].parse().expect("Send-Q is a number"))
        })
        .unwrap_or_else(|| panic!("ss lists no listener on {addr}:\n{text}"))
}

#[tokio::test]
async fn the_binary_listens_with_the_configured_backlog() {
    if !have_ss() {
        support::skip::skipped("`ss` (iproute2) is not installed to read the accept queue");
        return;
    }
    // The kernel caps every backlog at net.core.somaxconn.
    let somaxconn: u32 = std::fs::read_to_string("/proc/sys/net/core/somaxconn")
        .expect("Linux, where ss runs")
        .trim()
        .parse()
        .expect("a number");
    let dir = tempfile::tempdir().expect("temp dir");
    // The proxy and admin addresses of a binary serving `server`, and the
    // process, killed on drop.
    let start = |server: &str| {
        let path = dir.path().join("gateway.yaml");
        std::fs::write(
            &path,
            format!(
                "listen: 127.0.0.1:0\nadmin: 127.0.0.1:0\n{server}routes: [ {{ name: a, respond: {{}} }} ]\n"
            ),
        )
        .expect("write config");
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"));
        cmd.arg("--config").arg(&path);
        let started = support::binary::spawn_listening(cmd, 2, None);
        let admin = started.admin.expect("an admin listener");
        (started.proxy[0], admin, Child(started.child))
    };

    // 100: below any kernel's cap, and neither std's 128 nor the default.
    let (proxy, admin, child) = start("server: { backlog: 100 }\n");
    assert_eq!(listen_queue(proxy), 100);
    assert_eq!(listen_queue(admin), 100);
    drop(child);

    // The default asks for 4096; the kernel grants up to somaxconn.
    let (proxy, admin, _child) = start("");
    let expected = 4096.min(somaxconn);
    assert_eq!(listen_queue(proxy), expected);
    assert_eq!(listen_queue(admin), expected);
}
