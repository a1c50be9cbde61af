//! What browsers and support need: `request_id`, `cors` and the header
//! rules `request_headers` / `response_headers`, at the top level and on
//! routes. A route's own `cors` or rules replace the top level's whole
//! (they are not merged field by field), and are resolved here, so the
//! running gateway reads one policy per route.
//!
//! Header rules may not name what the gateway owns: `Host`, `Forwarded`,
//! `X-Forwarded-*`, the request-id header, the identity headers it reads
//! (the API key header, the trusted user header), hop-by-hop headers,
//! `Content-Length` (the framing), the rate-limit headers and
//! `Retry-After` (written by the limits, as `headers:` says) and
//! `Access-Control-*` (written by `cors:`).

use std::collections::BTreeMap;
use std::sync::Arc;

use http::{HeaderName, HeaderValue, Method};

use super::check::{Check, Checked, Reported, choice, parse_duration, text};
use super::routes::parse_method;
use crate::config::file::{self, Field, Flag, OneOrMany, Text};
use crate::config::position::child_key;
use crate::config::{Cors, CorsOrigins, HeaderMode, HeaderRules, KeepFrom, RequestIdConfig};

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

/// What the header rules and CORS need of the rest of the file.
#[derive(Debug, Clone)]
pub(super) struct Facts {
    /// `headers:`, whose names CORS exposes.
    pub(super) mode: HeaderMode,
    /// The request-id header.
    pub(super) request_id: HeaderName,
    /// Headers the gateway owns, which rules may not name.
    pub(super) owned: Vec<HeaderName>,
}

/// A route's CORS policy and header rules, resolved.
#[derive(Debug, Default)]
pub(super) struct RouteBrowsers {
    pub(super) cors: Option<Arc<Cors>>,
    pub(super) request_headers: Option<Arc<HeaderRules>>,
    pub(super) response_headers: Option<Arc<HeaderRules>>,
}

/// The top level's `cors`, `request_headers` and `response_headers`.
#[derive(Debug, Default)]
pub(super) struct Defaults {
    pub(super) cors: Option<CorsSpec>,
    pub(super) request_headers: Option<Arc<HeaderRules>>,
    pub(super) response_headers: Option<Arc<HeaderRules>>,
}

impl Facts {
    /// The names the gateway owns, given the identity headers it reads.
    pub(super) fn new(
        mode: HeaderMode,
        request_id: HeaderName,
        api_key: HeaderName,
        user: HeaderName,
    ) -> Self {
        let mut owned = vec![
            http::header::HOST,
            http::header::FORWARDED,
            http::header::CONTENT_LENGTH,
            request_id.clone(),
            api_key,
            user,
        ];
        owned.extend(HOP_BY_HOP.map(HeaderName::from_static));
        // The rate-limit headers of every style, and Retry-After: `headers:`
        // says which a response carries.
        for m in HeaderMode::SPELLINGS.map(|(_, m)| m) {
            owned.extend(
                rate_limit_names(m)
                    .iter()
                    .copied()
                    .map(HeaderName::from_static),
            );
        }
        owned.push(http::header::RETRY_AFTER);
        Self {
            mode,
            request_id,
            owned,
        }
    }

    /// Why a rule may not name `name`, if it may not.
    fn refuses(&self, name: &HeaderName) -> Option<&'static str> {
        let s = name.as_str();
        if s.starts_with("x-forwarded-") {
            return Some("is set by the gateway (X-Forwarded-*); a rule may not change it");
        }
        if s.starts_with("access-control-") {
            return Some("is a CORS header; write the route's cors: instead");
        }
        if name == self.request_id {
            return Some("is the request-id header, which the gateway sets");
        }
        if self.owned.contains(name) {
            return Some(
                "is owned by the gateway (Host, Forwarded, Content-Length, the identity headers it reads, hop-by-hop and rate-limit headers); a rule may not change it",
            );
        }
        None
    }
}

impl Check<'_> {
    /// `request_id: { header, keep_from }`.
    pub(super) fn request_id(
        &mut self,
        rid: &file::RequestId,
        path: &str,
    ) -> Checked<RequestIdConfig> {
        let header = self.optional(
            &rid.header,
            &child_key(path, "header"),
            text(parse_header_name),
        );
        let keep_from = self.optional(
            &rid.keep_from,
            &child_key(path, "keep_from"),
            choice(&KeepFrom::SPELLINGS),
        );
        let header = header?;
        if let Some(h) = &header
            && (h == http::header::HOST
                || h.as_str().starts_with("x-forwarded-")
                || HOP_BY_HOP.contains(&h.as_str()))
        {
            return Err(self.value_error(
                &child_key(path, "header"),
                format!("{h} is a header the gateway sets itself; name another, e.g. x-request-id"),
            ));
        }
        let defaults = RequestIdConfig::default();
        Ok(RequestIdConfig {
            header: header.unwrap_or(defaults.header),
            keep_from: keep_from?.unwrap_or(defaults.keep_from),
        })
    }

    /// The top level's `cors`, `request_headers` and `response_headers`.
    pub(super) fn browser_defaults(&mut self, root: &file::Root, facts: &Facts) -> Defaults {
        let cors = self.optional(&root.cors, "cors", Self::cors);
        let request_headers = self.optional(&root.request_headers, "request_headers", |c, v, p| {
            c.header_rules(v, p, facts)
        });
        let response_headers =
            self.optional(&root.response_headers, "response_headers", |c, v, p| {
                c.header_rules(v, p, facts)
            });
        Defaults {
            cors: cors.ok().flatten(),
            request_headers: request_headers.ok().flatten().map(Arc::new),
            response_headers: response_headers.ok().flatten().map(Arc::new),
        }
    }

    /// A route's own `cors` and rules, else the top level's, resolved
    /// against the route's methods.
    pub(super) fn route_browsers(
        &mut self,
        route: &file::Route,
        path: &str,
        methods: &[Method],
        defaults: &Defaults,
        facts: &Facts,
    ) -> Checked<RouteBrowsers> {
        let cors = self.optional(&route.cors, &child_key(path, "cors"), Self::cors);
        let request_headers = self.optional(
            &route.request_headers,
            &child_key(path, "request_headers"),
            |c, v, p| c.header_rules(v, p, facts),
        );
        let response_headers = self.optional(
            &route.response_headers,
            &child_key(path, "response_headers"),
            |c, v, p| c.header_rules(v, p, facts),
        );
        let cors = cors?.or_else(|| defaults.cors.clone());
        Ok(RouteBrowsers {
            cors: cors.map(|spec| Arc::new(finish(spec, methods, facts))),
            request_headers: request_headers?
                .map(Arc::new)
                .or_else(|| defaults.request_headers.clone()),
            response_headers: response_headers?
                .map(Arc::new)
                .or_else(|| defaults.response_headers.clone()),
        })
    }

    /// Every route's resolved `cors` and rules, in route order; checked
    /// even when other fields of the routes are wrong.
    pub(super) fn routes_browsers(
        &mut self,
        root: &file::Root,
        routes: &Checked<Vec<crate::config::Route>>,
        defaults: &Defaults,
        facts: &Facts,
    ) -> Checked<Vec<RouteBrowsers>> {
        let Field::Valid(items) = &root.routes else {
            return Err(Reported);
        };
        let read: Vec<Checked<RouteBrowsers>> = items
            .iter()
            .enumerate()
            .map(|(i, item)| {
                let Field::Valid(route) = item else {
                    return Err(Reported);
                };
                let methods = match routes {
                    Ok(r) => r.get(i).map(|r| &r.matcher.methods[..]).unwrap_or(&[]),
                    Err(_) => &[],
                };
                let path = crate::config::position::child_index("routes", i);
                self.route_browsers(route, &path, methods, defaults, facts)
            })
            .collect();
        read.into_iter().collect()
    }

    fn cors(&mut self, cors: &file::Cors, path: &str) -> Checked<CorsSpec> {
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

    /// `{ set, add, remove }`.
    fn header_rules(
        &mut self,
        rules: &file::HeaderRules,
        path: &str,
        facts: &Facts,
    ) -> Checked<HeaderRules> {
        let set = self.optional(&rules.set, &child_key(path, "set"), |c, m, p| {
            c.header_map(m, p, facts)
        });
        let add = self.optional(&rules.add, &child_key(path, "add"), |c, m, p| {
            c.header_map(m, p, facts)
        });
        let remove = self.optional(&rules.remove, &child_key(path, "remove"), |c, items, p| {
            c.each(items, p, |c, name: &Text, p| {
                let name = parse_header_name(&name.0).map_err(|m| c.value_error(p, m))?;
                match facts.refuses(&name) {
                    None => Ok(name),
                    Some(why) => Err(c.value_error(p, format!("{name} {why}"))),
                }
            })
        });
        Ok(HeaderRules {
            set: set?.unwrap_or_default(),
            add: add?.unwrap_or_default(),
            remove: remove?.unwrap_or_default(),
        })
    }

    /// `{ name: value, … }`: names reported at their key, values at theirs.
    fn header_map(
        &mut self,
        map: &BTreeMap<String, Field<Text>>,
        path: &str,
        facts: &Facts,
    ) -> Checked<Vec<(HeaderName, HeaderValue)>> {
        let read: Vec<Checked<(HeaderName, HeaderValue)>> = map
            .iter()
            .map(|(name, value)| {
                let p = child_key(path, name);
                let name = match parse_header_name(name) {
                    Ok(n) => self.owned_by(&n, &p, facts).map(|()| n),
                    Err(m) => {
                        let pos = self.positions.key(&p);
                        Err(self.push(&p, m, pos))
                    }
                };
                let value = match value {
                    Field::Absent => Err(self.value_error(&p, "needs a value")),
                    Field::Invalid(m) => Err(self.value_error(&p, m.clone())),
                    Field::Valid(Text(v)) => HeaderValue::from_str(v).map_err(|_| {
                        self.value_error(
                            &p,
                            format!("{v:?} is not a valid header value (no control characters or line breaks)"),
                        )
                    }),
                };
                Ok((name?, value?))
            })
            .collect();
        read.into_iter().collect()
    }

    /// Refuses, at its key, a name the gateway owns.
    fn owned_by(&mut self, name: &HeaderName, path: &str, facts: &Facts) -> Checked<()> {
        match facts.refuses(name) {
            None => Ok(()),
            Some(why) => {
                let pos = self.positions.key(path);
                Err(self.push(path, format!("{name} {why}"), pos))
            }
        }
    }
}

/// A spec met with a route's methods: the header values a policy sends.
pub(super) fn finish(spec: CorsSpec, route_methods: &[Method], facts: &Facts) -> Cors {
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
        expose_headers: expose_value(facts.mode, &facts.request_id, &spec.expose),
        max_age: spec.max_age,
    }
}

/// The hop-by-hop headers (RFC 9110 §7.6.1), as the forwarder's
/// `proxy::HOP_HEADERS` names them (a test holds the two together; the
/// loader cannot import the forwarder, which imports the configuration).
const HOP_BY_HOP: [&str; 6] = [
    "connection",
    "proxy-connection",
    "keep-alive",
    "te",
    "transfer-encoding",
    "upgrade",
];

/// The names of the rate-limit headers a response carries in `mode`, as
/// `headers` writes them (a test holds the two together).
fn rate_limit_names(mode: HeaderMode) -> &'static [&'static str] {
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

/// A header name, lower-cased; pseudo-headers and bad characters refused.
pub(super) fn parse_header_name(s: &str) -> Result<HeaderName, String> {
    HeaderName::from_bytes(s.as_bytes()).map_err(|_| {
        format!("{s:?} is not a header name (letters, digits and !#$%&'*+-.^_`|~ only)")
    })
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

/// Gives each route the CORS policy and header rules checked for it.
pub(super) fn attach(routes: &mut [crate::config::Route], browsers: Vec<RouteBrowsers>) {
    for (route, b) in routes.iter_mut().zip(browsers) {
        route.cors = b.cors;
        route.request_headers = b.request_headers;
        route.response_headers = b.response_headers;
    }
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

    #[test]
    fn lists_match_the_forwarder_and_the_header_renderer() {
        use crate::headers;
        let hop: Vec<&str> = crate::proxy::HOP_HEADERS
            .iter()
            .map(HeaderName::as_str)
            .collect();
        assert_eq!(hop, HOP_BY_HOP);
        let written = [
            (
                HeaderMode::Ietf,
                vec![&headers::RATELIMIT, &headers::RATELIMIT_POLICY],
            ),
            (
                HeaderMode::Github,
                vec![
                    &headers::X_LIMIT,
                    &headers::X_REMAINING,
                    &headers::X_USED,
                    &headers::X_RESET,
                    &headers::X_RESOURCE,
                ],
            ),
            (
                HeaderMode::Legacy,
                vec![
                    &headers::LEGACY_LIMIT,
                    &headers::LEGACY_REMAINING,
                    &headers::LEGACY_RESET,
                ],
            ),
            (HeaderMode::None, vec![]),
        ];
        for (mode, names) in written {
            let names: Vec<&str> = names.iter().map(|n| n.as_str()).collect();
            assert_eq!(rate_limit_names(mode), names, "{mode:?}");
        }
    }

    #[test]
    fn owned_names() {
        let facts = Facts::new(
            HeaderMode::Ietf,
            HeaderName::from_static("x-request-id"),
            HeaderName::from_static("x-api-key"),
            HeaderName::from_static("x-user"),
        );
        for name in [
            "host",
            "forwarded",
            "x-forwarded-for",
            "x-forwarded-prefix",
            "x-request-id",
            "x-api-key",
            "x-user",
            "connection",
            "te",
            "transfer-encoding",
            "content-length",
            "access-control-allow-origin",
        ] {
            assert!(
                facts.refuses(&HeaderName::from_static(name)).is_some(),
                "{name}"
            );
        }
        for name in ["x-gateway", "server", "authorization", "via"] {
            assert!(
                facts.refuses(&HeaderName::from_static(name)).is_none(),
                "{name}"
            );
        }
    }
}
