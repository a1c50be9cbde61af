//! How an exchange on a native connection fails.

use std::io;

use super::decode::DecodeError;
use super::head::HeadError;
use crate::proxy::body::ClientBodyError;

/// Why an exchange with an upstream, or its response body, failed.
#[derive(Debug, thiserror::Error)]
pub enum NativeError {
    /// The connection failed.
    #[error("upstream connection: {0}")]
    Io(#[from] io::Error),
    /// The upstream closed the connection before a byte of response.
    #[error("upstream closed the connection before answering")]
    Closed,
    /// The upstream closed the connection within the response head.
    #[error("upstream closed the connection within the response head")]
    HeadCut,
    /// The response head was refused.
    #[error(transparent)]
    Head(#[from] HeadError),
    /// The response body broke its framing or was cut short.
    #[error("upstream response body: {0}")]
    Body(#[from] DecodeError),
    /// The request body's bytes did not match its `Content-Length`.
    #[error("request body does not match its Content-Length")]
    BodyLength,
    /// The client's body failed while it was forwarded: the client's fault,
    /// found in the source chain.
    #[error("client body: {0}")]
    Client(#[source] ClientBodyError),
}
