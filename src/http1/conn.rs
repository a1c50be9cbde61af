//! One client connection served: heads read, requests handed to the
//! service in order, bodies read while the service runs, answers written
//! in order, until the connection closes or is handed to hyper.

use std::convert::Infallible;
use std::future::poll_fn;
use std::io;
use std::pin::{Pin, pin};
use std::task::Poll;
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use http::{Request, Response};
use http_body::Body;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::sync::{Notify, oneshot, watch};
use tokio::time::{Instant, Sleep};
use tower::{Service, ServiceExt};

use super::body::{PumpEnd, READ_CHUNK, RequestBody, pump};
use super::head::{self, BodyFraming, HeadRead, Refusal, RequestHead};
use super::rewind::Rewind;
use super::write::{self, Encoder, ResponseTo};

/// Data frames at least this large are written from their own buffer
/// instead of being copied into the write buffer.
const COPY_LIMIT: usize = 16 * 1024;
/// The stack buffer the first bytes of a head are read into.
const FIRST_READ: usize = 2048;
/// The write buffer is sent once it holds this much.
const FLUSH_AT: usize = 64 * 1024;

/// What a connection is held to.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// Time for a whole head, from when the connection waits for it
    /// (`timeouts.header_read`).
    pub header_read: Duration,
    /// The largest head read; larger is answered 431 (hyper's read buffer
    /// bound: `server.max_header_size` plus the listener's slack).
    pub max_head: usize,
}

/// How serving a connection ended.
#[derive(Debug)]
pub enum ConnEnd<I> {
    /// The connection is closed, or is to be dropped.
    Closed,
    /// Not this server's to serve: the connection, its bytes read so far
    /// to be read again, for hyper.
    HandOff(Rewind<I>),
}

/// What reading a head came to.
enum Read {
    Head(Box<RequestHead>),
    Preface,
    Refused(Refusal),
    /// The client closed, the head took too long, or the gateway drains.
    Closed,
}

/// The connection's halves and buffers.
struct Conn<I> {
    rd: ReadHalf<I>,
    wr: WriteHalf<I>,
    rbuf: BytesMut,
    wbuf: Vec<u8>,
    /// Where a head's fields lie, while it is parsed.
    spans: Vec<(head::Span, head::Span)>,
}

/// Serves `io` until it closes; see the module root's `serve`.
pub(super) async fn serve<I, S, B>(
    io: I,
    mut service: S,
    settings: Settings,
    mut stop: watch::Receiver<bool>,
) -> io::Result<ConnEnd<I>>
where
    I: AsyncRead + AsyncWrite + Unpin,
    S: Service<Request<RequestBody>, Response = Response<B>, Error = Infallible>,
    B: Body,
    B::Data: Buf,
{
    let (rd, wr) = tokio::io::split(io);
    let mut conn = Conn {
        rd,
        wr,
        rbuf: BytesMut::new(),
        wbuf: Vec::new(),
        spans: Vec::new(),
    };
    // One timer for the connection's life, moved for each head.
    let mut timer = pin!(tokio::time::sleep(settings.header_read));
    let mut first = true;
    loop {
        if !first {
            timer.as_mut().reset(Instant::now() + settings.header_read);
        }
        let read = conn
            .read_head(timer.as_mut(), &mut stop, settings.max_head)
            .await;
        let head = match read {
            Read::Head(h) => h,
            Read::Preface if first => return Ok(conn.hand_off(Bytes::new())),
            Read::Preface => return conn.refuse(Refusal::BadRequest("HTTP/2 preface")).await,
            Read::Refused(r) => return conn.refuse(r).await,
            Read::Closed => return Ok(ConnEnd::Closed),
        };
        first = false;
        if head.wants_upgrade {
            return Ok(conn.hand_off(head.raw.clone()));
        }
        let keep = conn.exchange(&mut service, head, &stop).await?;
        if !keep {
            let _ = conn.wr.shutdown().await;
            return Ok(ConnEnd::Closed);
        }
        if conn.rbuf.is_empty() {
            // Nothing pipelined: an idle connection holds no buffers; the
            // next head is read on the stack first (see `read_head`).
            conn.rbuf = BytesMut::new();
            conn.wbuf = Vec::new();
            conn.spans = Vec::new();
        }
    }
}

impl<I: AsyncRead + AsyncWrite + Unpin> Conn<I> {
    /// Reads until a whole head is in the buffer, within the timer.
    async fn read_head(
        &mut self,
        mut timer: Pin<&mut Sleep>,
        stop: &mut watch::Receiver<bool>,
        max_head: usize,
    ) -> Read {
        loop {
            if !self.rbuf.is_empty() {
                match head::parse_with(&mut self.rbuf, &mut self.spans) {
                    HeadRead::Head(h) => return Read::Head(h),
                    HeadRead::Preface => return Read::Preface,
                    HeadRead::Refused(r) => return Read::Refused(r),
                    HeadRead::Partial if self.rbuf.len() >= max_head => {
                        return Read::Refused(Refusal::TooLarge);
                    }
                    HeadRead::Partial => {}
                }
            }
            let stopping = *stop.borrow();
            if stopping && self.rbuf.is_empty() {
                return Read::Closed;
            }
            if self.rbuf.capacity() == 0 {
                // A connection between requests holds no buffer: the next
                // head is read on the stack and kept in one of its size.
                let mut first = [0u8; FIRST_READ];
                tokio::select! {
                    read = self.rd.read(&mut first) => match read {
                        Ok(0) | Err(_) => return Read::Closed,
                        Ok(n) => self.rbuf = BytesMut::from(&first[..n]),
                    },
                    () = timer.as_mut() => return Read::Closed,
                    changed = stop.changed(), if !stopping => {
                        if changed.is_err() {
                            return Read::Closed;
                        }
                    }
                }
                continue;
            }
            if self.rbuf.capacity() - self.rbuf.len() < 1024 {
                let room = max_head.saturating_sub(self.rbuf.len()).max(1024);
                self.rbuf.reserve(READ_CHUNK.max(self.rbuf.len()).min(room));
            }
            let idle = self.rbuf.is_empty();
            tokio::select! {
                read = self.rd.read_buf(&mut self.rbuf) => match read {
                    Ok(0) | Err(_) => return Read::Closed,
                    Ok(_) => {}
                },
                () = timer.as_mut() => return Read::Closed,
                changed = stop.changed(), if idle && !stopping => {
                    if changed.is_err() {
                        return Read::Closed;
                    }
                }
            }
        }
    }

    /// The connection, with `head` and the unread bytes to be read again.
    fn hand_off(self, head: Bytes) -> ConnEnd<I> {
        let io = self.rd.unsplit(self.wr);
        let prefix = if head.is_empty() {
            self.rbuf.freeze()
        } else {
            let mut all = BytesMut::with_capacity(head.len() + self.rbuf.len());
            all.extend_from_slice(&head);
            all.extend_from_slice(&self.rbuf);
            all.freeze()
        };
        ConnEnd::HandOff(Rewind::new(io, prefix))
    }

    /// Answers a head that cannot be read as hyper does, and closes.
    async fn refuse(mut self, why: Refusal) -> io::Result<ConnEnd<I>> {
        write::refusal(&mut self.wbuf, why.status());
        self.wr.write_all(&self.wbuf).await?;
        self.wr.flush().await?;
        let _ = self.wr.shutdown().await;
        Ok(ConnEnd::Closed)
    }

    /// One request and its answer; whether the connection goes on.
    async fn exchange<S, B>(
        &mut self,
        service: &mut S,
        head: Box<RequestHead>,
        stop: &watch::Receiver<bool>,
    ) -> io::Result<bool>
    where
        S: Service<Request<RequestBody>, Response = Response<B>, Error = Infallible>,
        B: Body,
        B::Data: Buf,
    {
        let RequestHead {
            method,
            uri,
            version,
            headers,
            framing,
            keep_alive,
            expect_continue,
            ..
        } = *head;
        let has_body = framing != BodyFraming::Length(0);
        let (body, tx, mut gate) = if has_body {
            let (b, tx, gate) = RequestBody::channel(framing, expect_continue);
            (b, Some(tx), gate)
        } else {
            (RequestBody::empty(), None, None)
        };
        let mut req = Request::new(body);
        *req.method_mut() = method.clone();
        *req.uri_mut() = uri;
        *req.version_mut() = version;
        *req.headers_mut() = headers;
        let Ok(ready) = service.ready().await;
        let mut answer = pin!(ready.call(req));
        let go = Notify::new();
        let gated = gate.is_some().then_some(&go);
        let Self {
            rd, wr, rbuf, wbuf, ..
        } = self;
        let mut reading = pin!(async move {
            match tx {
                Some(tx) => pump(rd, rbuf, framing, tx, gated).await,
                None => PumpEnd::Done,
            }
        });
        let mut read = None;
        let res = loop {
            tokio::select! {
                res = &mut answer => break res,
                end = &mut reading, if read.is_none() => read = Some(end),
                wanted = wanted(&mut gate) => {
                    gate = None;
                    if wanted {
                        wr.write_all(write::CONTINUE).await?;
                        wr.flush().await?;
                        go.notify_one();
                    }
                }
            }
        };
        let Ok(res) = res;
        let (parts, body) = res.into_parts();
        let hint = (!body.is_end_stream()).then(|| body.size_hint());
        let ex = ResponseTo {
            method: &method,
            version,
            keep_alive: keep_alive && !*stop.borrow(),
        };
        wbuf.reserve(256 + 48 * parts.headers.len());
        let (encoder, keep) = write::head(wbuf, &parts, hint, ex);
        drop(parts);
        let mut writing = pin!(send_body(wr, wbuf, body, encoder));
        let complete = loop {
            tokio::select! {
                done = &mut writing => break done?,
                end = &mut reading, if read.is_none() => read = Some(end),
            }
        };
        Ok(keep && complete && (!has_body || read == Some(PumpEnd::Done)))
    }
}

/// Whether the service asked for a body whose client waits for
/// `100 Continue`; never, without such a body.
async fn wanted(gate: &mut Option<oneshot::Receiver<()>>) -> bool {
    match gate {
        Some(g) => g.await.is_ok(),
        None => std::future::pending().await,
    }
}

/// Writes the body after a head already in `wbuf`; whether it was sent
/// whole with its framing (else the connection closes).
async fn send_body<W, B>(
    wr: &mut W,
    wbuf: &mut Vec<u8>,
    body: B,
    encoder: Encoder,
) -> io::Result<bool>
where
    W: AsyncWrite + Unpin,
    B: Body,
    B::Data: Buf,
{
    if encoder == Encoder::Length(0) {
        flush(wr, wbuf).await?;
        return Ok(true);
    }
    let mut body = pin!(body);
    let mut left = match encoder {
        Encoder::Length(n) => n,
        Encoder::Chunked | Encoder::Close => u64::MAX,
    };
    loop {
        // A body's error only ends the connection; it is not kept.
        let polled = poll_fn(|cx| Poll::Ready(next_frame(body.as_mut(), cx))).await;
        let frame = match polled {
            Poll::Ready(f) => f,
            Poll::Pending => {
                // Nothing more for now: what is buffered goes out first.
                flush(wr, wbuf).await?;
                poll_fn(|cx| next_frame(body.as_mut(), cx)).await
            }
        };
        let frame = match frame {
            Some(Ok(frame)) => frame,
            None => {
                // The end: a chunked body says it; a body of known length
                // must have come whole.
                let whole = match encoder {
                    Encoder::Chunked => {
                        wbuf.extend_from_slice(b"0\r\n\r\n");
                        true
                    }
                    Encoder::Length(_) => left == 0,
                    Encoder::Close => false,
                };
                flush(wr, wbuf).await?;
                return Ok(whole);
            }
            // A failed body ends the connection, its framing unfinished.
            Some(Err(_)) => {
                flush(wr, wbuf).await?;
                return Ok(false);
            }
        };
        let Ok(mut data) = frame.into_data() else {
            // Trailers are not sent to HTTP/1.1 clients.
            continue;
        };
        let len = data.remaining();
        if len as u64 > left {
            return Ok(false);
        }
        left -= len as u64;
        if encoder == Encoder::Chunked && len > 0 {
            write::chunk_size(wbuf, len);
        }
        if len >= COPY_LIMIT {
            flush(wr, wbuf).await?;
            wr.write_all_buf(&mut data).await?;
        } else {
            while data.has_remaining() {
                let c = data.chunk();
                wbuf.extend_from_slice(c);
                let n = c.len();
                data.advance(n);
            }
        }
        if encoder == Encoder::Chunked && len > 0 {
            wbuf.extend_from_slice(b"\r\n");
        }
        if let Encoder::Length(_) = encoder
            && left == 0
        {
            flush(wr, wbuf).await?;
            return Ok(true);
        }
        if wbuf.len() >= FLUSH_AT {
            flush(wr, wbuf).await?;
        }
    }
}

/// The body's next frame, its error dropped.
fn next_frame<B: Body>(
    body: Pin<&mut B>,
    cx: &mut std::task::Context<'_>,
) -> Poll<Option<Result<http_body::Frame<B::Data>, ()>>> {
    body.poll_frame(cx).map(|f| f.map(|r| r.map_err(drop)))
}

/// Sends what the write buffer holds.
async fn flush<W: AsyncWrite + Unpin>(wr: &mut W, wbuf: &mut Vec<u8>) -> io::Result<()> {
    if !wbuf.is_empty() {
        wr.write_all(wbuf).await?;
        wbuf.clear();
    }
    wr.flush().await
}
