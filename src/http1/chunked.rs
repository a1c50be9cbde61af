//! The chunked transfer coding (RFC 9112 §7.1), decoded from a
//! connection's read buffer as hyper's decoder does it: hex sizes without
//! overflow, spaces or tabs after the size, extensions skipped up to
//! [`EXTENSIONS_LIMIT`] bytes in all but never across a bare LF, every line
//! ended by CRLF, and trailer fields ([`TRAILER_LIMIT`] bytes,
//! [`MAX_HEADERS`] lines) kept and handed on.
//!
//! It is the one reading of the grammar in tollgate: the native server
//! decodes request bodies with it, and the native upstream client
//! (`proxy::h1`) response bodies, so both refuse the same inputs.

use bytes::{Buf, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue};

use super::head::MAX_HEADERS;

/// Bytes of chunk extensions one body may carry (hyper's bound).
pub const EXTENSIONS_LIMIT: u64 = 16 * 1024;
/// Bytes of trailer section one body may carry (hyper's bound).
pub const TRAILER_LIMIT: usize = 16 * 1024;

/// Where the decoder is in the coding.
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

/// What one step of decoding gives.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// Bytes of the body.
    Data(bytes::Bytes),
    /// The trailer fields; the body has ended.
    Trailers(HeaderMap),
    /// The body has ended, without trailers.
    End,
    /// The buffer holds no more of the body: read more.
    More,
}

/// A chunked body's decoder.
#[derive(Debug)]
pub struct Chunked {
    state: State,
    size: u64,
    extensions: u64,
    trailers: Option<BytesMut>,
    trailer_lines: usize,
}

impl Default for Chunked {
    fn default() -> Self {
        Self {
            state: State::Start,
            size: 0,
            extensions: 0,
            trailers: None,
            trailer_lines: 0,
        }
    }
}

fn hex(b: u8) -> Option<u64> {
    match b {
        b'0'..=b'9' => Some(u64::from(b - b'0')),
        b'a'..=b'f' => Some(u64::from(b - b'a' + 10)),
        b'A'..=b'F' => Some(u64::from(b - b'A' + 10)),
        _ => None,
    }
}

impl Chunked {
    /// Whether the body has been read to its end.
    pub fn is_done(&self) -> bool {
        self.state == State::End
    }

    /// Decodes from the front of `buf` until there is data, the end, or
    /// nothing left to read.
    ///
    /// # Errors
    /// The coding is broken; the text says how.
    pub fn step(&mut self, buf: &mut BytesMut) -> Result<Step, &'static str> {
        loop {
            if self.state == State::End {
                return Ok(Step::End);
            }
            if self.state == State::Body {
                if buf.is_empty() {
                    return Ok(Step::More);
                }
                let n = usize::try_from(self.size)
                    .unwrap_or(usize::MAX)
                    .min(buf.len());
                self.size -= n as u64;
                if self.size == 0 {
                    self.state = State::BodyCr;
                }
                return Ok(Step::Data(buf.split_to(n).freeze()));
            }
            let Some(&b) = buf.first() else {
                return Ok(Step::More);
            };
            buf.advance(1);
            if let Some(done) = self.byte(b)? {
                return Ok(done);
            }
        }
    }

    /// One byte of the coding outside chunk data.
    fn byte(&mut self, b: u8) -> Result<Option<Step>, &'static str> {
        self.state = match self.state {
            State::Start => {
                let d = hex(b).ok_or("invalid chunk size line: missing size digit")?;
                self.size = d;
                State::Size
            }
            State::Size => match (b, hex(b)) {
                (_, Some(d)) => {
                    self.size = self
                        .size
                        .checked_mul(16)
                        .and_then(|s| s.checked_add(d))
                        .ok_or("invalid chunk size: overflow")?;
                    State::Size
                }
                (b'\t' | b' ', None) => State::SizeLws,
                (b';', None) => State::Extension,
                (b'\r', None) => State::SizeLf,
                _ => return Err("invalid chunk size line: invalid size"),
            },
            State::SizeLws => match b {
                b'\t' | b' ' => State::SizeLws,
                b';' => State::Extension,
                b'\r' => State::SizeLf,
                _ => return Err("invalid chunk size linear white space"),
            },
            State::Extension => match b {
                b'\r' => State::SizeLf,
                b'\n' => return Err("invalid chunk extension contains newline"),
                _ => {
                    self.extensions += 1;
                    if self.extensions >= EXTENSIONS_LIMIT {
                        return Err("chunk extensions over limit");
                    }
                    State::Extension
                }
            },
            State::SizeLf => match (b, self.size) {
                (b'\n', 0) => State::EndCr,
                (b'\n', _) => State::Body,
                _ => return Err("invalid chunk size LF"),
            },
            State::BodyCr if b == b'\r' => State::BodyLf,
            State::BodyCr => return Err("invalid chunk body CR"),
            State::BodyLf if b == b'\n' => State::Start,
            State::BodyLf => return Err("invalid chunk body LF"),
            State::Trailer => {
                self.keep(b)?;
                if b == b'\r' {
                    State::TrailerLf
                } else {
                    State::Trailer
                }
            }
            State::TrailerLf => {
                if b != b'\n' {
                    return Err("invalid trailer end LF");
                }
                if self.trailer_lines >= MAX_HEADERS {
                    return Err("chunk trailers count overflow");
                }
                self.trailer_lines += 1;
                self.keep(b)?;
                State::EndCr
            }
            State::EndCr if b == b'\r' => {
                if self.trailers.is_some() {
                    self.keep(b)?;
                }
                State::EndLf
            }
            State::EndCr => {
                match &mut self.trailers {
                    None => self.trailers = Some(BytesMut::from(&[b][..])),
                    Some(_) => self.keep(b)?,
                }
                State::Trailer
            }
            State::EndLf => {
                if b != b'\n' {
                    return Err("invalid chunk end LF");
                }
                if self.trailers.is_some() {
                    self.keep(b)?;
                }
                self.state = State::End;
                return match self.trailers.take() {
                    Some(t) => trailers(&t, self.trailer_lines).map(|t| Some(Step::Trailers(t))),
                    None => Ok(Some(Step::End)),
                };
            }
            // `step` takes chunk data and the end before reading a byte.
            State::Body | State::End => return Err("chunk decoder out of step"),
        };
        Ok(None)
    }

    fn keep(&mut self, b: u8) -> Result<(), &'static str> {
        let t = self.trailers.get_or_insert_with(BytesMut::new);
        t.extend_from_slice(&[b]);
        if t.len() >= TRAILER_LIMIT {
            return Err("chunk trailers bytes over limit");
        }
        Ok(())
    }
}

/// The trailer section parsed as header fields.
fn trailers(buf: &[u8], count: usize) -> Result<HeaderMap, &'static str> {
    let mut fields = vec![httparse::EMPTY_HEADER; count];
    match httparse::parse_headers(buf, &mut fields) {
        Ok(httparse::Status::Complete((_, fields))) => {
            let mut map = HeaderMap::with_capacity(fields.len());
            for f in fields {
                let name = HeaderName::from_bytes(f.name.as_bytes())
                    .map_err(|_| "invalid trailer name")?;
                let value =
                    HeaderValue::from_bytes(f.value).map_err(|_| "invalid trailer value")?;
                map.append(name, value);
            }
            Ok(map)
        }
        Ok(httparse::Status::Partial) => Err("partial trailer section"),
        Err(_) => Err("invalid trailer section"),
    }
}
