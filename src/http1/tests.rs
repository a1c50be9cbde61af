//! The native server's reading and writing, held to what hyper's server
//! does with the same bytes (the `http1_diff` fuzz target holds the two
//! against each other on arbitrary input; these are the cases by name).

use bytes::BytesMut;
use http::{Method, StatusCode, Version};

use super::body::decode_all;
use super::head::{BodyFraming, HeadRead, Refusal, parse};
use super::write::{self, Encoder, ResponseTo};

fn head(text: &[u8]) -> HeadRead {
    parse(&mut BytesMut::from(text))
}

fn refused(text: &[u8]) -> StatusCode {
    match head(text) {
        HeadRead::Refused(r) => r.status(),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

fn accepted(text: &[u8]) -> super::head::RequestHead {
    match head(text) {
        HeadRead::Head(h) => h,
        other => panic!("expected a head, got {other:?}"),
    }
}

#[test]
fn a_head_is_read_in_place_and_what_follows_is_left() {
    let mut buf = BytesMut::from(&b"GET /a?b HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n\r\nnext"[..]);
    let HeadRead::Head(h) = parse(&mut buf) else {
        panic!("a head");
    };
    assert_eq!(h.method, Method::GET);
    assert_eq!(h.uri, "/a?b");
    assert_eq!(h.version, Version::HTTP_11);
    assert_eq!(h.headers["x-a"], "1");
    assert_eq!(h.framing, BodyFraming::Length(0));
    assert!(h.keep_alive && !h.wants_upgrade);
    assert_eq!(&buf[..], b"next");
}

#[test]
fn a_partial_head_waits_for_more() {
    assert!(matches!(
        head(b"GET / HTTP/1.1\r\nHost: x\r\n"),
        HeadRead::Partial
    ));
}

#[test]
fn malformed_heads_are_400_as_hyper_answers_them() {
    for bad in [
        &b"G@T / HTTP/1.1\r\n\r\n"[..],
        b"GET / HTTP/1.2\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: x\r\n folded\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a\rb\r\n\r\n",
        b"GET / HTTP/1.1\r\nX: a\0b\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost : x\r\n\r\n",
        b"GET /a b HTTP/1.1\r\n\r\n",
        b"POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
        b"POST / HTTP/1.1\r\nContent-Length: +1\r\n\r\n",
        b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n",
        b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
    ] {
        assert_eq!(
            refused(bad),
            StatusCode::BAD_REQUEST,
            "{}",
            String::from_utf8_lossy(bad)
        );
    }
}

#[test]
fn too_many_fields_are_431_and_an_overlong_target_414() {
    let mut many = b"GET / HTTP/1.1\r\n".to_vec();
    for i in 0..=super::head::MAX_HEADERS {
        many.extend_from_slice(format!("x-{i}: 1\r\n").as_bytes());
    }
    many.extend_from_slice(b"\r\n");
    assert_eq!(refused(&many), StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
    let long = format!(
        "GET /{} HTTP/1.1\r\n\r\n",
        "a".repeat(super::head::MAX_TARGET)
    );
    assert_eq!(refused(long.as_bytes()), StatusCode::URI_TOO_LONG);
}

#[test]
fn a_length_past_the_largest_hyper_reads_is_431() {
    let head = |n: &str| format!("POST / HTTP/1.1\r\nContent-Length: {n}\r\n\r\n");
    let max = u64::MAX;
    let largest = (max - 2).to_string();
    let h = accepted(head(&largest).as_bytes());
    assert_eq!(h.framing, BodyFraming::Length(max - 2));
    for over in [(max - 1).to_string(), max.to_string(), format!("0{max}")] {
        assert_eq!(
            refused(head(&over).as_bytes()),
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "{over}"
        );
    }
    // Past `u64::MAX` it is no number at all.
    assert_eq!(
        refused(head("18446744073709551616").as_bytes()),
        StatusCode::BAD_REQUEST
    );
    // A second, different length is a conflict first.
    let two = format!("POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: {max}\r\n\r\n");
    assert_eq!(refused(two.as_bytes()), StatusCode::BAD_REQUEST);
}

#[test]
fn framing_headers_are_read_as_hyper_reads_them() {
    // Equal lengths twice: one is kept.
    let h = accepted(b"POST / HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\n");
    assert_eq!(h.framing, BodyFraming::Length(3));
    assert_eq!(h.headers.get_all("content-length").iter().count(), 1);
    // With Transfer-Encoding the length goes, and the connection closes
    // after the request (the guard refuses the pair when it reaches it).
    let h = accepted(b"POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n");
    assert_eq!(h.framing, BodyFraming::Chunked);
    assert!(!h.keep_alive && !h.headers.contains_key("content-length"));
    // HTTP/1.0 keeps the connection only when asked; `close` wins over a
    // later `keep-alive`.
    assert!(!accepted(b"GET / HTTP/1.0\r\n\r\n").keep_alive);
    assert!(accepted(b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n").keep_alive);
    let h = accepted(b"GET / HTTP/1.1\r\nConnection: close\r\nConnection: keep-alive\r\n\r\n");
    assert!(!h.keep_alive);
    assert!(
        accepted(b"POST / HTTP/1.1\r\nExpect: 100-Continue\r\nContent-Length: 1\r\n\r\n")
            .expect_continue
    );
}

#[test]
fn upgrades_connect_and_the_h2_preface_go_to_hyper() {
    assert!(accepted(b"GET / HTTP/1.1\r\nUpgrade: websocket\r\n\r\n").wants_upgrade);
    assert!(!accepted(b"GET / HTTP/1.0\r\nUpgrade: websocket\r\n\r\n").wants_upgrade);
    assert!(accepted(b"CONNECT a:443 HTTP/1.1\r\n\r\n").wants_upgrade);
    assert!(matches!(
        head(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"),
        HeadRead::Preface
    ));
}

fn chunked(body: &[u8]) -> Result<(Vec<u8>, Option<http::HeaderMap>), &'static str> {
    decode_all(BodyFraming::Chunked, &mut BytesMut::from(body))
}

#[test]
fn chunked_bodies_decode_with_extensions_and_trailers() {
    let (data, trailers) =
        chunked(b"5;a=b\r\nhello\r\n1 \r\n!\r\n0\r\nX-T: 1\r\n\r\n").expect("valid");
    assert_eq!(data, b"hello!");
    assert_eq!(trailers.expect("trailers")["x-t"], "1");
    assert_eq!(chunked(b"0\r\n\r\n").expect("empty"), (vec![], None));
}

#[test]
fn broken_chunked_bodies_are_refused() {
    for bad in [
        &b"x\r\n"[..],
        b"-1\r\n",
        b"1 A\r\n",
        b"1;a\nb\r\n",
        b"f0000000000000003\r\nabc",
        b"3\r\nabcX\r\n",
        b"3\nabc\r\n0\r\n\r\n",
        b"3\r\nabc\r\n0\r\n\rX",
    ] {
        assert!(chunked(bad).is_err(), "{}", String::from_utf8_lossy(bad));
    }
    let ext = format!("1;{}\r\na\r\n0\r\n\r\n", "e".repeat(16 * 1024));
    assert_eq!(chunked(ext.as_bytes()), Err("chunk extensions over limit"));
}

#[test]
fn a_body_of_known_length_stops_at_its_length() {
    let mut buf = BytesMut::from(&b"abcGET"[..]);
    let (data, _) = decode_all(BodyFraming::Length(3), &mut buf).expect("whole");
    assert_eq!((&data[..], &buf[..]), (&b"abc"[..], &b"GET"[..]));
    assert!(decode_all(BodyFraming::Length(9), &mut BytesMut::from(&b"abc"[..])).is_err());
}

fn written(
    status: u16,
    method: &Method,
    version: Version,
    hint: Option<http_body::SizeHint>,
) -> (String, Encoder, bool) {
    let mut res = http::Response::new(());
    *res.status_mut() = StatusCode::from_u16(status).expect("status");
    let (parts, ()) = res.into_parts();
    let mut dst = Vec::new();
    let ex = ResponseTo {
        method,
        version,
        keep_alive: true,
    };
    let (enc, keep) = write::head(&mut dst, &parts, hint, (None, None), ex);
    (String::from_utf8(dst).expect("text"), enc, keep)
}

#[test]
fn late_fields_are_written_after_the_maps_as_if_they_were_its_own() {
    use http::header::{CONNECTION, CONTENT_LENGTH, CONTENT_TYPE, HeaderValue, RETRY_AFTER};
    let mut res = http::Response::new(());
    *res.status_mut() = StatusCode::TOO_MANY_REQUESTS;
    res.headers_mut()
        .insert("vary", HeaderValue::from_static("origin"));
    let mut late = write::LateFields::default();
    late.push(&CONTENT_TYPE, &HeaderValue::from_static("text/plain"));
    late.push_number(&RETRY_AFTER, 7);
    late.push(&CONNECTION, &HeaderValue::from_static("close"));
    // The writer's own fields are not taken.
    late.push(&CONTENT_LENGTH, &HeaderValue::from_static("99"));
    let (parts, ()) = res.into_parts();
    let mut dst = Vec::new();
    let ex = ResponseTo {
        method: &Method::GET,
        version: Version::HTTP_11,
        keep_alive: true,
    };
    let exact = Some(http_body::SizeHint::with_exact(2));
    let (enc, keep) = write::head(&mut dst, &parts, exact, (Some(&late), None), ex);
    let text = String::from_utf8(dst).expect("text");
    assert!(
        text.starts_with(
            "HTTP/1.1 429 Too Many Requests\r\nvary: origin\r\ncontent-type: text/plain\r\n\
             retry-after: 7\r\nconnection: close\r\ncontent-length: 2\r\ndate: "
        ),
        "{text}"
    );
    // The `close` among them ends the connection, and is said once.
    assert_eq!((enc, keep), (Encoder::Length(2), false));
    assert_eq!(text.matches("connection").count(), 1, "{text}");
}

#[test]
fn responses_are_framed_as_hyper_frames_them() {
    let exact = Some(http_body::SizeHint::with_exact(5));
    let (text, enc, keep) = written(200, &Method::GET, Version::HTTP_11, exact);
    assert!(
        text.starts_with("HTTP/1.1 200 OK\r\ncontent-length: 5\r\ndate: "),
        "{text}"
    );
    assert!(text.ends_with("\r\n\r\n") && enc == Encoder::Length(5) && keep);
    let (text, enc, _) = written(
        200,
        &Method::GET,
        Version::HTTP_11,
        Some(http_body::SizeHint::new()),
    );
    assert!(text.contains("transfer-encoding: chunked\r\n") && enc == Encoder::Chunked);
    // HTTP/1.0 without a length: the end of the connection ends the body.
    let (text, enc, keep) = written(
        200,
        &Method::GET,
        Version::HTTP_10,
        Some(http_body::SizeHint::new()),
    );
    assert!(text.starts_with("HTTP/1.0 200 OK\r\n") && enc == Encoder::Close && !keep);
    // HEAD says the length and sends nothing; 204 and 304 send no body.
    let (text, enc, _) = written(200, &Method::HEAD, Version::HTTP_11, exact);
    assert!(text.contains("content-length: 5\r\n") && enc == Encoder::Length(0));
    for status in [204, 304] {
        let (text, enc, _) = written(status, &Method::GET, Version::HTTP_11, exact);
        assert!(
            !text.contains("content-length") && enc == Encoder::Length(0),
            "{text}"
        );
    }
    let (text, ..) = written(429, &Method::GET, Version::HTTP_11, None);
    assert!(
        text.starts_with("HTTP/1.1 429 Too Many Requests\r\ncontent-length: 0\r\n"),
        "{text}"
    );
}

#[test]
fn chunk_sizes_are_hex() {
    let mut dst = Vec::new();
    write::chunk_size(&mut dst, 0x1a2b);
    write::chunk_size(&mut dst, 1);
    assert_eq!(dst, b"1a2b\r\n1\r\n");
}

#[test]
fn refusals_close_with_an_empty_body() {
    let mut dst = Vec::new();
    write::refusal(&mut dst, Refusal::TooLarge.status());
    let text = String::from_utf8(dst).expect("text");
    assert!(text.starts_with(
        "HTTP/1.1 431 Request Header Fields Too Large\r\nconnection: close\r\ncontent-length: 0\r\n"
    ));
}

#[test]
fn bytes_over_0x7f_in_a_target_are_taken_as_hyper_takes_them() {
    // The fuzz target's first finding against its grammar check: both
    // servers take them, and the canonical target percent-encodes them.
    let h = accepted(b"WET /a\xc2\x9d=c HTTP/1.1\r\nHost: \n\n");
    assert_eq!(h.method.as_str(), "WET");
    assert_eq!(h.uri.path().as_bytes(), b"/a\xc2\x9d=c");
    assert_eq!(h.headers["host"], "");
}

/// A connection on loopback: the server's end and the client's.
async fn connected() -> (tokio::net::TcpStream, tokio::net::TcpStream) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("bound");
    let (accepted, client) = tokio::join!(listener.accept(), tokio::net::TcpStream::connect(addr));
    let (stream, _) = accepted.expect("accepted");
    (stream, client.expect("connected"))
}

/// Serves `stream` with a service that answers `ok`, parking it after
/// the linger when `parks`.
fn serve_ok(
    stream: tokio::net::TcpStream,
    parks: bool,
    stop: tokio::sync::watch::Receiver<bool>,
    idle_since: Option<tokio::time::Instant>,
) -> impl Future<Output = std::io::Result<super::ConnEnd<tokio::net::TcpStream>>> {
    let service = tower::service_fn(|_req: http::Request<super::RequestBody>| async {
        Ok::<_, std::convert::Infallible>(http::Response::new(http_body_util::Full::new(
            bytes::Bytes::from_static(b"ok"),
        )))
    });
    let settings = super::Settings {
        header_read: std::time::Duration::from_secs(30),
        idle: std::time::Duration::from_secs(30),
        max_head: 16 * 1024,
        parks,
    };
    super::serve(stream, service, settings, stop, idle_since)
}

/// Serves one connection on this thread's runtime with a service that
/// answers `ok`; the client's end.
async fn served() -> tokio::net::TcpStream {
    let (stream, client) = connected().await;
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        let _held = stop_tx;
        let _ = serve_ok(stream, false, stop, None).await;
    });
    client
}

/// Sends a request on `client` and reads the whole answer.
async fn ask(client: &mut tokio::net::TcpStream) -> Vec<u8> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    client
        .write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .expect("sent");
    let mut got = Vec::new();
    while !got.ends_with(b"\r\n\r\nok") {
        let mut chunk = [0u8; 512];
        let n = client.read(&mut chunk).await.expect("read");
        assert!(n > 0, "closed early: {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&chunk[..n]);
    }
    got
}

#[tokio::test(flavor = "current_thread")]
async fn an_idle_connection_gives_its_buffers_back_and_takes_them_again() {
    // One thread runs the client and the server: once the client has its
    // answer, the server's task has written it and waits for the next head.
    let mut client = served().await;
    let before = super::spare::kept();
    let answer = ask(&mut client).await;
    assert!(answer.starts_with(b"HTTP/1.1 200 OK\r\n"));
    let after_one = super::spare::kept();
    assert_eq!(
        (after_one.0 - before.0, after_one.1 - before.1),
        (1, 1),
        "the waiting connection holds neither buffer"
    );
    ask(&mut client).await;
    ask(&mut client).await;
    assert_eq!(
        super::spare::kept(),
        after_one,
        "the same buffers serve each request"
    );
}

/// The size of the future `make` returns, without making one.
fn future_size<A, F>(_make: impl FnOnce(A) -> F) -> usize {
    std::mem::size_of::<F>()
}

#[test]
fn a_connection_keeps_no_room_for_a_request_between_requests() {
    // A service whose future holds 16 KiB across a wait, as the gateway's
    // holds its phases: the connection's own future must not be sized
    // for it, or each idle connection keeps that much.
    let service = tower::service_fn(|_req: http::Request<super::RequestBody>| async {
        let held = [7u8; 16 * 1024];
        tokio::task::yield_now().await;
        std::hint::black_box(&held);
        Ok::<_, std::convert::Infallible>(http::Response::new(
            http_body_util::Empty::<bytes::Bytes>::new(),
        ))
    });
    let settings = super::Settings {
        header_read: std::time::Duration::from_secs(30),
        idle: std::time::Duration::from_secs(30),
        max_head: 16 * 1024,
        parks: false,
    };
    let (_stop_tx, stop) = tokio::sync::watch::channel(false);
    let answer = future_size(|req: http::Request<super::RequestBody>| {
        tower::Service::call(&mut { service }, req)
    });
    assert!(
        answer >= 16 * 1024,
        "the service's future holds {answer} bytes"
    );
    let conn = future_size(|io: tokio::net::TcpStream| {
        super::serve(io, service, settings, stop.clone(), None)
    });
    assert!(
        conn < 4 * 1024,
        "a connection's future is {conn} bytes, sized for its service's ({answer})"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn a_connection_idle_past_the_linger_serves_its_next_request() {
    let mut client = served().await;
    ask(&mut client).await;
    // Time passing, not readiness: past the linger the connection waits
    // without its requests' allocation, and still serves what comes.
    tokio::time::sleep(super::conn::LINGER * 3).await;
    let answer = ask(&mut client).await;
    assert!(answer.starts_with(b"HTTP/1.1 200 OK\r\n"));
    let answer = ask(&mut client).await;
    assert!(answer.starts_with(b"HTTP/1.1 200 OK\r\n"));
}

#[tokio::test(flavor = "current_thread")]
async fn a_parking_connection_idle_past_the_linger_ends_and_serves_again_from_its_idle_start() {
    let (stream, mut client) = connected().await;
    let (_stop_tx, stop) = tokio::sync::watch::channel(false);
    let serving = tokio::spawn(serve_ok(stream, true, stop.clone(), None));
    ask(&mut client).await;
    let answered = tokio::time::Instant::now();
    let ended = serving.await.expect("served").expect("no error");
    let super::ConnEnd::Idle(stream, since) = ended else {
        panic!("the connection ended otherwise than idle: {ended:?}");
    };
    assert!(
        answered.duration_since(since) < super::conn::LINGER,
        "idle since it waited for its next head"
    );
    assert!(
        since.elapsed() >= super::conn::LINGER,
        "ended after the linger"
    );
    // Served again from when it went idle: it answers, and parks again.
    let serving = tokio::spawn(serve_ok(stream, true, stop, Some(since)));
    ask(&mut client).await;
    let ended = serving.await.expect("served").expect("no error");
    assert!(matches!(ended, super::ConnEnd::Idle(..)), "{ended:?}");
}
