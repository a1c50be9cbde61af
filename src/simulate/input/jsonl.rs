//! JSON lines: `{"ts": …, "method": "GET", "host": "…", "path": "/…",
//! "peer": "192.0.2.7", "headers": {"x-api-key": "…"}}`, `ts` in
//! milliseconds since the epoch (a number under 10^11 is seconds) or an
//! RFC 3339 string, a header's value one string or a list of them.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};

use http::{HeaderMap, HeaderName, HeaderValue};
use serde::Deserialize;

use super::line::Parts;
use crate::simulate::time;

/// Reads one line.
///
/// # Errors
/// What is wrong with the line, for the bad-lines report.
pub fn parse(b: &[u8]) -> Result<Parts<'_>, String> {
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
    Ok(Parts {
        ts_ms,
        peer,
        method: j.method,
        host: j.host,
        path: j.path,
        headers,
        extensions: http::Extensions::new(),
    })
}

/// An IP, or an IP and port.
fn peer(s: &str) -> Result<SocketAddr, String> {
    s.parse::<SocketAddr>()
        .or_else(|_| s.parse::<IpAddr>().map(|ip| SocketAddr::new(ip, 0)))
        .map_err(|_| format!("peer {s:?} is not an IP address"))
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
    headers: BTreeMap<String, OneOrMany<'a>>,
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
