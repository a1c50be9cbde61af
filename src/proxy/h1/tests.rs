use bytes::{Bytes, BytesMut};
use http::{Method, StatusCode, Version};

use super::decode::{DecodeError, Decoder};
use super::head::{Delimited, Head, HeadError, MAX_HEAD, parse};
use crate::http1::chunked::Step;
use crate::http1::fields::{field_name, read_into};
use crate::http1::text_fields::materialize;

mod forwarding;

/// The map of a parsed head's response, its passed fields read into it.
fn map(h: Head) -> http::HeaderMap {
    let mut res = h.response;
    if let Some(passed) = &h.passed {
        read_into(res.headers_mut(), passed);
    }
    res.headers().clone()
}

fn head(text: &str) -> Result<Option<Head>, HeadError> {
    parse(&mut BytesMut::from(text), &Method::GET)
}

fn refused(text: &str) -> HeadError {
    match head(text) {
        Err(e) => e,
        Ok(h) => panic!("{text:?} was accepted: {h:?}"),
    }
}

#[test]
fn a_plain_head_is_parsed_in_place_and_leaves_the_body() {
    let mut buf =
        BytesMut::from("HTTP/1.1 200 OK\r\ncontent-length: 5\r\nx-a: 1\r\nX-A: 2\r\n\r\nhello");
    let h = parse(&mut buf, &Method::GET).unwrap().unwrap();
    assert_eq!(h.response.status(), StatusCode::OK);
    assert_eq!(h.response.version(), Version::HTTP_11);
    assert_eq!(h.framing, Delimited::Length(5));
    assert!(h.keep_alive);
    let map = map(h);
    let xa: Vec<_> = map.get_all("x-a").iter().collect();
    assert_eq!(xa, ["1", "2"]);
    assert_eq!(map["content-length"], "5");
    assert_eq!(&buf[..], b"hello");
}

#[test]
fn a_partial_head_waits_and_takes_nothing() {
    let text = "HTTP/1.1 200 OK\r\ncontent-len";
    let mut buf = BytesMut::from(text);
    assert!(parse(&mut buf, &Method::GET).unwrap().is_none());
    assert_eq!(&buf[..], text.as_bytes());
}

#[test]
fn informational_heads_are_skipped() {
    let mut buf = BytesMut::from(
        "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\nHTTP/1.1 201 Created\r\ncontent-length: 2\r\n\r\nhi",
    );
    let h = parse(&mut buf, &Method::POST).unwrap().unwrap();
    assert_eq!(h.response.status(), StatusCode::CREATED);
    assert!(map(h).get("link").is_none());
    assert_eq!(&buf[..], b"hi");
}

#[test]
fn framing_follows_the_method_the_status_and_the_fields() {
    let with =
        |method: Method, text: &str| parse(&mut BytesMut::from(text), &method).unwrap().unwrap();
    let h = with(Method::HEAD, "HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\n");
    assert_eq!(h.framing, Delimited::Length(0));
    let h = with(
        Method::GET,
        "HTTP/1.1 304 Not Modified\r\ncontent-length: 9\r\n\r\n",
    );
    assert_eq!(h.framing, Delimited::Length(0));
    let h = with(
        Method::GET,
        "HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n",
    );
    assert_eq!(h.framing, Delimited::Chunked);
    let h = with(
        Method::GET,
        "HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\n",
    );
    assert_eq!((h.framing, h.keep_alive), (Delimited::Close, false));
    let h = with(Method::GET, "HTTP/1.1 200 OK\r\n\r\n");
    assert_eq!((h.framing, h.keep_alive), (Delimited::Close, false));
    let h = with(
        Method::GET,
        "HTTP/1.1 200 OK\r\ncontent-length: 7, 7\r\ncontent-length: 7\r\n\r\n",
    );
    assert_eq!(h.framing, Delimited::Length(7));
}

#[test]
fn keep_alive_follows_the_version_and_connection() {
    let k = |text: &str| head(text).unwrap().unwrap().keep_alive;
    assert!(!k(
        "HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 0\r\n\r\n"
    ));
    assert!(!k(
        "HTTP/1.1 200 OK\r\nconnection: Close\r\nconnection: keep-alive\r\ncontent-length: 0\r\n\r\n"
    ));
    assert!(!k("HTTP/1.0 200 OK\r\ncontent-length: 0\r\n\r\n"));
    assert!(k(
        "HTTP/1.0 200 OK\r\nconnection: keep-alive\r\ncontent-length: 0\r\n\r\n"
    ));
}

#[test]
fn a_reason_phrase_of_its_own_is_kept() {
    let h = head("HTTP/1.1 200 Fine Thanks\r\ncontent-length: 0\r\n\r\n")
        .unwrap()
        .unwrap();
    let phrase = h.response.extensions().get::<hyper::ext::ReasonPhrase>();
    assert_eq!(phrase.map(|p| p.as_bytes()), Some(&b"Fine Thanks"[..]));
    let h = head("HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
        .unwrap()
        .unwrap();
    assert!(
        h.response
            .extensions()
            .get::<hyper::ext::ReasonPhrase>()
            .is_none()
    );
}

#[test]
fn heads_hyper_refuses_are_refused() {
    for text in [
        // obs-fold, a space before the colon, NUL and bare CR in a value
        "HTTP/1.1 200 OK\r\nx-a: 1\r\n 2\r\ncontent-length: 0\r\n\r\n",
        "HTTP/1.1 200 OK\r\nx-a : 1\r\ncontent-length: 0\r\n\r\n",
        "HTTP/1.1 200 OK\r\nx-a: 1\x002\r\ncontent-length: 0\r\n\r\n",
        "HTTP/1.1 200 OK\r\nx-a: 1\r2\r\ncontent-length: 0\r\n\r\n",
        // status codes of other than three digits, versions other than 1.x
        "HTTP/1.1 2000 OK\r\n\r\n",
        "HTTP/1.1 20 OK\r\n\r\n",
        "HTTP/2.0 200 OK\r\n\r\n",
        "ICY 200 OK\r\n\r\n",
    ] {
        assert!(matches!(refused(text), HeadError::Syntax(_)), "{text:?}");
    }
    for text in [
        "HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\n",
        "HTTP/1.1 200 OK\r\ncontent-length: 5, 6\r\n\r\n",
        "HTTP/1.1 200 OK\r\ncontent-length: +5\r\n\r\n",
        "HTTP/1.1 200 OK\r\ncontent-length: 0x5\r\n\r\n",
        "HTTP/1.1 200 OK\r\ncontent-length: \r\n\r\n",
        "HTTP/1.1 200 OK\r\ncontent-length: 99999999999999999999\r\n\r\n",
    ] {
        assert_eq!(refused(text), HeadError::Length, "{text:?}");
    }
    assert_eq!(
        refused("HTTP/1.0 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"),
        HeadError::Http10Chunked
    );
}

#[test]
fn heads_refused_where_hyper_is_more_lenient() {
    assert_eq!(
        refused("HTTP/1.1 200 OK\r\ncontent-length: 5\r\ntransfer-encoding: chunked\r\n\r\n"),
        HeadError::LengthAndChunked
    );
    assert_eq!(
        refused("HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\n\r\n"),
        HeadError::Upgrade
    );
    let connect = parse(
        &mut BytesMut::from("HTTP/1.1 200 OK\r\n\r\n"),
        &Method::CONNECT,
    );
    assert_eq!(connect.unwrap_err(), HeadError::Upgrade);
}

#[test]
fn heads_past_the_bounds_are_too_large() {
    let many: String = (0..101).map(|i| format!("x-{i}: v\r\n")).collect();
    assert_eq!(
        refused(&format!("HTTP/1.1 200 OK\r\n{many}\r\n")),
        HeadError::TooLarge
    );
    let long = format!("HTTP/1.1 200 OK\r\nx-a: {}", "a".repeat(MAX_HEAD));
    assert_eq!(refused(&long), HeadError::TooLarge);
    // Just under the bound, still waiting.
    let under = format!("HTTP/1.1 200 OK\r\nx-a: {}", "a".repeat(MAX_HEAD - 30));
    assert!(head(&under).unwrap().is_none());
}

/// Everything `decoder` gives for `input`, fed in pieces of `step` bytes,
/// then the connection's end.
fn decode_all(framing: Delimited, input: &[u8], step: usize) -> Result<Vec<Step>, DecodeError> {
    let mut d = Decoder::new(framing);
    let mut buf = BytesMut::new();
    let mut out: Vec<Step> = Vec::new();
    let mut data = Vec::new();
    let flush = |data: &mut Vec<u8>, out: &mut Vec<Step>| {
        if !data.is_empty() {
            out.push(Step::Data(Bytes::from(std::mem::take(data))));
        }
    };
    let mut fed = 0;
    loop {
        match d.decode(&mut buf)? {
            Step::Data(b) => data.extend_from_slice(&b),
            Step::More if fed < input.len() => {
                let to = (fed + step).min(input.len());
                buf.extend_from_slice(&input[fed..to]);
                fed = to;
            }
            Step::More => {
                let end = d.eof()?;
                flush(&mut data, &mut out);
                out.push(end);
                return Ok(out);
            }
            other => {
                flush(&mut data, &mut out);
                out.push(other);
                return Ok(out);
            }
        }
    }
}

#[test]
fn chunks_with_extensions_and_trailers_decode_alike_in_any_pieces() {
    let input = b"5;name=value\r\nhello\r\n6 \t\r\n world\r\nA\r\n0123456789\r\n0\r\ngrpc-status: 0\r\nx-b: 1\r\n\r\n";
    let whole = decode_all(Delimited::Chunked, input, input.len()).unwrap();
    assert_eq!(whole.len(), 2, "{whole:?}");
    assert_eq!(
        whole[0],
        Step::Data(Bytes::from_static(b"hello world0123456789"))
    );
    let Step::Trailers(t) = &whole[1] else {
        panic!("trailers: {whole:?}");
    };
    assert_eq!(t.get("grpc-status").unwrap(), "0");
    assert_eq!(t.get("x-b").unwrap(), "1");
    for step in [1, 2, 7] {
        assert_eq!(
            decode_all(Delimited::Chunked, input, step).unwrap(),
            whole,
            "{step}"
        );
    }
    let plain = decode_all(Delimited::Chunked, b"2\r\nhi\r\n0\r\n\r\n", 1).unwrap();
    assert_eq!(plain, [Step::Data(Bytes::from_static(b"hi")), Step::End]);
}

#[test]
fn bad_chunk_framing_is_refused() {
    for input in [
        &b"-1\r\nx\r\n0\r\n\r\n"[..],
        b" 5\r\nhello\r\n0\r\n\r\n",
        b"5 5\r\nhello\r\n0\r\n\r\n",
        b"0x5\r\nhello\r\n0\r\n\r\n",
        b"5\nhello\r\n0\r\n\r\n",
        b"5\r\nhello0\r\n\r\n",
        b"5\r\nhello\n0\r\n\r\n",
        b"5;a\nb\r\nhello\r\n0\r\n\r\n",
        b"0\r\n\r\r",
        b"0\r\nx: 1\r\r\n",
    ] {
        let got = decode_all(Delimited::Chunked, input, input.len());
        assert!(
            matches!(got, Err(DecodeError::Chunk(_))),
            "{:?}: {got:?}",
            String::from_utf8_lossy(input)
        );
    }
    let huge = b"10000000000000000\r\n";
    assert_eq!(
        decode_all(Delimited::Chunked, huge, 3),
        Err(DecodeError::Chunk("invalid chunk size: overflow"))
    );
    let ext = format!("1;{}\r\nx\r\n0\r\n\r\n", "e".repeat(16 * 1024));
    assert_eq!(
        decode_all(Delimited::Chunked, ext.as_bytes(), 4096),
        Err(DecodeError::Chunk("chunk extensions over limit"))
    );
    let trailer = format!("0\r\nx-a: {}\r\n\r\n", "t".repeat(16 * 1024));
    assert!(matches!(
        decode_all(Delimited::Chunked, trailer.as_bytes(), 4096),
        Err(DecodeError::Chunk(_))
    ));
    let bad_field = b"0\r\nx a: 1\r\n\r\n";
    assert!(matches!(
        decode_all(Delimited::Chunked, bad_field, 64),
        Err(DecodeError::Chunk(_))
    ));
}

#[test]
fn a_body_cut_short_is_incomplete_and_a_close_delimited_one_ends_at_the_close() {
    assert_eq!(
        decode_all(Delimited::Length(10), b"0123", 2),
        Err(DecodeError::Incomplete)
    );
    assert_eq!(
        decode_all(Delimited::Chunked, b"5\r\nhel", 2),
        Err(DecodeError::Incomplete)
    );
    let close = decode_all(Delimited::Close, b"all of it", 4).unwrap();
    assert_eq!(
        close,
        [Step::Data(Bytes::from_static(b"all of it")), Step::End]
    );
    // A length body stops at its length; what follows is not its.
    let mut d = Decoder::new(Delimited::Length(3));
    let mut buf = BytesMut::from("abcdef");
    assert_eq!(
        d.decode(&mut buf),
        Ok(Step::Data(Bytes::from_static(b"abc")))
    );
    assert!(d.is_done());
    assert_eq!(d.decode(&mut buf), Ok(Step::End));
    assert_eq!(&buf[..], b"def");
}

#[tokio::test]
async fn a_request_that_reached_no_one_stays_whole_with_the_caller() {
    use http_body_util::BodyExt as _;
    use std::sync::Arc;

    // A port nothing listens on: the connect is refused.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let dial = crate::proxy::dial::Dial {
        authority: addr.to_string().parse().unwrap(),
        addr: Some(addr),
        timeout: std::time::Duration::from_secs(2),
    };
    let idle = Arc::new(super::IdleConns::new(std::time::Duration::from_secs(60)));
    let body = crate::proxy::body::UpstreamBody::new(Bytes::from_static(b"payload").into(), None);
    let mut req = http::Request::post("/a?b=c")
        .header("host", "up.test")
        .header("x-two", "1")
        .header("x-two", "2")
        .body(body)
        .unwrap();
    let err = super::send(&dial, &idle, &mut req, far())
        .await
        .expect_err("no upstream");
    assert!(
        matches!(err, crate::proxy::dial::SendError::Connect(_)),
        "{err:?}"
    );
    assert_eq!(req.method(), http::Method::POST);
    assert_eq!(req.uri(), "/a?b=c");
    let twos: Vec<_> = req.headers().get_all("x-two").iter().collect();
    assert_eq!(twos, ["1", "2"]);
    let got = req.into_body().collect().await.expect("the body");
    assert_eq!(got.to_bytes(), "payload");
}

/// An upstream that answers each request `early` as soon as its head is
/// in, then reads its body; sends (connection, body bytes) per request.
async fn early_upstream() -> (
    std::net::SocketAddr,
    tokio::sync::mpsc::UnboundedReceiver<(usize, usize)>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut n = 0;
        while let Ok((mut s, _)) = listener.accept().await {
            n += 1;
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = vec![0u8; 64 * 1024];
                loop {
                    let end = loop {
                        if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            break at + 4;
                        }
                        match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(k) => buf.extend_from_slice(&chunk[..k]),
                        }
                    };
                    let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                    let length: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .and_then(|v| v.trim().parse().ok())
                        .unwrap_or(0);
                    buf.drain(..end);
                    let answer =
                        format!("HTTP/1.1 200 OK\r\nx-conn: {n}\r\ncontent-length: 5\r\n\r\nearly");
                    if s.write_all(answer.as_bytes()).await.is_err() {
                        return;
                    }
                    while buf.len() < length {
                        match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(k) => buf.extend_from_slice(&chunk[..k]),
                        }
                    }
                    buf.drain(..length);
                    let _ = tx.send((n, length));
                }
            });
        }
    });
    (addr, rx)
}

#[tokio::test]
async fn a_response_that_ends_before_its_request_body_lets_the_body_finish_and_the_connection_serve_again()
 {
    use http_body_util::BodyExt as _;
    use std::sync::Arc;

    let (addr, mut heard) = early_upstream().await;
    let dial = crate::proxy::dial::Dial {
        authority: addr.to_string().parse().unwrap(),
        addr: Some(addr),
        timeout: std::time::Duration::from_secs(2),
    };
    let idle = Arc::new(super::IdleConns::new(std::time::Duration::from_secs(60)));
    // More than loopback's socket buffers take: the answer comes while
    // the body is still being written.
    let size = 32 << 20;
    let body = crate::proxy::body::UpstreamBody::new(Bytes::from(vec![b'x'; size]).into(), None);
    let mut req = http::Request::post("/up")
        .header("host", "up.test")
        .body(body)
        .unwrap();
    let within = std::time::Duration::from_secs(10);
    let res = tokio::time::timeout(within, super::send(&dial, &idle, &mut req, far()))
        .await
        .expect("a head in time")
        .expect("a response");
    let mut res = res;
    materialize(&mut res);
    assert_eq!(res.headers()["x-conn"], "1");
    let got = tokio::time::timeout(within, res.into_body().collect())
        .await
        .expect("the body in time")
        .expect("the body");
    assert_eq!(got.to_bytes(), "early");
    let first = tokio::time::timeout(within, heard.recv())
        .await
        .expect("heard");
    assert_eq!(first, Some((1, size)));
    // The body's own task gives the connection back once it is written.
    for _ in 0..1000 {
        if idle.kept() == 1 {
            break;
        }
        tokio::task::yield_now().await;
    }
    assert_eq!(idle.kept(), 1, "the connection is kept");
    let mut req = http::Request::get("/next")
        .header("host", "up.test")
        .body(crate::proxy::body::UpstreamBody::empty())
        .unwrap();
    let mut res = super::send(&dial, &idle, &mut req, far())
        .await
        .expect("a response");
    materialize(&mut res);
    assert_eq!(res.headers()["x-conn"], "1");
}

#[tokio::test]
async fn a_response_read_whole_leaves_no_readiness_and_a_close_is_seen() {
    use std::future::poll_fn;
    use std::task::{Context, Waker};
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let io = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut up, _) = listener.accept().await.unwrap();
    let mut conn = super::conn::Conn::new(io, far());
    conn.out
        .extend_from_slice(b"GET / HTTP/1.1\r\nhost: up\r\n\r\n");
    conn.flush().await.expect("the request goes out");
    let mut got = [0u8; 64];
    let n = up.read(&mut got).await.unwrap();
    assert!(got[..n].ends_with(b"\r\n\r\n"));
    let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
    up.write_all(answer).await.unwrap();
    let n = poll_fn(|cx| conn.poll_fill(cx))
        .await
        .expect("the response");
    assert_eq!(n, answer.len());
    // The read filled less than it offered: the socket is drained, and
    // the runtime knows it without another read.
    let mut cx = Context::from_waker(Waker::noop());
    assert!(conn.io.poll_read_ready(&mut cx).is_pending());
    assert!(conn.idle_and_open());

    // The upstream closes the idle connection: once the runtime has seen
    // it, the connection is not taken again.
    drop(up);
    poll_fn(|cx| conn.io.poll_read_ready(cx))
        .await
        .expect("readable at the close");
    assert!(!conn.idle_and_open());
}

/// Every token character, as `httparse` admits in a field name.
const TCHARS: &[u8] =
    b"!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

#[test]
fn common_field_names_are_recognised_as_from_bytes_makes_them_and_only_them() {
    let common = [
        "date",
        "etag",
        "vary",
        "server",
        "expires",
        "location",
        "connection",
        "set-cookie",
        "content-type",
        "accept-ranges",
        "cache-control",
        "last-modified",
        "content-length",
        "content-encoding",
        "transfer-encoding",
        "keep-alive",
        "x-request-id",
    ];
    for name in common {
        // Each byte in turn swapped for every token character: the name
        // made is the one `HeaderName::from_bytes` makes.
        for at in 0..name.len() {
            for &c in TCHARS {
                let mut bytes = name.as_bytes().to_vec();
                bytes[at] = c;
                let want = http::HeaderName::from_bytes(&bytes).unwrap();
                assert_eq!(
                    field_name(&bytes).expect("a name"),
                    want,
                    "{}",
                    String::from_utf8_lossy(&bytes)
                );
            }
        }
        let upper = name.to_ascii_uppercase();
        assert_eq!(field_name(upper.as_bytes()).expect("a name"), name);
    }
    assert_eq!(field_name(b"x-Custom").expect("a name"), "x-custom");
    assert!(field_name(b"").is_none());
}

#[test]
fn hop_by_hop_fields_and_those_connection_names_stay_behind() {
    let h = head(
        "HTTP/1.1 200 OK\r\nConnection: keep-alive, X-Gone\r\nX-Gone: 1\r\nKeep-Alive: timeout=5\r\nTE: trailers\r\nUpgrade: h2c\r\nProxy-Connection: keep-alive\r\nX-Kept: 2\r\nclose: 3\r\nconnection: Content-Length, close\r\nContent-Length: 0\r\nx-gone: 4\r\n\r\n",
    )
    .unwrap()
    .unwrap();
    // Framing still reads what `Connection` names.
    assert_eq!(h.framing, Delimited::Length(0));
    assert!(!h.keep_alive);
    let map = map(h);
    let names: Vec<_> = map.keys().map(http::HeaderName::as_str).collect();
    // `close` is the connection option, not a field's name.
    assert_eq!(names, ["x-kept", "close"]);
}

#[test]
fn the_map_holds_the_length_and_the_rest_is_passed_as_written() {
    let h = head(
        "HTTP/1.1 200 OK\r\nServer: up\r\nContent-Length: 2\r\nX-Odd-Case:  spaced value \t\r\nx-odd-case:\tcafé\r\n\r\n",
    )
    .unwrap()
    .unwrap();
    let names: Vec<_> = h.response.headers().keys().collect();
    assert_eq!(names, ["content-length"]);
    let passed = h.passed.as_deref().expect("passed fields");
    let mut out = Vec::new();
    assert!(!passed.write(&mut out, h.response.headers()));
    assert_eq!(
        String::from_utf8_lossy(&out),
        "Server: up\r\nX-Odd-Case: spaced value\r\nx-odd-case: caf\u{e9}\r\n"
    );
}

/// A deadline no test reaches.
fn far() -> tokio::time::Instant {
    tokio::time::Instant::now() + std::time::Duration::from_secs(3600)
}

/// An upstream that reads what it is sent and never answers.
async fn silent_upstream() -> std::net::SocketAddr {
    use tokio::io::AsyncReadExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut chunk = [0u8; 1024];
                while matches!(s.read(&mut chunk).await, Ok(n) if n > 0) {}
            });
        }
    });
    addr
}

#[tokio::test]
async fn a_head_past_the_deadline_is_expired_and_its_connection_not_kept() {
    use std::sync::Arc;
    let addr = silent_upstream().await;
    let dial = crate::proxy::dial::Dial {
        authority: addr.to_string().parse().unwrap(),
        addr: Some(addr),
        timeout: std::time::Duration::from_secs(2),
    };
    let idle = Arc::new(super::IdleConns::new(std::time::Duration::from_secs(60)));
    let mut req = http::Request::get("/slow")
        .header("host", "up.test")
        .body(crate::proxy::body::UpstreamBody::empty())
        .unwrap();
    let started = tokio::time::Instant::now();
    let until = started + std::time::Duration::from_millis(100);
    let err = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        super::send(&dial, &idle, &mut req, until),
    )
    .await
    .expect("the deadline ends the send")
    .expect_err("no answer");
    assert!(
        matches!(err, crate::proxy::dial::SendError::Expired),
        "{err:?}"
    );
    assert!(started.elapsed() >= std::time::Duration::from_millis(100));
    assert_eq!(idle.kept(), 0, "a timed-out connection is dropped");
    // The request keeps its head for a caller that sends it elsewhere.
    assert_eq!(req.uri(), "/slow");
}

#[tokio::test(start_paused = true)]
async fn a_connections_timer_that_fired_for_an_earlier_exchange_waits_for_the_next_ones_instant() {
    use std::future::poll_fn;
    use std::task::Poll;
    use std::time::Duration;
    use tokio::time::Instant;

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let io = tokio::net::TcpStream::connect(listener.local_addr().unwrap())
        .await
        .unwrap();
    let start = Instant::now();
    let mut conn = super::conn::Conn::new(io, start + Duration::from_millis(10));
    // The first exchange's deadline registers the timer, which fires
    // while the connection is between requests.
    assert!(
        poll_fn(|cx| Poll::Ready(conn.poll_expired(cx)))
            .await
            .is_pending()
    );
    tokio::time::sleep(Duration::from_millis(20)).await;
    // The next exchange's instant is later: the timer waits for it.
    conn.arm(start + Duration::from_millis(100));
    assert!(
        poll_fn(|cx| Poll::Ready(conn.poll_expired(cx)))
            .await
            .is_pending()
    );
    poll_fn(|cx| conn.poll_expired(cx)).await;
    assert!(start.elapsed() >= Duration::from_millis(100));
    // A sooner instant (a gRPC call's deadline) moves the timer sooner.
    let now = Instant::now();
    conn.arm(now + Duration::from_secs(60));
    conn.arm(now + Duration::from_millis(5));
    poll_fn(|cx| conn.poll_expired(cx)).await;
    assert!(now.elapsed() < Duration::from_secs(60));
}
