//! One HTTP/1.1 connection to an upstream, with one read and one write
//! buffer and one timer; no task or channel of its own.
//!
//! The timer bounds each exchange's wait for the answer's head (the
//! route's timeout, or a gRPC call's sooner deadline). It is made with the
//! connection and kept for its life, so a request sets an instant
//! ([`Conn::arm`]) rather than making, registering and clearing a timer of
//! its own. The runtime's timer is moved only when it must fire sooner
//! than it would; when it fires before the instant set since, it is set
//! again to that instant ([`Conn::poll_expired`]), so a busy connection
//! touches the runtime's timer wheel about once per timeout, not once per
//! request.

use std::future::{Future as _, poll_fn};
use std::io;
use std::pin::{Pin, pin};
use std::task::{Context, Poll, Waker};

use bytes::BytesMut;
use tokio::io::{AsyncReadExt as _, AsyncWrite as _};
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};

/// The first read's size; reads double while they fill what they asked
/// for, up to [`MAX_READ`], as a body streams.
const FIRST_READ: usize = 8 * 1024;
/// The largest read.
const MAX_READ: usize = 256 * 1024;

/// A connection and its buffers.
#[derive(Debug)]
pub struct Conn {
    pub io: TcpStream,
    /// Bytes read and not yet used.
    pub buf: BytesMut,
    /// The request head (and small body frames) before they are written.
    pub out: Vec<u8>,
    /// The next read's size.
    want: usize,
    /// When the exchange under way must have its answer's head.
    until: Instant,
    /// The runtime's timer, due at `until` or sooner.
    timer: Pin<Box<Sleep>>,
}

/// Why [`Conn::flush`] stopped.
#[derive(Debug)]
pub enum Unflushed {
    /// The write failed after this many bytes.
    Io(usize, io::Error),
    /// The exchange's deadline passed after this many bytes.
    Expired(usize),
}

impl Conn {
    /// A connection over `io`, with empty buffers, whose first exchange
    /// must have its answer's head by `until`.
    pub fn new(io: TcpStream, until: Instant) -> Box<Self> {
        Box::new(Self {
            io,
            buf: BytesMut::new(),
            out: Vec::new(),
            want: FIRST_READ,
            until,
            timer: Box::pin(tokio::time::sleep_until(until)),
        })
    }

    /// Sets when the next exchange must have its answer's head. Only an
    /// instant before the timer's moves the runtime's timer; a later one
    /// is taken up when the timer fires.
    pub fn arm(&mut self, until: Instant) {
        self.until = until;
        if until < self.timer.deadline() {
            self.timer.as_mut().reset(until);
        }
    }

    /// Ready once the instant [`Self::arm`] set has passed; otherwise the
    /// task is woken when it passes. Polled where an exchange waits, after
    /// what it waits for, as a timeout polls its future first.
    pub fn poll_expired(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        while self.timer.as_mut().poll(cx).is_ready() {
            if self.timer.deadline() >= self.until {
                return Poll::Ready(());
            }
            // Fired at an earlier exchange's instant: wait for this one's.
            let until = self.until;
            self.timer.as_mut().reset(until);
        }
        Poll::Pending
    }

    /// Whether the upstream has neither closed the connection nor sent
    /// anything unasked while it sat idle.
    ///
    /// The runtime's readiness answers first, without a syscall: the last
    /// read found the socket drained ([`Self::poll_fill`]), so a socket not
    /// readable since has had no byte and no end of file — as far as the
    /// runtime's last look at its events goes, the same view hyper's client
    /// has of its idle connections. A close that crosses the next request
    /// is the keep-alive race, which the sender's rules handle. Only a
    /// socket that became readable is asked, with a one-byte read.
    pub fn idle_and_open(&self) -> bool {
        let mut cx = Context::from_waker(Waker::noop());
        if self.io.poll_read_ready(&mut cx).is_pending() {
            return true;
        }
        let mut probe = [0u8; 1];
        matches!(self.io.try_read(&mut probe), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
    }

    /// Gives back a large read buffer before the connection goes idle.
    pub fn trim(&mut self) {
        if self.buf.capacity() > 4 * FIRST_READ {
            self.buf = BytesMut::new();
            self.want = FIRST_READ;
        }
        if self.out.capacity() > 4 * FIRST_READ {
            self.out = Vec::new();
        }
    }

    /// Reads what the upstream sent into `buf`; `Ok(0)` at its end of file.
    ///
    /// Through the stream's `poll_read`, which marks the socket not
    /// readable when a read fills less than it offered (the socket is
    /// drained; the runtime's epoll is edge-triggered): a response read
    /// whole leaves no readiness behind, so neither the next read of this
    /// connection nor [`Self::idle_and_open`] spends a syscall to learn
    /// that nothing is there.
    pub fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        if self.buf.capacity() - self.buf.len() < self.want {
            self.buf.reserve(self.want);
        }
        let polled = pin!(self.io.read_buf(&mut self.buf)).poll(cx);
        if let Poll::Ready(Ok(n)) = polled
            && n >= self.want
            && self.want < MAX_READ
        {
            self.want *= 2;
        }
        polled
    }

    /// Writes `out`, up to the instant [`Self::arm`] set.
    ///
    /// # Errors
    /// The write failed, or the instant passed; either says how many bytes
    /// went out before.
    pub async fn flush(&mut self) -> Result<(), Unflushed> {
        let mut at = 0;
        poll_fn(|cx| {
            while at < self.out.len() {
                match Pin::new(&mut self.io).poll_write(cx, &self.out[at..]) {
                    Poll::Ready(Ok(0)) => {
                        return Poll::Ready(Err(Unflushed::Io(
                            at,
                            io::ErrorKind::WriteZero.into(),
                        )));
                    }
                    Poll::Ready(Ok(n)) => at += n,
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(Unflushed::Io(at, e))),
                    Poll::Pending => {
                        return self.poll_expired(cx).map(|()| Err(Unflushed::Expired(at)));
                    }
                }
            }
            Poll::Ready(Ok(()))
        })
        .await
    }
}
