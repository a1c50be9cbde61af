//! File structs → validated [`Config`]: stage two of loading.
//!
//! [`parse_str`] reads the text into a [`yaml_serde::Value`] (a syntax error
//! is the one error it reports alone), reads that into the
//! [`file`](super::file) structs, and then walks them with a [`Check`] that
//! knows the field path of every node. Each rule that fails records a
//! [`ConfigError`] with that path and the position found in the
//! [`Positions`] index, and validation carries on: every check of a struct
//! runs before its results are combined, so one bad field never hides
//! another. Only when nothing was recorded is the [`Config`] returned.
//!
//! Positions: a value error points at the value, an unknown field at its
//! key, a missing field at the mapping that lacks it. Errors are sorted by
//! position, so they read top to bottom like the file.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::num::NonZeroU64;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, HeaderValue, Method, StatusCode, Uri};
use ipnet::IpNet;

use super::file::{self, Field, Flag, Int, OneOrMany, Text};
use super::position::{Pos, Positions, child_index, child_key};
use super::{
    Action, ApiKeyConfig, BreakerConfig, ClientIpConfig, ClockSource, Config, HeaderMode,
    KeySource, KeySpec, Limit, Listen, OnError, PathMatch, Plan, PlanLimit, RedisConfig, RedisTls,
    RedisTopology, Respond, Route, RouteMatch, ServerSettings, StoreConfig, Timeouts, UnknownKey,
    Upstream, UserConfig,
};
use crate::identity::jwt::{JwtAlgorithm, JwtVerifier};
use crate::limit::Algorithm;
use crate::target::{EscapedSlashes, PathRules};

/// One problem in a configuration file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// Field path, e.g. `routes[1].limits[0].window`; empty for the whole file.
    pub path: String,
    /// What is wrong and, where it helps, how to fix it.
    pub message: String,
    /// 1-based line and column of the offending node, when known.
    pub line: Option<usize>,
    /// 1-based column.
    pub column: Option<usize>,
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if !self.path.is_empty() {
            write!(f, "{}: ", self.path)?;
        }
        f.write_str(&self.message)?;
        if let (Some(l), Some(c)) = (self.line, self.column) {
            write!(f, " (line {l}, col {c})")?;
        }
        Ok(())
    }
}

/// Every problem found in a configuration file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl std::fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

/// Parses and validates YAML text.
///
/// # Errors
/// Every problem found, each with its field path and position.
pub fn parse_str(src: &str) -> Result<Config, ConfigErrors> {
    parse_in(src, None)
}

/// [`parse_str`] with relative file paths (TLS certificates and keys, CA
/// files) taken from `base` instead of the working directory.
fn parse_in(src: &str, base: Option<&Path>) -> Result<Config, ConfigErrors> {
    // Some editors save a byte order mark; the YAML loader would misread it.
    let src = src.strip_prefix('\u{feff}').unwrap_or(src);
    let mut value: yaml_serde::Value =
        yaml_serde::from_str(src).map_err(|e| syntax_error(&e, src))?;
    // Merge keys (`<<: *defaults`) are resolved, so shared route or limit
    // settings can be written once.
    value.apply_merge().map_err(|e| syntax_error(&e, src))?;

    let positions = Positions::index(src);
    let mut check = Check {
        positions: &positions,
        errors: Vec::new(),
        base,
    };
    let (root, unknown) = file::from_value(value);
    for field in unknown {
        check.unknown(&field);
    }
    let config = match root {
        Ok(root) => check.config(&root).ok(),
        Err(message) => {
            check.value_error("", message);
            None
        }
    };
    let mut errors = check.errors;
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

/// Reads and validates a configuration file.
///
/// # Errors
/// The file cannot be read, or [`parse_str`] finds problems.
pub fn load_file(path: &Path) -> Result<Config, ConfigErrors> {
    let src = std::fs::read_to_string(path).map_err(|e| {
        ConfigErrors(vec![ConfigError {
            path: String::new(),
            message: format!("cannot read {}: {e}", path.display()),
            line: None,
            column: None,
        }])
    })?;
    // Relative certificate and key paths are relative to the file that
    // names them, as nginx and Envoy read theirs.
    parse_in(&src, path.parent())
}

fn error(path: &str, message: impl Into<String>, pos: Option<Pos>) -> ConfigError {
    ConfigError {
        path: path.to_owned(),
        message: message.into(),
        line: pos.map(|p| p.line),
        column: pos.map(|p| p.col),
    }
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
    ConfigErrors(vec![error("", format!("invalid YAML: {message}"), pos)])
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

/// Marks a check that failed; its error is already recorded.
#[derive(Debug, Clone, Copy)]
struct Reported;

type Checked<T> = Result<T, Reported>;

/// Walks the file structs, recording every problem.
struct Check<'p> {
    positions: &'p Positions,
    errors: Vec<ConfigError>,
    /// Directory that relative file paths are resolved against.
    base: Option<&'p Path>,
}

/// Adapts a parser of one leaf into a check that reports at the value.
fn leaf<T, U>(
    parse: impl Fn(&T) -> Result<U, String>,
) -> impl Fn(&mut Check<'_>, &T, &str) -> Checked<U> {
    move |check, value, path| parse(value).map_err(|m| check.value_error(path, m))
}

/// A leaf parser over the text of a [`Text`].
fn text<U>(
    parse: impl Fn(&str) -> Result<U, String>,
) -> impl Fn(&mut Check<'_>, &Text, &str) -> Checked<U> {
    leaf(move |t: &Text| parse(&t.0))
}

/// A whole number in `min..=max`.
fn int(min: i64, max: i64) -> impl Fn(&mut Check<'_>, &Int, &str) -> Checked<i64> {
    leaf(move |&Int(n): &Int| {
        if n < min && max == i64::MAX {
            Err(format!("must be at least {min}, found {n}"))
        } else if !(min..=max).contains(&n) {
            Err(format!("must be between {min} and {max}, found {n}"))
        } else {
            Ok(n)
        }
    })
}

/// A count of at least 1.
fn positive(check: &mut Check<'_>, value: &Int, path: &str) -> Checked<u64> {
    let n = int(1, i64::MAX)(check, value, path)?;
    u64::try_from(n).map_err(|_| check.value_error(path, "must be at least 1"))
}

impl Check<'_> {
    fn push(&mut self, path: &str, message: impl Into<String>, pos: Option<Pos>) -> Reported {
        self.errors.push(error(path, message, pos));
        Reported
    }

    /// An error about the value at `path`.
    fn value_error(&mut self, path: &str, message: impl Into<String>) -> Reported {
        let pos = self.positions.value(path);
        self.push(path, message, pos)
    }

    fn unknown(&mut self, field: &file::UnknownField) {
        let pos = self.positions.key(&child_key(&field.parent, &field.key));
        let mut message = format!("unknown field {:?}", field.key);
        if !field.expected.is_empty() {
            message.push_str("; expected one of ");
            message.push_str(&field.expected.join(", "));
        }
        self.push(&field.parent, message, pos);
    }

    /// An optional field, read by `read` when present.
    fn optional<T, U>(
        &mut self,
        field: &Field<T>,
        path: &str,
        read: impl FnOnce(&mut Self, &T, &str) -> Checked<U>,
    ) -> Checked<Option<U>> {
        match field {
            Field::Absent => Ok(None),
            Field::Invalid(message) => Err(self.value_error(path, message.clone())),
            Field::Valid(value) => read(self, value, path).map(Some),
        }
    }

    /// A required field `name` of the mapping at `parent`.
    fn required<T, U>(
        &mut self,
        field: &Field<T>,
        parent: &str,
        name: &str,
        read: impl FnOnce(&mut Self, &T, &str) -> Checked<U>,
    ) -> Checked<U> {
        let path = child_key(parent, name);
        if let Some(value) = self.optional(field, &path, read)? {
            return Ok(value);
        }
        let pos = self.positions.value(parent);
        Err(self.push(parent, format!("missing required field {name:?}"), pos))
    }

    /// A scalar or a list of them; list items get their own `[i]` paths.
    fn each<T, U>(
        &mut self,
        items: &OneOrMany<T>,
        path: &str,
        mut read: impl FnMut(&mut Self, &T, &str) -> Checked<U>,
    ) -> Checked<Vec<U>> {
        let mut read_one = |check: &mut Self, item: &Field<T>, path: &str| match item {
            Field::Absent => Err(check.value_error(path, "empty entry")),
            Field::Invalid(message) => Err(check.value_error(path, message.clone())),
            Field::Valid(value) => read(check, value, path),
        };
        match items {
            OneOrMany::One(item) => read_one(self, item, path).map(|v| vec![v]),
            OneOrMany::Many(items) => {
                let read: Vec<Checked<U>> = items
                    .iter()
                    .enumerate()
                    .map(|(i, item)| read_one(self, item, &child_index(path, i)))
                    .collect();
                read.into_iter().collect()
            }
        }
    }

    /// A list of mappings; each item is read by `read` with its own path.
    fn list<T, U>(
        &mut self,
        items: &[Field<T>],
        path: &str,
        mut read: impl FnMut(&mut Self, &T, &str) -> Checked<U>,
    ) -> Checked<Vec<U>> {
        let read: Vec<Checked<U>> = items
            .iter()
            .enumerate()
            .map(|(i, item)| {
                let path = child_index(path, i);
                match item {
                    Field::Absent => Err(self.value_error(&path, "empty entry")),
                    Field::Invalid(message) => Err(self.value_error(&path, message.clone())),
                    Field::Valid(value) => read(self, value, &path),
                }
            })
            .collect();
        read.into_iter().collect()
    }

    fn config(&mut self, root: &file::Root) -> Checked<Config> {
        let listen = self.required(&root.listen, "", "listen", |check, items, path| {
            let addrs = check.each(items, path, Self::listen)?;
            if addrs.is_empty() {
                return Err(check.value_error(path, "needs at least one address"));
            }
            Ok(addrs)
        });
        let admin = self.optional(&root.admin, "admin", text(parse_socket_addr));
        let store = self.optional(&root.store, "store", Self::store);
        let client_ip = self.optional(&root.client_ip, "client_ip", Self::client_ip);
        let headers = self.optional(&root.headers, "headers", text(parse_header_mode));
        let plans = self.optional(&root.plans, "plans", Self::plans);
        let api_keys = self.optional(&root.api_keys, "api_keys", Self::api_keys);
        let users = self.optional(&root.users, "users", Self::users);
        let timeouts = self.optional(&root.timeouts, "timeouts", Self::timeouts);
        let server = self.optional(&root.server, "server", Self::server);
        // Routes are checked even when `timeouts` is not, with the default.
        let default_timeout = match &timeouts {
            Ok(Some(t)) => t.upstream_response,
            _ => Timeouts::default().upstream_response,
        };
        let routes = self.required(&root.routes, "", "routes", |check, routes, path| {
            check.routes(routes, path, default_timeout)
        });

        // Cross-field rules: plan names used exist, plan limits have plans,
        // the Redis hash has a Redis.
        // Plan names as written, so these checks run even when a plan's
        // limits have errors of their own.
        let plan_names: Vec<Arc<str>> = match &root.plans {
            Field::Valid(map) => map.keys().map(|k| Arc::from(k.as_str())).collect(),
            _ => Vec::new(),
        };
        let plans_ok = !matches!(root.plans, Field::Invalid(_));
        if let (Ok(Some(keys)), true) = (&api_keys, plans_ok) {
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
            let has_redis = matches!(&store, Ok(Some(s)) if s.redis.is_some());
            if keys.redis_hash && !has_redis && store.is_ok() {
                self.value_error(
                    "api_keys.redis_hash",
                    "needs store.redis: the key hash lives in Redis",
                );
            }
        }
        if let (Ok(routes), true) = (&routes, plans_ok) {
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

        Ok(Config {
            listen: listen?,
            admin: admin?,
            store: store?.unwrap_or_else(|| StoreConfig {
                redis: None,
                on_error: OnError::Local,
                prefix: DEFAULT_PREFIX.to_owned(),
                readable_keys: false,
                clock: ClockSource::Gateway,
                breaker: BreakerConfig::default(),
                deny_cache: DEFAULT_DENY_CACHE,
            }),
            client_ip: client_ip?.unwrap_or_default(),
            headers: headers?.unwrap_or(HeaderMode::Ietf),
            plans: plans?.unwrap_or_default(),
            api_keys: api_keys?.unwrap_or_else(default_api_keys),
            users: users?.unwrap_or_else(|| UserConfig {
                header: HeaderName::from_static("x-user"),
                jwt: None,
            }),
            timeouts: timeouts?.unwrap_or_default(),
            routes: routes?,
            server: server?.unwrap_or_default(),
        })
    }

    /// One `listen` entry: an address, or `{ addr, tls: { cert, key } }`.
    fn listen(&mut self, item: &file::Listen, path: &str) -> Checked<Listen> {
        let map = match item {
            file::Listen::Addr(t) => {
                return text(parse_socket_addr)(self, t, path).map(Listen::from);
            }
            file::Listen::Map(map) => map,
        };
        let addr = self.required(&map.addr, path, "addr", text(parse_socket_addr));
        let tls = self.optional(&map.tls, &child_key(path, "tls"), |check, tls, path| {
            let cert = check.required(&tls.cert, path, "cert", text(|s| Ok(s.to_owned())));
            let key = check.required(&tls.key, path, "key", text(|s| Ok(s.to_owned())));
            let (cert, key) = (cert?, key?);
            crate::tls::server_config(&check.file(&cert), &check.file(&key))
                .map_err(|e| check.value_error(path, e.to_string()))
        });
        Ok(Listen {
            addr: addr?,
            tls: tls?,
        })
    }

    /// `path` as written, resolved against the configuration file's directory.
    fn file(&self, path: &str) -> PathBuf {
        match self.base {
            Some(base) if Path::new(path).is_relative() => base.join(path),
            _ => PathBuf::from(path),
        }
    }

    fn server(&mut self, server: &file::Server, path: &str) -> Checked<ServerSettings> {
        let defaults = ServerSettings::default();
        let max_connections = self.optional(
            &server.max_connections,
            &child_key(path, "max_connections"),
            int(1, 1_000_000),
        );
        let max_header_size = self.optional(
            &server.max_header_size,
            &child_key(path, "max_header_size"),
            text(|s| {
                let n = parse_size(s)?;
                // hyper's HTTP/1.1 read buffer cannot be smaller than 8 KiB.
                if !(8 * 1024..=16 * 1024 * 1024).contains(&n) {
                    return Err(format!("{s:?} is out of range; write 8KiB to 16MiB"));
                }
                Ok(n)
            }),
        );
        let backlog = self.optional(
            &server.backlog,
            &child_key(path, "backlog"),
            int(1, i64::from(i32::MAX)),
        );
        let max_uri_size = self.optional(
            &server.max_uri_size,
            &child_key(path, "max_uri_size"),
            text(|s| {
                let n = parse_size(s)?;
                // Past hyper's own stop tollgate never sees the request:
                // hyper answers 414 by itself, with an empty body.
                if !(1024..=63 * 1024).contains(&n) {
                    return Err(format!(
                        "{s:?} is out of range; write 1KiB to 63KiB (hyper refuses targets over 64 KiB by itself)"
                    ));
                }
                Ok(n)
            }),
        );
        let max_body_size = self.optional(
            &server.max_body_size,
            &child_key(path, "max_body_size"),
            text(parse_size),
        );
        let rules = self.optional(&server.path, &child_key(path, "path"), Self::path_rules);
        Ok(ServerSettings {
            max_connections: max_connections?
                .and_then(|n| usize::try_from(n).ok())
                .unwrap_or(defaults.max_connections),
            backlog: backlog?
                .and_then(|n| u32::try_from(n).ok())
                .unwrap_or(defaults.backlog),
            max_header_size: max_header_size?
                .and_then(|n| usize::try_from(n).ok())
                .unwrap_or(defaults.max_header_size),
            max_uri_size: max_uri_size?
                .and_then(|n| usize::try_from(n).ok())
                .unwrap_or(defaults.max_uri_size),
            max_body_size: max_body_size?.or(defaults.max_body_size),
            path: rules?.unwrap_or(defaults.path),
        })
    }

    fn path_rules(&mut self, section: &file::ServerPath, path: &str) -> Checked<PathRules> {
        let defaults = PathRules::default();
        let flag = |_: &mut Self, b: &file::Flag, _: &str| Ok(b.0);
        let normalize = self.optional(&section.normalize, &child_key(path, "normalize"), flag);
        let merge_slashes = self.optional(
            &section.merge_slashes,
            &child_key(path, "merge_slashes"),
            flag,
        );
        let escaped_slashes = self.optional(
            &section.escaped_slashes,
            &child_key(path, "escaped_slashes"),
            text(|s| {
                EscapedSlashes::SPELLINGS
                    .iter()
                    .find(|(name, _)| *name == s)
                    .map(|&(_, v)| v)
                    .ok_or_else(|| format!("{s:?} is not one of reject, keep, decode"))
            }),
        );
        Ok(PathRules {
            normalize: normalize?.unwrap_or(defaults.normalize),
            merge_slashes: merge_slashes?.unwrap_or(defaults.merge_slashes),
            escaped_slashes: escaped_slashes?.unwrap_or(defaults.escaped_slashes),
        })
    }

    fn store(&mut self, store: &file::Store, path: &str) -> Checked<StoreConfig> {
        let redis = self.optional(&store.redis, &child_key(path, "redis"), Self::redis);
        let on_error = self.optional(
            &store.on_error,
            &child_key(path, "on_error"),
            text(parse_on_error),
        );
        let prefix = self.optional(
            &store.prefix,
            &child_key(path, "prefix"),
            text(|s| Ok(s.to_owned())),
        );
        let readable_keys = self.optional(
            &store.readable_keys,
            &child_key(path, "readable_keys"),
            |_, b, _| Ok(*b),
        );
        let clock = self.optional(&store.clock, &child_key(path, "clock"), text(parse_clock));
        let breaker = self.optional(&store.breaker, &child_key(path, "breaker"), Self::breaker);
        let deny_cache = self.optional(
            &store.deny_cache,
            &child_key(path, "deny_cache"),
            int(0, 10_000_000),
        );
        Ok(StoreConfig {
            redis: redis?,
            on_error: on_error?.unwrap_or(OnError::Local),
            prefix: prefix?.unwrap_or_else(|| DEFAULT_PREFIX.to_owned()),
            readable_keys: readable_keys?.is_some_and(|file::Flag(b)| b),
            deny_cache: deny_cache?.map_or(DEFAULT_DENY_CACHE, |n| n as usize),
            clock: clock?.unwrap_or_default(),
            breaker: breaker?.unwrap_or_default(),
        })
    }

    fn breaker(&mut self, breaker: &file::Breaker, path: &str) -> Checked<BreakerConfig> {
        let defaults = BreakerConfig::default();
        let failures = self.optional(
            &breaker.failures,
            &child_key(path, "failures"),
            int(1, 1_000_000),
        );
        let probe_interval = self.optional(
            &breaker.probe_interval,
            &child_key(path, "probe_interval"),
            text(parse_timeout),
        );
        Ok(BreakerConfig {
            failures: match failures? {
                Some(n) => u32::try_from(n).unwrap_or(defaults.failures),
                None => defaults.failures,
            },
            probe_interval: probe_interval?.unwrap_or(defaults.probe_interval),
        })
    }

    fn redis(&mut self, redis: &file::Redis, path: &str) -> Checked<RedisConfig> {
        let defaults = RedisConfig::default();
        let url = self.optional(&redis.url, &child_key(path, "url"), text(parse_redis_url));
        let cluster = self.optional(
            &redis.cluster,
            &child_key(path, "cluster"),
            |check, items, path| {
                let seeds = check.each(items, path, text(parse_host_port))?;
                if seeds.is_empty() {
                    return Err(check.value_error(path, "needs at least one seed node"));
                }
                Ok(seeds)
            },
        );
        let sentinel = self.optional(
            &redis.sentinel,
            &child_key(path, "sentinel"),
            Self::sentinel,
        );
        let username = self.optional(
            &redis.username,
            &child_key(path, "username"),
            text(|s| Ok(s.to_owned())),
        );
        let password = self.optional(
            &redis.password,
            &child_key(path, "password"),
            text(|s| Ok(s.to_owned())),
        );
        let database = self.optional(&redis.database, &child_key(path, "database"), int(0, 255));
        let tls = self.optional(&redis.tls, &child_key(path, "tls"), |check, tls, path| {
            let ca_file = check.optional(
                &tls.ca_file,
                &child_key(path, "ca_file"),
                text(|s| {
                    if s.is_empty() {
                        Err("must not be empty; write the path of a PEM file".to_owned())
                    } else {
                        Ok(std::path::PathBuf::from(s))
                    }
                }),
            )?;
            Ok(RedisTls { ca_file })
        });
        let timeout = self.optional(
            &redis.timeout,
            &child_key(path, "timeout"),
            text(parse_timeout),
        );
        let connect_timeout = self.optional(
            &redis.connect_timeout,
            &child_key(path, "connect_timeout"),
            text(parse_timeout),
        );
        let reconnect = self.optional(
            &redis.reconnect,
            &child_key(path, "reconnect"),
            |check, r, path| {
                let min = check.optional(&r.min, &child_key(path, "min"), text(parse_timeout));
                let max = check.optional(&r.max, &child_key(path, "max"), text(parse_timeout));
                let jitter =
                    check.optional(&r.jitter, &child_key(path, "jitter"), text(parse_duration));
                let (min, max, jitter) = (
                    min?.unwrap_or(defaults.reconnect_min),
                    max?.unwrap_or(defaults.reconnect_max),
                    jitter?.unwrap_or(defaults.reconnect_jitter),
                );
                if min > max {
                    return Err(check.value_error(
                        &child_key(path, "min"),
                        format!("{min:?} is longer than max {max:?}"),
                    ));
                }
                Ok((min, max, jitter))
            },
        );
        let pool_size = self.optional(&redis.pool_size, &child_key(path, "pool_size"), int(1, 64));

        // Exactly one of url, cluster and sentinel.
        let given: Vec<&str> = [
            ("url", !redis.url.is_absent()),
            ("cluster", !redis.cluster.is_absent()),
            ("sentinel", !redis.sentinel.is_absent()),
        ]
        .iter()
        .filter(|(_, present)| *present)
        .map(|(name, _)| *name)
        .collect();
        if given.len() != 1 {
            let pos = self.positions.value(path);
            let message = if given.is_empty() {
                "missing required field \"url\" (or cluster, or sentinel)".to_owned()
            } else {
                format!(
                    "set one of url, cluster and sentinel, not {}",
                    given.join(" and ")
                )
            };
            return Err(self.push(path, message, pos));
        }
        if !redis.database.is_absent() && !redis.cluster.is_absent() {
            let db_path = child_key(path, "database");
            return Err(self.value_error(&db_path, "a Redis Cluster has only database 0"));
        }
        let url = url?;
        let topology = match (cluster?, sentinel?) {
            (Some(seeds), _) => RedisTopology::Cluster { seeds },
            (None, Some((service_name, nodes))) => RedisTopology::Sentinel {
                service_name,
                nodes,
            },
            (None, None) => RedisTopology::Standalone,
        };
        let tls = tls?;
        if let (Some(u), Some(_)) = (&url, &tls) {
            if !u.starts_with("rediss://") {
                let tls_path = child_key(path, "tls");
                return Err(self.value_error(
                    &tls_path,
                    "applies to rediss:// URLs; write the url as rediss://HOST:PORT",
                ));
            }
        }
        let reconnect = reconnect?;
        Ok(RedisConfig {
            url: url.unwrap_or_default(),
            timeout: timeout?.unwrap_or(defaults.timeout),
            topology,
            username: username?,
            password: password?,
            database: database?.and_then(|d| u8::try_from(d).ok()),
            tls,
            connect_timeout: connect_timeout?.unwrap_or(defaults.connect_timeout),
            reconnect_min: reconnect.map_or(defaults.reconnect_min, |r| r.0),
            reconnect_max: reconnect.map_or(defaults.reconnect_max, |r| r.1),
            reconnect_jitter: reconnect.map_or(defaults.reconnect_jitter, |r| r.2),
            pool_size: pool_size?
                .and_then(|n| usize::try_from(n).ok())
                .unwrap_or(defaults.pool_size),
        })
    }

    fn sentinel(
        &mut self,
        sentinel: &file::Sentinel,
        path: &str,
    ) -> Checked<(String, Vec<(String, u16)>)> {
        let name = self.required(
            &sentinel.service_name,
            path,
            "service_name",
            text(|s| {
                if s.is_empty() {
                    Err("must not be empty; write the master's name, e.g. mymaster".to_owned())
                } else {
                    Ok(s.to_owned())
                }
            }),
        );
        let nodes = self.required(&sentinel.nodes, path, "nodes", |check, items, path| {
            let nodes = check.each(items, path, text(parse_host_port))?;
            if nodes.is_empty() {
                return Err(check.value_error(path, "needs at least one sentinel"));
            }
            Ok(nodes)
        });
        Ok((name?, nodes?))
    }

    fn client_ip(&mut self, client_ip: &file::ClientIp, path: &str) -> Checked<ClientIpConfig> {
        let trusted_proxies = self.optional(
            &client_ip.trusted_proxies,
            &child_key(path, "trusted_proxies"),
            |check, items, path| check.each(items, path, text(parse_ip_net)),
        );
        let ipv6_prefix = self.optional(
            &client_ip.ipv6_prefix,
            &child_key(path, "ipv6_prefix"),
            int(1, 128),
        );
        let defaults = ClientIpConfig::default();
        Ok(ClientIpConfig {
            trusted_proxies: trusted_proxies?.unwrap_or(defaults.trusted_proxies),
            ipv6_prefix: match ipv6_prefix? {
                Some(n) => u8::try_from(n).unwrap_or(defaults.ipv6_prefix),
                None => defaults.ipv6_prefix,
            },
        })
    }

    fn plans(
        &mut self,
        plans: &std::collections::BTreeMap<String, Field<Vec<Field<file::PlanLimit>>>>,
        path: &str,
    ) -> Checked<Vec<Plan>> {
        let read: Vec<Checked<Plan>> = plans
            .iter()
            .map(|(name, limits)| {
                let plan_path = child_key(path, name);
                let name = parse_plan_name(name).map_err(|m| self.value_error(&plan_path, m));
                let limits = match limits {
                    Field::Absent => Err(self.value_error(&plan_path, "needs at least one limit")),
                    Field::Invalid(m) => Err(self.value_error(&plan_path, m.clone())),
                    Field::Valid(items) => {
                        let checked = self.list(items, &plan_path, Self::plan_limit);
                        let unique = self.unique(items, |l| &l.name, &plan_path, "limit name");
                        unique.and(checked)
                    }
                };
                Ok(Plan {
                    name: name?,
                    limits: limits?,
                })
            })
            .collect();
        read.into_iter().collect()
    }

    fn plan_limit(&mut self, limit: &file::PlanLimit, path: &str) -> Checked<PlanLimit> {
        let name = self.required(&limit.name, path, "name", text(parse_limit_name));
        let max = self.required(&limit.limit, path, "limit", positive);
        let month = is_month(&limit.window);
        let window = self.required(&limit.window, path, "window", text(parse_window));
        let algorithm = self.algorithm(&limit.algorithm, &limit.burst, &max, &window, month, path);
        Ok(PlanLimit {
            name: name?,
            limit: NonZeroU64::new(max?).ok_or(Reported)?,
            window_ms: window?,
            algorithm: algorithm?,
        })
    }

    fn api_keys(&mut self, keys: &file::ApiKeys, path: &str) -> Checked<ApiKeyConfig> {
        let defaults = default_api_keys();
        let header = self.optional(
            &keys.header,
            &child_key(path, "header"),
            text(parse_header_name),
        );
        let map = self.optional(&keys.keys, &child_key(path, "keys"), |check, map, path| {
            let read: Vec<Checked<(String, Arc<str>)>> = map
                .iter()
                .map(|(key, plan)| {
                    let key_path = child_key(path, key);
                    if key.is_empty() {
                        return Err(check.value_error(&key_path, "an API key must not be empty"));
                    }
                    match plan {
                        Field::Valid(Text(plan)) => Ok((key.clone(), Arc::from(plan.as_str()))),
                        Field::Invalid(m) => Err(check.value_error(&key_path, m.clone())),
                        Field::Absent => Err(check.value_error(&key_path, "needs a plan name")),
                    }
                })
                .collect();
            read.into_iter()
                .collect::<Checked<std::collections::HashMap<_, _>>>()
        });
        let unknown = self.optional(
            &keys.unknown,
            &child_key(path, "unknown"),
            text(|s| {
                Ok(match s {
                    "reject" => UnknownKey::Reject,
                    plan => UnknownKey::Plan(Arc::from(plan)),
                })
            }),
        );
        let redis_hash = self.optional(
            &keys.redis_hash,
            &child_key(path, "redis_hash"),
            |_, b: &bool, _| Ok(*b),
        );
        let cache = self.optional(&keys.cache, &child_key(path, "cache"), text(parse_timeout));
        Ok(ApiKeyConfig {
            header: header?.unwrap_or(defaults.header),
            keys: map?.unwrap_or_default(),
            unknown: unknown?.unwrap_or(defaults.unknown),
            redis_hash: redis_hash?.unwrap_or(defaults.redis_hash),
            cache: cache?.unwrap_or(defaults.cache),
        })
    }

    fn users(&mut self, users: &file::Users, path: &str) -> Checked<UserConfig> {
        let header = self.optional(
            &users.header,
            &child_key(path, "header"),
            text(parse_header_name),
        );
        let jwt = self.optional(&users.jwt, &child_key(path, "jwt"), Self::jwt);
        Ok(UserConfig {
            header: header?.unwrap_or_else(|| HeaderName::from_static("x-user")),
            jwt: jwt?,
        })
    }

    fn jwt(&mut self, jwt: &file::Jwt, path: &str) -> Checked<JwtVerifier> {
        let alg_path = child_key(path, "algorithm");
        let algorithm = self.optional(
            &jwt.algorithm,
            &alg_path,
            text(|s| one_of(s, &JwtAlgorithm::SPELLINGS)),
        );
        let secret = self.optional(
            &jwt.secret,
            &child_key(path, "secret"),
            text(|s| Ok(s.to_owned())),
        );
        let key_path = child_key(path, "public_key");
        let public_key = self.optional(
            &jwt.public_key,
            &key_path,
            text(|s| std::fs::read(s).map_err(|e| format!("cannot read {s:?}: {e}"))),
        );
        let claim = self.optional(
            &jwt.claim,
            &child_key(path, "claim"),
            text(|s| {
                if s.is_empty() {
                    Err("must name a claim, e.g. sub".to_owned())
                } else {
                    Ok(s.to_owned())
                }
            }),
        );
        let claim = claim?.unwrap_or_else(|| "sub".to_owned());
        let (algorithm, secret, public_key) = (algorithm?, secret?, public_key?);
        let (alg, key) = match (algorithm, secret, public_key) {
            (None | Some(JwtAlgorithm::Hs256), Some(secret), None) => {
                if secret.len() < 32 {
                    return Err(self.value_error(
                        &child_key(path, "secret"),
                        "is shorter than 32 bytes; an HS256 secret should be at least as long as its hash (RFC 7518 §3.2)",
                    ));
                }
                (JwtAlgorithm::Hs256, secret.into_bytes())
            }
            (Some(alg @ (JwtAlgorithm::Rs256 | JwtAlgorithm::Es256)), None, Some(pem)) => {
                (alg, pem)
            }
            (_, Some(_), Some(_)) => {
                return Err(self.value_error(
                    path,
                    "set either secret (HS256) or public_key (RS256, ES256), not both",
                ));
            }
            (None, None, Some(_)) => {
                return Err(self.value_error(path, "a public_key needs algorithm: RS256 or ES256"));
            }
            (None | Some(JwtAlgorithm::Hs256), None, _) => {
                return Err(self.value_error(path, "HS256 needs a secret"));
            }
            (Some(_), _, None) => {
                return Err(self.value_error(
                    path,
                    "RS256 and ES256 need public_key: the path of a PEM public key",
                ));
            }
        };
        JwtVerifier::new(alg, &key, &claim).map_err(|m| self.value_error(&key_path, m))
    }

    fn timeouts(&mut self, timeouts: &file::Timeouts, path: &str) -> Checked<Timeouts> {
        let defaults = Timeouts::default();
        let mut one = |field: &Field<Text>, name: &str, default: Duration| {
            self.optional(field, &child_key(path, name), text(parse_timeout))
                .map(|t| t.unwrap_or(default))
        };
        let header_read = one(&timeouts.header_read, "header_read", defaults.header_read);
        let upstream_connect = one(
            &timeouts.upstream_connect,
            "upstream_connect",
            defaults.upstream_connect,
        );
        let upstream_response = one(
            &timeouts.upstream_response,
            "upstream_response",
            defaults.upstream_response,
        );
        let upstream_idle = one(
            &timeouts.upstream_idle,
            "upstream_idle",
            defaults.upstream_idle,
        );
        let idle = one(&timeouts.idle, "idle", defaults.idle);
        let drain = one(&timeouts.drain, "drain", defaults.drain);
        Ok(Timeouts {
            header_read: header_read?,
            upstream_connect: upstream_connect?,
            upstream_response: upstream_response?,
            upstream_idle: upstream_idle?,
            idle: idle?,
            drain: drain?,
        })
    }

    fn routes(
        &mut self,
        routes: &[Field<file::Route>],
        path: &str,
        default_timeout: Duration,
    ) -> Checked<Vec<Route>> {
        if routes.is_empty() {
            return Err(self.value_error(path, "needs at least one route"));
        }
        let checked = self.list(routes, path, |check, route, path| {
            check.route(route, path, default_timeout)
        });
        let unique = self.unique(routes, |route| &route.name, path, "route name");
        unique?;
        checked
    }

    /// Reports every name that repeats an earlier one in the list at `path`.
    ///
    /// Works on the names as written, so duplicates are found even when
    /// other fields of the items are wrong.
    fn unique<T>(
        &mut self,
        items: &[Field<T>],
        name: impl Fn(&T) -> &Field<Text>,
        path: &str,
        what: &str,
    ) -> Checked<()> {
        let names = items.iter().map(|item| match item {
            Field::Valid(item) => match name(item) {
                Field::Valid(Text(name)) => Some(name.as_str()),
                _ => None,
            },
            _ => None,
        });
        let mut first: HashMap<&str, usize> = HashMap::new();
        let mut result = Ok(());
        for (i, name) in names.enumerate() {
            let Some(name) = name else { continue };
            if let Some(&j) = first.get(name) {
                let here = child_key(&child_index(path, i), "name");
                let message = format!(
                    "duplicate {what} {name:?}; it is already used by {}",
                    child_index(path, j)
                );
                result = Err(self.value_error(&here, message));
            } else {
                first.insert(name, i);
            }
        }
        result
    }

    fn route(
        &mut self,
        route: &file::Route,
        path: &str,
        default_timeout: Duration,
    ) -> Checked<Route> {
        let name = self.required(&route.name, path, "name", text(parse_route_name));
        let matcher = self.optional(&route.matcher, &child_key(path, "match"), Self::matcher);
        let action = self.action(route, path, default_timeout);
        let cost = self.optional(&route.cost, &child_key(path, "cost"), positive);
        let limits = self.optional(
            &route.limits,
            &child_key(path, "limits"),
            |check, limits, path| check.limits(limits, path),
        );
        let on_error = self.optional(
            &route.on_error,
            &child_key(path, "on_error"),
            text(parse_on_error),
        );
        let shadow = self.optional(
            &route.shadow,
            &child_key(path, "shadow"),
            leaf(|&Flag(b): &Flag| Ok::<_, String>(b)),
        );
        Ok(Route {
            name: name?,
            matcher: matcher?.unwrap_or_default(),
            action: action?,
            cost: cost?.unwrap_or(1),
            limits: limits?.unwrap_or_default(),
            shadow: shadow?.unwrap_or(false),
            on_error: on_error?,
        })
    }

    /// `upstream` (with its optional `timeout`) or `respond`, exactly one.
    fn action(
        &mut self,
        route: &file::Route,
        path: &str,
        default_timeout: Duration,
    ) -> Checked<Action> {
        let upstream_path = child_key(path, "upstream");
        let respond_path = child_key(path, "respond");
        let timeout_path = child_key(path, "timeout");
        let upstream = self.optional(&route.upstream, &upstream_path, text(parse_upstream));
        let respond = self.optional(&route.respond, &respond_path, Self::respond);
        let timeout = self.optional(&route.timeout, &timeout_path, text(parse_timeout));
        let ca_path = child_key(path, "upstream_ca");
        let is_https =
            matches!(&route.upstream, Field::Valid(Text(u)) if u.starts_with("https://"));
        let tls = self.optional(&route.upstream_ca, &ca_path, |check, ca, path| {
            if !is_https {
                return Err(check.value_error(
                    path,
                    "applies only to https:// upstreams; remove it or use https://",
                ));
            }
            crate::tls::client_config(Some(&check.file(&ca.0)))
                .map_err(|e| check.value_error(path, e.to_string()))
        });
        let upgrade = self.optional(&route.upgrade, &child_key(path, "upgrade"), |_, b, _| {
            Ok(*b)
        });
        let forward_proxy_authorization = self.optional(
            &route.forward_proxy_authorization,
            &child_key(path, "forward_proxy_authorization"),
            |_, b, _| Ok(*b),
        );

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
        match (upstream?, respond?) {
            (Some(uri), _) => Ok(Action::Upstream(Upstream {
                uri,
                timeout: timeout?.unwrap_or(default_timeout),
                tls: tls?,
                upgrade: upgrade?.is_some_and(|file::Flag(b)| b),
                forward_proxy_authorization: forward_proxy_authorization?
                    .is_some_and(|file::Flag(b)| b),
            })),
            (None, Some(respond)) => Ok(Action::Respond(respond)),
            // Both absent was reported above.
            (None, None) => Err(Reported),
        }
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
        Ok(Respond {
            status: status?.unwrap_or(StatusCode::OK),
            body: body?.unwrap_or_default(),
            content_type: content_type?.unwrap_or_else(|| DEFAULT_CONTENT_TYPE.to_owned()),
        })
    }

    fn limits(&mut self, limits: &[Field<file::Limit>], path: &str) -> Checked<Vec<Limit>> {
        let checked = self.list(limits, path, Self::limit);
        let unique = self.unique(limits, |limit| &limit.name, path, "limit name");
        unique?;
        checked
    }

    fn limit(&mut self, limit: &file::Limit, path: &str) -> Checked<Limit> {
        let name = self.required(&limit.name, path, "name", text(parse_limit_name));
        let key = self.required(&limit.key, path, "key", Self::key);
        let cost = self.optional(&limit.cost, &child_key(path, "cost"), positive);
        let shadow = self.optional(
            &limit.shadow,
            &child_key(path, "shadow"),
            leaf(|&Flag(b): &Flag| Ok::<_, String>(b)),
        );
        let plan = self
            .optional(&limit.plan, &child_key(path, "plan"), |_, b: &bool, _| {
                Ok(*b)
            })
            .map(|p| p.unwrap_or(false));
        if let Ok(true) = plan {
            // The numbers come from the caller's plan; any written here
            // would be silently ignored, so they are refused.
            let mut numbers = Ok(());
            for (field, absent) in [
                ("limit", limit.limit.is_absent()),
                ("window", limit.window.is_absent()),
                ("algorithm", limit.algorithm.is_absent()),
                ("burst", limit.burst.is_absent()),
            ] {
                if !absent {
                    numbers = Err(self.value_error(
                        &child_key(path, field),
                        "a limit with plan: true takes its numbers from the caller's plan; remove this",
                    ));
                }
            }
            numbers?;
            return Ok(Limit {
                name: name?,
                key: key?,
                limit: NonZeroU64::MIN,
                window_ms: NonZeroU64::MIN,
                cost: cost?,
                algorithm: Algorithm::default(),
                plan: true,
                shadow: shadow?.unwrap_or(false),
            });
        }
        let max = self.required(&limit.limit, path, "limit", positive);
        let month = is_month(&limit.window);
        let window = self.required(&limit.window, path, "window", text(parse_window));
        let algorithm = self.algorithm(&limit.algorithm, &limit.burst, &max, &window, month, path);
        plan?;
        Ok(Limit {
            name: name?,
            key: key?,
            limit: NonZeroU64::new(max?).ok_or(Reported)?,
            window_ms: window?,
            cost: cost?,
            algorithm: algorithm?,
            plan: false,
            shadow: shadow?.unwrap_or(false),
        })
    }

    /// `algorithm` and `burst` of a limit with limit `max` and `window`,
    /// and the bounds that depend on them.
    fn algorithm(
        &mut self,
        algorithm: &Field<Text>,
        burst: &Field<Int>,
        max: &Checked<u64>,
        window: &Checked<NonZeroU64>,
        month: bool,
        path: &str,
    ) -> Checked<Algorithm> {
        let alg_path = child_key(path, "algorithm");
        let mut algorithm = self.optional(algorithm, &alg_path, text(parse_algorithm));
        if month {
            // A calendar month is counted as a fixed window.
            algorithm = match algorithm {
                Ok(None | Some(Algorithm::FixedWindow)) => Ok(Some(Algorithm::CalendarMonth)),
                Ok(Some(other)) => Err(self.value_error(
                    &alg_path,
                    format!(
                        "a window of one calendar month is counted as a fixed window; remove {}, or write a window like 30d",
                        other.name()
                    ),
                )),
                Err(r) => Err(r),
            };
        }
        let burst_path = child_key(path, "burst");
        let burst = self.optional(burst, &burst_path, positive);
        // gcra takes its burst (default: the limit); the others have none.
        let algorithm = match (algorithm, &burst, max) {
            (Ok(Some(Algorithm::Gcra { .. })), Ok(b), Ok(l)) => Ok(Algorithm::Gcra {
                burst: b.unwrap_or(*l),
            }),
            (Ok(Some(Algorithm::Gcra { .. })), _, _) => Err(Reported),
            (Ok(other), Ok(Some(_)), _) => Err(self.value_error(
                &burst_path,
                format!(
                    "only a gcra limit takes a burst; this one is {}",
                    other.unwrap_or_default().name()
                ),
            )),
            (Ok(other), _, _) => Ok(other.unwrap_or_default()),
            (Err(r), _, _) => Err(r),
        };
        if let (Ok(l), Ok(w), Ok(alg)) = (max, window, &algorithm) {
            // The Redis script computes in doubles: keep 3·max(L, B)·w below 2^53.
            let units = match alg {
                Algorithm::Gcra { burst } => (*l).max(*burst),
                _ => *l,
            };
            if u128::from(units) * u128::from(w.get()) * 3 >= 1u128 << 53 {
                let field = if units == *l { "limit" } else { "burst" };
                return Err(self.value_error(
                    &child_key(path, field),
                    "is too large for this window (limit × window in ms must stay below 3·10^15); use a shorter window or a smaller limit",
                ));
            }
            if *alg == Algorithm::SlidingLog && *l > MAX_LOG_LIMIT {
                return Err(self.value_error(
                    &child_key(path, "limit"),
                    format!(
                        "is too large for sliding_log, which keeps one entry per unit (at most {MAX_LOG_LIMIT}); use sliding_window or gcra"
                    ),
                ));
            }
        }
        algorithm
    }

    fn key(&mut self, key: &OneOrMany<Text>, path: &str) -> Checked<KeySpec> {
        let parts = self.each(key, path, text(parse_key_chain))?;
        if parts.is_empty() {
            return Err(self.value_error(path, "needs at least one source, e.g. ip"));
        }
        Ok(KeySpec { parts })
    }
}

const DEFAULT_PREFIX: &str = "tg:";
/// Denied requests remembered in process: a few MB at most.
const DEFAULT_DENY_CACHE: usize = 10_000;
/// A sliding log keeps one entry per admitted unit; past this, memory per
/// identity (tens of bytes per entry in Redis) is better spent elsewhere.
const MAX_LOG_LIMIT: u64 = 100_000;
const DEFAULT_CONTENT_TYPE: &str = "text/plain; charset=utf-8";

fn parse_socket_addr(s: &str) -> Result<SocketAddr, String> {
    s.parse().map_err(|_| {
        format!("{s:?} is not a socket address; write IP:PORT, e.g. 127.0.0.1:8080 or [::1]:8080")
    })
}

fn one_of<T: Copy>(s: &str, choices: &[(&str, T)]) -> Result<T, String> {
    choices
        .iter()
        .find(|(name, _)| *name == s)
        .map(|&(_, value)| value)
        .ok_or_else(|| {
            let names: Vec<&str> = choices.iter().map(|(name, _)| *name).collect();
            format!("unknown value {s:?}; expected one of {}", names.join(", "))
        })
}

fn parse_header_mode(s: &str) -> Result<HeaderMode, String> {
    one_of(s, &HeaderMode::SPELLINGS)
}

/// Plan names appear in key maps and the Redis hash.
fn parse_plan_name(s: &str) -> Result<Arc<str>, String> {
    let ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-');
    if s.is_empty() || !s.chars().all(ok) || s == "reject" {
        return Err(format!(
            "{s:?} is not a valid plan name; use letters, digits, '_', '.' and '-' (and not \"reject\")"
        ));
    }
    Ok(Arc::from(s))
}

fn default_api_keys() -> ApiKeyConfig {
    ApiKeyConfig {
        header: HeaderName::from_static("x-api-key"),
        keys: HashMap::new(),
        unknown: UnknownKey::Reject,
        redis_hash: false,
        cache: Duration::from_secs(10),
    }
}

fn parse_algorithm(s: &str) -> Result<Algorithm, String> {
    one_of(s, &Algorithm::SPELLINGS)
}

fn parse_on_error(s: &str) -> Result<OnError, String> {
    one_of(s, &OnError::SPELLINGS)
}

fn parse_clock(s: &str) -> Result<ClockSource, String> {
    one_of(s, &ClockSource::SPELLINGS)
}

fn parse_redis_url(s: &str) -> Result<String, String> {
    match s
        .strip_prefix("redis://")
        .or_else(|| s.strip_prefix("rediss://"))
    {
        Some(rest) if !rest.is_empty() && !rest.starts_with('/') => Ok(s.to_owned()),
        Some(_) => Err(format!("{s:?} has no host; write redis://HOST:PORT")),
        None => Err(format!(
            "{s:?} is not a Redis URL; write redis://HOST:PORT, e.g. redis://127.0.0.1:6379"
        )),
    }
}

/// `host:port` or `[v6]:port`, as a `(host, port)` pair.
fn parse_host_port(s: &str) -> Result<(String, u16), String> {
    let bad = || format!("{s:?} is not HOST:PORT; write e.g. 127.0.0.1:7000");
    let (host, port) = s.rsplit_once(':').ok_or_else(bad)?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    let port: u16 = port.parse().map_err(|_| bad())?;
    if host.is_empty() || port == 0 || host.contains(['/', ' ', '@']) {
        return Err(bad());
    }
    Ok((host.to_owned(), port))
}

/// `10.0.0.0/8`, `::1/128`, or a bare address (a /32 or /128 network).
///
/// A network with host bits set (`10.0.0.1/8`) is refused rather than
/// truncated: it is a list of whom to believe, and the writer meant either
/// the one proxy `10.0.0.1` or all of `10.0.0.0/8`. Guessing the network
/// would trust sixteen million addresses to write `X-Forwarded-For` when
/// one was meant; the error names both readings.
fn parse_ip_net(s: &str) -> Result<IpNet, String> {
    let net = if s.contains('/') {
        s.parse::<IpNet>().ok()
    } else {
        s.parse::<IpAddr>().ok().map(IpNet::from)
    };
    let net = net.ok_or_else(|| {
        format!(
            "{s:?} is not an IP address or CIDR network; write e.g. 10.0.0.0/8, 192.0.2.7 or ::1"
        )
    })?;
    if net.trunc() != net {
        let one = IpNet::from(net.addr());
        return Err(format!(
            "{s:?} has host bits set; write {} (or {one} for one address)",
            net.trunc()
        ));
    }
    Ok(net)
}

fn parse_header_name(s: &str) -> Result<HeaderName, String> {
    HeaderName::from_bytes(s.as_bytes()).map_err(|_| {
        format!("{s:?} is not a valid header name; use letters, digits and '-', e.g. x-api-key")
    })
}

/// A duration: a whole number and one of `ms`, `s`, `m`, `h`, `d`.
fn parse_duration(s: &str) -> Result<Duration, String> {
    let digits = s.bytes().take_while(u8::is_ascii_digit).count();
    let (number, unit) = s.split_at(digits);
    let millis_per_unit: u64 = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => {
            return Err(format!(
                "{s:?} is not a duration; write {}",
                duration_hint(s)
            ));
        }
    };
    number
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(millis_per_unit))
        .map(Duration::from_millis)
        .ok_or_else(|| format!("{s:?} is not a duration; write {}", duration_hint(s)))
}

/// How to write what the user meant: `5 minutes` → `5m or 300s`.
fn duration_hint(s: &str) -> String {
    const GENERIC: &str = "a whole number and a unit (ms, s, m, h or d), e.g. 5m or 300s";
    let s = s.trim();
    let digits = s.bytes().take_while(u8::is_ascii_digit).count();
    let (number, word) = s.split_at(digits);
    let Ok(n) = number.parse::<u64>() else {
        return GENERIC.to_owned();
    };
    let smaller = |factor: u64, unit: &str| {
        n.checked_mul(factor)
            .map_or(String::new(), |m| format!(" or {m}{unit}"))
    };
    match word.trim().to_ascii_lowercase().as_str() {
        "" => format!("{n}s or {n}ms (a unit is required)"),
        "ms" | "msec" | "msecs" | "millis" | "millisecond" | "milliseconds" => format!("{n}ms"),
        "s" | "sec" | "secs" | "second" | "seconds" => format!("{n}s{}", smaller(1000, "ms")),
        "m" | "min" | "mins" | "minute" | "minutes" => format!("{n}m{}", smaller(60, "s")),
        "h" | "hr" | "hrs" | "hour" | "hours" => format!("{n}h{}", smaller(60, "m")),
        "d" | "day" | "days" => format!("{n}d{}", smaller(24, "h")),
        _ => GENERIC.to_owned(),
    }
}

/// A timeout: a duration above zero.
fn parse_timeout(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d.is_zero() {
        return Err(format!("{s:?} is too short; a timeout must be more than 0"));
    }
    Ok(d)
}

/// Whether a window is written as `month` (a calendar month in UTC).
fn is_month(window: &Field<Text>) -> bool {
    matches!(window, Field::Valid(Text(s)) if s == "month")
}

/// The nominal length of `window: month` (30 days), shown as the policy's
/// `w`; the count itself follows calendar months.
const MONTH_MS: u64 = 30 * 86_400_000;

/// A limit window: a duration of at least one second, in milliseconds, or
/// `month` (nominally 30 days; see [`is_month`]).
fn parse_window(s: &str) -> Result<NonZeroU64, String> {
    if s == "month" {
        return NonZeroU64::new(MONTH_MS).ok_or_else(|| "month".to_owned());
    }
    let d = parse_duration(s)?;
    if d < Duration::from_secs(1) {
        return Err(format!("{s:?} is too short; a window must be at least 1s"));
    }
    u64::try_from(d.as_millis())
        .ok()
        .and_then(NonZeroU64::new)
        .ok_or_else(|| format!("{s:?} is too long"))
}

fn parse_route_name(s: &str) -> Result<Arc<str>, String> {
    if s.is_empty() {
        return Err("must not be empty".to_owned());
    }
    Ok(Arc::from(s))
}

/// Limit names are rendered inside a quoted header string (`"per_ip";q=…`).
fn parse_limit_name(s: &str) -> Result<Arc<str>, String> {
    let ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-');
    if s.is_empty() || !s.chars().all(ok) {
        return Err(format!(
            "{s:?} is not a valid limit name; use letters, digits, '_', '.' and '-'"
        ));
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
fn parse_method(s: &str) -> Result<Method, String> {
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

/// A size in bytes: a whole number, optionally with a binary unit
/// (`512`, `8KiB`, `10MiB`, `1GiB`).
fn parse_size(s: &str) -> Result<u64, String> {
    let digits = s.bytes().take_while(u8::is_ascii_digit).count();
    let (number, unit) = s.split_at(digits);
    let factor: u64 = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        _ => {
            return Err(format!(
                "{s:?} is not a size; write bytes or a whole number with KiB, MiB or GiB, e.g. 64KiB"
            ));
        }
    };
    number
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(factor))
        .ok_or_else(|| format!("{s:?} is not a size; write e.g. 64KiB or 10MiB"))
}

/// `http://host[:port][/base]` or `https://…`.
fn parse_upstream(s: &str) -> Result<Uri, String> {
    let example = "e.g. http://127.0.0.1:9000";
    if !s.contains("://") {
        return Err(format!("{s:?} has no scheme; write http://{s}"));
    }
    let uri: Uri = s
        .parse()
        .map_err(|_| format!("{s:?} is not a URL; write {example}"))?;
    match uri.scheme_str() {
        Some("http" | "https") => {}
        Some(other) => {
            return Err(format!(
                "{s:?} has unsupported scheme {other:?}; write {example}"
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

fn parse_content_type(s: &str) -> Result<String, String> {
    HeaderValue::from_str(s)
        .map(|_| s.to_owned())
        .map_err(|_| format!("{s:?} is not a valid header value"))
}

/// One part of a key: `api_key | user | ip` (first present wins).
fn parse_key_chain(s: &str) -> Result<Vec<KeySource>, String> {
    s.split('|')
        .map(|source| match source.trim() {
            "" => Err(format!(
                "{s:?} has an empty source; write e.g. ip or api_key | ip"
            )),
            "ip" => Ok(KeySource::Ip),
            "api_key" => Ok(KeySource::ApiKey),
            "user" => Ok(KeySource::User),
            other => match other.strip_prefix("header:") {
                Some(name) => HeaderName::from_bytes(name.trim().as_bytes())
                    .map(KeySource::Header)
                    .map_err(|_| {
                        format!(
                            "{name:?} is not a valid header name; use letters, digits and '-', e.g. header:x-client-id"
                        )
                    }),
                None => Err(format!(
                    "unknown key source {other:?}; expected ip, api_key, user or header:NAME"
                )),
            },
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("1d"), Ok(Duration::from_secs(86_400)));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        assert_eq!(
            parse_duration("5 minutes"),
            Err("\"5 minutes\" is not a duration; write 5m or 300s".into())
        );
        assert_eq!(
            parse_duration("60"),
            Err("\"60\" is not a duration; write 60s or 60ms (a unit is required)".into())
        );
        assert_eq!(
            parse_duration("2 hours"),
            Err("\"2 hours\" is not a duration; write 2h or 120m".into())
        );
        for bad in [
            "",
            "s",
            "1.5s",
            "-1s",
            "1S",
            "1m30s",
            "99999999999999999999s",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
        assert!(parse_duration("18446744073709551615d").is_err());
    }

    #[test]
    fn windows_and_timeouts() {
        assert_eq!(parse_window("1s").ok(), NonZeroU64::new(1000));
        assert_eq!(
            parse_window("999ms"),
            Err("\"999ms\" is too short; a window must be at least 1s".into())
        );
        assert!(parse_timeout("0ms").is_err());
    }

    #[test]
    fn key_chains() {
        assert_eq!(
            parse_key_chain("api_key | user|ip"),
            Ok(vec![KeySource::ApiKey, KeySource::User, KeySource::Ip])
        );
        assert_eq!(
            parse_key_chain("header:X-Client"),
            Ok(vec![KeySource::Header(HeaderName::from_static("x-client"))])
        );
        assert!(parse_key_chain("ip |").is_err());
        assert!(parse_key_chain("cookie:x").is_err());
    }

    #[test]
    fn nets_hosts_methods_upstreams() {
        assert_eq!(parse_ip_net("::1").map(|n| n.prefix_len()), Ok(128));
        assert_eq!(
            parse_ip_net("10.1.2.3/8"),
            Err("\"10.1.2.3/8\" has host bits set; write 10.0.0.0/8 (or 10.1.2.3/32 for one address)".into())
        );
        assert_eq!(
            parse_ip_net("2001:db8::1/64"),
            Err("\"2001:db8::1/64\" has host bits set; write 2001:db8::/64 (or 2001:db8::1/128 for one address)".into())
        );
        assert_eq!(
            parse_ip_net("10.1.2.3/32").map(|n| n.to_string()),
            Ok("10.1.2.3/32".into())
        );
        assert_eq!(
            parse_ip_net("0.0.0.0/0").map(|n| n.to_string()),
            Ok("0.0.0.0/0".into())
        );
        assert_eq!(parse_host("*.Example.COM"), Ok("*.example.com".into()));
        assert!(parse_host("a.example.com:80").is_err());
        assert!(parse_host("a.*.com").is_err());
        assert_eq!(parse_method("post"), Ok(Method::POST));
        assert!(parse_method("GTE").is_err());
        assert!(parse_upstream("http://127.0.0.1:9000/base").is_ok());
        assert!(parse_upstream("https://x").is_ok());
        assert!(parse_upstream("ftp://x").is_err());
        assert_eq!(parse_size("64KiB"), Ok(65_536));
        assert_eq!(parse_size("10MiB"), Ok(10 << 20));
        assert_eq!(parse_size("512"), Ok(512));
        assert!(parse_size("10MB").is_err());
        assert!(parse_size("99999999999GiB").is_err());
        assert!(parse_upstream("http:///x").is_err());
        assert!(parse_upstream("127.0.0.1:9000").is_err());
        assert!(parse_upstream("http://x/?q=1").is_err());
        assert!(parse_redis_url("redis://").is_err());
        assert!(parse_redis_url("rediss://h:6380").is_ok());
        assert_eq!(parse_host_port("[::1]:7000"), Ok(("::1".into(), 7000)));
        assert_eq!(parse_host_port("h:7000"), Ok(("h".into(), 7000)));
        for bad in ["h", "h:0", ":7000", "h:x", "h:70000"] {
            assert!(parse_host_port(bad).is_err(), "{bad}");
        }
    }
}
