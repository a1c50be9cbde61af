//! One HTTP/1.1 connection to an upstream, with one read and one write
//! buffer; no task or channel of its own.

use std::io;
use std::task::{Context, Poll, ready};

use bytes::BytesMut;
use tokio::io::AsyncWriteExt as _;
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
    pub fn idle_and_open(&self) -> bool {
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
    pub fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        if self.buf.capacity() - self.buf.len() < self.want {
            self.buf.reserve(self.want);
        }
        loop {
            ready!(self.io.poll_read_ready(cx))?;
            match self.io.try_read_buf(&mut self.buf) {
                Ok(n) => {
                    if n >= self.want && self.want < MAX_READ {
                        self.want *= 2;
                    }
                    return Poll::Ready(Ok(n));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
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
