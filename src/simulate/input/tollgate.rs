//! tollgate's own JSON access log, written with `access_log.replay: true`:
//! `tracing-subscriber`'s JSON shape, the event's fields under `fields` (or
//! flattened at the top level). Other events in the file are skipped. The
//! client IP becomes `X-Forwarded-For` when it differs from the peer, the
//! caller digest stands in for the API key or user header, the request
//! body's fields (`json`) are what the limits read of it, and the amounts
//! its response body reported (`settled`) settle the replayed reservations.

use std::borrow::Cow;
use std::net::{IpAddr, SocketAddr};

use http::{HeaderMap, HeaderName, HeaderValue};
use serde::Deserialize;

use super::line::{Parts, ip};
use crate::decision::settle::Reported;
use crate::identity::render_ip;
use crate::pipeline::exchange::json_read;
use crate::proxy::X_FORWARDED_FOR;

/// Reads one line: `None` for another event than a request. The caller
/// digest goes in `api_key_header` or `user_header`, by identity kind.
///
/// # Errors
/// What is wrong with the line, for the bad-lines report.
pub fn parse<'a>(
    b: &'a [u8],
    api_key_header: &HeaderName,
    user_header: &HeaderName,
) -> Result<Option<Parts<'a>>, String> {
    let v: TollgateEvent<'_> = serde_json::from_slice(b).map_err(|e| format!("not JSON: {e}"))?;
    if v.target.as_deref().is_some_and(|t| t != "tollgate::access") {
        return Ok(None);
    }
    let f = v.fields.unwrap_or(v.flat);
    let Some(ts_ms) = f.ts else {
        // An access line without the replay fields, or another event.
        return if f.method.is_some() {
            Err("no replay fields: the gateway wrote it without access_log.replay: true".into())
        } else {
            Ok(None)
        };
    };
    let peer_ip = ip(f.peer.as_deref().ok_or("no peer")?.as_bytes())?;
    let headers = headers(&f, peer_ip, api_key_header, user_header)?;
    let mut extensions = http::Extensions::new();
    if let Some(json) = f.json.as_deref() {
        extensions.insert(json_read(json)?);
    }
    if let Some(settled) = f.settled.as_deref() {
        extensions.insert(Reported::parse(settled)?);
    }
    let path = f.path.ok_or("no path")?;
    Ok(Some(Parts {
        ts_ms,
        peer: SocketAddr::new(peer_ip, 0),
        method: f.method,
        host: f.host,
        path,
        headers,
        extensions,
    }))
}

/// The headers an access line stands for: `X-Forwarded-For` when the
/// client is not the peer, the caller digest under the header of its kind.
fn headers(
    f: &AccessFields<'_>,
    peer_ip: IpAddr,
    api_key_header: &HeaderName,
    user_header: &HeaderName,
) -> Result<HeaderMap, String> {
    let mut headers = HeaderMap::new();
    if let Some(client) = f.client.as_deref() {
        let client = ip(client.as_bytes())?;
        if client != peer_ip {
            let text = HeaderValue::from_bytes(render_ip(client, &mut [0u8; 48]));
            headers.insert(X_FORWARDED_FOR.clone(), text.map_err(|e| e.to_string())?);
        }
    }
    if let Some(caller) = f.caller.as_deref() {
        let name = match f.identity.as_deref() {
            Some("api_key") => api_key_header,
            Some("user") => user_header,
            other => return Err(format!("a caller digest with identity {other:?}")),
        };
        let v = HeaderValue::from_str(caller).map_err(|_| "caller is not a header value")?;
        headers.insert(name.clone(), v);
    }
    Ok(headers)
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
    #[serde(borrow, default)]
    json: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    settled: Option<Cow<'a, str>>,
}
