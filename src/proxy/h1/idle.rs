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
            let (conn, expires) = self
                .idle
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .pop()?;
            let now = *now.get_or_insert_with(Instant::now);
            if expires.is_none_or(|at| now <= at) && conn.idle_and_open() {
                return Some(conn);
            }
        }
    }

    /// Keeps `conn` for the next request, when there is room.
    pub fn put(&self, mut conn: Box<Conn>) {
        conn.trim();
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        if idle.len() < MAX_IDLE {
            idle.push((conn, Instant::now().checked_add(self.idle_timeout)));
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
