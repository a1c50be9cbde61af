//! One HTTP/1.1 connection to an upstream, with one read and one write
//! buffer; no task or channel of its own.

use std::future::Future as _;
use std::io;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use bytes::BytesMut;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

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
}

impl Conn {
    /// A connection over `io`, with empty buffers.
    pub fn new(io: TcpStream) -> Box<Self> {
        Box::new(Self {
            io,
            buf: BytesMut::new(),
            out: Vec::new(),
            want: FIRST_READ,
        })
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

    /// Writes `out`, then clears it; the bytes written before a failure.
    pub async fn flush(&mut self) -> Result<(), (usize, io::Error)> {
        let mut at = 0;
        while at < self.out.len() {
            match self.io.write(&self.out[at..]).await {
                Ok(0) => return Err((at, io::ErrorKind::WriteZero.into())),
                Ok(n) => at += n,
                Err(e) => return Err((at, e)),
            }
        }
        Ok(())
    }
}
