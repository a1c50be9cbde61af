//! Reading recorded traffic: the files (plain or gzip), their lines with
//! file and line number, the three line formats, and the bad lines.
//!
//! Each line becomes a [`Line`]: the instant it happened, the TCP peer and
//! a request head, built so that the gateway's own phases read it exactly
//! as they read a live one.
//!
//! - **combined** (nginx `combined`, Apache `%h %l %u %t "%r" %>s %b
//!   "%{Referer}i" "%{User-agent}i"`): the peer is the first field, the
//!   time the bracketed one (whole seconds, or with `.mmm`), the request
//!   line gives method and target. Extra quoted fields after the user
//!   agent become headers in the order `--field` names them (`-` skips
//!   one; a field logged as `-` is absent). The host is `--host`, unless a
//!   field is mapped to `host`, or the target is in absolute form. The
//!   common format (no referer or user agent) reads too, when no field is
//!   mapped.
//! - **tollgate**: the gateway's JSON access log written with
//!   `access_log.replay: true` (other events in the file are skipped). The
//!   client IP becomes `X-Forwarded-For` when it differs from the peer,
//!   and the caller digest stands in for the API key or user header
//!   (see docs/simulate.md for what that reconstructs and what it cannot).
//! - **jsonl**: `{"ts": …, "method": "GET", "host": "…", "path": "/…",
//!   "peer": "192.0.2.7", "headers": {"x-api-key": "…"}}`; `ts` in
//!   milliseconds since the epoch (a number under 10^11 is seconds) or an
//!   RFC 3339 string; `method` defaults to GET.

use std::borrow::Cow;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use flate2::read::MultiGzDecoder;
use http::header::HOST;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Uri};
use serde::Deserialize;

use super::options::{InputFormat, SimError};
use super::time;

/// One recorded request, ready for the pipeline.
#[derive(Debug)]
pub struct Line {
    /// When it happened, in ms since the epoch.
    pub ts_ms: u64,
    /// The TCP peer (port 0).
    pub peer: SocketAddr,
    /// The request head.
    pub req: Request<()>,
}

/// What a line turned out to be.
// Made and taken apart at once, never stored: boxing the request would
// cost an allocation per line for nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Parsed {
    /// A request.
    Request(Line),
    /// Not a request: blank, or another event in a tollgate log.
    Skip,
}

/// The format of the lines starting with `first` (the first non-empty
/// line): JSON that is a tollgate access-log event, other JSON, or the
/// combined format.
pub fn detect(first: &[u8]) -> InputFormat {
    let first = first.trim_ascii();
    if !first.starts_with(b"{") {
        return InputFormat::Combined;
    }
    let text = String::from_utf8_lossy(first);
    if text.contains("\"tollgate::access\"") || text.contains("\"fields\"") {
        InputFormat::Tollgate
    } else {
        InputFormat::Jsonl
    }
}

/// The first non-empty line of `path` (for [`detect`]).
///
/// # Errors
/// The file cannot be opened or read.
pub fn first_line(path: &Path) -> Result<Vec<u8>, SimError> {
    let mut r = open(path, Arc::default())?;
    let mut buf = Vec::new();
    loop {
        buf.clear();
        let n = r
            .read_until(b'\n', &mut buf)
            .map_err(|e| io_error(path, e))?;
        if n == 0 || !buf.trim_ascii().is_empty() {
            return Ok(buf);
        }
    }
}

fn io_error(path: &Path, source: io::Error) -> SimError {
    SimError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// Counts the bytes read from a file (the progress bar's position).
struct Counted<R> {
    inner: R,
    read: Arc<AtomicU64>,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

fn open(path: &Path, read: Arc<AtomicU64>) -> Result<Box<dyn BufRead + Send>, SimError> {
    let file = File::open(path).map_err(|e| io_error(path, e))?;
    let counted = Counted { inner: file, read };
    let gz = path.extension().is_some_and(|e| e == "gz");
    Ok(if gz {
        Box::new(BufReader::with_capacity(
            1 << 18,
            MultiGzDecoder::new(BufReader::with_capacity(1 << 16, counted)),
        ))
    } else {
        Box::new(BufReader::with_capacity(1 << 18, counted))
    })
}

/// The lines of several files in turn, each with its file and number.
pub struct Lines {
    files: std::vec::IntoIter<PathBuf>,
    current: Option<(PathBuf, Box<dyn BufRead + Send>)>,
    /// 1-based number of the line last read, in its file.
    pub number: u64,
    /// Index in the list of files of the file now read.
    pub index: usize,
    /// Bytes read from the files so far (compressed, for gzip).
    pub read: Arc<AtomicU64>,
    /// Whether a file has been opened yet.
    current_seen: bool,
}

impl Lines {
    /// The lines of `files`, in order.
    pub fn new(files: Vec<PathBuf>) -> Self {
        Self {
            files: files.into_iter(),
            current: None,
            number: 0,
            index: 0,
            read: Arc::default(),
            current_seen: false,
        }
    }

    /// The file now read.
    pub fn file(&self) -> Option<&Path> {
        self.current.as_ref().map(|(p, _)| p.as_path())
    }

    /// Reads the next line into `buf` (without its line ending); false at
    /// the end of the last file.
    ///
    /// # Errors
    /// A file cannot be opened or read (a truncated gzip stream too).
    pub fn next_into(&mut self, buf: &mut Vec<u8>) -> Result<bool, SimError> {
        buf.clear();
        self.append_next(buf)
    }

    /// Appends the next line to `buf` (without its line ending); false at
    /// the end of the last file.
    ///
    /// # Errors
    /// As [`Self::next_into`].
    pub fn append_next(&mut self, buf: &mut Vec<u8>) -> Result<bool, SimError> {
        let start = buf.len();
        loop {
            if self.current.is_none() {
                let Some(path) = self.files.next() else {
                    return Ok(false);
                };
                let reader = open(&path, self.read.clone())?;
                if self.current_seen {
                    self.index += 1;
                }
                self.current_seen = true;
                self.current = Some((path, reader));
                self.number = 0;
            }
            let Some((path, reader)) = &mut self.current else {
                continue;
            };
            let n = reader
                .read_until(b'\n', buf)
                .map_err(|e| io_error(path, e))?;
            if n == 0 {
                self.current = None;
                continue;
            }
            self.number += 1;
            while buf.len() > start && buf.last().is_some_and(|&c| c == b'\n' || c == b'\r') {
                buf.pop();
            }
            return Ok(true);
        }
    }
}

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
        match self.format {
            InputFormat::Combined => self.combined(line).map(Parsed::Request),
            InputFormat::Jsonl => self.jsonl(line).map(Parsed::Request),
            InputFormat::Tollgate => self.tollgate(line),
        }
    }

    fn combined(&self, b: &[u8]) -> Result<Line, String> {
        let sp = b.iter().position(|&c| c == b' ').ok_or("one field only")?;
        let peer = ip(&b[..sp])?;
        let rest = &b[sp..];
        let open = rest
            .iter()
            .position(|&c| c == b'[')
            .ok_or("no [time] field")?;
        let close = rest[open..]
            .iter()
            .position(|&c| c == b']')
            .ok_or("no [time] field")?
            + open;
        let ts_ms = time::parse_clf(&rest[open + 1..close]).ok_or_else(|| {
            format!(
                "time {:?} is not like 10/Oct/2000:13:55:36 -0700",
                String::from_utf8_lossy(&rest[open + 1..close])
            )
        })?;
        let (request, rest) = quoted(&rest[close + 1..]).ok_or("no quoted request line")?;
        let (method, target) = request_line(&request)?;
        let mut req = Request::new(());
        *req.method_mut() = method;
        *req.uri_mut() = target;
        if let Some(h) = &self.host {
            req.headers_mut().insert(HOST, h.clone());
        }
        if !self.fields.is_empty() {
            // status and size, then referer and user agent.
            let rest = skip_token(skip_token(rest));
            let (_, rest) = quoted(rest).ok_or("no quoted referer")?;
            let (_, mut rest) = quoted(rest).ok_or("no quoted user agent")?;
            for (i, name) in self.fields.iter().enumerate() {
                let (value, after) = quoted(rest).ok_or_else(|| {
                    format!(
                        "{} extra quoted field(s) named by --field, found {i}",
                        self.fields.len()
                    )
                })?;
                rest = after;
                let Some(name) = name else { continue };
                if *value == *b"-" || value.is_empty() {
                    continue;
                }
                let v = HeaderValue::from_bytes(&value)
                    .map_err(|_| format!("field {name} is not a header value"))?;
                req.headers_mut().append(name.clone(), v);
            }
        }
        Ok(Line {
            ts_ms,
            peer: SocketAddr::new(peer, 0),
            req,
        })
    }

    fn jsonl(&self, b: &[u8]) -> Result<Line, String> {
        let j: JsonLine<'_> = serde_json::from_slice(b).map_err(|e| format!("not JSON: {e}"))?;
        let ts_ms = j.ts.ms()?;
        let peer = peer(&j.peer)?;
        let mut headers = HeaderMap::new();
        for (name, values) in &j.headers {
            let name = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| format!("{name:?} is not a header name"))?;
            for v in values.iter() {
                let v = HeaderValue::from_str(v)
                    .map_err(|_| format!("header {name}: not a header value"))?;
                headers.append(name.clone(), v);
            }
        }
        self.request(
            ts_ms,
            peer,
            j.method.as_deref(),
            j.host.as_deref(),
            &j.path,
            headers,
        )
    }

    fn tollgate(&self, b: &[u8]) -> Result<Parsed, String> {
        let v: TollgateEvent<'_> =
            serde_json::from_slice(b).map_err(|e| format!("not JSON: {e}"))?;
        if v.target.as_deref().is_some_and(|t| t != "tollgate::access") {
            return Ok(Parsed::Skip);
        }
        let f = v.fields.unwrap_or(v.flat);
        let Some(ts_ms) = f.ts else {
            // An access line without the replay fields, or another event.
            return if f.method.is_some() {
                Err("no replay fields: the gateway wrote it without access_log.replay: true".into())
            } else {
                Ok(Parsed::Skip)
            };
        };
        let peer_ip = ip(f.peer.as_deref().ok_or("no peer")?.as_bytes())?;
        let mut headers = HeaderMap::new();
        if let Some(client) = f.client.as_deref() {
            let client = ip(client.as_bytes())?;
            if client != peer_ip {
                headers.insert(
                    HeaderName::from_static("x-forwarded-for"),
                    HeaderValue::from_str(&client.to_string()).map_err(|e| e.to_string())?,
                );
            }
        }
        if let Some(caller) = f.caller.as_deref() {
            let name = match f.identity.as_deref() {
                Some("api_key") => &self.api_key_header,
                Some("user") => &self.user_header,
                other => return Err(format!("a caller digest with identity {other:?}")),
            };
            let v = HeaderValue::from_str(caller).map_err(|_| "caller is not a header value")?;
            headers.insert(name.clone(), v);
        }
        let path = f.path.as_deref().ok_or("no path")?;
        self.request(
            ts_ms,
            SocketAddr::new(peer_ip, 0),
            f.method.as_deref(),
            f.host.as_deref(),
            path,
            headers,
        )
        .map(Parsed::Request)
    }

    fn request(
        &self,
        ts_ms: u64,
        peer: SocketAddr,
        method: Option<&str>,
        host: Option<&str>,
        path: &str,
        mut headers: HeaderMap,
    ) -> Result<Line, String> {
        let method = match method {
            Some(m) => Method::from_bytes(m.as_bytes()).map_err(|_| format!("method {m:?}"))?,
            None => Method::GET,
        };
        let uri = Uri::try_from(path).map_err(|e| format!("path {path:?}: {e}"))?;
        match host {
            Some(h) => {
                let v = HeaderValue::from_str(h).map_err(|_| format!("host {h:?}"))?;
                headers.insert(HOST, v);
            }
            None => {
                if let Some(h) = &self.host
                    && !headers.contains_key(HOST)
                {
                    headers.insert(HOST, h.clone());
                }
            }
        }
        let mut req = Request::new(());
        *req.method_mut() = method;
        *req.uri_mut() = uri;
        *req.headers_mut() = headers;
        Ok(Line { ts_ms, peer, req })
    }
}

fn ip(b: &[u8]) -> Result<IpAddr, String> {
    std::str::from_utf8(b)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("{:?} is not an IP address", String::from_utf8_lossy(b)))
}

/// An IP, or an IP and port.
fn peer(s: &str) -> Result<SocketAddr, String> {
    s.parse::<SocketAddr>()
        .or_else(|_| s.parse::<IpAddr>().map(|ip| SocketAddr::new(ip, 0)))
        .map_err(|_| format!("peer {s:?} is not an IP address"))
}

/// Method and target of `METHOD TARGET [PROTOCOL]`.
fn request_line(r: &[u8]) -> Result<(Method, Uri), String> {
    let bad = || {
        format!(
            "request line {:?} is not METHOD TARGET PROTOCOL",
            String::from_utf8_lossy(r)
        )
    };
    let first = r.iter().position(|&c| c == b' ').ok_or_else(bad)?;
    let rest = &r[first + 1..];
    let target = match rest.iter().rposition(|&c| c == b' ') {
        Some(last) if rest[last + 1..].starts_with(b"HTTP/") => &rest[..last],
        _ => rest,
    };
    let method = Method::from_bytes(&r[..first]).map_err(|_| bad())?;
    let uri = Uri::try_from(target).map_err(|_| bad())?;
    Ok((method, uri))
}

/// Skips spaces, then one token.
fn skip_token(b: &[u8]) -> &[u8] {
    let b = b.trim_ascii_start();
    let end = b.iter().position(|&c| c == b' ').unwrap_or(b.len());
    &b[end..]
}

/// Skips spaces, then reads one `"…"` field: its value (escapes `\"`,
/// `\\` and nginx's `\xHH` undone) and what follows it.
fn quoted(b: &[u8]) -> Option<(Cow<'_, [u8]>, &[u8])> {
    let b = b.trim_ascii_start();
    let b = b.strip_prefix(b"\"")?;
    let mut i = 0;
    let mut escaped = false;
    while i < b.len() {
        match b[i] {
            b'"' => break,
            b'\\' => {
                escaped = true;
                i += 2;
            }
            _ => i += 1,
        }
    }
    if i >= b.len() {
        return None;
    }
    let raw = &b[..i];
    let rest = &b[i + 1..];
    if !escaped {
        return Some((Cow::Borrowed(raw), rest));
    }
    let mut out = Vec::with_capacity(raw.len());
    let mut j = 0;
    while j < raw.len() {
        if raw[j] == b'\\' && j + 1 < raw.len() {
            let hex = |c: u8| (c as char).to_digit(16);
            if raw[j + 1] == b'x'
                && let (Some(h), Some(l)) = (
                    raw.get(j + 2).copied().and_then(hex),
                    raw.get(j + 3).copied().and_then(hex),
                )
            {
                out.push((h * 16 + l) as u8);
                j += 4;
                continue;
            }
            out.push(raw[j + 1]);
            j += 2;
        } else {
            out.push(raw[j]);
            j += 1;
        }
    }
    Some((Cow::Owned(out), rest))
}

/// A `jsonl` line.
#[derive(Debug, Deserialize)]
struct JsonLine<'a> {
    ts: Ts<'a>,
    #[serde(borrow, default)]
    method: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    host: Option<Cow<'a, str>>,
    #[serde(borrow)]
    path: Cow<'a, str>,
    #[serde(borrow)]
    peer: Cow<'a, str>,
    #[serde(borrow, default)]
    headers: std::collections::BTreeMap<String, OneOrMany<'a>>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Ts<'a> {
    Number(f64),
    #[serde(borrow)]
    Text(Cow<'a, str>),
}

impl Ts<'_> {
    fn ms(&self) -> Result<u64, String> {
        match self {
            // Under 10^11 it cannot be milliseconds of this century: seconds.
            Self::Number(n) if *n >= 0.0 && *n < 1e11 => Ok((n * 1000.0).round() as u64),
            Self::Number(n) if *n >= 0.0 && *n < 1e15 => Ok(n.round() as u64),
            Self::Number(n) => Err(format!("ts {n} is not a time")),
            Self::Text(s) => {
                time::parse_rfc3339(s).ok_or_else(|| format!("ts {s:?} is not RFC 3339"))
            }
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum OneOrMany<'a> {
    #[serde(borrow)]
    One(Cow<'a, str>),
    #[serde(borrow)]
    Many(Vec<Cow<'a, str>>),
}

impl OneOrMany<'_> {
    fn iter(&self) -> impl Iterator<Item = &str> {
        let (one, many) = match self {
            Self::One(s) => (Some(s.as_ref()), &[][..]),
            Self::Many(v) => (None, &v[..]),
        };
        one.into_iter().chain(many.iter().map(AsRef::as_ref))
    }
}

/// One line of tollgate's JSON log: `tracing-subscriber`'s shape, with the
/// event's fields under `fields` (or at the top level, flattened).
#[derive(Debug, Deserialize)]
struct TollgateEvent<'a> {
    #[serde(borrow, default)]
    target: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    fields: Option<AccessFields<'a>>,
    #[serde(borrow, flatten)]
    flat: AccessFields<'a>,
}

#[derive(Debug, Default, Deserialize)]
struct AccessFields<'a> {
    #[serde(default)]
    ts: Option<u64>,
    #[serde(borrow, default)]
    method: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    peer: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    client: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    host: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    path: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    identity: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    caller: Option<Cow<'a, str>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parser(format: InputFormat, fields: &[&str]) -> Parser {
        let fields: Vec<HeaderName> = fields
            .iter()
            .map(|f| HeaderName::from_bytes(f.as_bytes()).unwrap())
            .collect();
        Parser::new(
            format,
            &fields,
            Some(HeaderValue::from_static("api.test")),
            HeaderName::from_static("x-api-key"),
            HeaderName::from_static("x-user"),
        )
    }

    fn line(p: &Parser, s: &str) -> Line {
        match p.parse(s.as_bytes()) {
            Ok(Parsed::Request(l)) => l,
            other => panic!("{s}: {other:?}"),
        }
    }

    #[test]
    fn combined_with_extra_fields() {
        let p = parser(
            InputFormat::Combined,
            &["x-forwarded-for", "-", "x-api-key"],
        );
        let l = line(
            &p,
            r#"10.0.0.1 - - [10/Oct/2000:13:55:36 -0700] "POST /api/x?y=1 HTTP/1.1" 200 12 "-" "curl/8 \"q\"" "203.0.113.9, 10.0.0.2" "skip" "k\x22x""#,
        );
        assert_eq!(l.ts_ms, 971_211_336_000);
        assert_eq!(l.peer.ip().to_string(), "10.0.0.1");
        assert_eq!(l.req.method(), Method::POST);
        assert_eq!(l.req.uri(), "/api/x?y=1");
        let h = l.req.headers();
        assert_eq!(h["x-forwarded-for"], "203.0.113.9, 10.0.0.2");
        assert_eq!(h["x-api-key"], "k\"x");
        assert_eq!(h["host"], "api.test");
        assert_eq!(h.len(), 3);
    }

    #[test]
    fn combined_bad_lines_say_why() {
        let p = parser(InputFormat::Combined, &[]);
        for (s, why) in [
            ("garbage", "one field only"),
            ("1.2.3.4 - - [x] \"GET / HTTP/1.1\" 200 1", "time"),
            (
                "nope - - [10/Oct/2000:13:55:36 -0700] \"GET /\"",
                "IP address",
            ),
            (
                "1.2.3.4 - - [10/Oct/2000:13:55:36 -0700] \"-\" 400 0",
                "request line",
            ),
        ] {
            let e = p.parse(s.as_bytes()).unwrap_err();
            assert!(e.contains(why), "{s}: {e}");
        }
        // The common format reads when no extra field is wanted.
        let l = line(
            &p,
            "1.2.3.4 - - [10/Oct/2000:13:55:36 -0700] \"GET /a HTTP/1.0\" 200 1",
        );
        assert_eq!(l.req.uri(), "/a");
        let p = parser(InputFormat::Combined, &["x-api-key"]);
        let e = p
            .parse(
                b"1.2.3.4 - - [10/Oct/2000:13:55:36 -0700] \"GET /a HTTP/1.0\" 200 1 \"-\" \"ua\"",
            )
            .unwrap_err();
        assert!(e.contains("1 extra quoted field(s)"), "{e}");
    }

    #[test]
    fn jsonl_lines() {
        let p = parser(InputFormat::Jsonl, &[]);
        let l = line(
            &p,
            r#"{"ts": 1700000000123, "method": "PUT", "host": "h.test", "path": "/p", "peer": "192.0.2.1:4000", "headers": {"x-a": ["1", "2"], "x-b": "3"}}"#,
        );
        assert_eq!(l.ts_ms, 1_700_000_000_123);
        assert_eq!(l.peer.to_string(), "192.0.2.1:4000");
        assert_eq!(l.req.headers()["host"], "h.test");
        assert_eq!(l.req.headers().get_all("x-a").iter().count(), 2);
        let l = line(
            &p,
            r#"{"ts": "2023-11-14T22:13:20.5Z", "path": "/", "peer": "::1"}"#,
        );
        assert_eq!(l.ts_ms, 1_700_000_000_500);
        assert_eq!(l.req.method(), Method::GET);
        assert_eq!(l.req.headers()["host"], "api.test");
        let l = line(&p, r#"{"ts": 1700000000.25, "path": "/", "peer": "::1"}"#);
        assert_eq!(l.ts_ms, 1_700_000_000_250);
        assert!(p.parse(b"{\"ts\": 1}").is_err());
    }

    #[test]
    fn tollgate_lines() {
        let p = parser(InputFormat::Tollgate, &[]);
        let l = line(
            &p,
            r#"{"timestamp":"x","level":"INFO","fields":{"message":"request","route":"api","method":"GET","status":200,"identity":"api_key","decision":"allowed","ts":1700000000000,"peer":"10.0.0.1","client":"203.0.113.9","host":"api.test","path":"/api/a","caller":"00ff00ff00ff00ff"},"target":"tollgate::access"}"#,
        );
        assert_eq!(l.ts_ms, 1_700_000_000_000);
        assert_eq!(l.req.headers()["x-forwarded-for"], "203.0.113.9");
        assert_eq!(l.req.headers()["x-api-key"], "00ff00ff00ff00ff");
        assert!(matches!(
            p.parse(br#"{"fields":{"message":"listening"},"target":"tollgate::server"}"#),
            Ok(Parsed::Skip)
        ));
        let e = p
            .parse(
                br#"{"fields":{"message":"request","method":"GET"},"target":"tollgate::access"}"#,
            )
            .unwrap_err();
        assert!(e.contains("access_log.replay"), "{e}");
    }

    #[test]
    fn detection() {
        assert_eq!(detect(b"1.2.3.4 - - [...]"), InputFormat::Combined);
        assert_eq!(detect(br#"{"ts":1,"path":"/"}"#), InputFormat::Jsonl);
        assert_eq!(
            detect(br#"{"fields":{},"target":"tollgate::access"}"#),
            InputFormat::Tollgate
        );
    }
}
