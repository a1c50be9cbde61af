//! tollgate's own HTTP/1.1 server connection (`server.http1: native`):
//! one read buffer and one write buffer per connection, heads parsed in
//! place with `httparse`, answers written straight into the write buffer,
//! one deadline per connection for its heads, the service called in place,
//! and no buffer held while the connection waits for its next request (the
//! buffers go back to the thread's spares). A plain-text connection idle
//! past a short linger ends its task and is [`park`]ed: its owner's parker
//! waits for it to be readable and serves it again from there.
//!
//! It reads what hyper's server reads and refuses what it refuses, with
//! the same statuses ([`head`], [`chunked`]); the differential fuzz target
//! `http1_diff` holds the two against each other. What it does not serve it
//! hands back, with the bytes it has read, for hyper to serve
//! ([`ConnEnd::HandOff`]): a connection that opens with HTTP/2's preface
//! (h2c with prior knowledge), and a request that asks for an `Upgrade`
//! (WebSocket) or is a `CONNECT`, so that upgrades keep hyper's machinery.
//!
//! Differences from hyper's server, each chosen:
//! - a response's trailers are not sent (hyper sends them only to a client
//!   that announced `TE: trailers` and for fields the response declared);
//! - a response's own `Transfer-Encoding` is dropped and the framing chosen
//!   here, from `Content-Length` or the body's length;
//! - an answer that ends a connection says `connection: close`.

mod body;
pub mod chunked;
mod conn;
pub mod fields;
pub mod head;
mod locked;
pub mod park;
mod rewind;
pub(crate) mod spare;
pub mod text_fields;
pub mod write;

use std::convert::Infallible;
use std::io;

use bytes::Buf;
use http::{Request, Response};
use tokio::sync::watch;

pub use body::{BodyError, RequestBody, decode_all};
pub use conn::{ConnEnd, Settings, Transport};
pub use rewind::Rewind;

/// Serves HTTP/1.1 on `io`, each request to `service`, until the client
/// closes, sends no byte of its next head within `settings.idle`, a head
/// takes longer than `settings.header_read`, an answer ends
/// the connection, `stop` turns true while no request is in flight, the
/// connection is handed off, or (under `settings.parks`) it goes idle.
/// `idle_since` serves a parked connection again: it has waited for its
/// next head since then.
///
/// # Errors
/// Writing to the connection failed.
pub fn serve<I, S, B>(
    io: I,
    service: S,
    settings: Settings,
    stop: watch::Receiver<bool>,
    idle_since: Option<tokio::time::Instant>,
) -> impl Future<Output = io::Result<ConnEnd<I>>>
where
    I: Transport,
    S: tower::Service<Request<RequestBody>, Response = Response<B>, Error = Infallible>,
    B: http_body::Body + text_fields::TextFields,
    B::Data: Buf,
{
    conn::serve(io, service, settings, stop, idle_since)
}

#[cfg(test)]
mod tests;
