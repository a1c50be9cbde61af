//! Idle keep-alive connections under the native HTTP/1.1 server: past a
//! short linger with no byte come, a connection's task ends and the
//! listener's parker holds the socket; it is served again when bytes come,
//! closed by the idle timeout, and closed at once by the drain.

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::gateway::Gateway;

/// Longer than the native server's linger (10 ms), after which an idle
/// connection is parked.
const PAST_THE_LINGER: Duration = Duration::from_millis(60);

async fn native(extra: &str) -> Gateway {
    Gateway::start(&format!(
        r#"
listen: 127.0.0.1:0
server: {{ http1: native }}
{extra}
routes:
  - name: ok
    match: {{ path_prefix: / }}
    respond: {{ body: "fine\n" }}
"#
    ))
    .await
}

/// Reads `n` whole answers (each with a `content-length` body) from `s`;
/// their status lines.
async fn answers(s: &mut TcpStream, n: usize) -> Vec<String> {
    let read = read_answers(s, n).await;
    read.into_iter().map(|(status, _)| status).collect()
}

/// Reads `n` whole answers (each with a `content-length` body) from `s`;
/// their status lines, lowercase, and bodies.
pub(crate) async fn read_answers(s: &mut TcpStream, n: usize) -> Vec<(String, String)> {
    let mut buf = Vec::new();
    let mut got = Vec::new();
    let mut chunk = [0u8; 4096];
    while got.len() < n {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .map_or(0, |v| v.trim().parse().expect("a length"));
            if buf.len() >= end + 4 + len {
                let status = head.lines().next().unwrap_or_default().to_owned();
                let body = String::from_utf8_lossy(&buf[end + 4..end + 4 + len]).into_owned();
                got.push((status, body));
                buf.drain(..end + 4 + len);
                continue;
            }
        }
        let read = s.read(&mut chunk).await.expect("read");
        assert!(read > 0, "closed after {} answers", got.len());
        buf.extend_from_slice(&chunk[..read]);
    }
    got
}

const GET: &[u8] = b"GET /a HTTP/1.1\r\nhost: gateway.test\r\n\r\n";

/// Whether the gateway closed `s` (EOF or reset) within `within`.
async fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    let mut byte = [0u8; 1];
    matches!(
        tokio::time::timeout(within, s.read(&mut byte)).await,
        Ok(Ok(0) | Err(_))
    )
}

#[tokio::test]
async fn a_parked_connection_is_served_again_when_its_next_requests_come() {
    let gw = native("").await;
    let mut s = TcpStream::connect(gw.addr).await.expect("connect");
    s.write_all(GET).await.expect("write");
    assert_eq!(answers(&mut s, 1).await, ["http/1.1 200 ok"]);
    for _ in 0..3 {
        // Time passing is what is tested: idle past the linger, parked.
        tokio::time::sleep(PAST_THE_LINGER).await;
        // Two requests in one write: both answered, in order, by the
        // connection served again.
        let two = [GET, b"GET /b HTTP/1.1\r\nhost: gateway.test\r\n\r\n"].concat();
        s.write_all(&two).await.expect("write");
        assert_eq!(answers(&mut s, 2).await, ["http/1.1 200 ok"; 2]);
    }
    // A head that comes in pieces across the park is read whole.
    tokio::time::sleep(PAST_THE_LINGER).await;
    s.write_all(&GET[..10]).await.expect("write");
    tokio::time::sleep(PAST_THE_LINGER).await;
    s.write_all(&GET[10..]).await.expect("write");
    assert_eq!(answers(&mut s, 1).await, ["http/1.1 200 ok"]);
}

#[tokio::test]
async fn a_parked_connection_is_closed_by_the_idle_timeout() {
    let gw = native("timeouts: { idle: 1s }").await;
    let mut s = TcpStream::connect(gw.addr).await.expect("connect");
    s.write_all(GET).await.expect("write");
    assert_eq!(answers(&mut s, 1).await, ["http/1.1 200 ok"]);
    let answered = Instant::now();
    assert!(closed_within(&mut s, Duration::from_secs(5)).await);
    let after = answered.elapsed();
    // The parker closes an eighth of the timeout late at most.
    assert!(
        after >= Duration::from_millis(950) && after < Duration::from_millis(1_600),
        "closed {after:?} after the answer; idle is 1s"
    );
    // Served again, a connection is parked again and closed by the
    // timeout, counted from its last answer.
    let mut s = TcpStream::connect(gw.addr).await.expect("connect");
    s.write_all(GET).await.expect("write");
    answers(&mut s, 1).await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    s.write_all(GET).await.expect("write");
    answers(&mut s, 1).await;
    let answered = Instant::now();
    assert!(closed_within(&mut s, Duration::from_secs(5)).await);
    assert!(answered.elapsed() >= Duration::from_millis(950));
}

#[tokio::test]
async fn a_parked_connection_is_closed_at_once_by_the_drain() {
    let gw = native("timeouts: { drain: 20s }").await;
    let mut s = TcpStream::connect(gw.addr).await.expect("connect");
    s.write_all(GET).await.expect("write");
    assert_eq!(answers(&mut s, 1).await, ["http/1.1 200 ok"]);
    tokio::time::sleep(PAST_THE_LINGER).await;
    let started = Instant::now();
    let stopped = tokio::time::timeout(Duration::from_secs(10), gw.stop()).await;
    assert!(
        stopped.is_ok() && started.elapsed() < Duration::from_secs(3),
        "the drain waited {:?} for an idle connection",
        started.elapsed()
    );
    assert!(closed_within(&mut s, Duration::from_secs(1)).await);
}
