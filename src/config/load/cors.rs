//! `cors:` at the top level and on routes: the policy as checked
//! ([`CorsSpec`]), then met with a route's methods ([`finish`]) into the
//! header values it sends.

use http::{HeaderName, HeaderValue, Method};

use super::check::{Check, Checked, parse_duration, parse_header_name, text};
use super::routes::parse_method;
use crate::config::file::{self, Flag, OneOrMany, Text};
use crate::config::position::child_key;
use crate::config::{Cors, CorsOrigins, HeaderMode};

/// Methods a preflight is allowed when neither `allow_methods` nor the
/// route's `match.methods` names them.
const COMMON_METHODS: [Method; 6] = [
    Method::GET,
    Method::HEAD,
    Method::POST,
    Method::PUT,
    Method::PATCH,
    Method::DELETE,
];

/// A `cors:` mapping as checked, before it meets a route's methods.
#[derive(Debug, Clone)]
pub(super) struct CorsSpec {
    origins: CorsOrigins,
    credentials: bool,
    methods: Option<Vec<Method>>,
    allow_headers: Option<HeaderValue>,
    expose: Vec<HeaderName>,
    max_age: Option<HeaderValue>,
}

impl Check<'_> {
    pub(super) fn cors(&mut self, cors: &file::Cors, path: &str) -> Checked<CorsSpec> {
        let origins = self.required(&cors.allow_origins, path, "allow_origins", |c, v, p| {
            c.origins(v, p)
        });
        let methods = self.optional(
            &cors.allow_methods,
            &child_key(path, "allow_methods"),
            |c, items, p| c.each(items, p, text(parse_method)),
        );
        let allow_headers = self.optional(
            &cors.allow_headers,
            &child_key(path, "allow_headers"),
            |c, items, p| c.each(items, p, text(parse_header_name)),
        );
        let expose = self.optional(
            &cors.expose_headers,
            &child_key(path, "expose_headers"),
            |c, items, p| c.each(items, p, text(parse_header_name)),
        );
        let max_age = self.optional(
            &cors.max_age,
            &child_key(path, "max_age"),
            text(|s| {
                let d = parse_duration(s)?;
                Ok(HeaderValue::from(d.as_secs()))
            }),
        );
        let credentials_path = child_key(path, "allow_credentials");
        let credentials = self.optional(&cors.allow_credentials, &credentials_path, |_, f, _| {
            let Flag(b) = *f;
            Ok(b)
        });
        let origins = origins?;
        let credentials = credentials?.unwrap_or(false);
        if credentials && origins == CorsOrigins::Any {
            return Err(self.value_error(
                &credentials_path,
                "true cannot go with allow_origins \"*\": browsers refuse credentials from a wildcard origin; list the origins instead",
            ));
        }
        let allow_headers = allow_headers?.map(|names| join(&names));
        Ok(CorsSpec {
            origins,
            credentials,
            methods: methods?,
            allow_headers,
            expose: expose?.unwrap_or_default(),
            max_age: max_age?,
        })
    }

    /// `allow_origins`: `"*"` alone, or serialized origins.
    fn origins(&mut self, items: &OneOrMany<Text>, path: &str) -> Checked<CorsOrigins> {
        let read = self.each(items, path, text(parse_origin))?;
        if read.is_empty() {
            return Err(self.value_error(path, "needs at least one origin, or \"*\""));
        }
        let any = read.iter().any(Option::is_none);
        if any && read.len() > 1 {
            return Err(self.value_error(
                path,
                "\"*\" allows every origin; write it alone or list the origins",
            ));
        }
        if any {
            return Ok(CorsOrigins::Any);
        }
        Ok(CorsOrigins::List(read.into_iter().flatten().collect()))
    }
}

/// A spec met with a route's methods: the header values a policy sends.
pub(super) fn finish(
    spec: CorsSpec,
    route_methods: &[Method],
    mode: HeaderMode,
    request_id: &HeaderName,
) -> Cors {
    let methods: &[Method] = match &spec.methods {
        Some(m) => m,
        None if !route_methods.is_empty() => route_methods,
        None => &COMMON_METHODS,
    };
    let names: Vec<&str> = methods.iter().map(Method::as_str).collect();
    let allow_methods = HeaderValue::from_str(&names.join(", "))
        .unwrap_or_else(|_| HeaderValue::from_static("GET, HEAD, POST"));
    Cors {
        origins: spec.origins,
        allow_credentials: spec.credentials,
        allow_methods,
        allow_headers: spec.allow_headers,
        expose_headers: expose_value(mode, request_id, &spec.expose),
        max_age: spec.max_age,
    }
}

/// The names of the rate-limit headers a response carries in `mode`, as
/// `headers` writes them (a test holds the two together).
pub(super) fn rate_limit_names(mode: HeaderMode) -> &'static [&'static str] {
    match mode {
        HeaderMode::Ietf => &["ratelimit", "ratelimit-policy"],
        HeaderMode::Github => &[
            "x-ratelimit-limit",
            "x-ratelimit-remaining",
            "x-ratelimit-used",
            "x-ratelimit-reset",
            "x-ratelimit-resource",
        ],
        HeaderMode::Legacy => &["ratelimit-limit", "ratelimit-remaining", "ratelimit-reset"],
        HeaderMode::None => &[],
    }
}

/// `Access-Control-Expose-Headers` for `mode`: its rate-limit headers,
/// `Retry-After`, the request-id header and `extra`, without repeats.
fn expose_value(mode: HeaderMode, request_id: &HeaderName, extra: &[HeaderName]) -> HeaderValue {
    let mut names: Vec<&str> = rate_limit_names(mode).to_vec();
    names.push("retry-after");
    names.push(request_id.as_str());
    for n in extra {
        if !names.contains(&n.as_str()) {
            names.push(n.as_str());
        }
    }
    // Header names are tokens, so the joined list is a valid value.
    HeaderValue::from_str(&names.join(", "))
        .unwrap_or_else(|_| HeaderValue::from_static("retry-after"))
}

/// Names joined with `, `: empty for none (`allow_headers: []` allows no
/// header beyond the CORS-safelisted ones, and none is sent).
fn join(names: &[HeaderName]) -> HeaderValue {
    let all: Vec<&str> = names.iter().map(HeaderName::as_str).collect();
    // Header names are tokens, so the joined list is a valid value.
    HeaderValue::from_str(&all.join(", ")).unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// `"*"` (`None`) or a serialized origin, `scheme://host[:port]`,
/// lower-cased.
fn parse_origin(s: &str) -> Result<Option<String>, String> {
    if s == "*" {
        return Ok(None);
    }
    let example = "write e.g. https://app.example.com, or \"*\"";
    let lower = s.to_ascii_lowercase();
    let rest = lower
        .strip_prefix("https://")
        .or_else(|| lower.strip_prefix("http://"))
        .ok_or_else(|| format!("{s:?} is not an origin (http:// or https://); {example}"))?;
    if rest.ends_with('/') {
        return Err(format!(
            "{s:?} ends with /; an origin has no path: write {:?}",
            s.trim_end_matches('/')
        ));
    }
    let ok = !rest.is_empty()
        && rest.parse::<http::uri::Authority>().is_ok()
        && !rest.contains(['@', '/', '?', '#', '*']);
    if !ok {
        return Err(format!("{s:?} is not an origin; {example}"));
    }
    Ok(Some(lower))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins() {
        assert_eq!(parse_origin("*"), Ok(None));
        assert_eq!(
            parse_origin("https://App.Example.com:8443"),
            Ok(Some("https://app.example.com:8443".into()))
        );
        for bad in [
            "app.example.com",
            "https://app.example.com/",
            "https://app.example.com/x",
            "ftp://x",
            "https://",
            "https://*.example.com",
            "https://u@x",
        ] {
            assert!(parse_origin(bad).is_err(), "{bad}");
        }
    }
}
