//! What a caller of the admin API sends, read and checked: the query of
//! `/admin/callers` and `DELETE /admin/overrides`, and the JSON body of
//! `PUT /admin/overrides`. Pure functions over bytes (the fuzz target
//! `admin_request` drives them); every refusal names the field at fault.

use std::net::IpAddr;
use std::time::Duration;

use http::{HeaderName, HeaderValue};
use serde_json::{Map, Value};

use crate::config::load::parse_duration;

/// The largest body `PUT /admin/overrides` reads.
pub const MAX_BODY: usize = 64 * 1024;

/// A refusal: the field at fault and why (a 400 problem+json).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {detail}")]
pub struct BadField {
    /// The query parameter or JSON field, or `body` for the body as a
    /// whole.
    pub field: String,
    /// What is wrong with it and what to write instead.
    pub detail: String,
}

/// The 400 naming `field`, with why.
pub(super) fn bad(field: impl Into<String>, detail: impl Into<String>) -> BadField {
    BadField {
        field: field.into(),
        detail: detail.into(),
    }
}

/// Which caller a request is about: the identity values it would present.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CallerFields {
    /// The client IP, as the gateway would resolve it.
    pub ip: Option<IpAddr>,
    /// The API key.
    pub api_key: Option<String>,
    /// The user.
    pub user: Option<String>,
    /// `header.NAME` values.
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// `json.FIELD` values: a string field of the request body, for
    /// `json:FIELD` keys.
    pub json: Vec<(String, String)>,
}

impl CallerFields {
    /// Whether no identity value was given.
    pub fn is_empty(&self) -> bool {
        self.ip.is_none()
            && self.api_key.is_none()
            && self.user.is_none()
            && self.headers.is_empty()
            && self.json.is_empty()
    }

    /// Takes `name=value` when `name` is a caller field; `Ok(false)` when it
    /// is not one.
    fn take(&mut self, name: &str, value: &str) -> Result<bool, BadField> {
        if value.is_empty() {
            return Err(bad(name, "is empty"));
        }
        let twice = || bad(name, "is given twice");
        match name {
            "ip" => {
                let ip = value
                    .parse()
                    .map_err(|_| bad(name, format!("{value:?} is not an IP address")))?;
                if self.ip.replace(ip).is_some() {
                    return Err(twice());
                }
            }
            "api_key" => {
                if self.api_key.replace(value.to_owned()).is_some() {
                    return Err(twice());
                }
            }
            "user" => {
                if self.user.replace(value.to_owned()).is_some() {
                    return Err(twice());
                }
            }
            _ if name.starts_with("json.") => {
                let field = &name["json.".len()..];
                if field.is_empty() {
                    return Err(bad(
                        name,
                        "names no field; write json.FIELD, e.g. json.model",
                    ));
                }
                if self.json.iter().any(|(f, _)| f == field) {
                    return Err(twice());
                }
                self.json.push((field.to_owned(), value.to_owned()));
            }
            _ => {
                let Some(header) = name.strip_prefix("header.") else {
                    return Ok(false);
                };
                let header = HeaderName::try_from(header)
                    .map_err(|_| bad(name, format!("{header:?} is not a header name")))?;
                let value =
                    HeaderValue::from_str(value).map_err(|_| bad(name, "is not a header value"))?;
                if self.headers.iter().any(|(h, _)| *h == header) {
                    return Err(twice());
                }
                self.headers.push((header, value));
            }
        }
        Ok(true)
    }

    /// The caller's fields for an audit line, an API key by its digest.
    pub fn describe(&self) -> String {
        let mut out = Vec::new();
        if let Some(ip) = self.ip {
            out.push(format!("ip={ip}"));
        }
        if let Some(k) = &self.api_key {
            out.push(format!("api_key={}", crate::identity::digest(k.as_bytes())));
        }
        if let Some(u) = &self.user {
            out.push(format!("user={u}"));
        }
        for (h, v) in &self.headers {
            out.push(format!("header.{h}={}", v.to_str().unwrap_or("?")));
        }
        for (f, v) in &self.json {
            out.push(format!("json.{f}={v}"));
        }
        out.join("&")
    }

    /// The one field an override is for; an error unless exactly one is
    /// given.
    pub fn subject(&self) -> Result<(String, String), BadField> {
        let mut all: Vec<(String, String)> = Vec::new();
        if let Some(v) = &self.api_key {
            all.push(("api_key".into(), v.clone()));
        }
        if let Some(v) = &self.user {
            all.push(("user".into(), v.clone()));
        }
        if let Some(v) = &self.ip {
            all.push(("ip".into(), v.to_string()));
        }
        for (h, v) in &self.headers {
            let v = v.to_str().unwrap_or_default().to_owned();
            all.push((format!("header.{h}"), v));
        }
        match all.len() {
            1 => Ok(all.remove(0)),
            0 => Err(bad("caller", NAME_A_CALLER)),
            _ => Err(bad(
                all[1].0.clone(),
                "an override is for one caller field; give only one of api_key, user, ip, header.NAME",
            )),
        }
    }
}

const NAME_A_CALLER: &str =
    "name a caller: ip, api_key, user or header.NAME (json.FIELD only beside one of them)";

/// The query of `/admin/callers` (and `DELETE /admin/overrides`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CallerQuery {
    /// The caller.
    pub caller: CallerFields,
    /// Only this route's limits.
    pub route: Option<String>,
    /// Only this limit (`name`, or `route/name`).
    pub limit: Option<String>,
}

impl CallerQuery {
    /// The route and the limit asked for: `limit=route/name` names both,
    /// else `route=` and `limit=` as given.
    pub fn route_and_limit(&self) -> (Option<&str>, Option<&str>) {
        match self.limit.as_deref().and_then(|l| l.split_once('/')) {
            Some((r, l)) => (Some(r), Some(l)),
            None => (self.route.as_deref(), self.limit.as_deref()),
        }
    }
}

/// Reads a query string (`ip=203.0.113.7&route=api`).
///
/// # Errors
/// [`BadField`] for an unknown parameter, one given twice, a value that
/// does not parse, or no caller field at all.
pub fn parse_query(query: &[u8]) -> Result<CallerQuery, BadField> {
    let mut out = CallerQuery::default();
    for (name, value) in form_urlencoded::parse(query) {
        if out.caller.take(&name, &value)? {
            continue;
        }
        let slot = match &*name {
            "route" => &mut out.route,
            "limit" => &mut out.limit,
            other => {
                return Err(bad(
                    other,
                    "unknown parameter; use ip, api_key, user, header.NAME, route or limit",
                ));
            }
        };
        if value.is_empty() {
            return Err(bad(&*name, "is empty"));
        }
        if slot.replace(value.into_owned()).is_some() {
            return Err(bad(&*name, "is given twice"));
        }
    }
    if out.caller.is_empty() {
        return Err(bad("caller", NAME_A_CALLER));
    }
    Ok(out)
}

/// What `PUT /admin/overrides` asks for, checked for shape (the limit and
/// plan names are checked against the configuration by the handler).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OverrideBody {
    /// The caller: exactly one field.
    pub caller: CallerFields,
    /// The limit (`name` or `route/name`); `None` for the whole caller.
    pub limit: Option<String>,
    /// A quota for the limit.
    pub quota: Option<u64>,
    /// A window for the limit.
    pub window: Option<Duration>,
    /// The plan to serve the caller by.
    pub plan: Option<String>,
    /// Not counted by the limit (or any limit).
    pub exempt: bool,
    /// How long the override stands; `None`: until removed.
    pub ttl: Option<Duration>,
}

/// Reads the JSON body of `PUT /admin/overrides`.
///
/// # Errors
/// [`BadField`] for a body over [`MAX_BODY`], bad JSON, an unknown field, a
/// value of the wrong kind, or a combination that says nothing or two
/// things at once.
pub fn parse_override(body: &[u8]) -> Result<OverrideBody, BadField> {
    if body.len() > MAX_BODY {
        return Err(bad("body", format!("is over {} KiB", MAX_BODY / 1024)));
    }
    let value: Value =
        serde_json::from_slice(body).map_err(|e| bad("body", format!("is not JSON: {e}")))?;
    let Value::Object(map) = value else {
        return Err(bad("body", "is not a JSON object"));
    };
    let mut out = OverrideBody::default();
    for (name, v) in &map {
        read_field(&mut out, name, v)?;
    }
    check_combination(&out, &map)?;
    Ok(out)
}

fn string<'v>(name: &str, v: &'v Value) -> Result<&'v str, BadField> {
    v.as_str().ok_or_else(|| bad(name, "is not a string"))
}

fn duration(name: &str, v: &Value) -> Result<Duration, BadField> {
    let d = parse_duration(string(name, v)?).map_err(|e| bad(name, e))?;
    if d.is_zero() {
        return Err(bad(name, "must be longer than 0"));
    }
    Ok(d)
}

fn read_field(out: &mut OverrideBody, name: &str, v: &Value) -> Result<(), BadField> {
    match name {
        "limit" => out.limit = Some(string(name, v)?.to_owned()),
        "plan" => out.plan = Some(string(name, v)?.to_owned()),
        "quota" => {
            out.quota = Some(
                v.as_u64()
                    .filter(|&q| q > 0)
                    .ok_or_else(|| bad(name, "is not a positive integer"))?,
            );
        }
        "window" => out.window = Some(duration(name, v)?),
        "ttl" => out.ttl = Some(duration(name, v)?),
        "exempt" => {
            out.exempt = v
                .as_bool()
                .ok_or_else(|| bad(name, "is not true or false"))?
        }
        _ => {
            let value = string(name, v);
            if !out.caller.take(name, value.as_ref().map_or("", |s| s))? {
                return Err(bad(
                    name,
                    "unknown field; use api_key, user, ip, header.NAME, limit, quota, window, plan, exempt or ttl",
                ));
            }
            value?;
        }
    }
    Ok(())
}

fn check_combination(out: &OverrideBody, map: &Map<String, Value>) -> Result<(), BadField> {
    out.caller.subject()?;
    let numbers = out.quota.is_some() || out.window.is_some();
    if !numbers && out.plan.is_none() && !out.exempt {
        return Err(bad(
            "body",
            "say what changes: quota and/or window, plan, or exempt: true",
        ));
    }
    if out.plan.is_some() && (out.limit.is_some() || numbers || out.exempt) {
        return Err(bad(
            "plan",
            "a plan is for the whole caller; leave out limit, quota, window and exempt",
        ));
    }
    if out.exempt && numbers {
        let field = if map.contains_key("quota") {
            "quota"
        } else {
            "window"
        };
        return Err(bad(
            field,
            "an exempt caller is not counted; leave out quota and window",
        ));
    }
    if numbers && out.limit.is_none() {
        return Err(bad(
            "limit",
            "quota and window are a limit's; name the limit",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries() {
        let q = parse_query(b"ip=203.0.113.7&api_key=k%201&header.X-Tenant=a&route=api").unwrap();
        assert_eq!(q.caller.ip, Some("203.0.113.7".parse().unwrap()));
        assert_eq!(q.caller.api_key.as_deref(), Some("k 1"));
        assert_eq!(q.caller.headers[0].0, "x-tenant");
        assert_eq!(q.route.as_deref(), Some("api"));
        assert_eq!(parse_query(b"ipp=1").unwrap_err().field, "ipp");
        assert_eq!(parse_query(b"ip=nope").unwrap_err().field, "ip");
        assert_eq!(parse_query(b"route=api").unwrap_err().field, "caller");
        assert_eq!(parse_query(b"user=a&user=b").unwrap_err().field, "user");
        assert_eq!(
            parse_query(b"header.a%20b=1").unwrap_err().field,
            "header.a b"
        );
    }

    #[test]
    fn bodies() {
        let o = parse_override(
            br#"{"api_key":"k1","limit":"per_key","quota":6,"window":"1m","ttl":"24h"}"#,
        )
        .unwrap();
        assert_eq!(o.quota, Some(6));
        assert_eq!(o.window, Some(Duration::from_secs(60)));
        assert_eq!(o.ttl, Some(Duration::from_secs(86_400)));
        assert_eq!(o.caller.subject().unwrap(), ("api_key".into(), "k1".into()));
        let field = |b: &[u8]| parse_override(b).unwrap_err().field;
        assert_eq!(field(br#"{"api_key":"k1","limit":"l","quota":0}"#), "quota");
        assert_eq!(
            field(br#"{"api_key":"k1","limit":"l","quota":"6"}"#),
            "quota"
        );
        assert_eq!(
            field(br#"{"api_key":"k1","limit":"l","quota":6,"colour":1}"#),
            "colour"
        );
        assert_eq!(field(br#"{"api_key":1,"exempt":true}"#), "api_key");
        assert_eq!(field(br#"{"limit":"l","quota":6}"#), "caller");
        assert_eq!(field(br#"{"api_key":"k1","quota":6}"#), "limit");
        assert_eq!(
            field(br#"{"api_key":"k1","plan":"pro","limit":"l"}"#),
            "plan"
        );
        assert_eq!(field(b"{nope"), "body");
        assert_eq!(field(&vec![b' '; MAX_BODY + 1]), "body");
        assert!(parse_override(br#"{"ip":"10.0.0.1","exempt":true}"#).is_ok());
    }
}
