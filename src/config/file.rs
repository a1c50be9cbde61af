//! Serde mirror of the YAML file: stage one of loading.
//!
//! These structs follow the file's shape and nothing more; every rule about
//! values (durations, addresses, required fields, exclusive fields) lives in
//! [`load`](super::load), which turns them into the validated model.
//!
//! The shape is built so that one mistake never hides another:
//!
//! - Every field is a [`Field`], which *keeps* a type error instead of
//!   returning it. A map where a string belongs makes that one field
//!   [`Field::Invalid`]; the rest of the file is still read and checked.
//! - Leaves ([`Text`], [`Int`], [`OneOrMany`]) read a whole
//!   [`yaml_serde::Value`] first, so they always consume their node and can
//!   say what they found ("expected a string, found a mapping").
//! - Structs do not use `deny_unknown_fields`, which would stop at the first
//!   unknown field. [`from_value`] runs the deserializer under
//!   `serde_ignored` and returns every ignored key instead, with the list of
//!   fields that were expected at that place.
//!
//! [`Field`] may swallow an error only because the input is a
//! [`yaml_serde::Value`]: its map and sequence accessors take each node out
//! before handing it over, so a failed node leaves its parent readable. A
//! streaming deserializer would be left mid-node, which is why
//! [`from_value`] is the only entry point.

use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;

use schemars::JsonSchema;
use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};
use yaml_serde::Value;

use super::position::{child_index, child_key};
use super::schema::spellings;
use super::{ClockSource, HeaderMode, OnError};
use crate::identity::jwt::JwtAlgorithm;
use crate::limit::Algorithm;
use crate::target::EscapedSlashes;

/// One field as written: absent (or `null`), of the wrong type, or read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Field<T> {
    /// Not in the file, or written as `null` / left empty.
    #[default]
    Absent,
    /// Present but not of the expected type; the message says why.
    Invalid(String),
    /// Present and well typed.
    Valid(T),
}

impl<T> Field<T> {
    /// Whether the field was left out.
    pub fn is_absent(&self) -> bool {
        matches!(self, Self::Absent)
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Field<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_option(FieldVisitor(PhantomData))
    }
}

struct FieldVisitor<T>(PhantomData<T>);

impl<'de, T: Deserialize<'de>> Visitor<'de> for FieldVisitor<T> {
    type Value = Field<T>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any value")
    }

    fn visit_none<E: de::Error>(self) -> Result<Field<T>, E> {
        Ok(Field::Absent)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Field<T>, E> {
        Ok(Field::Absent)
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Field<T>, D::Error> {
        Ok(match T::deserialize(deserializer) {
            Ok(value) => Field::Valid(value),
            Err(e) => Field::Invalid(tidy(&e.to_string())),
        })
    }
}

/// Rewrites serde's `invalid type: map, expected a string` (what a struct or
/// a list reports for a node of the wrong kind) as
/// `expected a string, found a mapping`, in the words the leaves use.
fn tidy(message: &str) -> String {
    let Some((found, expected)) = message
        .strip_prefix("invalid type: ")
        .and_then(|rest| rest.split_once(", expected "))
    else {
        return message.to_owned();
    };
    let expected = match expected {
        "a sequence" => "a list",
        // A mapping key that is not a string (`1: x`, `true: x`).
        "field identifier" => "a field name",
        other => other,
    };
    let found = match found {
        "map" => "a mapping".to_owned(),
        "sequence" => "a list".to_owned(),
        "unit value" => "null".to_owned(),
        other => match other.split_once(' ') {
            Some(("string", s)) => format!("the string {s}"),
            Some(("integer" | "floating", n)) => {
                format!(
                    "the number {}",
                    n.trim_start_matches("point ").trim_matches('`')
                )
            }
            Some(("boolean", b)) => b.trim_matches('`').to_owned(),
            _ => other.to_owned(),
        },
    };
    format!("expected {expected}, found {found}")
}

/// Says what kind of node `value` is, for "expected …, found …" messages.
fn describe(value: &Value) -> String {
    match value {
        Value::Null => "null".to_owned(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => format!("the number {n}"),
        Value::String(s) => format!("the string {s:?}"),
        Value::Sequence(_) => "a list".to_owned(),
        Value::Mapping(_) => "a mapping".to_owned(),
        Value::Tagged(t) => format!("a value tagged {}", t.tag),
    }
}

/// A scalar read as text. Strings are taken as written; numbers and
/// booleans in their YAML spelling, so `window: 60` reaches the duration
/// parser (which then asks for a unit) instead of failing as "not a string".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Text(pub String);

impl<'de> Deserialize<'de> for Text {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match Value::deserialize(deserializer)? {
            Value::String(s) => Ok(Self(s)),
            Value::Number(n) => Ok(Self(n.to_string())),
            Value::Bool(b) => Ok(Self(b.to_string())),
            other => Err(de::Error::custom(format_args!(
                "expected a string, found {}",
                describe(&other)
            ))),
        }
    }
}

/// A whole number. Range checks are the loader's business.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Int(pub i64);

impl<'de> Deserialize<'de> for Int {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = Value::deserialize(deserializer)?;
        if let Value::Number(n) = &value {
            if let Some(i) = n.as_i64() {
                return Ok(Self(i));
            }
            if n.is_u64() {
                return Err(de::Error::custom(format_args!("{n} is too large")));
            }
        }
        Err(de::Error::custom(format_args!(
            "expected a whole number, found {}",
            describe(&value)
        )))
    }
}

/// A YAML boolean (`true` / `false`), nothing else: `yes` or `"true"` is
/// more likely a mistake than a choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flag(pub bool);

impl<'de> Deserialize<'de> for Flag {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match Value::deserialize(deserializer)? {
            Value::Bool(b) => Ok(Self(b)),
            other => Err(de::Error::custom(format_args!(
                "expected true or false, found {}",
                describe(&other)
            ))),
        }
    }
}

/// One scalar or a list of them (`key: ip` or `key: [ip, user]`).
///
/// Each item is its own [`Field`], so one bad item does not hide the others.
/// Only for leaf item types: the items are read from owned values, outside
/// the unknown-field tracking of [`from_value`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OneOrMany<T> {
    /// A single value.
    One(Field<T>),
    /// A list, possibly empty.
    Many(Vec<Field<T>>),
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for OneOrMany<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        fn item<'de, T: Deserialize<'de>>(value: Value) -> Field<T> {
            Field::deserialize(value).unwrap_or_else(|e| Field::Invalid(e.to_string()))
        }
        Ok(match Value::deserialize(deserializer)? {
            Value::Sequence(items) => Self::Many(items.into_iter().map(item).collect()),
            other => Self::One(item(other)),
        })
    }
}

/// The whole file.
#[derive(Debug, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(default, expecting = "a mapping")]
#[schemars(deny_unknown_fields)]
pub struct Root {
    /// `listen: ADDR`, `{ addr, tls: { cert, key } }`, or a list of them.
    pub listen: Field<OneOrMany<Listen>>,
    /// `admin: ADDR`
    pub admin: Field<Text>,
    /// `store:`
    pub store: Field<Store>,
    /// `client_ip:`
    pub client_ip: Field<ClientIp>,
    /// `headers: ietf | github | legacy | none`
    #[schemars(extend("enum" = spellings(&HeaderMode::SPELLINGS)))]
    pub headers: Field<Text>,
    /// `plans: { free: [limits], pro: [limits] }`
    pub plans: Field<BTreeMap<String, Field<Vec<Field<PlanLimit>>>>>,
    /// `api_keys: { header, keys, unknown, redis_hash, cache }`
    pub api_keys: Field<ApiKeys>,
    /// `users: { header, jwt }`
    pub users: Field<Users>,
    /// `timeouts:`
    pub timeouts: Field<Timeouts>,
    /// `routes:`
    pub routes: Field<Vec<Field<Route>>>,
    /// `server: { max_connections, backlog, max_header_size, max_uri_size, max_body_size }`
    pub server: Field<Server>,
}

/// One `listen` entry: `127.0.0.1:8080` or `{ addr: …, tls: { cert, key } }`.
///
/// Read from an owned value (it is a [`OneOrMany`] item), so the mapping
/// form checks its own unknown fields with `deny_unknown_fields`: the first
/// unknown key of that small mapping is reported, with the fields allowed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Listen {
    /// `127.0.0.1:8080`
    Addr(Text),
    /// `{ addr, tls }`
    Map(ListenMap),
}

impl<'de> Deserialize<'de> for Listen {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match Value::deserialize(deserializer)? {
            map @ Value::Mapping(_) => ListenMap::deserialize(map)
                .map(Self::Map)
                .map_err(|e| de::Error::custom(tidy(&e.to_string()))),
            seq @ Value::Sequence(_) => Err(de::Error::custom(format_args!(
                "expected an address or a mapping {{ addr, tls }}, found {}",
                describe(&seq)
            ))),
            other => Text::deserialize(other)
                .map(Self::Addr)
                .map_err(|e| de::Error::custom(e.to_string())),
        }
    }
}

/// `listen: { addr, tls }`
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields, expecting = "a mapping")]
pub struct ListenMap {
    /// `addr: 127.0.0.1:8443`
    pub addr: Field<Text>,
    /// `tls: { cert, key }`
    pub tls: Field<Tls>,
}

/// `listen[i].tls:`
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields, expecting = "a mapping")]
pub struct Tls {
    /// `cert: /path/to/chain.pem`
    pub cert: Field<Text>,
    /// `key: /path/to/key.pem`
    pub key: Field<Text>,
}

/// `server:` — caps on what one client may hold or send.
#[derive(Debug, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(default, expecting = "a mapping")]
#[schemars(deny_unknown_fields)]
pub struct Server {
    /// `max_connections: 10000`
    pub max_connections: Field<Int>,
    /// `backlog: 4096` (accept queue of each listener; capped by the kernel)
    pub backlog: Field<Int>,
    /// `max_header_size: 128KiB`
    #[schemars(transform = super::schema::size)]
    pub max_header_size: Field<Text>,
    /// `max_uri_size: 16KiB` (path and query of the request target)
    #[schemars(transform = super::schema::size)]
    pub max_uri_size: Field<Text>,
    /// `max_body_size: 10MiB`
    #[schemars(transform = super::schema::size)]
    pub max_body_size: Field<Text>,
    /// `path: { normalize, merge_slashes, escaped_slashes }`
    pub path: Field<ServerPath>,
}

/// `server.path:` — how request paths are made canonical.
#[derive(Debug, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(default, expecting = "a mapping")]
#[schemars(deny_unknown_fields)]
pub struct ServerPath {
    /// `normalize: true` (false: route on and forward the raw path)
    pub normalize: Field<Flag>,
    /// `merge_slashes: true`
    pub merge_slashes: Field<Flag>,
    /// `escaped_slashes: reject | keep | decode`
    #[schemars(extend("enum" = spellings(&EscapedSlashes::SPELLINGS)))]
    pub escaped_slashes: Field<Text>,
}

/// `store:`
#[derive(Debug, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(default, expecting = "a mapping")]
#[schemars(deny_unknown_fields)]
pub struct Store {
    /// `redis: { url, timeout }`
    pub redis: Field<Redis>,
    /// `on_error: allow | deny | local`
    #[schemars(extend("enum" = spellings(&OnError::SPELLINGS)))]
    pub on_error: Field<Text>,
    /// `prefix: "tg:"`
    pub prefix: Field<Text>,
    /// `readable_keys: true` (Redis keys name the identity in clear)
    pub readable_keys: Field<Flag>,
    /// `clock: gateway | redis`
    #[schemars(extend("enum" = spellings(&ClockSource::SPELLINGS)))]
    pub clock: Field<Text>,
    /// `breaker: { failures, probe_interval }`
    pub breaker: Field<Breaker>,
    /// `deny_cache: 10000` (entries; 0 turns it off)
    pub deny_cache: Field<Int>,
}

/// `store.redis:`
#[derive(Debug, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(default, expecting = "a mapping")]
#[schemars(deny_unknown_fields)]
pub struct Redis {
    /// `url: redis://host:port`
    pub url: Field<Text>,
    /// `cluster: [host:port, ...]` (seed nodes)
    pub cluster: Field<OneOrMany<Text>>,
    /// `sentinel: { service_name, nodes }`
    pub sentinel: Field<Sentinel>,
    /// `username: tollgate`
    pub username: Field<Text>,
    /// `password: s3cret`
    pub password: Field<Text>,
    /// `database: 0`
    pub database: Field<Int>,
    /// `tls: { ca_file }`
    pub tls: Field<RedisTls>,
    /// `timeout: 25ms`
    #[schemars(transform = super::schema::duration)]
    pub timeout: Field<Text>,
    /// `connect_timeout: 1s`
    #[schemars(transform = super::schema::duration)]
    pub connect_timeout: Field<Text>,
    /// `reconnect: { min, max, jitter }`
    pub reconnect: Field<Reconnect>,
    /// `pool_size: 1`
    pub pool_size: Field<Int>,
}

/// `store.redis.sentinel:`
#[derive(Debug, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(default, expecting = "a mapping")]
#[schemars(deny_unknown_fields)]
pub struct Sentinel {
    /// `service_name: mymaster`
    pub service_name: Field<Text>,
    /// `nodes: [host:port, ...]`
    pub nodes: Field<OneOrMany<Text>>,
}

/// `store.redis.tls:`
#[derive(Debug, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(default, expecting = "a mapping")]
#[schemars(deny_unknown_fields)]
pub struct RedisTls {
    /// `ca_file: /etc/tollgate/redis-ca.pem`
    pub ca_file: Field<Text>,
}

/// `store.redis.reconnect:`
#[derive(Debug, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(default, expecting = "a mapping")]
#[schemars(deny_unknown_fields)]
pub struct Reconnect {
    /// `min: 100ms`
    #[schemars(transform = super::schema::duration)]
    pub min: Field<Text>,
    /// `max: 1s`
    #[schemars(transform = super::schema::duration)]
    pub max: Field<Text>,
    /// `jitter: 100ms`
    #[schemars(transform = super::schema::duration)]
    pub jitter: Field<Text>,
}

/// `store.breaker:`
#[derive(Debug, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(default, expecting = "a mapping")]
#[schemars(deny_unknown_fields)]
pub struct Breaker {
    /// `failures: 3`
    pub failures: Field<Int>,
    /// `probe_interval: 200ms`
    #[schemars(transform = super::schema::duration)]
    pub probe_interval: Field<Text>,
}

/// `client_ip:`
#[derive(Debug, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(default, expecting = "a mapping")]
#[schemars(deny_unknown_fields)]
pub struct ClientIp {
    /// `trusted_proxies: [CIDR or IP, ...]`
    pub trusted_proxies: Field<OneOrMany<Text>>,
    /// `ipv6_prefix: 64`
    pub ipv6_prefix: Field<Int>,
}

/// `api_keys:`
#[derive(Debug, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(default, expecting = "a mapping")]
#[schemars(deny_unknown_fields)]
pub struct ApiKeys {
    /// `header: x-api-key`
    pub header: Field<Text>,
    /// `keys: { KEY: PLAN }`
    pub keys: Field<BTreeMap<String, Field<Text>>>,
    /// `unknown: PLAN | reject`
    pub unknown: Field<Text>,
    /// `redis_hash: true` — look keys up with `HGET <prefix>keys KEY`
    pub redis_hash: Field<bool>,
    /// `cache: 10s` — how long a Redis answer is reused
    #[schemars(transform = super::schema::duration)]
    pub cache: Field<Text>,
}

/// One item of `plans.NAME:`.
#[derive(Debug, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(default, expecting = "a mapping")]
#[schemars(deny_unknown_fields)]
pub struct PlanLimit {
    /// `name: per_minute`
    pub name: Field<Text>,
    /// `limit: 100`
    pub limit: Field<Int>,
    /// `window: 1m` or `window: month`
    #[schemars(transform = super::schema::window)]
    pub window: Field<Text>,
    /// `algorithm: sliding_window | fixed_window | sliding_log | gcra`
    #[schemars(extend("enum" = spellings(&Algorithm::SPELLINGS)))]
    pub algorithm: Field<Text>,
    /// `burst: 20`
    pub burst: Field<Int>,
}

/// `users:`
#[derive(Debug, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(default, expecting = "a mapping")]
#[schemars(deny_unknown_fields)]
pub struct Users {
    /// `header: x-user`
    pub header: Field<Text>,
    /// `jwt: { algorithm, secret | public_key, claim }`
    pub jwt: Field<Jwt>,
}

/// `users.jwt:`
#[derive(Debug, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(default, expecting = "a mapping")]
#[schemars(deny_unknown_fields)]
pub struct Jwt {
    /// `algorithm: HS256 | RS256 | ES256`
    #[schemars(extend("enum" = spellings(&JwtAlgorithm::SPELLINGS)))]
    pub algorithm: Field<Text>,
    /// `secret: "..."` (HS256)
    pub secret: Field<Text>,
    /// `public_key: /path/key.pem` (RS256, ES256)
    pub public_key: Field<Text>,
    /// `claim: sub`
    pub claim: Field<Text>,
}

/// `timeouts:`
#[derive(Debug, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(default, expecting = "a mapping")]
#[schemars(deny_unknown_fields)]
pub struct Timeouts {
    /// `header_read: 10s`
    #[schemars(transform = super::schema::duration)]
    pub header_read: Field<Text>,
    /// `upstream_connect: 5s`
    #[schemars(transform = super::schema::duration)]
    pub upstream_connect: Field<Text>,
    /// `upstream_response: 30s`
    #[schemars(transform = super::schema::duration)]
    pub upstream_response: Field<Text>,
    /// `upstream_idle: 4s` (idle keep-alive connections to upstreams)
    #[schemars(transform = super::schema::duration)]
    pub upstream_idle: Field<Text>,
    /// `idle: 60s`
    #[schemars(transform = super::schema::duration)]
    pub idle: Field<Text>,
    /// `drain: 30s`
    #[schemars(transform = super::schema::duration)]
    pub drain: Field<Text>,
}

/// One item of `routes:`.
#[derive(Debug, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(default, expecting = "a mapping")]
#[schemars(deny_unknown_fields)]
pub struct Route {
    /// `name: api`
    pub name: Field<Text>,
    /// `match: { host, path, path_prefix, methods }`
    #[serde(rename = "match")]
    pub matcher: Field<Match>,
    /// `upstream: http://host:port[/base]`
    pub upstream: Field<Text>,
    /// `respond: { status, body, content_type }`
    pub respond: Field<Respond>,
    /// `timeout: 30s`
    #[schemars(transform = super::schema::duration)]
    pub timeout: Field<Text>,
    /// `cost: 1`
    pub cost: Field<Int>,
    /// `limits:`
    pub limits: Field<Vec<Field<Limit>>>,
    /// `upstream_ca: /path/to/ca.pem` (https upstreams)
    pub upstream_ca: Field<Text>,
    /// `upgrade: true` (pass `Upgrade` requests such as WebSocket through)
    pub upgrade: Field<Flag>,
    /// `forward_proxy_authorization: true` (pass the client's
    /// `Proxy-Authorization` on; it is removed otherwise)
    pub forward_proxy_authorization: Field<Flag>,
    /// `shadow: true`
    pub shadow: Field<Flag>,
    /// `on_error: allow | deny | local` (overrides `store.on_error`)
    #[schemars(extend("enum" = spellings(&OnError::SPELLINGS)))]
    pub on_error: Field<Text>,
}

/// `routes[i].match:`
#[derive(Debug, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(default, expecting = "a mapping")]
#[schemars(deny_unknown_fields)]
pub struct Match {
    /// `host: api.example.com`
    pub host: Field<Text>,
    /// `path: /exact`
    pub path: Field<Text>,
    /// `path_prefix: /api/`
    pub path_prefix: Field<Text>,
    /// `methods: [GET, POST]`
    pub methods: Field<OneOrMany<Text>>,
}

/// `routes[i].respond:`
#[derive(Debug, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(default, expecting = "a mapping")]
#[schemars(deny_unknown_fields)]
pub struct Respond {
    /// `status: 200`
    pub status: Field<Int>,
    /// `body: "hello"`
    pub body: Field<Text>,
    /// `content_type: text/plain`
    pub content_type: Field<Text>,
}

/// One item of `routes[i].limits:`.
#[derive(Debug, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(default, expecting = "a mapping")]
#[schemars(deny_unknown_fields)]
pub struct Limit {
    /// `name: per_ip`
    pub name: Field<Text>,
    /// `key: ip`, `key: api_key | ip`, `key: [ip, header:x-user]`
    pub key: Field<OneOrMany<Text>>,
    /// `limit: 100`
    pub limit: Field<Int>,
    /// `window: 1m` or `window: month`
    #[schemars(transform = super::schema::window)]
    pub window: Field<Text>,
    /// `cost: 2`
    pub cost: Field<Int>,
    /// `shadow: true`
    pub shadow: Field<Flag>,
    /// `algorithm: sliding_window | fixed_window | sliding_log | gcra`
    #[schemars(extend("enum" = spellings(&Algorithm::SPELLINGS)))]
    pub algorithm: Field<Text>,
    /// `burst: 20` (gcra only)
    pub burst: Field<Int>,
    /// `plan: true` — the numbers come from the caller's plan
    pub plan: Field<bool>,
}

/// A key the structs do not know.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownField {
    /// Path of the mapping that holds it (`""` for the top level).
    pub parent: String,
    /// The key as written.
    pub key: String,
    /// The fields allowed in that mapping.
    pub expected: &'static [&'static str],
}

/// Reads a parsed YAML document into [`Root`].
///
/// Returns every unknown key alongside; field type errors are kept inside
/// the [`Field`]s. A `null` document reads as an empty one.
///
/// # Errors
/// Only when the document itself is not a mapping.
pub fn from_value(value: Value) -> (Result<Root, String>, Vec<UnknownField>) {
    let mut unknown = Vec::new();
    if value.is_null() {
        return (Ok(Root::default()), unknown);
    }
    let root = serde_ignored::deserialize(value, |path| unknown.push(unknown_field(&path)))
        .map_err(|e| tidy(&e.to_string()));
    (root, unknown)
}

fn unknown_field(path: &serde_ignored::Path<'_>) -> UnknownField {
    /// Renders `path` in the error-path syntax, collecting its mapping keys.
    fn render(path: &serde_ignored::Path<'_>, keys: &mut Vec<String>) -> String {
        use serde_ignored::Path;
        match path {
            Path::Root => String::new(),
            Path::Seq { parent, index } => child_index(&render(parent, keys), *index),
            Path::Map { parent, key } => {
                let parent = render(parent, keys);
                keys.push(key.clone());
                child_key(&parent, key)
            }
            Path::Some { parent }
            | Path::NewtypeStruct { parent }
            | Path::NewtypeVariant { parent } => render(parent, keys),
        }
    }
    let mut keys = Vec::new();
    let (parent, key) = match path {
        serde_ignored::Path::Map { parent, key } => (render(parent, &mut keys), key.clone()),
        other => (render(other, &mut keys), String::new()),
    };
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    UnknownField {
        parent,
        key,
        expected: fields_at(&keys),
    }
}

/// The fields of the struct found under the mapping keys `keys` (sequence
/// indices left out: `routes[0].limits[1]` is `["routes", "limits"]`).
fn fields_at(keys: &[&str]) -> &'static [&'static str] {
    match keys {
        [] => fields_of::<Root>(),
        ["store"] => fields_of::<Store>(),
        ["store", "redis"] => fields_of::<Redis>(),
        ["store", "redis", "sentinel"] => fields_of::<Sentinel>(),
        ["store", "redis", "tls"] => fields_of::<RedisTls>(),
        ["store", "redis", "reconnect"] => fields_of::<Reconnect>(),
        ["store", "breaker"] => fields_of::<Breaker>(),
        ["client_ip"] => fields_of::<ClientIp>(),
        ["api_keys"] => fields_of::<ApiKeys>(),
        ["users"] => fields_of::<Users>(),
        ["users", "jwt"] => fields_of::<Jwt>(),
        ["plans", _] => fields_of::<PlanLimit>(),
        ["timeouts"] => fields_of::<Timeouts>(),
        ["server"] => fields_of::<Server>(),
        ["server", "path"] => fields_of::<ServerPath>(),
        ["routes"] => fields_of::<Route>(),
        ["routes", "match"] => fields_of::<Match>(),
        ["routes", "respond"] => fields_of::<Respond>(),
        ["routes", "limits"] => fields_of::<Limit>(),
        _ => &[],
    }
}

/// The field names serde's derive gives a struct, asked from the derive
/// itself (it passes them to `deserialize_struct`), so the "expected one
/// of" lists can never drift from the structs above.
fn fields_of<'de, T: Deserialize<'de>>() -> &'static [&'static str] {
    struct Probe<'a>(&'a mut &'static [&'static str]);

    impl<'de> Deserializer<'de> for Probe<'_> {
        type Error = de::value::Error;

        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
            Err(de::Error::custom("not a struct"))
        }

        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _name: &'static str,
            fields: &'static [&'static str],
            _visitor: V,
        ) -> Result<V::Value, Self::Error> {
            *self.0 = fields;
            Err(de::Error::custom("probed"))
        }

        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
            bytes byte_buf option unit unit_struct newtype_struct seq tuple
            tuple_struct map enum identifier ignored_any
        }
    }

    let mut fields: &'static [&'static str] = &[];
    // The probe always fails; it is only asked for the field list.
    let _ = T::deserialize(Probe(&mut fields));
    fields
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(src: &str) -> (Result<Root, String>, Vec<UnknownField>) {
        let value: Value = yaml_serde::from_str(src).expect("test YAML parses");
        from_value(value)
    }

    #[test]
    fn field_lists_come_from_the_derive() {
        assert_eq!(
            fields_of::<Route>(),
            [
                "name",
                "match",
                "upstream",
                "respond",
                "timeout",
                "cost",
                "limits",
                "upstream_ca",
                "upgrade",
                "forward_proxy_authorization",
                "shadow",
                "on_error"
            ]
        );
        assert_eq!(fields_at(&["routes", "limits"]), fields_of::<Limit>());
        assert!(fields_at(&["nope"]).is_empty());
    }

    #[test]
    fn a_bad_field_does_not_stop_the_rest() {
        let (root, unknown) = read("headers: {a: 1}\nroutes: [{name: [x], cost: 2, nope: 1}, 7]\n");
        let root = root.expect("root reads");
        assert_eq!(
            root.headers,
            Field::Invalid("expected a string, found a mapping".into())
        );
        let Field::Valid(routes) = &root.routes else {
            panic!("routes: {:?}", root.routes)
        };
        let Field::Valid(route) = &routes[0] else {
            panic!("route: {:?}", routes[0])
        };
        assert_eq!(
            route.name,
            Field::Invalid("expected a string, found a list".into())
        );
        assert_eq!(route.cost, Field::Valid(Int(2)));
        assert_eq!(
            routes[1],
            Field::Invalid("expected a mapping, found the number 7".into())
        );
        assert_eq!(unknown.len(), 1);
        assert_eq!(unknown[0].parent, "routes[0]");
        assert_eq!(unknown[0].key, "nope");
        assert_eq!(unknown[0].expected, fields_of::<Route>());
    }

    #[test]
    fn null_is_absent_and_scalars_are_text() {
        let (root, _) = read("listen:\nheaders: 12\nstore: ~\n");
        let root = root.expect("root reads");
        assert!(root.listen.is_absent());
        assert!(root.store.is_absent());
        assert_eq!(root.headers, Field::Valid(Text("12".into())));
    }

    #[test]
    fn one_or_many() {
        let (root, _) = read("listen: [a, [b], ~, {addr: c, b: 1}]\n");
        let root = root.expect("root reads");
        assert_eq!(
            root.listen,
            Field::Valid(OneOrMany::Many(vec![
                Field::Valid(Listen::Addr(Text("a".into()))),
                Field::Invalid(
                    "expected an address or a mapping { addr, tls }, found a list".into()
                ),
                Field::Absent,
                Field::Invalid("unknown field `b`, expected `addr` or `tls`".into()),
            ]))
        );
    }

    #[test]
    fn tidy_messages() {
        assert_eq!(
            tidy("invalid type: string \"x\", expected a mapping"),
            "expected a mapping, found the string \"x\""
        );
        assert_eq!(
            tidy("invalid type: floating point `1.5`, expected a sequence"),
            "expected a list, found the number 1.5"
        );
        assert_eq!(
            tidy("invalid type: boolean `true`, expected a mapping"),
            "expected a mapping, found true"
        );
        assert_eq!(
            tidy("invalid type: integer `1`, expected field identifier"),
            "expected a field name, found the number 1"
        );
        assert_eq!(tidy("something else"), "something else");
    }

    #[test]
    fn not_a_mapping() {
        let (root, _) = read("[1, 2]\n");
        assert_eq!(root.err(), Some("expected a mapping, found a list".into()));
        let (root, _) = read("");
        assert!(root.is_ok());
    }
}
