//! One client connection served: heads read, requests handed to the
//! service in order, bodies read while the service runs, answers written
//! in order, until the connection closes or is handed to hyper.
//!
//! The connection task owns its stream; the request body's reader and the
//! answer's writer share it through a mutex that each locks only inside
//! one poll (one task polls both, so it is never contended). Between
//! requests the task holds no buffer: they go back to the thread's
//! [`spare`](super::spare)s. The exchange's state, the service's future
//! among it, stays in the task: boxing it per request would copy all of
//! it into the box each time.

use std::convert::Infallible;
use std::future::{Future, poll_fn};
use std::io;
use std::pin::{Pin, pin};
use std::sync::{Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use http::{Request, Response};
use http_body::Body;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{Notify, oneshot, watch};
use tokio::time::{Instant, Sleep};
use tower::Service;

use super::body::{PumpEnd, READ_CHUNK, RequestBody, pump};
use super::head::{self, BodyFraming, HeadRead, Refusal, RequestHead};
use super::locked::{Locked, gone, inner};
use super::rewind::Rewind;
use super::spare;
use super::text_fields::TextFields;
use super::write::{self, Encoder, ResponseTo};

/// Data frames at least this large are written from their own buffer
/// instead of being copied into the write buffer.
const COPY_LIMIT: usize = 16 * 1024;
/// The write buffer is sent once it holds this much.
const FLUSH_AT: usize = 64 * 1024;

/// What a connection is held to.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// Time for a whole head, from when the connection waits for it
    /// (`timeouts.header_read`).
    pub header_read: Duration,
    /// Time a connection may wait for the first byte of a head
    /// (`timeouts.idle`; the shorter of the two applies).
    pub idle: Duration,
    /// The largest head read; larger is answered 431 (hyper's read buffer
    /// bound: `server.max_header_size` plus the listener's slack).
    pub max_head: usize,
    /// Whether a connection idle past [`LINGER`] ends its serving with
    /// [`ConnEnd::Idle`], to be parked, rather than wait on (a stream that
    /// cannot wait unbuffered waits on regardless).
    pub parks: bool,
}

/// A stream the server can wait on for bytes without a buffer to read
/// them into.
pub trait Transport: AsyncRead + AsyncWrite + Unpin {
    /// Whether [`Transport::poll_read_ready`] tells. A stream that cannot
    /// (TLS, whose records may already hold plaintext) waits in a read,
    /// with a buffer.
    const WAITS_UNBUFFERED: bool = false;

    /// Ready once a read may find bytes (or the end).
    fn poll_read_ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let _ = cx;
        Poll::Ready(Ok(()))
    }

    /// The plain socket, for a connection parked while idle; `None` for a
    /// stream that does not wait unbuffered.
    fn into_socket(self) -> Option<tokio::net::TcpStream>
    where
        Self: Sized,
    {
        None
    }
}

impl Transport for tokio::net::TcpStream {
    const WAITS_UNBUFFERED: bool = true;

    fn poll_read_ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        tokio::net::TcpStream::poll_read_ready(self, cx)
    }

    fn into_socket(self) -> Option<tokio::net::TcpStream> {
        Some(self)
    }
}

impl<I: AsyncRead + AsyncWrite + Unpin> Transport for tokio_rustls::server::TlsStream<I> {}

/// How serving a connection ended.
#[derive(Debug)]
pub enum ConnEnd<I> {
    /// The connection is closed, or is to be dropped.
    Closed,
    /// Not this server's to serve: the connection, its bytes read so far
    /// to be read again, for hyper.
    HandOff(Rewind<I>),
    /// Idle past [`LINGER`] (under [`Settings::parks`]): the connection,
    /// nothing unread, and when it began to wait for its next head, to be
    /// served again from there ([`serve`]'s `idle_since`) once readable.
    Idle(I, Instant),
}

/// What reading a head came to.
// Unboxed for the reason `HeadRead` is.
#[allow(clippy::large_enum_variant)]
enum Read {
    Head(RequestHead),
    Preface,
    Refused(Refusal),
    /// The client closed, the head took too long, or the gateway drains.
    Closed,
    /// No byte within [`LINGER`] of the wait that began then: the
    /// connection is idle.
    Idle(Instant),
}

/// How long a connection waits for its next head with the state of its
/// requests still allocated: a client that sends its requests one after
/// another on a fast network sends the next within it, and the
/// allocation serves it too.
pub(super) const LINGER: Duration = Duration::from_millis(10);

/// Which wait for a head this is, for its deadline.
#[derive(Clone, Copy)]
enum Wait {
    /// The connection's first: the timer is set already.
    First,
    /// The next head, from now, first within [`LINGER`].
    Next,
    /// The rest of a wait that began then and lingered.
    Rest(Instant),
    /// The rest of a wait that began then, on a connection served again
    /// after it was parked: first within [`LINGER`] from now.
    Resumed(Instant),
}

impl Wait {
    /// Sets `timer` for the wait's first byte, due `to_first_byte` after it
    /// began; when it began, and whether the timer ends a linger first.
    fn begin(self, mut timer: Pin<&mut Sleep>, to_first_byte: Duration) -> (Instant, bool) {
        match self {
            Wait::First => (Instant::now(), false),
            Wait::Next => {
                let now = Instant::now();
                let lingers = LINGER < to_first_byte;
                timer
                    .as_mut()
                    .reset(now + if lingers { LINGER } else { to_first_byte });
                (now, lingers)
            }
            Wait::Rest(since) => {
                timer.as_mut().reset(since + to_first_byte);
                (since, false)
            }
            Wait::Resumed(since) => {
                let due = since + to_first_byte;
                let linger = Instant::now() + LINGER;
                let lingers = linger < due;
                timer.as_mut().reset(if lingers { linger } else { due });
                (since, lingers)
            }
        }
    }
}

/// How a run of requests one after another ended.
// Unboxed for the reason `HeadRead` is.
#[allow(clippy::large_enum_variant)]
enum After {
    /// The connection waits, idle, for its next head.
    Idle(Instant),
    /// An answer ended the connection.
    Close,
    /// A head that is not served here, or none.
    Read(Read),
}

/// The connection's stream and buffers.
struct Conn<I> {
    io: Mutex<I>,
    /// Empty, without room, between requests.
    rbuf: BytesMut,
    /// Empty, without room, between requests.
    wbuf: Vec<u8>,
}

/// Serves `io` until it closes or parks; see the module root's `serve`.
///
/// What the connection keeps for its life is made here and captured by
/// the future, which uses it in place: an `async fn` would keep its
/// arguments twice, once as received and once as the locals they are
/// moved into.
#[allow(clippy::manual_async_fn)]
pub(super) fn serve<I, S, B>(
    io: I,
    mut service: S,
    settings: Settings,
    stop: watch::Receiver<bool>,
    idle_since: Option<Instant>,
) -> impl Future<Output = io::Result<ConnEnd<I>>>
where
    I: Transport,
    S: Service<Request<RequestBody>, Response = Response<B>, Error = Infallible>,
    B: Body + TextFields,
    B::Data: Buf,
{
    let mut conn = Conn {
        io: Mutex::new(io),
        rbuf: BytesMut::new(),
        wbuf: Vec::new(),
    };
    async move {
        // One timer for the connection's life, moved for each head.
        let mut timer = pin!(tokio::time::sleep(settings.idle.min(settings.header_read)));
        // One wait for the drain for the connection's life, heard only while
        // the connection waits for a head.
        let mut drain = pin!(drained(stop.clone()));
        let mut wait = idle_since.map_or(Wait::First, Wait::Resumed);
        let parks = settings.parks && I::WAITS_UNBUFFERED;
        loop {
            let mut read = conn
                .read_head(timer.as_mut(), drain.as_mut(), &stop, &settings, wait)
                .await;
            loop {
                let head = match read {
                    Read::Head(h) if !h.wants_upgrade => h,
                    Read::Head(h) => return Ok(conn.hand_off(h.raw.clone())),
                    Read::Preface if matches!(wait, Wait::First) => {
                        return Ok(conn.hand_off(Bytes::new()));
                    }
                    // Boxed: the task is not sized for a refusal's writing.
                    Read::Preface => {
                        return Box::pin(conn.refuse(Refusal::BadRequest("HTTP/2 preface"))).await;
                    }
                    Read::Refused(r) => return Box::pin(conn.refuse(r)).await,
                    Read::Closed => return Ok(ConnEnd::Closed),
                    Read::Idle(since) if parks => return Ok(conn.park(since)),
                    Read::Idle(since) => {
                        wait = Wait::Rest(since);
                        break;
                    }
                };
                wait = Wait::Next;
                // Boxed for as long as requests come one after another, so
                // that a connection waiting, idle, for its next head keeps
                // none of their state (the service's future among it). The
                // box is allocated before what it holds is made, so that
                // that is made in it: made first and then boxed, all of it
                // would be copied.
                let run = Box::into_pin(Box::write(
                    Box::new_uninit(),
                    conn.run(
                        &mut service,
                        head,
                        &stop,
                        timer.as_mut(),
                        drain.as_mut(),
                        &settings,
                    ),
                ));
                match run.await? {
                    After::Idle(since) if parks => return Ok(conn.park(since)),
                    After::Idle(since) => {
                        wait = Wait::Rest(since);
                        break;
                    }
                    After::Close => {
                        let _ = inner(&mut conn.io).shutdown().await;
                        return Ok(ConnEnd::Closed);
                    }
                    After::Read(next) => read = next,
                }
            }
        }
    }
}

/// Completes once the gateway drains, or once the drain's sender is gone
/// and no drain can come. One such future lives as long as its
/// connection, so its waiter is registered with the channel once, not at
/// every wait for a head.
#[allow(clippy::manual_async_fn)]
fn drained(mut stop: watch::Receiver<bool>) -> impl Future<Output = ()> {
    async move {
        let _ = stop.wait_for(|stopping| *stopping).await;
    }
}

impl<I: Transport> Conn<I> {
    /// Gives the buffers back when nothing pipelined waits in them.
    fn rest(&mut self) {
        if self.rbuf.is_empty() {
            spare::give_read(std::mem::take(&mut self.rbuf));
        }
        spare::give_write(std::mem::take(&mut self.wbuf));
    }

    /// Serves `head` and the requests that follow it within [`LINGER`] of
    /// each answer, until the connection goes idle or ends.
    #[allow(clippy::too_many_arguments)]
    async fn run<S, B>(
        &mut self,
        service: &mut S,
        mut head: RequestHead,
        stop: &watch::Receiver<bool>,
        mut timer: Pin<&mut Sleep>,
        mut drain: Pin<&mut impl Future<Output = ()>>,
        settings: &Settings,
    ) -> io::Result<After>
    where
        S: Service<Request<RequestBody>, Response = Response<B>, Error = Infallible>,
        B: Body + TextFields,
        B::Data: Buf,
    {
        loop {
            // Made where it is kept, and never moved: a move copies all of
            // it.
            let keep = pin!(self.exchange(service, head, stop)).await?;
            if !keep {
                return Ok(After::Close);
            }
            self.rest();
            let read = self
                .read_head(timer.as_mut(), drain.as_mut(), stop, settings, Wait::Next)
                .await;
            head = match read {
                Read::Head(h) if !h.wants_upgrade => h,
                Read::Idle(since) => return Ok(After::Idle(since)),
                other => return Ok(After::Read(other)),
            };
        }
    }

    /// Reads until a whole head is in the buffer, within the timer: the
    /// first byte within the shorter of `idle` and `header_read`, the
    /// whole head within `header_read`.
    ///
    /// A future that captures its arguments rather than an `async fn`,
    /// which would keep them twice.
    #[allow(clippy::manual_async_fn)]
    fn read_head<'a>(
        &'a mut self,
        mut timer: Pin<&'a mut Sleep>,
        mut drain: Pin<&'a mut impl Future<Output = ()>>,
        stop: &'a watch::Receiver<bool>,
        settings: &'a Settings,
        wait: Wait,
    ) -> impl Future<Output = Read> + 'a {
        async move {
            let to_first_byte = settings.idle.min(settings.header_read);
            let (began, lingers) = wait.begin(timer.as_mut(), to_first_byte);
            // Until the first byte, the timer firing in a wait that lingers
            // ends the linger (the connection is idle); else it ends the
            // wait.
            let mut started = false;
            loop {
                if !self.rbuf.is_empty() {
                    match head::parse(&mut self.rbuf) {
                        HeadRead::Head(h) => return Read::Head(h),
                        HeadRead::Preface => return Read::Preface,
                        HeadRead::Refused(r) => return Read::Refused(r),
                        HeadRead::Partial if self.rbuf.len() >= settings.max_head => {
                            return Read::Refused(Refusal::TooLarge);
                        }
                        HeadRead::Partial => {}
                    }
                    if !started && (lingers || to_first_byte < settings.header_read) {
                        timer.as_mut().reset(began + settings.header_read);
                    }
                    started = true;
                }
                let stopping = *stop.borrow();
                if stopping && self.rbuf.is_empty() {
                    return Read::Closed;
                }
                if self.rbuf.capacity() == 0 {
                    if !I::WAITS_UNBUFFERED {
                        self.rbuf = spare::read_buffer();
                        continue;
                    }
                    // No buffer until there are bytes to read into it.
                    let io = inner(&mut self.io);
                    tokio::select! {
                        biased;
                        ready = poll_fn(|cx| io.poll_read_ready(cx)) => {
                            if ready.is_err() {
                                return Read::Closed;
                            }
                        }
                        () = timer.as_mut() => {
                            return if lingers && !started { Read::Idle(began) } else { Read::Closed };
                        }
                        () = drain.as_mut(), if !stopping => return Read::Closed,
                    }
                    // One read, with a buffer: the readiness may be left over
                    // from the last request's read, and then the read finds
                    // nothing, clears it, and the buffer goes back.
                    let mut buf = spare::read_buffer();
                    let read = {
                        let mut read = pin!(io.read_buf(&mut buf));
                        poll_fn(|cx| Poll::Ready(read.as_mut().poll(cx))).await
                    };
                    match read {
                        Poll::Ready(Ok(0) | Err(_)) => return Read::Closed,
                        Poll::Ready(Ok(_)) => self.rbuf = buf,
                        Poll::Pending => spare::give_read(buf),
                    }
                    continue;
                }
                if self.rbuf.capacity() - self.rbuf.len() < 1024 {
                    let room = settings.max_head.saturating_sub(self.rbuf.len()).max(1024);
                    self.rbuf.reserve(READ_CHUNK.max(self.rbuf.len()).min(room));
                }
                let idle = self.rbuf.is_empty();
                let io = inner(&mut self.io);
                tokio::select! {
                    biased;
                    read = io.read_buf(&mut self.rbuf) => match read {
                        Ok(0) | Err(_) => return Read::Closed,
                        Ok(_) => {}
                    },
                    () = timer.as_mut() => {
                        return if lingers && !started { Read::Idle(began) } else { Read::Closed };
                    }
                    () = drain.as_mut(), if idle && !stopping => return Read::Closed,
                }
            }
        }
    }

    /// The connection, with `head` and the unread bytes to be read again.
    fn hand_off(self, head: Bytes) -> ConnEnd<I> {
        let io = self.io.into_inner().unwrap_or_else(PoisonError::into_inner);
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

    /// The connection, idle since `since`, to be parked: its buffers go
    /// back (nothing is unread in them).
    fn park(mut self, since: Instant) -> ConnEnd<I> {
        self.rest();
        ConnEnd::Idle(
            self.io.into_inner().unwrap_or_else(PoisonError::into_inner),
            since,
        )
    }

    /// Answers a head that cannot be read as hyper does, and closes.
    async fn refuse(mut self, why: Refusal) -> io::Result<ConnEnd<I>> {
        write::refusal(&mut self.wbuf, why.status());
        let io = inner(&mut self.io);
        io.write_all(&self.wbuf).await?;
        io.flush().await?;
        let _ = io.shutdown().await;
        Ok(ConnEnd::Closed)
    }

    /// One request and its answer; whether the connection goes on.
    async fn exchange<S, B>(
        &mut self,
        service: &mut S,
        head: RequestHead,
        stop: &watch::Receiver<bool>,
    ) -> io::Result<bool>
    where
        S: Service<Request<RequestBody>, Response = Response<B>, Error = Infallible>,
        B: Body + TextFields,
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
        } = head;
        let to = |keep_alive: bool| ResponseTo {
            method: &method,
            version,
            keep_alive: keep_alive && !*stop.borrow(),
        };
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
        let Ok(()) = poll_fn(|cx| service.poll_ready(cx)).await;
        // Made where it is kept, and never moved: a move copies all of it.
        let mut answer = pin!(service.call(req));
        let Some(tx) = tx else {
            // No body to read alongside: the answer, then its writing,
            // while a read watches for the client leaving (hyper's server
            // does the same), which drops the exchange and with it what
            // the request holds (a concurrency slot, a place in a delay).
            let Self { io, rbuf, wbuf } = self;
            let mut rd = Locked(&*io);
            let mut left = pin!(gone(&mut rd, rbuf));
            let res = tokio::select! {
                biased;
                res = &mut answer => res,
                () = &mut left => return Ok(false),
            };
            let Ok(res) = res;
            let (body, encoder, keep) = response_head(wbuf, res, to(keep_alive));
            let mut wr = Locked(&*io);
            let complete = tokio::select! {
                biased;
                complete = send_body(&mut wr, wbuf, body, encoder) => complete?,
                () = &mut left => return Ok(false),
            };
            return Ok(keep && complete);
        };
        let go = Notify::new();
        let gated = gate.is_some().then_some(&go);
        let Self { io, rbuf, wbuf } = self;
        let mut rd = Locked(&*io);
        let mut wr = Locked(&*io);
        let mut reading = pin!(pump(&mut rd, rbuf, framing, tx, gated));
        let mut read = None;
        let res = loop {
            tokio::select! {
                biased;
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
        let (body, encoder, keep) = response_head(wbuf, res, to(keep_alive));
        let mut writing = pin!(send_body(&mut wr, wbuf, body, encoder));
        let complete = loop {
            tokio::select! {
                biased;
                complete = &mut writing => break complete?,
                end = &mut reading, if read.is_none() => read = Some(end),
            }
        };
        Ok(keep && complete && read == Some(PumpEnd::Done))
    }
}

/// Writes the head of `res` into `wbuf`: its body, how to frame it, and
/// whether the connection may go on once it is sent. Not a future of its
/// own: the response is taken apart where it was received, not moved
/// into one first.
fn response_head<B>(wbuf: &mut Vec<u8>, res: Response<B>, to: ResponseTo<'_>) -> (B, Encoder, bool)
where
    B: Body + TextFields,
{
    let (parts, body) = res.into_parts();
    let hint = (!body.is_end_stream()).then(|| body.size_hint());
    if wbuf.capacity() == 0 {
        *wbuf = spare::write_buffer();
    }
    wbuf.reserve(256 + 48 * parts.headers.len());
    let (encoder, keep) = write::head(wbuf, &parts, hint, (body.late(), body.passed()), to);
    // Written: the map goes back to the thread, for the next head read or
    // answer made there.
    spare::give_map(parts.headers);
    (body, encoder, keep)
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
