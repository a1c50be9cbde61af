//! The combined format (nginx `combined`, Apache `%h %l %u %t "%r" %>s %b
//! "%{Referer}i" "%{User-agent}i"`), with extra quoted fields after the
//! user agent read as headers; the common format (no referer or user
//! agent) reads too when no extra field is wanted.

use std::borrow::Cow;
use std::net::SocketAddr;

use http::header::HOST;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Uri};

use super::line::{Line, ip};
use crate::simulate::time;

/// Reads one line. `fields` name the header of each extra quoted field
/// (`None`: skipped); `host` is the `Host` of every request that no
/// field gives one.
///
/// # Errors
/// What is wrong with the line, for the bad-lines report.
pub fn parse(
    b: &[u8],
    fields: &[Option<HeaderName>],
    host: Option<&HeaderValue>,
) -> Result<Line, String> {
    let sp = b.iter().position(|&c| c == b' ').ok_or("one field only")?;
    let peer = ip(&b[..sp])?;
    let (ts_ms, rest) = bracketed_time(&b[sp..])?;
    let (request, rest) = quoted(rest).ok_or("no quoted request line")?;
    let (method, target) = request_line(&request)?;
    let mut headers = HeaderMap::new();
    if !fields.is_empty() {
        extra_fields(rest, fields, &mut headers)?;
    }
    // `--host` unless a field named `host` gave one.
    if let Some(h) = host
        && !headers.contains_key(HOST)
    {
        headers.insert(HOST, h.clone());
    }
    Ok(Line::new(
        ts_ms,
        SocketAddr::new(peer, 0),
        method,
        target,
        headers,
    ))
}

/// The `[10/Oct/2000:13:55:36 -0700]` field, in ms since the epoch, and
/// what follows it.
fn bracketed_time(b: &[u8]) -> Result<(u64, &[u8]), String> {
    let open = b.iter().position(|&c| c == b'[').ok_or("no [time] field")?;
    let close = b[open..]
        .iter()
        .position(|&c| c == b']')
        .ok_or("no [time] field")?
        + open;
    let ts_ms = time::parse_clf(&b[open + 1..close]).ok_or_else(|| {
        format!(
            "time {:?} is not like 10/Oct/2000:13:55:36 -0700",
            String::from_utf8_lossy(&b[open + 1..close])
        )
    })?;
    Ok((ts_ms, &b[close + 1..]))
}

/// After the request line: status, size, referer, user agent, then one
/// quoted field per entry of `fields`, appended to `headers` (a field
/// logged as `-` or empty is absent).
fn extra_fields(
    rest: &[u8],
    fields: &[Option<HeaderName>],
    headers: &mut HeaderMap,
) -> Result<(), String> {
    let rest = skip_token(skip_token(rest));
    let (_, rest) = quoted(rest).ok_or("no quoted referer")?;
    let (_, mut rest) = quoted(rest).ok_or("no quoted user agent")?;
    for (i, name) in fields.iter().enumerate() {
        let (value, after) = quoted(rest).ok_or_else(|| {
            format!(
                "{} extra quoted field(s) named by --field, found {i}",
                fields.len()
            )
        })?;
        rest = after;
        let Some(name) = name else { continue };
        if *value == *b"-" || value.is_empty() {
            continue;
        }
        let v = HeaderValue::from_bytes(&value)
            .map_err(|_| format!("field {name} is not a header value"))?;
        headers.append(name.clone(), v);
    }
    Ok(())
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
    Some((Cow::Owned(unescape(raw)), rest))
}

/// A quoted field's bytes with `\"`, `\\` and `\xHH` undone.
fn unescape(raw: &[u8]) -> Vec<u8> {
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
    out
}
