//! An upstream response's body, decoded out of the connection's read
//! buffer: `Content-Length` bytes, chunks with their trailers (RFC 9112
//! §7.1), or everything until the upstream closes.
//!
//! The chunked grammar is read as hyper's decoder reads it, byte for byte,
//! so the two refuse the same inputs: a size line of hex digits (no sign,
//! no leading space; overflow refused), optional spaces or tabs, then
//! extensions (skipped; a bare LF in one refused; at most
//! [`EXTENSIONS_LIMIT`] bytes of them over the body) and CRLF; each chunk's
//! data followed by CRLF exactly; trailers of at most [`TRAILERS_LIMIT`]
//! bytes and [`super::head::MAX_HEADERS`] fields.

use bytes::{Buf, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue};

use super::head::{Delimited, MAX_HEADERS};

/// Bytes of chunk extensions a body may carry in all.
pub const EXTENSIONS_LIMIT: u64 = 16 * 1024;
/// Bytes of trailer section a body may carry.
pub const TRAILERS_LIMIT: usize = 16 * 1024;

/// What one step of decoding gave.
#[derive(Debug, PartialEq, Eq)]
pub enum Decoded {
    /// Body bytes (never empty).
    Data(Bytes),
    /// The trailer fields, which end the body.
    Trailers(HeaderMap),
    /// The body is complete.
    End,
    /// More bytes are needed.
    More,
}

/// Why a body was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// A chunk size line, a chunk's CRLF or the last chunk broke the grammar.
    #[error("invalid chunk framing: {0}")]
    Chunk(&'static str),
    /// A chunk size past `u64`.
    #[error("invalid chunk size: overflow")]
    Overflow,
    /// More chunk extensions than [`EXTENSIONS_LIMIT`].
    #[error("chunk extensions over limit")]
    Extensions,
    /// A trailer section past its limits or refused by the field grammar.
    #[error("invalid trailers: {0}")]
    Trailers(&'static str),
    /// The connection closed before the body's end.
    #[error("end of file before message length reached")]
    Incomplete,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Start,
    Size,
    SizeLws,
    Extension,
    SizeLf,
    Body,
    BodyCr,
    BodyLf,
    Trailer,
    TrailerLf,
    EndCr,
    EndLf,
    End,
}

#[derive(Debug)]
struct Chunked {
    state: State,
    size: u64,
    extensions: u64,
    trailers: Option<BytesMut>,
    trailer_lines: usize,
}

#[derive(Debug)]
enum Kind {
    Length(u64),
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
            Delimited::Chunked => Kind::Chunked(Box::new(Chunked {
                state: State::Start,
                size: 0,
                extensions: 0,
                trailers: None,
                trailer_lines: 0,
            })),
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
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Decoded, DecodeError> {
        match &mut self.0 {
            Kind::Done => Ok(Decoded::End),
            Kind::Length(left) => {
                if buf.is_empty() {
                    return Ok(Decoded::More);
                }
                let n = usize::try_from(*left).map_or(buf.len(), |l| l.min(buf.len()));
                *left -= n as u64;
                if *left == 0 {
                    self.0 = Kind::Done;
                }
                Ok(Decoded::Data(buf.split_to(n).freeze()))
            }
            Kind::Close if buf.is_empty() => Ok(Decoded::More),
            Kind::Close => Ok(Decoded::Data(buf.split().freeze())),
            Kind::Chunked(c) => {
                let got = c.decode(buf)?;
                if matches!(got, Decoded::Trailers(_) | Decoded::End) {
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
    pub fn eof(&mut self) -> Result<Decoded, DecodeError> {
        match self.0 {
            Kind::Close | Kind::Done => {
                self.0 = Kind::Done;
                Ok(Decoded::End)
            }
            Kind::Length(_) | Kind::Chunked(_) => Err(DecodeError::Incomplete),
        }
    }
}

impl Chunked {
    fn decode(&mut self, buf: &mut BytesMut) -> Result<Decoded, DecodeError> {
        loop {
            match self.state {
                State::Body => {
                    if buf.is_empty() {
                        return Ok(Decoded::More);
                    }
                    let n = usize::try_from(self.size).map_or(buf.len(), |s| s.min(buf.len()));
                    self.size -= n as u64;
                    if self.size == 0 {
                        self.state = State::BodyCr;
                    }
                    return Ok(Decoded::Data(buf.split_to(n).freeze()));
                }
                State::End => {
                    return match self.trailers.take() {
                        Some(t) => trailers(&t, self.trailer_lines).map(Decoded::Trailers),
                        None => Ok(Decoded::End),
                    };
                }
                _ => {
                    let Some(&b) = buf.first() else {
                        return Ok(Decoded::More);
                    };
                    buf.advance(1);
                    self.state = self.step(b)?;
                }
            }
        }
    }

    /// The state after byte `b` of a size line, a chunk's CRLF or the end.
    fn step(&mut self, b: u8) -> Result<State, DecodeError> {
        use State::{
            Body, BodyCr, BodyLf, End, EndCr, EndLf, Extension, Size, SizeLf, SizeLws, Start,
            Trailer, TrailerLf,
        };
        Ok(match (self.state, b) {
            (Start | Size, _) if b.is_ascii_hexdigit() => {
                let digit = u64::from((b as char).to_digit(16).unwrap_or_default());
                self.size = self
                    .size
                    .checked_mul(16)
                    .and_then(|s| s.checked_add(digit))
                    .ok_or(DecodeError::Overflow)?;
                Size
            }
            (Start, _) => return Err(DecodeError::Chunk("missing size digit")),
            (Size | SizeLws, b'\t' | b' ') => SizeLws,
            (Size | SizeLws, b';') => Extension,
            (Size | SizeLws | Extension, b'\r') => SizeLf,
            (Size | SizeLws, _) => return Err(DecodeError::Chunk("invalid size line")),
            (Extension, b'\n') => return Err(DecodeError::Chunk("newline in an extension")),
            (Extension, _) => {
                self.extensions += 1;
                if self.extensions >= EXTENSIONS_LIMIT {
                    return Err(DecodeError::Extensions);
                }
                Extension
            }
            (SizeLf, b'\n') if self.size == 0 => EndCr,
            (SizeLf, b'\n') => Body,
            (SizeLf, _) => return Err(DecodeError::Chunk("size line without LF")),
            (BodyCr, b'\r') => BodyLf,
            (BodyCr, _) => return Err(DecodeError::Chunk("chunk without CR")),
            (BodyLf, b'\n') => Start,
            (BodyLf, _) => return Err(DecodeError::Chunk("chunk without LF")),
            (Trailer, _) => {
                self.keep(b)?;
                if b == b'\r' { TrailerLf } else { Trailer }
            }
            (TrailerLf, b'\n') => {
                if self.trailer_lines >= MAX_HEADERS {
                    return Err(DecodeError::Trailers("too many fields"));
                }
                self.trailer_lines += 1;
                self.keep(b)?;
                EndCr
            }
            (TrailerLf, _) => return Err(DecodeError::Trailers("line without LF")),
            (EndCr, b'\r') => {
                if self.trailers.is_some() {
                    self.keep(b)?;
                }
                EndLf
            }
            (EndCr, _) => {
                if self.trailers.is_none() {
                    self.trailers = Some(BytesMut::with_capacity(64));
                }
                self.keep(b)?;
                Trailer
            }
            (EndLf, b'\n') => {
                if self.trailers.is_some() {
                    self.keep(b)?;
                }
                End
            }
            (EndLf, _) => return Err(DecodeError::Chunk("last chunk without CRLF")),
            (Body | End, _) => self.state,
        })
    }

    /// Keeps a byte of the trailer section, within its limit.
    fn keep(&mut self, b: u8) -> Result<(), DecodeError> {
        let t = self.trailers.get_or_insert_with(BytesMut::new);
        t.extend_from_slice(&[b]);
        if t.len() >= TRAILERS_LIMIT {
            return Err(DecodeError::Trailers("over the byte limit"));
        }
        Ok(())
    }
}

/// The trailer fields of a section of `lines` lines.
fn trailers(section: &[u8], lines: usize) -> Result<HeaderMap, DecodeError> {
    let mut fields = vec![httparse::EMPTY_HEADER; lines];
    match httparse::parse_headers(section, &mut fields) {
        Ok(httparse::Status::Complete((_, fields))) => {
            let mut map = HeaderMap::with_capacity(fields.len());
            for f in fields {
                let name = HeaderName::from_bytes(f.name.as_bytes())
                    .map_err(|_| DecodeError::Trailers("invalid field name"))?;
                let value = HeaderValue::from_bytes(f.value)
                    .map_err(|_| DecodeError::Trailers("invalid field value"))?;
                map.append(name, value);
            }
            Ok(map)
        }
        Ok(httparse::Status::Partial) => Err(DecodeError::Trailers("incomplete section")),
        Err(_) => Err(DecodeError::Trailers("malformed field")),
    }
}
