//! An I/O stream that tells an observer about the bytes it moves: the
//! upstream pool counts what a connection has read (so "no response byte
//! yet" is known exactly), the listener notes when a client connection last
//! moved a byte (its idle timeout). One wrapper, two observers.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// What an [`Observed`] stream reports.
pub trait Observer {
    /// `n > 0` bytes were read.
    fn read(&self, n: usize);
    /// `n > 0` bytes were written.
    fn wrote(&self, n: usize);
}

/// `inner`, with every read and write of at least one byte reported to
/// `observer`.
#[derive(Debug)]
pub struct Observed<I, O> {
    /// The stream.
    pub inner: I,
    /// Who hears of its bytes.
    pub observer: O,
}

impl<I: AsyncRead + Unpin, O: Observer + Unpin> AsyncRead for Observed<I, O> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        let n = buf.filled().len() - before;
        if n > 0 {
            self.observer.read(n);
        }
        polled
    }
}

impl<I: AsyncWrite + Unpin, O: Observer + Unpin> AsyncWrite for Observed<I, O> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = polled
            && n > 0
        {
            self.observer.wrote(n);
        }
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(n)) = polled
            && n > 0
        {
            self.observer.wrote(n);
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
