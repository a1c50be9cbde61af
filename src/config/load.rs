//! File structs → validated [`Config`]: stage two of loading.
//!
//! [`parse_str`] reads the text into a [`yaml_serde::Value`] (a syntax error
//! is the one error it reports alone), expands the `${VAR}` references of
//! its scalars (`environment.rs`), reads that into the
//! [`file`](mod@super::file) structs, and then walks them with a `Check` that
//! knows the field path of every node. Each rule that fails records a
//! [`ConfigError`] with that path and the position found in the
//! `Positions` index, and validation carries on: every check of a struct
//! runs before its results are combined, so one bad field never hides
//! another. Only when nothing was recorded is the [`Config`] returned.
//!
//! Positions: a value error points at the value, an unknown field at its
//! key, a missing field at the mapping that lacks it. Errors are sorted by
//! position, so they read top to bottom like the file.
//!
//! One file per section of the YAML. A section's checks read only their own
//! part of the file and build only their own types; plans borrow the limit
//! rules of `limits.rs`.
//!
//! | `load/` | reads |
//! |---|---|
//! | `advice.rs` | nothing of the file: the warnings `tollgate check` prints for a valid configuration |
//! | `check.rs` | nothing itself: the `Check` walker, its field helpers and the duration parsers every section uses |
//! | `environment.rs` | every scalar, before the rest: `${VAR}` references expanded |
//! | `errors.rs` | nothing: [`ConfigError`] and [`ConfigErrors`], what loading reports |
//! | `server.rs` | `listen` (with TLS), `server` (caps, sizes, `server.path`), `timeouts`, `access_log` |
//! | `store.rs` | `store`: Redis and its topologies, `on_error`, `clock`, breaker, deny cache |
//! | `callers.rs` | `client_ip`, `api_keys`, `plans`, `users` (header, JWT) |
//! | `upstreams.rs` | `upstreams`: pools of targets, balance, health checks, ejection, retries |
//! | `routes.rs` | `routes`: match, upstream (a URL or a pool's name) or respond, cost, `on_error`, shadow |
//! | `limits.rs` | a route's `limits` and what plans share with them: windows, algorithms, keys |
//! | `shares.rs` | `share:` across routes: the limits of one share agree |
//! | `exempt.rs` | `exempt` (top level and per route): addresses and API keys not counted |
//! | `request_id.rs` | `request_id` |
//! | `cors.rs` | `cors` (top level and per route) |
//! | `header_rules.rs` | `request_headers`, `response_headers` (top level and per route), and what each route gets of them and of `cors` |
//! | `telemetry.rs` | `tracing`, and the `OTEL_*` variables for what it leaves out |
//!
//! This file puts the sections together (`Check::config`) and checks the
//! few rules that span two of them: plans named by `api_keys` and by
//! `plan: true` limits exist, and the Redis key hash has a Redis. Defaults
//! are not here: each sits beside its type in [`config`](super). Enum
//! fields read their spellings from the enum's own table (`SPELLINGS`),
//! which `tollgate schema` lists too.
//!
//! Certificates, CA files, JWT keys and secret files are read while loading, so
//! [`load_file`] does blocking file I/O; the reload runs it on a blocking
//! thread ([`crate::reload`]).

mod advice;
mod callers;
mod check;
mod cors;
mod cost;
mod environment;
mod errors;
mod exempt;
mod header_rules;
mod limits;
mod request_id;
mod routes;
mod server;
mod shares;
mod store;
mod telemetry;
mod upstreams;

pub use check::parse_duration;

use std::path::Path;
use std::sync::Arc;

use super::file::{self, Field};
use super::position::{Pos, Positions, child_key};
use super::{
    ApiKeyConfig, Config, HeaderMode, Limit, Listen, PlansFrom, RequestIdConfig, Route,
    StoreConfig, Timeouts, UnknownKey,
};
pub use advice::{advice, worst_wait_ms};
pub use check::Reader;
use check::{Check, Checked, choice, error, text};
pub use environment::{Env, process_env};
pub use errors::{ConfigError, ConfigErrors};

/// Parses and validates YAML text, with `${VAR}` references read from the
/// process environment.
///
/// # Errors
/// Every problem found, each with its field path and position.
pub fn parse_str(src: &str) -> Result<Config, ConfigErrors> {
    parse_in(src, None, &process_env, Reader::Gateway)
}

/// Parses and validates the YAML of an application's `RateLimitLayer`: a
/// `store:`, the caller sections its keys need and a top-level `limits:`
/// list, checked as the gateway's file is, with `${VAR}` references read
/// from the process environment.
///
/// # Errors
/// Every problem found, each with its field path and position.
pub fn parse_layer_str(src: &str) -> Result<Config, ConfigErrors> {
    parse_in(src, None, &process_env, Reader::Layer)
}

/// Reads and validates the file of an application's `RateLimitLayer`
/// ([`parse_layer_str`]); relative paths are taken from its directory.
///
/// # Errors
/// The file cannot be read, or [`parse_layer_str`] finds problems.
pub fn load_layer_file(path: &Path) -> Result<Config, ConfigErrors> {
    let src = read_file(path)?;
    parse_in(&src, path.parent(), &process_env, Reader::Layer)
}

/// [`parse_str`] with `${VAR}` references read from `env` instead of the
/// process environment.
///
/// # Errors
/// Every problem found, each with its field path and position.
pub fn parse_str_with_env(src: &str, env: Env<'_>) -> Result<Config, ConfigErrors> {
    parse_in(src, None, env, Reader::Gateway)
}

/// [`parse_str_with_env`] with relative file paths (TLS certificates and
/// keys, CA files, secret files) taken from `base` instead of the working
/// directory.
fn parse_in(
    src: &str,
    base: Option<&Path>,
    env: Env<'_>,
    reader: Reader,
) -> Result<Config, ConfigErrors> {
    // Some editors save a byte order mark; the YAML loader would misread it.
    let src = src.strip_prefix('\u{feff}').unwrap_or(src);
    let mut value: yaml_serde::Value =
        yaml_serde::from_str(src).map_err(|e| syntax_error(&e, src))?;
    // Merge keys (`<<: *defaults`) are resolved, so shared route or limit
    // settings can be written once.
    value.apply_merge().map_err(|e| syntax_error(&e, src))?;
    // After parsing, so a variable's value is the text of one scalar and
    // never structure.
    let expansion = environment::expand_tree(&mut value, env);

    let positions = Positions::index(src);
    let mut check = Check {
        positions: &positions,
        errors: Vec::new(),
        base,
        store: check::StoreFacts::default(),
        reader,
    };
    let (root, unknown) = file::from_value(value);
    for field in unknown {
        check.unknown(&field);
    }
    let config = match root {
        Ok(root) => check.config(&root, env).ok(),
        Err(message) => {
            check.value_error("", message);
            None
        }
    };
    let mut errors = check.errors;
    // A scalar that could not be expanded was read as empty text; what the
    // checks said of that text would only repeat the expansion error.
    errors.retain(|e| !expansion.iter().any(|(path, _)| *path == e.path));
    for (path, message) in expansion {
        let at = positions.value(&path);
        errors.push(error(&path, message, at));
    }
    match config {
        Some(config) if errors.is_empty() => Ok(config),
        _ => {
            errors.sort_by_key(|e| (e.line.is_none(), e.line, e.column));
            if errors.is_empty() {
                // Every failed check records an error; this is a safety net.
                errors.push(error("", "invalid configuration", None));
            }
            Err(ConfigErrors(errors))
        }
    }
}

/// The text of the file at `path`, or the error that says why not.
fn read_file(path: &Path) -> Result<String, ConfigErrors> {
    std::fs::read_to_string(path).map_err(|e| {
        ConfigErrors(vec![ConfigError {
            path: String::new(),
            message: format!("cannot read {}: {e}", path.display()),
            line: None,
            column: None,
        }])
    })
}

/// Reads and validates a configuration file.
///
/// # Errors
/// The file cannot be read, or [`parse_str`] finds problems.
pub fn load_file(path: &Path) -> Result<Config, ConfigErrors> {
    let src = read_file(path)?;
    // Relative certificate and key paths are relative to the file that
    // names them, as nginx and Envoy read theirs.
    parse_in(&src, path.parent(), &process_env, Reader::Gateway)
}

/// A YAML syntax (or loader) error: one error at `yaml_serde`'s location,
/// without the location repeated inside the message.
///
/// A tab where YAML wants indentation is the commonest syntax error in a
/// hand-edited file, and the parser's words for it ("found character that
/// cannot start any token") do not say so; it is named instead.
fn syntax_error(e: &yaml_serde::Error, src: &str) -> ConfigErrors {
    let location = e.location();
    let mut message = e.to_string();
    let pos = location.map(|l| Pos {
        line: l.line(),
        col: l.column(),
    });
    if let Some(p) = pos {
        message = message.replacen(&format!(" at line {} column {}", p.line, p.col), "", 1);
        if let Some(tab) = tab_in_error(src, p, &message) {
            return ConfigErrors(vec![error(
                "",
                "invalid YAML: a tab character; YAML indents with spaces only",
                Some(tab),
            )]);
        }
    }
    if let Some(p) = pos
        && reference_in_flow(src, p, &message)
    {
        message.push_str(
            "; a ${NAME} inside { … } or [ … ] must be quoted, as its braces are YAML's own: \
             write \"${NAME:-default}\"",
        );
    }
    ConfigErrors(vec![error("", format!("invalid YAML: {message}"), pos)])
}

/// Whether a syntax error at `pos` in a flow collection (`{ … }`, `[ … ]`)
/// has an unquoted `${` on its lines, from the collection's start (which
/// the parser's message names) to `pos`.
fn reference_in_flow(src: &str, pos: Pos, message: &str) -> bool {
    let Some((_, start)) = message
        .split_once("flow mapping at line ")
        .or_else(|| message.split_once("flow sequence at line "))
    else {
        return false;
    };
    let digits: String = start.chars().take_while(char::is_ascii_digit).collect();
    let first = digits
        .parse::<usize>()
        .map_or(pos.line, |l| l.clamp(1, pos.line.max(1)));
    let lines = src.lines().skip(first - 1).take(pos.line + 1 - first);
    lines.into_iter().any(unquoted_reference)
}

/// Whether `line` has a `${` outside quotes (a flow scalar's quotes do not
/// span lines in a file a person writes, so each line is read alone).
fn unquoted_reference(line: &str) -> bool {
    let mut quote: Option<char> = None;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match (quote, c) {
            (None, '"' | '\'') => quote = Some(c),
            (Some('"'), '\\') => {
                chars.next();
            }
            (Some(q), _) if c == q => quote = None,
            (None, '$') if chars.peek() == Some(&'{') => return true,
            (None, '#') => return false,
            _ => {}
        }
    }
    false
}

/// The tab a syntax error at `pos` is about: the character at `pos`, or,
/// when the parser's message names a tab, the first tab on that line.
fn tab_in_error(src: &str, pos: Pos, message: &str) -> Option<Pos> {
    let line = src.lines().nth(pos.line.checked_sub(1)?)?;
    if line.chars().nth(pos.col.checked_sub(1)?) == Some('\t') {
        return Some(pos);
    }
    if message.contains("tab character") {
        let col = line.chars().position(|c| c == '\t')? + 1;
        return Some(Pos {
            line: pos.line,
            col,
        });
    }
    None
}

/// What `cors` and the header rules are checked against: the header style and the
/// names the gateway owns, each the file's where it is valid, else the
/// default.
fn header_facts(
    headers: &Checked<Option<HeaderMode>>,
    request_id: &Checked<Option<RequestIdConfig>>,
    api_keys: &Checked<Option<ApiKeyConfig>>,
    users: &Checked<Option<super::UserConfig>>,
) -> header_rules::Facts {
    header_rules::Facts::new(
        *headers
            .as_ref()
            .ok()
            .and_then(Option::as_ref)
            .unwrap_or(&HeaderMode::default()),
        match request_id {
            Ok(Some(r)) => r.header.clone(),
            _ => RequestIdConfig::default().header,
        },
        match api_keys {
            Ok(Some(k)) => k.header.clone(),
            _ => ApiKeyConfig::default().header,
        },
        match users {
            Ok(Some(u)) => u.header.clone(),
            _ => super::UserConfig::default().header,
        },
    )
}

impl Check<'_> {
    /// The whole file: every section, then the rules that span sections.
    fn config(&mut self, root: &file::Root, env: Env<'_>) -> Checked<Config> {
        let listen = self.listens(root);
        let admin = self.optional(&root.admin, "admin", Self::admin);
        let store = self.optional(&root.store, "store", Self::store);
        // Limits (in plans and routes) resolve their `sync` against it.
        if let Ok(Some(s)) = &store {
            self.store = check::StoreFacts {
                redis: s.redis.is_some(),
                sync: s.redis.as_ref().and_then(|r| r.sync),
            };
        } else if !root.store.is_absent() {
            // A store with errors: assume Redis, so limits' `sync` is not
            // refused for a reason that is not the real one.
            self.store.redis = true;
        }
        let client_ip = self.optional(&root.client_ip, "client_ip", Self::client_ip);
        let headers = self.optional(&root.headers, "headers", choice(&HeaderMode::SPELLINGS));
        let plans = self.optional(&root.plans, "plans", Self::plans);
        let api_keys = self.optional(&root.api_keys, "api_keys", Self::api_keys);
        let users = self.optional(&root.users, "users", Self::users);
        let plans_from = self.optional(
            &root.plans_from,
            "plans_from",
            text(callers::parse_plans_from),
        );
        let (plans_from, users) = self.plan_source(root, plans_from, users, &api_keys);
        let timeouts = self.optional(&root.timeouts, "timeouts", Self::timeouts);
        let server = self.optional(&root.server, "server", Self::server);
        let access_log = self.optional(&root.access_log, "access_log", Self::access_log);
        let request_id = self.optional(&root.request_id, "request_id", Self::request_id);
        let exempt = self
            .optional(&root.exempt, "exempt", Self::exempt)
            .map(|e| e.map(Arc::new));
        let tracing = self.tracing(&root.tracing, env);
        // Routes are checked even when `timeouts` is not, with the default.
        let default_timeout = match &timeouts {
            Ok(Some(t)) => t.upstream_response,
            _ => Timeouts::default().upstream_response,
        };
        let upstreams = self.optional(&root.upstreams, "upstreams", Self::upstreams);
        let pools = routes::Pools {
            written: upstreams::names(root),
            checked: upstreams
                .as_ref()
                .ok()
                .cloned()
                .flatten()
                .unwrap_or_default(),
        };
        let routes = self.routes_of(root, default_timeout, &pools);
        let limits = self.top_limits(root);
        self.plan_references(root, &api_keys, &store, &routes);
        let facts = header_facts(&headers, &request_id, &api_keys, &users);
        let defaults = self.top_policies(root, &facts);
        let mut routes = routes;
        let policies = self.routes_policies(root, &routes, &defaults, &facts);
        if let (Ok(routes), Ok(policies)) = (&mut routes, policies) {
            header_rules::attach(routes, policies);
        }
        if let (Ok(routes), Ok(top)) = (&mut routes, &exempt) {
            exempt::inherit(routes, top.as_ref());
        }
        let top_cors = defaults
            .cors
            .clone()
            .map(|spec| Arc::new(cors::finish(spec, &[], facts.mode, &facts.request_id)));

        let admin = admin?.flatten();
        Ok(Config {
            listen: listen?,
            admin: admin.as_ref().map(|a| a.0),
            admin_token: admin.as_ref().and_then(|a| a.1.clone()),
            admin_replays: admin.and_then(|a| a.2),
            store: store?.unwrap_or_default(),
            client_ip: client_ip?.unwrap_or_default(),
            headers: headers?.unwrap_or_default(),
            plans: plans?.unwrap_or_default(),
            api_keys: api_keys?.unwrap_or_default(),
            plans_from: plans_from?.unwrap_or_default(),
            users: users?.unwrap_or_default(),
            timeouts: timeouts?.unwrap_or_default(),
            upstreams: upstreams?.unwrap_or_default(),
            routes: routes?,
            limits: limits?,
            server: server?.unwrap_or_default(),
            access_log: access_log?.unwrap_or_default(),
            request_id: request_id?.unwrap_or_default(),
            tracing: tracing?,
            cors: top_cors,
            response_headers: defaults.response_headers,
            exempt: exempt?,
        })
    }

    /// `routes`: required of the gateway's file, optional in a layer's.
    fn routes_of(
        &mut self,
        root: &file::Root,
        default_timeout: std::time::Duration,
        pools: &routes::Pools,
    ) -> Checked<Vec<Route>> {
        let read = |check: &mut Self, routes: &Vec<file::Field<file::Route>>, path: &str| {
            check.routes(routes, path, default_timeout, pools)
        };
        match self.reader {
            Reader::Gateway => self.required(&root.routes, "", "routes", read),
            Reader::Layer => self
                .optional(&root.routes, "routes", read)
                .map(Option::unwrap_or_default),
        }
    }

    /// `listen`: required of the gateway's file, optional in a layer's.
    fn listens(&mut self, root: &file::Root) -> Checked<Vec<Listen>> {
        let read = |check: &mut Self, items: &file::OneOrMany<file::Listen>, path: &str| {
            let addrs = check.each(items, path, Self::listen)?;
            if addrs.is_empty() {
                return Err(check.value_error(path, "needs at least one address"));
            }
            Ok(addrs)
        };
        match self.reader {
            Reader::Gateway => self.required(&root.listen, "", "listen", read),
            Reader::Layer => self
                .optional(&root.listen, "listen", read)
                .map(Option::unwrap_or_default),
        }
    }

    /// `limits` at the top level: required of a layer's file, refused in
    /// the gateway's (whose limits belong to a route).
    fn top_limits(&mut self, root: &file::Root) -> Checked<Vec<Limit>> {
        match self.reader {
            Reader::Layer => self.required(&root.limits, "", "limits", |check, l, path| {
                check.limits(l, path)
            }),
            Reader::Gateway if root.limits.is_absent() => Ok(Vec::new()),
            Reader::Gateway => Err(self.value_error(
                "limits",
                "top-level limits are an application's (RateLimitLayer); the gateway's limits go under a route: routes[N].limits",
            )),
        }
    }

    /// `plans_from` against what it reads: a claim needs `users.jwt` (whose
    /// verifier then reads the claim too), any source but `api_key` leaves
    /// `api_keys.keys` and `redis_hash` unread (refused), and plans must
    /// exist to be chosen.
    fn plan_source(
        &mut self,
        root: &file::Root,
        plans_from: Checked<Option<PlansFrom>>,
        users: Checked<Option<super::UserConfig>>,
        api_keys: &Checked<Option<ApiKeyConfig>>,
    ) -> (
        Checked<Option<PlansFrom>>,
        Checked<Option<super::UserConfig>>,
    ) {
        let (Ok(Some(source)), Ok(users)) = (&plans_from, &users) else {
            return (plans_from, users);
        };
        if *source == PlansFrom::ApiKey {
            return (plans_from, Ok(users.clone()));
        }
        let mut users = users.clone();
        if matches!(root.plans, Field::Absent) {
            let e = self.value_error(
                "plans_from",
                "no plans are defined; add plans: for this to choose from",
            );
            return (Err(e), Ok(users));
        }
        if let Ok(Some(keys)) = api_keys {
            let unread = [
                ("api_keys.keys", !keys.keys.is_empty()),
                ("api_keys.redis_hash", keys.redis_hash),
            ];
            for (path, written) in unread {
                if written {
                    self.value_error(
                        path,
                        "plans_from chooses plans by something other than the API key, so the plans of keys would never be read; remove this, or write plans_from: api_key",
                    );
                }
            }
        }
        if let PlansFrom::Claim(claim) = source {
            match users.as_mut().and_then(|u| u.jwt.take()) {
                Some(jwt) => {
                    if let Some(u) = users.as_mut() {
                        u.jwt = Some(jwt.with_plan_claim(claim));
                    }
                }
                None => {
                    let e = self.value_error(
                        "plans_from",
                        format!(
                            "claim:{claim} reads a verified JWT, and users.jwt is not set; configure users.jwt, or take the plan from header:NAME set by a trusted proxy"
                        ),
                    );
                    return (Err(e), Ok(users));
                }
            }
        }
        (plans_from, Ok(users))
    }

    /// Cross-field rules: plan names used exist, plan limits have plans,
    /// the Redis hash has a Redis.
    fn plan_references(
        &mut self,
        root: &file::Root,
        api_keys: &Checked<Option<ApiKeyConfig>>,
        store: &Checked<Option<StoreConfig>>,
        routes: &Checked<Vec<Route>>,
    ) {
        // Plan names as written, so these checks run even when a plan's
        // limits have errors of their own.
        let plan_names: Vec<Arc<str>> = match &root.plans {
            Field::Valid(map) => map.keys().map(|k| Arc::from(k.as_str())).collect(),
            _ => Vec::new(),
        };
        if matches!(root.plans, Field::Invalid(_)) {
            return;
        }
        if let Ok(Some(keys)) = api_keys {
            for (key, plan) in &keys.keys {
                if !plan_names.contains(plan) {
                    self.value_error(
                        &child_key("api_keys.keys", key),
                        format!("plan {plan:?} is not defined under plans"),
                    );
                }
            }
            if let UnknownKey::Plan(plan) = &keys.unknown {
                if !plan_names.contains(plan) {
                    self.value_error(
                        "api_keys.unknown",
                        format!(
                            "plan {plan:?} is not defined under plans; name a plan or write reject"
                        ),
                    );
                }
            }
            let has_redis = matches!(store, Ok(Some(s)) if s.redis.is_some());
            if keys.redis_hash && !has_redis && store.is_ok() {
                self.value_error(
                    "api_keys.redis_hash",
                    "needs store.redis: the key hash lives in Redis",
                );
            }
        }
        if let Ok(routes) = routes {
            for (i, route) in routes.iter().enumerate() {
                for (j, limit) in route.limits.iter().enumerate() {
                    if limit.plan && plan_names.is_empty() {
                        self.value_error(
                            &format!("routes[{i}].limits[{j}].plan"),
                            "no plans are defined; add plans: or give this limit its own limit and window",
                        );
                    }
                }
            }
        }
    }
}
