//! The idle native connections to one upstream.

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::conn::Conn;

/// Idle connections kept per upstream.
const MAX_IDLE: usize = 256;

/// The idle connections to one upstream, most recently used last, each
/// with the instant it expires (a comparison when it is taken, where the
/// time it went idle would need a subtraction); `None` for a timeout past
/// what the clock counts.
///
/// One clock read a reuse: the instant a connection is taken serves both
/// to check its expiry and, as [`Conn::since`], to count its next idle
/// time from. That counts the request's own time as idle too, so a
/// connection expires early, never late: no later than `idle_timeout`
/// after its last response ended it is not reused, and one whose answer
/// took longer than `idle_timeout` is not reused at all.
#[derive(Debug)]
pub struct IdleConns {
    idle: Mutex<Vec<(Box<Conn>, Option<Instant>)>>,
    idle_timeout: Duration,
}

impl IdleConns {
    /// No connections yet; an idle one is not reused after `idle_timeout`.
    pub fn new(idle_timeout: Duration) -> Self {
        Self {
            idle: Mutex::new(Vec::new()),
            idle_timeout,
        }
    }

    /// The most recently used connection that is still open and not
    /// expired; drops the others it passes.
    pub fn take(&self) -> Option<Box<Conn>> {
        let mut now = None;
        loop {
            let (mut conn, expires) = self
                .idle
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .pop()?;
            let now = *now.get_or_insert_with(Instant::now);
            if expires.is_none_or(|at| now <= at) && conn.idle_and_open() {
                conn.since = now;
                return Some(conn);
            }
        }
    }

    /// Keeps `conn` for the next request, when there is room, until
    /// `idle_timeout` after its use began.
    pub fn put(&self, mut conn: Box<Conn>) {
        conn.trim();
        let expires = conn.since.checked_add(self.idle_timeout);
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        if idle.len() < MAX_IDLE {
            idle.push((conn, expires));
        }
    }

    /// How many connections are kept.
    #[cfg(test)]
    pub fn kept(&self) -> usize {
        self.idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{Conn, IdleConns};

    /// A connection to a listener on loopback, accepted and kept open.
    async fn conn() -> (Box<Conn>, tokio::net::TcpStream) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let io = tokio::net::TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (peer, _) = listener.accept().await.unwrap();
        (Conn::new(io), peer)
    }

    #[tokio::test]
    async fn a_connection_is_reused_within_its_idle_timeout_counted_from_its_use() {
        let idle = IdleConns::new(Duration::from_secs(60));
        let (c, _peer) = conn().await;
        let connected = c.since;
        idle.put(c);
        let c = idle.take().expect("reused within the timeout");
        assert!(c.since >= connected, "taking it starts its next use");
        idle.put(c);
        assert_eq!(idle.kept(), 1);

        // Expiry counts from the use's start: a use longer than the
        // timeout leaves a connection that is not reused.
        let idle = IdleConns::new(Duration::from_millis(30));
        let (c, _peer) = conn().await;
        let begun = c.since;
        while begun.elapsed() <= Duration::from_millis(30) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        idle.put(c);
        assert_eq!(idle.kept(), 1);
        assert!(idle.take().is_none(), "expired");
        assert_eq!(idle.kept(), 0, "dropped once found expired");
    }
}
