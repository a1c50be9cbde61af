//! Reading recorded traffic: the files (plain or gzip), their lines with
//! file and line number, the three line formats, and the bad lines.
//!
//! Each line becomes a [`Line`]: the instant it happened, the TCP peer and
//! a request head, built so that the gateway's own phases read it exactly
//! as they read a live one. [`Parser`] sends each line to its format's
//! reader:
//!
//! - **combined** (nginx `combined`, Apache `%h %l %u %t "%r" %>s %b
//!   "%{Referer}i" "%{User-agent}i"`; `combined.rs`): the peer is the first
//!   field, the time the bracketed one (whole seconds, or with `.mmm`), the
//!   request line gives method and target. Extra quoted fields after the
//!   user agent become headers in the order `--field` names them (`-`
//!   skips one; a field logged as `-` is absent). The host is `--host`,
//!   unless a field is mapped to `host`, or the target is in absolute
//!   form. The common format (no referer or user agent) reads too, when no
//!   field is mapped.
//! - **tollgate** (`tollgate.rs`): the gateway's JSON access log written
//!   with `access_log.replay: true` (other events in the file are
//!   skipped). The client IP becomes `X-Forwarded-For` when it differs from
//!   the peer, and the caller digest stands in for the API key or user
//!   header (see docs/simulate.md for what that reconstructs and what it
//!   cannot).
//! - **jsonl** (`jsonl.rs`): `{"ts": …, "method": "GET", "host": "…",
//!   "path": "/…", "peer": "192.0.2.7", "headers": {"x-api-key": "…"}}`;
//!   `ts` in milliseconds since the epoch (a number under 10^11 is
//!   seconds) or an RFC 3339 string; `method` defaults to GET.
//!
//! `read.rs` opens the files and finds the format of the first line; what
//! the formats share (the [`Line`] a request becomes, the parts both JSON
//! formats name) sits in `line.rs`, so that no file here imports this one.

mod combined;
mod jsonl;
mod line;
mod read;
mod tollgate;

use http::{HeaderName, HeaderValue};

use super::options::InputFormat;

pub use line::{Line, Parsed};
pub use read::{Lines, detect, first_line};

/// Turns lines of one format into requests.
#[derive(Debug, Clone)]
pub struct Parser {
    format: InputFormat,
    /// Combined: the header of each extra quoted field (`None`: skipped).
    fields: Vec<Option<HeaderName>>,
    /// `Host` when the line names none.
    host: Option<HeaderValue>,
    /// Tollgate: where the caller digest goes, by identity kind.
    api_key_header: HeaderName,
    user_header: HeaderName,
}

impl Parser {
    /// A parser for `format`. `fields` are the combined format's extra
    /// fields (a field named `-` is skipped); the two header names are
    /// the simulated configuration's API-key and user headers.
    pub fn new(
        format: InputFormat,
        fields: &[HeaderName],
        host: Option<HeaderValue>,
        api_key_header: HeaderName,
        user_header: HeaderName,
    ) -> Self {
        Self {
            format,
            fields: fields
                .iter()
                .map(|f| (f.as_str() != "-").then(|| f.clone()))
                .collect(),
            host,
            api_key_header,
            user_header,
        }
    }

    /// Parses one line.
    ///
    /// # Errors
    /// What is wrong with the line, for the bad-lines report.
    pub fn parse(&self, line: &[u8]) -> Result<Parsed, String> {
        if line.trim_ascii().is_empty() {
            return Ok(Parsed::Skip);
        }
        let host = self.host.as_ref();
        match self.format {
            InputFormat::Combined => combined::parse(line, &self.fields, host).map(Parsed::Request),
            InputFormat::Jsonl => jsonl::parse(line)?.into_line(host).map(Parsed::Request),
            InputFormat::Tollgate => {
                match tollgate::parse(line, &self.api_key_header, &self.user_header)? {
                    Some(parts) => parts.into_line(host).map(Parsed::Request),
                    None => Ok(Parsed::Skip),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
