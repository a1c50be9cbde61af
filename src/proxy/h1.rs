//! tollgate's own HTTP/1.1 client for plain `http://` upstreams
//! (`server.http1: native`), beside hyper's ([`super::keepalive`]).
//!
//! Per request hyper's client costs a channel hop to the connection's
//! task, a dispatch there, timers, and a `Response<Incoming>` whose body
//! is fed through another channel. Here the task that sends a request
//! does the whole exchange on the connection itself ([`exchange`], on a
//! [`conn`]): it writes
//! the head from the request's parts straight into the connection's write
//! buffer ([`write`]), streams the body, and parses the response head in
//! place in the read buffer with `httparse` ([`head`]), writing the body
//! as it waits ([`upload`]), so an upstream that answers while it reads
//! is read from as it is written to. The response body
//! ([`body`]) reads from the connection as the client side polls it,
//! decoded as it is framed ([`decode`]), writes what is left of the
//! request body as it is polled, and gives the connection back to the
//! route's idle connections ([`idle`]) at its clean end ([`send`] holds
//! the keep-alive race's rules); a body dropped before its end closes the
//! connection.
//!
//! What it accepts from an upstream is what hyper's client accepts — the
//! same limits, the same chunked grammar — but for the few heads it
//! refuses where hyper does not ([`head`]'s module docs): each is a test
//! of its own, and the `h1_response` fuzz target holds the two parsers
//! to each other.

mod body;
mod conn;
pub mod decode;
mod error;
mod exchange;
pub mod head;
mod idle;
mod send;
mod upload;
mod write;

pub use body::NativeBody;
pub use error::NativeError;
pub use idle::IdleConns;
pub use send::send;

#[cfg(test)]
mod tests;
