//! Accepting and serving client connections: the connection cap, TLS
//! termination, the idle timeout, and the HTTP settings that bound what one
//! client can make the gateway hold.
//!
//! The gateway faces the clients it throttles, which are exactly the ones
//! that misbehave, so every resource a connection takes is bounded:
//!
//! - **connections**: a semaphore permit is taken *before* `accept`, so at
//!   `server.max_connections` the gateway stops accepting and further
//!   clients wait in the kernel's backlog (`server.backlog`, see [`bind`])
//!   instead of each costing a task;
//! - **header block**: `timeouts.header_read` (slowloris), enforced by
//!   hyper, and `server.max_header_size` (431, RFC 6585 §5), enforced by
//!   the [`guard`](crate::guard) so the answer carries a problem+json body,
//!   with hyper's own bound [`HEAD_SLACK`] above it;
//! - **TLS handshake**: bounded by `timeouts.header_read` too, since a
//!   handshake that never completes is the TLS form of slowloris;
//! - **idle**: a connection with no request in flight and no byte moving
//!   for `timeouts.idle` is closed (RFC 9112 §9.5 lets a server close idle
//!   keep-alive connections at any time). Requests waiting on a slow
//!   upstream are not idle; a response body that stops moving is. For
//!   HTTP/1.1 hyper's header-read clock also runs while a keep-alive
//!   connection waits for its next head, so there the shorter of the two
//!   applies; `idle` is what bounds HTTP/2 connections and stalled bodies.
//!   Under `server.http1: native` a plain-text keep-alive connection idle
//!   past a 10 ms linger is parked without a task ([`http1::park`], one
//!   parker per listener), which closes it between that timeout and an
//!   eighth of it later, and at once when the drain begins.
//!
//! Listener settings are read once when serving starts; the TLS settings of
//! each listener are read from the current configuration at every
//! handshake, so a reload that re-reads the certificate files takes effect
//! for new connections.

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tower::Service;
use tracing::{debug, warn};

use crate::config::{Http1, ServerSettings, Timeouts};
use crate::http1::park::{self, Park, Parked};
use crate::http1::{self, RequestBody};
use crate::pipeline::Gateway;
use crate::proxy::ClientBody;
use crate::proxy::io::{Observed, Observer};

/// How far hyper's own bound on a request head (the HTTP/1.1 read buffer,
/// the HTTP/2 `SETTINGS_MAX_HEADER_LIST_SIZE`) lies above
/// `server.max_header_size`. A head between the two reaches the
/// [`guard`](crate::guard), which answers 431 with a problem+json body; past
/// the larger bound hyper stops reading and answers 431 with an empty body.
/// 16 KiB covers a header that is somewhat too large — a grown cookie, a
/// token with more claims — while a connection can still make hyper buffer
/// no more than the cap plus 16 KiB.
pub const HEAD_SLACK: usize = 16 * 1024;

/// Binds a listening socket on `addr` with an accept queue of `backlog`
/// connections (`server.backlog`).
///
/// `std` and tokio's `TcpListener::bind` always ask for 128. This does what
/// they do otherwise — `SO_REUSEADDR` on Unix, so a restarted gateway can
/// bind while old connections sit in `TIME_WAIT` — and passes `backlog` to
/// `listen(2)`. The kernel silently caps it at `net.core.somaxconn` on
/// Linux (`kern.ipc.somaxconn` on the BSDs and macOS). Must be called
/// inside a Tokio runtime.
///
/// # Errors
/// The socket cannot be created, bound or put in the listening state.
pub fn bind(addr: SocketAddr, backlog: u32) -> io::Result<TcpListener> {
    socket_for(addr)?.listen(backlog)
}

/// A socket for `addr`, set up as `std` sets up a listener, not yet bound
/// to listen.
fn socket_for(addr: SocketAddr) -> io::Result<TcpSocket> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    // Windows' SO_REUSEADDR lets another process take a port in use, so
    // std leaves it off there; so does this.
    #[cfg(not(windows))]
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    Ok(socket)
}

/// What every connection of every listener shares.
pub struct Shared {
    builder: auto::Builder<TokioExecutor>,
    permits: Arc<Semaphore>,
    idle: Duration,
    handshake: Duration,
    /// The native HTTP/1.1 server's settings, when `server.http1` selects it.
    native: Option<http1::Settings>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("permits", &self.permits.available_permits())
            .field("idle", &self.idle)
            .finish_non_exhaustive()
    }
}

impl Shared {
    /// Connection settings from the configuration's caps and timeouts.
    pub fn new(settings: &ServerSettings, timeouts: &Timeouts) -> Self {
        // hyper's bound on a head, above the cap the guard enforces.
        let head_limit = settings.max_header_size.saturating_add(HEAD_SLACK);
        let mut builder = auto::Builder::new(TokioExecutor::new());
        builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(timeouts.header_read)
            // The read buffer bounds the header block: a head that does not
            // fit is answered 431 by hyper. hyper asserts a buffer of at
            // least 8 KiB, which `HEAD_SLACK` alone exceeds.
            .max_buf_size(head_limit)
            .keep_alive(true);
        builder
            .http2()
            .timer(TokioTimer::new())
            .max_header_list_size(u32::try_from(head_limit).unwrap_or(u32::MAX));
        Self {
            builder,
            permits: Arc::new(Semaphore::new(
                settings.max_connections.clamp(1, Semaphore::MAX_PERMITS),
            )),
            idle: timeouts.idle,
            handshake: timeouts.header_read,
            native: (settings.http1 == Http1::Native).then_some(http1::Settings {
                header_read: timeouts.header_read,
                idle: timeouts.idle,
                max_head: head_limit,
                parks: true,
            }),
        }
    }
}

/// The TLS settings of a listener now (read at every handshake, so a
/// reload that renews certificates applies to new connections); `None`
/// serves it in plain text.
pub type TlsNow = Arc<dyn Fn() -> Option<Arc<tokio_rustls::rustls::ServerConfig>> + Send + Sync>;

/// A request body a connection's service takes: hyper's (`Incoming`) or
/// the native HTTP/1.1 server's ([`RequestBody`]).
pub trait ServedBody:
    Into<ClientBody>
    + http_body::Body<Data = bytes::Bytes, Error: Into<Box<dyn std::error::Error + Send + Sync>>>
    + Send
    + 'static
{
}

impl<B> ServedBody for B where
    B: Into<ClientBody>
        + http_body::Body<Data = bytes::Bytes, Error: Into<Box<dyn std::error::Error + Send + Sync>>>
        + Send
        + 'static
{
}

/// What a listener serves: one tower service per connection, built when
/// the connection is accepted from its peer's address and whether it came
/// over TLS (the proxy's [`Gateway::connection`], the admin listener's
/// service). The service never fails and is always ready: the loop calls
/// it without `poll_ready`, on a clone per request (a handle's worth, no
/// allocation).
pub trait Served: Send + Sync + 'static {
    /// The body of its answers.
    type Body: http_body::Body<Data: Send, Error: Into<Box<dyn std::error::Error + Send + Sync>>>
        + crate::http1::text_fields::TextFields
        + Send
        + 'static;

    /// The service of the connection from `peer`, `secure` when over TLS,
    /// for requests whose bodies are `B`: hyper's (`Incoming`) or the
    /// native HTTP/1.1 server's ([`RequestBody`]).
    fn connection<B>(
        &self,
        peer: SocketAddr,
        secure: bool,
    ) -> impl Service<
        Request<B>,
        Response = Response<Self::Body>,
        Error = Infallible,
        Future: Send + 'static,
    > + Clone
    + Send
    + 'static
    where
        B: ServedBody;
}

impl Served for Gateway {
    type Body = crate::proxy::Body;

    fn connection<B>(
        &self,
        peer: SocketAddr,
        secure: bool,
    ) -> impl Service<
        Request<B>,
        Response = Response<Self::Body>,
        Error = Infallible,
        Future: Send + 'static,
    > + Clone
    + Send
    + 'static
    where
        B: ServedBody,
    {
        Gateway::connection(self, peer, secure)
    }
}

/// Accepts on `listener` until `stop` changes, serving each connection on
/// its own task under a watcher of `graceful`, which the caller drains
/// once every accept loop has ended, with the service `serve` makes for
/// it. The loop knows nothing of routes and limits.
pub async fn accept_loop<S: Served>(
    listener: TcpListener,
    serve: Arc<S>,
    tls: TlsNow,
    shared: Arc<Shared>,
    graceful: Arc<GracefulShutdown>,
    mut stop: watch::Receiver<bool>,
) {
    let (park, parker) = match shared.native {
        Some(settings) => {
            let (park, parker) = parker(&serve, &shared, &graceful, &stop, settings);
            (Some(park), Some(tokio::spawn(parker)))
        }
        None => (None, None),
    };
    loop {
        let permit = tokio::select! {
            _ = stop.changed() => break,
            permit = shared.permits.clone().acquire_owned() => match permit {
                Ok(p) => p,
                Err(_) => break,
            },
        };
        let (stream, peer) = tokio::select! {
            _ = stop.changed() => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let conn = Conn {
            peer,
            watcher: graceful.watcher(),
            permit,
        };
        let (serve, shared, stop) = (serve.clone(), shared.clone(), stop.clone());
        match tls() {
            None => {
                let park = park.clone();
                tokio::spawn(conn.serve(stream, serve, false, false, shared, stop, None, park));
            }
            // Boxed: a plain-text connection's task is not sized for a TLS
            // stream and its handshake.
            Some(tls) => {
                tokio::spawn(Box::pin(conn.serve_tls(tls, stream, serve, shared, stop)));
            }
        }
    }
    // The parker ends as the drain begins, closing what it holds; the
    // drain starts once it has.
    drop(park);
    if let Some(parker) = parker {
        let _ = parker.await;
    }
}

/// The parker of a listener's idle plain-text connections under the
/// native HTTP/1.1 server: each that becomes readable is served again on
/// a task of its own, from when it went idle; each idle for the shorter of
/// `timeouts.idle` and `timeouts.header_read` is closed, an eighth of
/// that late at most ([`park`]); all are closed when `stop` turns true.
///
/// A parked connection keeps its socket, when it went idle and its
/// permit; its peer's address is asked of the socket again, and a watcher
/// of the drain made again, when it is served again. The drain needs no
/// watcher of a parked connection: the parker closes those as it begins,
/// and the accept loop waits for the parker to end.
fn parker<S: Served>(
    serve: &Arc<S>,
    shared: &Arc<Shared>,
    graceful: &Arc<GracefulShutdown>,
    stop: &watch::Receiver<bool>,
    settings: http1::Settings,
) -> (
    Park<OwnedSemaphorePermit>,
    impl Future<Output = ()> + Send + 'static,
) {
    let (serve, shared, graceful) = (serve.clone(), shared.clone(), graceful.clone());
    let stop_ = stop.clone();
    let wake = move |parked: Parked<OwnedSemaphorePermit>, park: &Park<OwnedSemaphorePermit>| {
        let Parked {
            stream,
            since,
            with: permit,
        } = parked;
        // A socket whose peer is gone is closed.
        let Ok(peer) = stream.peer_addr() else {
            return;
        };
        let conn = Conn {
            peer,
            watcher: graceful.watcher(),
            permit,
        };
        let (serve, shared, stop) = (serve.clone(), shared.clone(), stop_.clone());
        let park = Some(park.clone());
        tokio::spawn(conn.serve(stream, serve, false, false, shared, stop, Some(since), park));
    };
    let timeout = settings.idle.min(settings.header_read);
    let (park, parker) = park::parker(timeout, stop.clone(), wake);
    (park, parker.run())
}

/// One accepted connection and what it holds while it is served.
struct Conn {
    peer: SocketAddr,
    /// Held until the connection ends, so that the drain waits for it;
    /// hyper's connections also hear the drain through it.
    watcher: Watcher,
    /// Released when the connection ends.
    permit: OwnedSemaphorePermit,
}

impl Conn {
    /// Serves `stream` over TLS once its handshake is done within the
    /// handshake timeout.
    async fn serve_tls<S: Served>(
        self,
        tls: Arc<tokio_rustls::rustls::ServerConfig>,
        stream: TcpStream,
        serve: Arc<S>,
        shared: Arc<Shared>,
        stop: watch::Receiver<bool>,
    ) {
        let peer = self.peer;
        let acceptor = tokio_rustls::TlsAcceptor::from(tls);
        match tokio::time::timeout(shared.handshake, acceptor.accept(stream)).await {
            Ok(Ok(stream)) => {
                // ALPN's choice: h2 is hyper's to serve.
                let h2 = stream.get_ref().1.alpn_protocol() == Some(b"h2");
                self.serve(stream, serve, true, h2, shared, stop, None, None)
                    .await;
            }
            Ok(Err(e)) => debug!(%peer, error = %e, "TLS handshake failed"),
            Err(_) => debug!(%peer, "TLS handshake timed out"),
        }
    }

    /// Serves the connection with the service `serve` makes for it until it
    /// ends, goes idle, or the drain (`stop`, and `graceful` for hyper's
    /// connections) ends it: over the native HTTP/1.1 server when
    /// `server.http1` selects it and ALPN did not choose `h2` (`h2`),
    /// handing to hyper what that server hands back.
    ///
    /// The native server keeps its own deadlines (`Settings::idle`,
    /// `Settings::header_read`) and calls the connection's service in
    /// place; hyper's connections are watched for idleness here. hyper's
    /// connection state is boxed, so that a native connection's task is
    /// not sized for it; the native server's is the task's own (it keeps
    /// no request's state while the connection waits). This is a future
    /// that captures its arguments rather than an `async fn`, which would
    /// keep them twice.
    ///
    /// A native connection that goes idle is handed to `park`, when there
    /// is one, and the task ends; `idle_since` serves such a connection
    /// again, idle since then.
    #[allow(clippy::manual_async_fn, clippy::too_many_arguments)]
    fn serve<I, S>(
        self,
        io: I,
        serve: Arc<S>,
        secure: bool,
        h2: bool,
        shared: Arc<Shared>,
        stop: watch::Receiver<bool>,
        idle_since: Option<tokio::time::Instant>,
        park: Option<Park<OwnedSemaphorePermit>>,
    ) -> impl Future<Output = ()> + Send + 'static
    where
        I: http1::Transport + Send + 'static,
        S: Served,
    {
        async move {
            let peer = self.peer;
            let Some(settings) = shared.native.filter(|_| !h2) else {
                let service = serve.connection::<Incoming>(peer, secure);
                return Box::pin(self.serve_hyper(io, service, &shared)).await;
            };
            // Made in place and awaited through the pin: moved, all of it
            // would be copied.
            let service = serve.connection::<RequestBody>(peer, secure);
            let native = pin!(http1::serve(io, service, settings, stop, idle_since));
            match native.await {
                Ok(http1::ConnEnd::HandOff(io)) => {
                    let service = serve.connection::<Incoming>(peer, secure);
                    Box::pin(self.serve_hyper(io, service, &shared)).await;
                }
                Ok(http1::ConnEnd::Idle(io, since)) => {
                    if let (Some(stream), Some(park)) = (io.into_socket(), park) {
                        park.park(Parked {
                            stream,
                            since,
                            with: self.permit,
                        });
                    }
                }
                Ok(http1::ConnEnd::Closed) => {}
                Err(e) => debug!(%peer, error = %e, "connection ended with an error"),
            }
        }
    }

    /// Serves the connection with hyper (HTTP/2, upgrades, and HTTP/1.1
    /// under `server.http1: hyper`).
    async fn serve_hyper<I, S, B>(self, io: I, service: S, shared: &Shared)
    where
        I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
        S: Service<Request<Incoming>, Response = Response<B>, Error = Infallible>
            + Clone
            + Send
            + 'static,
        S::Future: Send + 'static,
        B: http_body::Body + Send + 'static,
        B::Data: Send,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let Self {
            peer,
            watcher,
            permit,
            ..
        } = self;
        let activity = Arc::new(Activity::new());
        let io = Observed {
            inner: io,
            observer: activity.clone(),
        };
        let in_flight = activity.clone();
        // hyper calls by `&self`, tower by `&mut self`: a clone per
        // request. The service is always ready (see `Served`). It is called
        // inside the block and pinned there, so its future is made where it
        // is kept, not moved there.
        let service = hyper::service::service_fn(move |req: Request<Incoming>| {
            let guard = InFlight::begin(in_flight.clone());
            let mut service = service.clone();
            async move {
                let res = std::pin::pin!(service.call(req)).await;
                drop(guard);
                res
            }
        });
        let conn = shared
            .builder
            .serve_connection_with_upgrades(TokioIo::new(io), service)
            .into_owned();
        let conn = watcher.watch(conn);
        tokio::select! {
            ended = conn => {
                if let Err(e) = ended {
                    debug!(%peer, error = %e, "connection ended with an error");
                }
            }
            () = activity.idle(shared.idle) => debug!(%peer, "closing idle connection"),
        }
        drop(permit);
    }
}

/// Whether a connection moved a byte lately, and how many of its requests
/// are being handled.
///
/// The reads and writes only count (`moved`): no clock is read on the
/// request path. The idle watch looks at the count every eighth of the
/// idle timeout, so a connection is closed between `idle` and `idle × 9/8`
/// after its last byte.
#[derive(Debug)]
struct Activity {
    /// Reads, writes and requests ended so far.
    moved: AtomicU64,
    in_flight: AtomicUsize,
}

impl Activity {
    fn new() -> Self {
        Self {
            moved: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
        }
    }

    fn touch(&self) {
        self.moved.fetch_add(1, Ordering::Relaxed);
    }

    /// Completes once the connection has been idle for `limit`: nothing in
    /// flight and no byte moved at eight looks in a row, `limit / 8` apart.
    async fn idle(&self, limit: Duration) {
        let mut seen = self.moved.load(Ordering::Relaxed);
        let mut quiet = 0;
        while quiet < 8 {
            tokio::time::sleep(limit / 8).await;
            let now = self.moved.load(Ordering::Relaxed);
            if now != seen || self.in_flight.load(Ordering::Acquire) > 0 {
                seen = now;
                quiet = 0;
            } else {
                quiet += 1;
            }
        }
    }
}

/// Counts one request as in flight until dropped.
struct InFlight(Arc<Activity>);

impl InFlight {
    fn begin(activity: Arc<Activity>) -> Self {
        activity.in_flight.fetch_add(1, Ordering::AcqRel);
        Self(activity)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.touch();
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A client connection's bytes, either way, are activity.
impl Observer for Arc<Activity> {
    fn read(&self, _: usize) {
        self.touch();
    }

    fn wrote(&self, _: usize) {
        self.touch();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listener_sockets_reuse_addresses_as_std_does() {
        let socket = socket_for("127.0.0.1:0".parse().expect("addr")).expect("socket");
        #[cfg(not(windows))]
        assert!(socket.reuseaddr().expect("SO_REUSEADDR readable"));
        assert!(socket.local_addr().expect("bound").port() > 0);
        let v6 = socket_for("[::1]:0".parse().expect("addr"));
        // Hosts without IPv6 loopback cannot bind it; where they can, the
        // socket is an IPv6 one.
        if let Ok(v6) = v6 {
            assert!(v6.local_addr().expect("bound").is_ipv6());
        }
    }

    #[tokio::test]
    async fn bind_listens_with_the_backlog_given() {
        let listener = bind("127.0.0.1:0".parse().expect("addr"), 7).expect("bind");
        let addr = listener.local_addr().expect("bound");
        // Accepting proves the socket listens; the queue length itself is
        // visible only to the kernel (tests/edge.rs reads it with `ss`).
        let client = tokio::net::TcpStream::connect(addr);
        let (accepted, connected) = tokio::join!(listener.accept(), client);
        assert!(accepted.is_ok() && connected.is_ok());
    }
}
