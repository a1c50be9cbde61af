//! The header rules `request_headers` / `response_headers`, at the top
//! level and on routes, and what each route gets of them and of `cors`: a
//! route's own `cors` or rules replace the top level's whole (they are not
//! merged field by field), and are resolved here, so the running gateway
//! reads one policy per route.
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

use super::check::{Check, Checked, Reported, parse_header_name};
use super::cors::{self, rate_limit_names};
use crate::config::file::{self, Field, Text};
use crate::config::position::child_key;
use crate::config::{Cors, HeaderMode, HeaderRules};

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
pub(super) struct RoutePolicies {
    pub(super) cors: Option<Arc<Cors>>,
    pub(super) request_headers: Option<Arc<HeaderRules>>,
    pub(super) response_headers: Option<Arc<HeaderRules>>,
}

/// The top level's `cors`, `request_headers` and `response_headers`.
#[derive(Debug, Default)]
pub(super) struct Defaults {
    pub(super) cors: Option<cors::CorsSpec>,
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
    /// The top level's `cors`, `request_headers` and `response_headers`.
    pub(super) fn top_policies(&mut self, root: &file::Root, facts: &Facts) -> Defaults {
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
    pub(super) fn route_policies(
        &mut self,
        route: &file::Route,
        path: &str,
        methods: &[Method],
        defaults: &Defaults,
        facts: &Facts,
    ) -> Checked<RoutePolicies> {
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
        Ok(RoutePolicies {
            cors: cors
                .map(|spec| Arc::new(cors::finish(spec, methods, facts.mode, &facts.request_id))),
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
    pub(super) fn routes_policies(
        &mut self,
        root: &file::Root,
        routes: &Checked<Vec<crate::config::Route>>,
        defaults: &Defaults,
        facts: &Facts,
    ) -> Checked<Vec<RoutePolicies>> {
        let Field::Valid(items) = &root.routes else {
            return Err(Reported);
        };
        let read: Vec<Checked<RoutePolicies>> = items
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
                self.route_policies(route, &path, methods, defaults, facts)
            })
            .collect();
        read.into_iter().collect()
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

/// The hop-by-hop headers (RFC 9110 §7.6.1), as the forwarder's
/// `proxy::HOP_HEADERS` names them (a test holds the two together; the
/// loader cannot import the forwarder, which imports the configuration).
pub(super) const HOP_BY_HOP: [&str; 6] = [
    "connection",
    "proxy-connection",
    "keep-alive",
    "te",
    "transfer-encoding",
    "upgrade",
];

/// Gives each route the CORS policy and header rules checked for it.
pub(super) fn attach(routes: &mut [crate::config::Route], policies: Vec<RoutePolicies>) {
    for (route, b) in routes.iter_mut().zip(policies) {
        route.cors = b.cors;
        route.request_headers = b.request_headers;
        route.response_headers = b.response_headers;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::load::cors::rate_limit_names;

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
