//! The connection's stream shared by the parts of one exchange that read
//! and write it at once (the request body's reader, the answer's writer,
//! the watch for the client leaving), each locking it inside one poll.

use std::io;
use std::pin::Pin;
use std::sync::{Mutex, PoisonError};
use std::task::{Context, Poll};

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};

/// The stream, whether or not a poll panicked while holding it.
pub(super) fn inner<I>(io: &mut Mutex<I>) -> &mut I {
    io.get_mut().unwrap_or_else(PoisonError::into_inner)
}

/// The stream, for the body's reader or the answer's writer: locked for
/// one poll at a time.
pub(super) struct Locked<'a, I>(pub(super) &'a Mutex<I>);

impl<I: AsyncRead + Unpin> AsyncRead for Locked<'_, I> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let mut io = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        Pin::new(&mut *io).poll_read(cx, buf)
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Locked<'_, I> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let mut io = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        Pin::new(&mut *io).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut io = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        Pin::new(&mut *io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut io = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        Pin::new(&mut *io).poll_shutdown(cx)
    }
}

/// Completes when the client has closed its side (or the stream failed)
/// while an answer is on its way; pends otherwise. Bytes that come
/// instead (a pipelined request) are kept in `rbuf` for the next head,
/// and then the watch ends pending: a client that sends is not gone.
/// With bytes already waiting in `rbuf`, or no buffer to read into, it
/// only pends.
pub(super) async fn gone<R: AsyncRead + Unpin>(rd: &mut R, rbuf: &mut BytesMut) {
    if rbuf.is_empty() && rbuf.capacity() > 0 {
        match rd.read_buf(rbuf).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
    std::future::pending().await
}
