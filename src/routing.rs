//! Route matching: host, path, method; the first route in file order wins.
//!
//! Routes are few, so matching is a linear scan over pre-compiled routes —
//! no allocation per request. Everything a route needs per request that
//! does not depend on the request (its `RateLimit-Policy` value, the key
//! prefix of each limit) is built here once, at load time.

use std::collections::HashMap;
use std::sync::Arc;

use http::{HeaderValue, Method};

use crate::config::{BodyField, Config, KeySource, KeySpec, Limit, PathMatch, Plan, Route};
use crate::headers;
use crate::store::keys;

/// A route with what is pre-computed for it.
#[derive(Debug)]
pub struct CompiledRoute {
    /// Position of the route in the configuration's `routes`.
    pub index: usize,
    /// The route as configured.
    pub route: Route,
    /// `RateLimit-Policy` value, when the route has limits and the header mode shows it.
    pub policy_header: Option<HeaderValue>,
    /// Per limit: the key suffix `:<route>:<limit>` (`:@<share>` for a
    /// shared limit) appended after the identity.
    pub key_suffixes: Vec<keys::KeySuffix>,
    /// For a route with `plan: true` limits: per plan name, the route's
    /// limits with each plan limit expanded into the plan's limits. Empty
    /// when no limit takes its numbers from a plan.
    pub plan_views: HashMap<Arc<str>, Arc<LimitView>>,
    /// The request-body fields its limits read (`json:FIELD` keys,
    /// `reserve: { json: FIELD }`); empty on a route whose limits read no
    /// body, which is then never read.
    pub body_reads: BodyReads,
}

/// The fields of a request's JSON body that a route's limits read, each
/// once.
#[derive(Debug, Default)]
pub struct BodyReads {
    /// String fields, for `json:FIELD` key sources.
    pub text: Vec<BodyField>,
    /// Counts, for `reserve: { json: FIELD }`.
    pub counts: Vec<BodyField>,
}

impl BodyReads {
    /// What `limits` read.
    fn of<'a>(limits: impl IntoIterator<Item = &'a Limit>) -> Self {
        let mut reads = Self::default();
        for l in limits {
            let keys = l.key.parts.iter().flatten();
            for source in keys {
                if let KeySource::Json(f) = source
                    && !reads.text.contains(f)
                {
                    reads.text.push(f.clone());
                }
            }
            if let Some(f) = &l.reserve_from
                && !reads.counts.contains(f)
            {
                reads.counts.push(f.clone());
            }
        }
        reads
    }

    /// Whether the route reads no field of the body.
    pub fn is_empty(&self) -> bool {
        self.text.is_empty() && self.counts.is_empty()
    }
}

/// The limits of a route as one caller sees them, ready to decide.
#[derive(Debug)]
pub struct LimitView {
    /// The limits.
    pub limits: Vec<Limit>,
    /// Key suffix per limit.
    pub key_suffixes: Vec<keys::KeySuffix>,
    /// `RateLimit-Policy` for these limits.
    pub policy_header: Option<HeaderValue>,
}

impl CompiledRoute {
    /// The limits a caller is asked, with their key suffixes: `view`'s
    /// (a plan's, or the caller's overrides') when there is one, else the
    /// route's own.
    pub fn limits_in<'a>(
        &'a self,
        view: Option<&'a LimitView>,
    ) -> (&'a [Limit], &'a [keys::KeySuffix]) {
        match view {
            Some(v) => (&v.limits, &v.key_suffixes),
            None => (&self.route.limits, &self.key_suffixes),
        }
    }
}

/// The route's limits with every `plan: true` limit replaced by `plan`'s
/// limits, keyed `:<route>:<limit>.<plan limit>` — without the plan's name,
/// so a caller moved to another plan keeps what it has used.
fn plan_view(config: &Config, route: &Route, plan: &Plan) -> LimitView {
    let mut limits = Vec::new();
    let mut key_suffixes = Vec::new();
    for l in &route.limits {
        if !l.plan {
            key_suffixes.push(key_suffix(config, &route.name, l));
            limits.push(l.clone());
            continue;
        }
        for pl in &plan.limits {
            let limit = Limit {
                name: pl.name.clone(),
                key: l.key.clone(),
                limit: pl.limit,
                window_ms: pl.window_ms,
                cost: l.cost,
                algorithm: pl.algorithm,
                sync: pl.sync,
                delay: pl.delay,
                plan: false,
                // A plan limit inherits the shadow flag of the limit it expands.
                shadow: l.shadow,
                concurrency: None,
                share: None,
                settle: l.settle.clone(),
                reserve_from: l.reserve_from.clone(),
            };
            let stored = Limit {
                name: Arc::from(format!("{}.{}", l.name, pl.name)),
                ..limit.clone()
            };
            key_suffixes.push(key_suffix(config, &route.name, &stored));
            limits.push(limit);
        }
    }
    LimitView {
        policy_header: headers::policy_header(config.headers, &limits),
        limits,
        key_suffixes,
    }
}

/// All routes of one configuration.
#[derive(Debug)]
pub struct Router {
    routes: Vec<Arc<CompiledRoute>>,
}

impl Router {
    /// Compiles the routes of `config`.
    pub fn new(config: &Config) -> Self {
        let mut routes: Vec<CompiledRoute> = config
            .routes
            .iter()
            .enumerate()
            .map(|(index, r)| CompiledRoute {
                index,
                policy_header: headers::policy_header(config.headers, &r.limits),
                key_suffixes: r
                    .limits
                    .iter()
                    .map(|l| key_suffix(config, &r.name, l))
                    .collect(),
                plan_views: if r.limits.iter().any(|l| l.plan) {
                    config
                        .plans
                        .iter()
                        .map(|p| (p.name.clone(), Arc::new(plan_view(config, r, p))))
                        .collect()
                } else {
                    HashMap::new()
                },
                route: r.clone(),
                body_reads: BodyReads::default(),
            })
            .collect();
        for c in &mut routes {
            let views = c.plan_views.values().flat_map(|v| v.limits.iter());
            c.body_reads = BodyReads::of(c.route.limits.iter().chain(views));
        }
        if config.store.digest_keys() {
            digest_suffixes(&mut routes);
        }
        Self {
            routes: routes.into_iter().map(Arc::new).collect(),
        }
    }

    /// Every route, in the configuration's order.
    pub fn routes(&self) -> &[Arc<CompiledRoute>] {
        &self.routes
    }

    /// The first route that takes a request with this method, host (without
    /// port) and path — the canonical ones of [`crate::target`], the path
    /// without `;parameters`.
    pub fn find(
        &self,
        method: &Method,
        host: Option<&str>,
        path: &str,
    ) -> Option<&Arc<CompiledRoute>> {
        self.routes.iter().find(|c| {
            let m = &c.route.matcher;
            (m.methods.is_empty() || m.methods.contains(method))
                && match (&m.host, host) {
                    (None, _) => true,
                    (Some(_), None) => false,
                    (Some(want), Some(got)) => host_matches(want, got),
                }
                && match &m.path {
                    PathMatch::Any => true,
                    PathMatch::Exact(p) => path_is(p, path),
                    PathMatch::Prefix(p) => path_has_prefix(p, path),
                }
        })
    }
}

/// Replaces every key suffix by its digest ([`keys::limit_digests`]).
fn digest_suffixes(routes: &mut [CompiledRoute]) {
    let names: Vec<String> = routes
        .iter()
        .flat_map(|r| {
            r.key_suffixes
                .iter()
                .chain(r.plan_views.values().flat_map(|v| v.key_suffixes.iter()))
        })
        .filter(|s| !keys::is_share(s))
        .map(|s| s.to_string())
        .collect();
    let digest = keys::limit_digests(names.iter().map(String::as_str));
    // A share's suffix stays as it is: its key depends on the share alone,
    // never on the rest of the file.
    let digest = |s: &mut keys::KeySuffix| {
        if !keys::is_share(s) {
            *s = s.written_as(digest(s));
        }
    };
    for r in routes {
        r.key_suffixes.iter_mut().for_each(digest);
        for v in r.plan_views.values_mut() {
            // Built just above: this is the only reference.
            if let Some(v) = Arc::get_mut(v) {
                v.key_suffixes.iter_mut().for_each(digest);
            }
        }
    }
}

fn key_suffix(config: &Config, route: &str, limit: &Limit) -> keys::KeySuffix {
    let text = match (&limit.share, limit.concurrency) {
        (Some(share), Some(_)) => keys::share_concurrency_suffix(share),
        (Some(share), None) => keys::share_suffix(share, limit.algorithm),
        (None, Some(_)) => keys::concurrency_suffix(route, &limit.name),
        (None, None) => keys::limit_suffix(route, &limit.name, limit.algorithm),
    };
    // Counted in process and keyed by the client IP alone: the limit's
    // number and the address, no text (`StoreKey::Address`). A share's
    // key, a concurrency slot's and a `sync` limit's are written out, as
    // every key Redis sees is.
    let by_address = config.store.redis.is_none()
        && limit.share.is_none()
        && limit.concurrency.is_none()
        && limit.sync.is_none()
        && is_ip_alone(&limit.key);
    keys::KeySuffix::new(&config.store.prefix, text, by_address)
}

/// Whether `spec` is the client IP alone (`key: ip`), whose identity
/// `identity::write_key` writes as `ip=<net>`.
fn is_ip_alone(spec: &KeySpec) -> bool {
    matches!(&spec.parts[..], [chain] if matches!(&chain[..], [KeySource::Ip]))
}

/// `want` is lower-case; `*.example.com` matches any subdomain (not the apex).
fn host_matches(want: &str, got: &str) -> bool {
    match want.strip_prefix('*') {
        Some(suffix) => {
            got.len() > suffix.len()
                && got.as_bytes()[got.len() - suffix.len()..]
                    .eq_ignore_ascii_case(suffix.as_bytes())
        }
        None => want.eq_ignore_ascii_case(got),
    }
}

/// Whether `path` (canonical, without `;parameters`) is the configured
/// `want`, give or take one trailing slash: `/login` and `/login/` are one
/// resource to most frameworks (Express, Spring before 6, Rails), so a
/// limit on one holds on the other.
fn path_is(want: &str, path: &str) -> bool {
    fn trim(p: &str) -> &str {
        if p.len() > 1 {
            p.strip_suffix('/').unwrap_or(p)
        } else {
            p
        }
    }
    trim(want) == trim(path)
}

/// Whether `path` starts with the configured `prefix`; a prefix that ends
/// in `/` also takes the path without that slash (`/admin/` takes
/// `/admin`, which frameworks serve as the same resource).
fn path_has_prefix(prefix: &str, path: &str) -> bool {
    path.starts_with(prefix)
        || prefix
            .strip_suffix('/')
            .is_some_and(|p| !p.is_empty() && p == path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts() {
        assert!(host_matches("api.example.com", "API.example.com"));
        assert!(host_matches("*.example.com", "a.example.com"));
        assert!(!host_matches("*.example.com", "example.com"));
    }

    #[test]
    fn trailing_slashes() {
        assert!(path_is("/login", "/login/"));
        assert!(path_is("/login/", "/login"));
        assert!(path_is("/", "/"));
        assert!(!path_is("/", "/a"));
        assert!(!path_is("/login", "/login//"));
        assert!(path_has_prefix("/admin/", "/admin"));
        assert!(path_has_prefix("/admin/", "/admin/users"));
        assert!(path_has_prefix("/admin", "/administrators"));
        assert!(!path_has_prefix("/admin/", "/admins"));
        assert!(path_has_prefix("/", "/"));
    }
}
