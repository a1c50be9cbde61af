//! An upstream response's body, decoded out of the connection's read
//! buffer: `Content-Length` bytes, chunks with their trailers (RFC 9112
//! §7.1), or everything until the upstream closes.
//!
//! Chunks are read by the server's decoder ([`crate::http1::chunked`]),
//! the one reading of that grammar in tollgate, which reads it as hyper's
//! decoder does; so the native client refuses the chunked bodies hyper's
//! client refuses.

use bytes::BytesMut;

use super::head::Delimited;
use crate::http1::chunked::{Chunked, Step};

/// Why a body was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The chunked coding broke its grammar or limits; the text says how.
    #[error("invalid chunked body: {0}")]
    Chunk(&'static str),
    /// The connection closed before the body's end.
    #[error("end of file before message length reached")]
    Incomplete,
}

#[derive(Debug)]
enum Kind {
    Length(u64),
    /// Boxed: the decoder of every response is as small as a length's.
    Chunked(Box<Chunked>),
    Close,
    Done,
}

/// The decoder of one response body.
#[derive(Debug)]
pub struct Decoder(Kind);

impl Decoder {
    /// A decoder for a body framed as `framing`.
    pub fn new(framing: Delimited) -> Self {
        Self(match framing {
            Delimited::Length(0) => Kind::Done,
            Delimited::Length(n) => Kind::Length(n),
            Delimited::Chunked => Kind::Chunked(Box::default()),
            Delimited::Close => Kind::Close,
        })
    }

    /// Whether the body has ended: nothing more is read for it.
    pub fn is_done(&self) -> bool {
        matches!(self.0, Kind::Done)
    }

    /// Bytes left, when the framing says.
    pub fn remaining(&self) -> Option<u64> {
        match self.0 {
            Kind::Length(n) => Some(n),
            Kind::Done => Some(0),
            Kind::Chunked(_) | Kind::Close => None,
        }
    }

    /// Decodes what `buf` holds, taking the bytes it uses.
    ///
    /// # Errors
    /// The body breaks its framing.
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Step, DecodeError> {
        match &mut self.0 {
            Kind::Done => Ok(Step::End),
            Kind::Length(left) => {
                if buf.is_empty() {
                    return Ok(Step::More);
                }
                let n = usize::try_from(*left).map_or(buf.len(), |l| l.min(buf.len()));
                *left -= n as u64;
                if *left == 0 {
                    self.0 = Kind::Done;
                }
                Ok(Step::Data(buf.split_to(n).freeze()))
            }
            Kind::Close if buf.is_empty() => Ok(Step::More),
            Kind::Close => Ok(Step::Data(buf.split().freeze())),
            Kind::Chunked(c) => {
                let got = c.step(buf).map_err(DecodeError::Chunk)?;
                if matches!(got, Step::Trailers(_) | Step::End) {
                    self.0 = Kind::Done;
                }
                Ok(got)
            }
        }
    }

    /// The connection reached its end of file.
    ///
    /// # Errors
    /// The body was not complete: only a body read until the close ends so.
    pub fn eof(&mut self) -> Result<Step, DecodeError> {
        match self.0 {
            Kind::Close | Kind::Done => {
                self.0 = Kind::Done;
                Ok(Step::End)
            }
            Kind::Length(_) | Kind::Chunked(_) => Err(DecodeError::Incomplete),
        }
    }
}
