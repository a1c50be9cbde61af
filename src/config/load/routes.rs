//! The `routes` section: each route's name, `match` (host, path, methods),
//! action (`upstream` with its timeout, CA, upgrade and proxy-credential
//! settings, or a local `respond`), cost, failure policy, shadow flag and
//! `max_queue` (how many may wait for `on_limit: delay` limits).
//! Its `limits` are read by [`limits`](super::limits).

use std::sync::Arc;
use std::time::Duration;

use http::{HeaderValue, Method, StatusCode, Uri};

use super::check::{Check, Checked, Reported, choice, int, leaf, parse_timeout, positive, text};
use crate::config::file::{self, Field, Flag, Text};
use crate::config::position::child_key;
use crate::config::{
    Action, OnError, PathMatch, Respond, Route, RouteMatch, TargetScheme, Upstream, UpstreamPool,
};
use crate::target::{EscapedSlashes, PathRules};

/// How many requests of a route may wait at once on one gateway for its
/// `on_limit: delay` limits when `max_queue` is not written.
pub const DEFAULT_MAX_QUEUE: usize = 100;

/// The pools routes may name: as written (to tell an unknown name from a
/// pool with errors) and as checked.
pub(super) struct Pools<'a> {
    pub(super) written: Vec<&'a str>,
    pub(super) checked: Vec<Arc<UpstreamPool>>,
}

impl Check<'_> {
    pub(super) fn routes(
        &mut self,
        routes: &[Field<file::Route>],
        path: &str,
        default_timeout: Duration,
        pools: &Pools<'_>,
    ) -> Checked<Vec<Route>> {
        if routes.is_empty() {
            return Err(self.value_error(path, "needs at least one route"));
        }
        let checked = self.list(routes, path, |check, route, path| {
            check.route(route, path, default_timeout, pools)
        });
        let unique = self.unique(routes, |route| &route.name, path, "route name");
        unique?;
        if let Ok(routes) = &checked {
            self.shares(routes, path)?;
        }
        checked
    }

    fn route(
        &mut self,
        route: &file::Route,
        path: &str,
        default_timeout: Duration,
        pools: &Pools<'_>,
    ) -> Checked<Route> {
        let name = self.required(&route.name, path, "name", text(parse_route_name));
        let matcher = self.optional(&route.matcher, &child_key(path, "match"), Self::matcher);
        let action = self.action(route, path, default_timeout, pools);
        let cost = self.optional(&route.cost, &child_key(path, "cost"), positive);
        let limits = self.optional(
            &route.limits,
            &child_key(path, "limits"),
            |check, limits, path| check.limits(limits, path),
        );
        let on_error = self.optional(
            &route.on_error,
            &child_key(path, "on_error"),
            choice(&OnError::SPELLINGS),
        );
        let shadow = self.optional(
            &route.shadow,
            &child_key(path, "shadow"),
            leaf(|&Flag(b): &Flag| Ok::<_, String>(b)),
        );
        let exempt = self.optional(&route.exempt, &child_key(path, "exempt"), Self::exempt);
        let max_queue = self.optional(
            &route.max_queue,
            &child_key(path, "max_queue"),
            |c, v, p| {
                let n = int(0, 1_000_000)(c, v, p)?;
                usize::try_from(n).map_err(|_| Reported)
            },
        );
        Ok(Route {
            name: name?,
            matcher: matcher?.unwrap_or_default(),
            action: action?,
            cost: cost?.unwrap_or(1),
            limits: limits?.unwrap_or_default(),
            shadow: shadow?.unwrap_or(false),
            on_error: on_error?,
            max_queue: max_queue?.unwrap_or(DEFAULT_MAX_QUEUE),
            // Resolved with the top level's defaults once every route is
            // read (`header_rules.rs`).
            cors: None,
            request_headers: None,
            response_headers: None,
            // The top level's, when the route has none, once every route
            // is read (`exempt.rs`).
            exempt: exempt?.map(Arc::new),
        })
    }

    /// `upstream` (with its optional `timeout`) or `respond`, exactly one.
    fn action(
        &mut self,
        route: &file::Route,
        path: &str,
        default_timeout: Duration,
        pools: &Pools<'_>,
    ) -> Checked<Action> {
        let upstream_path = child_key(path, "upstream");
        let respond_path = child_key(path, "respond");
        let timeout_path = child_key(path, "timeout");
        let upstream = self.optional(&route.upstream, &upstream_path, |check, t, path| {
            check.destination(t, path, pools)
        });
        let named_pool = matches!(&upstream, Ok(Some((_, Some(_)))));
        if named_pool && matches!(route.upgrade, Field::Valid(file::Flag(true))) {
            let up_path = child_key(path, "upgrade");
            let pos = self.positions.key(&up_path);
            self.push(
                &up_path,
                "applies only to URL upstreams; a pool does not pass upgrades through",
                pos,
            );
        }
        if named_pool && !route.upstream_ca.is_absent() {
            let ca_path = child_key(path, "upstream_ca");
            let pos = self.positions.key(&ca_path);
            self.push(
                &ca_path,
                "applies only to URL upstreams; a pool's https targets take the pool's ca",
                pos,
            );
        }
        let respond = self.optional(&route.respond, &respond_path, Self::respond);
        let timeout = self.optional(&route.timeout, &timeout_path, text(parse_timeout));
        let ca_path = child_key(path, "upstream_ca");
        let is_https =
            matches!(&route.upstream, Field::Valid(Text(u)) if u.starts_with("https://"));
        let tls = self.optional(&route.upstream_ca, &ca_path, |check, ca, path| {
            check.upstream_ca(ca, path, is_https)
        });
        let is_h2c = matches!(&route.upstream, Field::Valid(Text(u)) if u.starts_with("h2c://"));
        let upgrade = self.optional(&route.upgrade, &child_key(path, "upgrade"), |c, b, p| {
            if is_h2c && b.0 {
                // HTTP/2 has no Upgrade (RFC 9113 §8.6).
                return Err(c.value_error(
                    p,
                    "an h2c:// upstream speaks HTTP/2, which cannot pass an Upgrade; use http:// for this route",
                ));
            }
            Ok(*b)
        });
        let forward_proxy_authorization = self.optional(
            &route.forward_proxy_authorization,
            &child_key(path, "forward_proxy_authorization"),
            |_, b, _| Ok(*b),
        );
        self.one_action(route, path)?;
        match (upstream?, respond?) {
            (Some((uri, pool)), _) => Ok(Action::Upstream(Upstream {
                uri,
                pool,
                timeout: timeout?.unwrap_or(default_timeout),
                tls: tls?,
                upgrade: upgrade?.is_some_and(|file::Flag(b)| b),
                forward_proxy_authorization: forward_proxy_authorization?
                    .is_some_and(|file::Flag(b)| b),
            })),
            (None, Some(respond)) => Ok(Action::Respond(respond)),
            // Both absent is reported by `one_action`.
            (None, None) => Err(Reported),
        }
    }

    /// `upstream:` — a URL, or the name of a pool (its first target's URL
    /// stands for the pool where one URL is needed).
    fn destination(
        &mut self,
        written: &Text,
        path: &str,
        pools: &Pools<'_>,
    ) -> Checked<(Uri, Option<Arc<UpstreamPool>>)> {
        let s = written.0.as_str();
        if super::upstreams::is_url(s) || !pools.written.contains(&s) && s.contains(':') {
            return text(parse_upstream)(self, written, path).map(|u| (u, None));
        }
        if !pools.written.contains(&s) {
            let known = if pools.written.is_empty() {
                "no pools are defined under upstreams".to_owned()
            } else {
                format!("the pools are {}", pools.written.join(", "))
            };
            return Err(self.value_error(
                path,
                format!("{s:?} is neither a URL nor a pool under upstreams ({known}); write e.g. http://127.0.0.1:9000 or a pool's name"),
            ));
        }
        // A pool with errors of its own has reported them.
        let pool = pools
            .checked
            .iter()
            .find(|p| &*p.name == s)
            .ok_or(Reported)?;
        let first = pool.targets.first().ok_or(Reported)?;
        let scheme = match first.scheme {
            TargetScheme::Http => "http",
            TargetScheme::Https => "https",
            TargetScheme::H2c => "h2c",
        };
        let uri = format!("{scheme}://{}", first.authority)
            .parse()
            .map_err(|_| Reported)?;
        Ok((uri, Some(pool.clone())))
    }

    /// `upstream_ca`: a CA file for an `https://` upstream, read now (a
    /// path relative to the configuration file's directory).
    fn upstream_ca(
        &mut self,
        ca: &Text,
        path: &str,
        is_https: bool,
    ) -> Checked<Arc<tokio_rustls::rustls::ClientConfig>> {
        if !is_https {
            return Err(self.value_error(
                path,
                "applies only to https:// upstreams; remove it or use https://",
            ));
        }
        crate::tls::client_config(Some(&self.file(&ca.0)))
            .map_err(|e| self.value_error(path, e.to_string()))
    }

    /// Exactly one of `upstream` and `respond`, and the upstream-only
    /// fields only beside `upstream`.
    fn one_action(&mut self, route: &file::Route, path: &str) -> Checked<()> {
        let respond_path = child_key(path, "respond");
        let timeout_path = child_key(path, "timeout");
        let has_upstream = !route.upstream.is_absent();
        let has_respond = !route.respond.is_absent();
        if has_upstream && has_respond {
            let pos = self.positions.key(&respond_path);
            return Err(self.push(path, "set either upstream or respond, not both", pos));
        }
        if !has_upstream && !has_respond {
            let pos = self.positions.value(path);
            return Err(self.push(
                path,
                "missing upstream or respond; a route forwards to an upstream or answers itself",
                pos,
            ));
        }
        for (field, name) in [
            (!route.upstream_ca.is_absent(), "upstream_ca"),
            (!route.upgrade.is_absent(), "upgrade"),
            (
                !route.forward_proxy_authorization.is_absent(),
                "forward_proxy_authorization",
            ),
        ] {
            if has_respond && field {
                let pos = self.positions.key(&child_key(path, name));
                return Err(self.push(
                    &child_key(path, name),
                    "applies only to routes with an upstream; remove it or use upstream",
                    pos,
                ));
            }
        }
        if has_respond && !route.timeout.is_absent() {
            let pos = self.positions.key(&timeout_path);
            return Err(self.push(
                &timeout_path,
                "applies only to routes with an upstream; remove it or use upstream",
                pos,
            ));
        }
        Ok(())
    }

    fn matcher(&mut self, matcher: &file::Match, path: &str) -> Checked<RouteMatch> {
        let host = self.optional(&matcher.host, &child_key(path, "host"), text(parse_host));
        let exact = self.optional(
            &matcher.path,
            &child_key(path, "path"),
            text(parse_url_path),
        );
        let prefix_path = child_key(path, "path_prefix");
        let prefix = self.optional(&matcher.path_prefix, &prefix_path, text(parse_url_path));
        let methods = self.optional(
            &matcher.methods,
            &child_key(path, "methods"),
            |check, items, path| check.each(items, path, text(parse_method)),
        );
        let path_match = match (exact?, prefix?) {
            (Some(_), Some(_)) => {
                let pos = self.positions.key(&prefix_path);
                return Err(self.push(path, "set either path or path_prefix, not both", pos));
            }
            (Some(exact), None) => PathMatch::Exact(exact),
            (None, Some(prefix)) => PathMatch::Prefix(prefix),
            (None, None) => PathMatch::Any,
        };
        Ok(RouteMatch {
            host: host?,
            path: path_match,
            methods: methods?.unwrap_or_default(),
        })
    }

    fn respond(&mut self, respond: &file::Respond, path: &str) -> Checked<Respond> {
        let status = self.optional(
            &respond.status,
            &child_key(path, "status"),
            |check, status, path| {
                let code = int(100, 599)(check, status, path)?;
                u16::try_from(code)
                    .ok()
                    .and_then(|c| StatusCode::from_u16(c).ok())
                    .ok_or_else(|| check.value_error(path, "is not an HTTP status code"))
            },
        );
        let body = self.optional(
            &respond.body,
            &child_key(path, "body"),
            text(|s| Ok(bytes::Bytes::from(s.to_owned()))),
        );
        let content_type = self.optional(
            &respond.content_type,
            &child_key(path, "content_type"),
            text(parse_content_type),
        );
        let defaults = Respond::default();
        Ok(Respond {
            status: status?.unwrap_or(defaults.status),
            body: body?.unwrap_or(defaults.body),
            content_type: content_type?.unwrap_or(defaults.content_type),
        })
    }
}

fn parse_route_name(s: &str) -> Result<Arc<str>, String> {
    if s.is_empty() {
        return Err("must not be empty".to_owned());
    }
    Ok(Arc::from(s))
}

/// `api.example.com` or `*.example.com`, lower-cased, without port.
fn parse_host(s: &str) -> Result<String, String> {
    let host = s.to_ascii_lowercase();
    let name = host.strip_prefix("*.").unwrap_or(&host);
    let label_ok = |label: &str| {
        !label.is_empty()
            && label
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_'))
    };
    if name.split('.').all(label_ok) {
        Ok(host)
    } else {
        Err(format!(
            "{s:?} is not a host name; write e.g. api.example.com or *.example.com, without scheme, port or path"
        ))
    }
}

fn parse_url_path(s: &str) -> Result<String, String> {
    if !s.starts_with('/') {
        return Err(format!("{s:?} does not start with /; write \"/{s}\""));
    }
    if s.parse::<http::uri::PathAndQuery>().is_err() || s.contains('?') {
        return Err(format!(
            "{s:?} is not a URL path; write e.g. /api/ (no spaces or query)"
        ));
    }
    if s.contains(';') {
        return Err(format!(
            "{s:?} holds ;parameters, which are removed from request paths before routes match; leave them out"
        ));
    }
    // Requests are matched in canonical form, so a route is written in it.
    // `%2F` stays what it is: it only matches under `escaped_slashes: keep`.
    let rules = PathRules {
        escaped_slashes: EscapedSlashes::Keep,
        ..PathRules::default()
    };
    match crate::target::canonical_path(s, &rules) {
        Ok(c) if c == s => Ok(s.to_owned()),
        Ok(c) => Err(format!(
            "{s:?} is not in the canonical form requests are matched in; write {c:?}"
        )),
        Err(e) => Err(format!("{s:?}: {e}")),
    }
}

const METHODS: [Method; 9] = [
    Method::GET,
    Method::HEAD,
    Method::POST,
    Method::PUT,
    Method::DELETE,
    Method::PATCH,
    Method::OPTIONS,
    Method::TRACE,
    Method::CONNECT,
];

/// One of the methods of RFC 9110 §9 and PATCH, in any case. Extension
/// methods are refused: in a config file they are far more likely typos.
pub(super) fn parse_method(s: &str) -> Result<Method, String> {
    let upper = s.to_ascii_uppercase();
    METHODS
        .iter()
        .find(|m| m.as_str() == upper)
        .cloned()
        .ok_or_else(|| {
            let names: Vec<&str> = METHODS.iter().map(Method::as_str).collect();
            format!(
                "{s:?} is not an HTTP method; expected one of {}",
                names.join(", ")
            )
        })
}

/// `http://host[:port][/base]`, `https://…` or `h2c://…` (HTTP/2 with
/// prior knowledge, cleartext).
fn parse_upstream(s: &str) -> Result<Uri, String> {
    let example = "e.g. http://127.0.0.1:9000";
    if !s.contains("://") {
        return Err(format!("{s:?} has no scheme; write http://{s}"));
    }
    let uri: Uri = s
        .parse()
        .map_err(|_| format!("{s:?} is not a URL; write {example}"))?;
    match uri.scheme_str() {
        Some("http" | "https" | "h2c") => {}
        Some(other) => {
            return Err(format!(
                "{s:?} has unsupported scheme {other:?}; write {example} (HTTP/1.1), https://… (TLS) or h2c://… (cleartext HTTP/2)"
            ));
        }
        None => return Err(format!("{s:?} is not a URL; write {example}")),
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(format!("{s:?} has no host; write {example}"));
    }
    if uri.query().is_some() {
        return Err(format!(
            "{s:?} has a query; an upstream takes a base path only"
        ));
    }
    Ok(uri)
}

fn parse_content_type(s: &str) -> Result<HeaderValue, String> {
    HeaderValue::from_str(s).map_err(|_| format!("{s:?} is not a valid header value"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_methods_upstreams() {
        assert_eq!(parse_host("*.Example.COM"), Ok("*.example.com".into()));
        assert!(parse_host("a.example.com:80").is_err());
        assert!(parse_host("a.*.com").is_err());
        assert_eq!(parse_method("post"), Ok(Method::POST));
        assert!(parse_method("GTE").is_err());
        assert!(parse_upstream("http://127.0.0.1:9000/base").is_ok());
        assert!(parse_upstream("https://x").is_ok());
        assert!(parse_upstream("h2c://10.0.0.5:50051").is_ok());
        assert!(parse_upstream("ftp://x").is_err());
        assert!(parse_upstream("http:///x").is_err());
        assert!(parse_upstream("127.0.0.1:9000").is_err());
        assert!(parse_upstream("http://x/?q=1").is_err());
    }
}
