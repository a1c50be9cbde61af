//! The file structs, one per mapping of the YAML file, from [`Root`] down.
//!
//! Every field is a [`Field`] and every leaf a [`Text`], [`Int`], [`Flag`]
//! or [`OneOrMany`] (`leaf.rs`), so a mistake in one field never hides
//! another; [`from_value`](super::from_value) reads them and collects the
//! unknown keys. Each struct also derives its part of the JSON Schema: an
//! enum field lists the spellings its loader parses, and durations,
//! windows and sizes take the shapes of `shape.rs`.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::Deserialize;
use serde::de::{self, Deserializer};
use yaml_serde::Value;

use super::leaf::{Field, Flag, Int, OneOrMany, Text, describe, tidy};
use super::pools::UpstreamPool;
use super::server::Server;
use super::shape::spellings;
use crate::config::{ClockSource, HeaderMode, KeepFrom, OnError, OnLimit};
use crate::jwt::JwtAlgorithm;
use crate::limit::{Algorithm, usage::Stream};

/// The whole file.
#[derive(Debug, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(default, expecting = "a mapping")]
#[schemars(deny_unknown_fields)]
pub struct Root {
    /// `listen: ADDR`, `{ addr, tls: { cert, key } }`, or a list of them.
    pub listen: Field<OneOrMany<Listen>>,
    /// `admin: ADDR` or `{ addr, token | token_file }`
    pub admin: Field<Admin>,
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
    /// `plans_from: api_key | claim:NAME | header:NAME` — what names a caller's plan
    pub plans_from: Field<Text>,
    /// `users: { header, jwt }`
    pub users: Field<Users>,
    /// `timeouts:`
    pub timeouts: Field<Timeouts>,
    /// `upstreams: { api: { targets, balance, … } }` (named pools of targets)
    pub upstreams: Field<BTreeMap<String, Field<UpstreamPool>>>,
    /// `routes:`
    pub routes: Field<Vec<Field<Route>>>,
    /// `limits:` at the top level: an application's `RateLimitLayer`
    /// applies them to every request (the gateway's are under a route).
    /// Left out of the JSON Schema, which describes the gateway's file.
    #[schemars(skip)]
    pub limits: Field<Vec<Field<Limit>>>,
    /// `server: { max_connections, backlog, max_header_size, max_uri_size, max_body_size }`
    pub server: Field<Server>,
    /// `access_log: { replay }`
    pub access_log: Field<AccessLog>,
    /// `tracing: { otlp_endpoint, sample_ratio }`
    pub tracing: Field<Tracing>,
    /// `request_id: { header, keep_from }`
    pub request_id: Field<RequestId>,
    /// `cors:` — the default of routes without their own
    pub cors: Field<Cors>,
    /// `request_headers: { set, add, remove }` — the default of routes without their own
    pub request_headers: Field<HeaderRules>,
    /// `response_headers: { set, add, remove }` — the default of routes without their own
    pub response_headers: Field<HeaderRules>,
    /// `exempt: { ips, api_keys }` — the default of routes without their own
    pub exempt: Field<Exempt>,
}

/// `exempt:` (top level or a route's)
#[derive(Debug, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(default, expecting = "a mapping")]
#[schemars(deny_unknown_fields)]
pub struct Exempt {
    /// `ips: [10.0.0.0/8, 192.0.2.7]` — client addresses (through trusted proxies)
    pub ips: Field<OneOrMany<Text>>,
    /// `api_keys: [internal-batch]`
    pub api_keys: Field<OneOrMany<Text>>,
}

/// `request_id:`
#[derive(Debug, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(default, expecting = "a mapping")]
#[schemars(deny_unknown_fields)]
pub struct RequestId {
    /// `header: x-request-id`
    pub header: Field<Text>,
    /// `keep_from: trusted | any | none`
    #[schemars(extend("enum" = spellings(&KeepFrom::SPELLINGS)))]
    pub keep_from: Field<Text>,
}

/// `cors:` (top level or a route's)
#[derive(Debug, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(default, expecting = "a mapping")]
#[schemars(deny_unknown_fields)]
pub struct Cors {
    /// `allow_origins: ["https://app.example.com"]` or `"*"`
    pub allow_origins: Field<OneOrMany<Text>>,
    /// `allow_methods: [GET, POST]` (default: the route's methods, else common ones)
    pub allow_methods: Field<OneOrMany<Text>>,
    /// `allow_headers: [x-api-key, authorization]` (default: those the preflight asks for)
    pub allow_headers: Field<OneOrMany<Text>>,
    /// `expose_headers: [x-trace]` (the rate-limit headers, Retry-After and the request id are always exposed)
    pub expose_headers: Field<OneOrMany<Text>>,
    /// `max_age: 10m`
    #[schemars(transform = super::shape::duration)]
    pub max_age: Field<Text>,
    /// `allow_credentials: false`
    pub allow_credentials: Field<Flag>,
}

/// `request_headers:` / `response_headers:`
#[derive(Debug, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(default, expecting = "a mapping")]
#[schemars(deny_unknown_fields)]
pub struct HeaderRules {
    /// `set: { x-gateway: tollgate }` — replaces
    pub set: Field<BTreeMap<String, Field<Text>>>,
    /// `add: { via: tollgate }` — appends
    pub add: Field<BTreeMap<String, Field<Text>>>,
    /// `remove: [server, x-debug]`
    pub remove: Field<OneOrMany<Text>>,
}

/// `access_log:`
#[derive(Debug, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(default, expecting = "a mapping")]
#[schemars(deny_unknown_fields)]
pub struct AccessLog {
    /// `replay: true` (write what `tollgate simulate` needs to replay a request)
    pub replay: Field<Flag>,
}

/// `tracing:`
#[derive(Debug, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(default, expecting = "a mapping")]
#[schemars(deny_unknown_fields)]
pub struct Tracing {
    /// `otlp_endpoint: http://collector:4318` (the OTLP/HTTP receiver; spans go to `/v1/traces` under it)
    pub otlp_endpoint: Field<Text>,
    /// `sample_ratio: 0.01` (the share of requests traced when no trusted proxy decided; 0 to 1)
    #[schemars(transform = super::shape::ratio)]
    pub sample_ratio: Field<Text>,
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
        Ok(match addr_or_map(deserializer, "{ addr, tls }")? {
            Ok(addr) => Self::Addr(addr),
            Err(map) => Self::Map(map),
        })
    }
}

/// An address written alone, or the mapping `M` (`shape` names its
/// fields in the error for anything else): the two forms `listen` entries
/// and `admin` take. The mapping checks its own unknown fields.
fn addr_or_map<'de, D, M>(deserializer: D, shape: &str) -> Result<Result<Text, M>, D::Error>
where
    D: Deserializer<'de>,
    M: de::DeserializeOwned,
{
    match Value::deserialize(deserializer)? {
        map @ Value::Mapping(_) => M::deserialize(map)
            .map(Err)
            .map_err(|e| de::Error::custom(tidy(&e.to_string()))),
        seq @ Value::Sequence(_) => Err(de::Error::custom(format_args!(
            "expected an address or a mapping {shape}, found {}",
            describe(&seq)
        ))),
        other => Text::deserialize(other)
            .map(Ok)
            .map_err(|e| de::Error::custom(e.to_string())),
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

/// `admin: 127.0.0.1:9090` or `{ addr: …, token_file: … }`, read as
/// [`Listen`] is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admin {
    /// `127.0.0.1:9090`
    Addr(Text),
    /// `{ addr, token, token_file }`
    Map(AdminMap),
}

impl<'de> Deserialize<'de> for Admin {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Ok(match addr_or_map(deserializer, "{ addr, token_file }")? {
            Ok(addr) => Self::Addr(addr),
            Err(map) => Self::Map(map),
        })
    }
}

/// `admin: { addr, token, token_file }`
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields, expecting = "a mapping")]
pub struct AdminMap {
    /// `addr: 127.0.0.1:9090`
    pub addr: Field<Text>,
    /// `token: "…"` — the bearer token of `/admin/callers` and `/admin/overrides`
    pub token: Field<Text>,
    /// `token_file: /run/secrets/tollgate-admin` — the token, read from a file
    pub token_file: Field<Text>,
    /// `replays: /var/lib/tollgate/replays` — the folder of `simulate`'s
    /// HTML reports the console opens
    pub replays: Field<Text>,
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
    /// `username_file: /run/secrets/redis-username` (instead of `username`)
    pub username_file: Field<Text>,
    /// `password: s3cret`
    pub password: Field<Text>,
    /// `password_file: /run/secrets/redis-password` (instead of `password`)
    pub password_file: Field<Text>,
    /// `database: 0`
    pub database: Field<Int>,
    /// `tls: { ca_file }`
    pub tls: Field<RedisTls>,
    /// `timeout: 25ms`
    #[schemars(transform = super::shape::duration)]
    pub timeout: Field<Text>,
    /// `connect_timeout: 1s`
    #[schemars(transform = super::shape::duration)]
    pub connect_timeout: Field<Text>,
    /// `startup_wait: 2s` — at start, how long the listeners wait for
    /// Redis before accepting
    #[schemars(transform = super::shape::duration)]
    pub startup_wait: Field<Text>,
    /// `reconnect: { min, max, jitter }`
    pub reconnect: Field<Reconnect>,
    /// `pool_size: 1`
    pub pool_size: Field<Int>,
    /// `sync: 100ms` — counter limits decided in process, exchanged with
    /// Redis this often
    #[schemars(transform = super::shape::duration)]
    pub sync: Field<Text>,
    /// `lease: 10s` — a concurrency slot's lease in Redis, renewed while
    /// its request lives
    #[schemars(transform = super::shape::duration)]
    pub lease: Field<Text>,
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
    #[schemars(transform = super::shape::duration)]
    pub min: Field<Text>,
    /// `max: 1s`
    #[schemars(transform = super::shape::duration)]
    pub max: Field<Text>,
    /// `jitter: 100ms`
    #[schemars(transform = super::shape::duration)]
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
    #[schemars(transform = super::shape::duration)]
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
    #[schemars(transform = super::shape::duration)]
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
    #[schemars(transform = super::shape::window)]
    pub window: Field<Text>,
    /// `algorithm: sliding_window | fixed_window | sliding_log | gcra`
    #[schemars(extend("enum" = spellings(&Algorithm::SPELLINGS)))]
    pub algorithm: Field<Text>,
    /// `burst: 20`
    pub burst: Field<Int>,
    /// `precision: 1s` (sliding_window: count in buckets of it)
    #[schemars(transform = super::shape::duration)]
    pub precision: Field<Text>,
    /// `sync: 100ms` or `sync: off` (sliding and fixed windows)
    #[schemars(transform = super::shape::sync)]
    pub sync: Field<Text>,
    /// `on_limit: reject | delay`
    #[schemars(extend("enum" = spellings(&OnLimit::SPELLINGS)))]
    pub on_limit: Field<Text>,
    /// `max_delay: 2s` (with `on_limit: delay`)
    #[schemars(transform = super::shape::duration)]
    pub max_delay: Field<Text>,
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
    /// `secret_file: /run/secrets/jwt` (HS256, instead of `secret`)
    pub secret_file: Field<Text>,
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
    #[schemars(transform = super::shape::duration)]
    pub header_read: Field<Text>,
    /// `upstream_connect: 5s`
    #[schemars(transform = super::shape::duration)]
    pub upstream_connect: Field<Text>,
    /// `upstream_response: 30s`
    #[schemars(transform = super::shape::duration)]
    pub upstream_response: Field<Text>,
    /// `upstream_idle: 4s` (idle keep-alive connections to upstreams)
    #[schemars(transform = super::shape::duration)]
    pub upstream_idle: Field<Text>,
    /// `idle: 60s`
    #[schemars(transform = super::shape::duration)]
    pub idle: Field<Text>,
    /// `drain: 30s`
    #[schemars(transform = super::shape::duration)]
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
    /// `upstream: http://host:port[/base]` (or `https://`, `h2c://`), or the
    /// name of a pool under `upstreams`
    pub upstream: Field<Text>,
    /// `respond: { status, body, content_type }`
    pub respond: Field<Respond>,
    /// `timeout: 30s`
    #[schemars(transform = super::shape::duration)]
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
    /// `max_queue: 100` (requests waiting for `on_limit: delay` limits)
    pub max_queue: Field<Int>,
    /// `cors:` (replaces the top level's)
    pub cors: Field<Cors>,
    /// `request_headers: { set, add, remove }` (replaces the top level's)
    pub request_headers: Field<HeaderRules>,
    /// `response_headers: { set, add, remove }` (replaces the top level's)
    pub response_headers: Field<HeaderRules>,
    /// `exempt: { ips, api_keys }` (replaces the top level's)
    pub exempt: Field<Exempt>,
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
    #[schemars(transform = super::shape::window)]
    pub window: Field<Text>,
    /// `cost: 2`, or `cost: { reserve: 100, from_header: x-tokens-used }`
    /// (settled by the response; `from_trailer` for a trailer)
    pub cost: Field<Cost>,
    /// `bytes: request | response | both` — a byte quota
    /// (`qu="content-bytes"`), settled as the body streams
    #[schemars(extend("enum" = spellings(&crate::limit::settle::Bytes::SPELLINGS)))]
    pub bytes: Field<Text>,
    /// `shadow: true`
    pub shadow: Field<Flag>,
    /// `algorithm: sliding_window | fixed_window | sliding_log | gcra`
    #[schemars(extend("enum" = spellings(&Algorithm::SPELLINGS)))]
    pub algorithm: Field<Text>,
    /// `burst: 20` (gcra only)
    pub burst: Field<Int>,
    /// `precision: 1s` (sliding_window only: count in buckets of it)
    #[schemars(transform = super::shape::duration)]
    pub precision: Field<Text>,
    /// `plan: true` — the numbers come from the caller's plan
    pub plan: Field<bool>,
    /// `sync: 100ms` or `sync: off` (sliding and fixed windows)
    #[schemars(transform = super::shape::sync)]
    pub sync: Field<Text>,
    /// `on_limit: reject | delay`
    #[schemars(extend("enum" = spellings(&OnLimit::SPELLINGS)))]
    pub on_limit: Field<Text>,
    /// `max_delay: 2s` (with `on_limit: delay`)
    #[schemars(transform = super::shape::duration)]
    pub max_delay: Field<Text>,
    /// `concurrency: 10` — requests in flight at once, instead of a rate
    pub concurrency: Field<Int>,
    /// `share: NAME` — one counter with the limits of other routes that
    /// name the same share
    pub share: Field<Text>,
}

/// A limit's `cost`: a number, or `{ reserve, from_header | from_trailer | from_body }`
/// for a cost the response settles (docs/limits.md#costs-settled-by-the-response).
///
/// Read from an owned value, so the mapping form checks its own unknown
/// fields with `deny_unknown_fields`, as [`Listen`] does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cost {
    /// `cost: 2`
    Fixed(Int),
    /// `cost: { reserve, from_header | from_trailer }`
    Settled(CostMap),
}

impl<'de> Deserialize<'de> for Cost {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match Value::deserialize(deserializer)? {
            map @ Value::Mapping(_) => CostMap::deserialize(map)
                .map(Self::Settled)
                .map_err(|e| de::Error::custom(tidy(&e.to_string()))),
            other => Int::deserialize(other).map(Self::Fixed).map_err(|e| {
                de::Error::custom(format_args!(
                    "{e}, or a mapping {{ reserve, from_header | from_trailer }}"
                ))
            }),
        }
    }
}

/// `cost: { reserve, from_header | from_trailer | from_body }`
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields, expecting = "a mapping")]
pub struct CostMap {
    /// `reserve: 100` or `reserve: { json: max_tokens, default: 1000 }` —
    /// taken when the request is decided
    pub reserve: Field<Reserve>,
    /// `from_header: x-tokens-used` — the response header with the final cost
    pub from_header: Field<Text>,
    /// `from_trailer: x-tokens-used` — the response trailer with the final cost
    pub from_trailer: Field<Text>,
    /// `from_body: openai | anthropic | { json: "usage.a + usage.b", stream: last | sum }`
    /// — the usage the response body reports
    pub from_body: Field<FromBody>,
}

/// A settled cost's `reserve`: a number, or a field of the request's JSON
/// body with a default.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reserve {
    /// `reserve: 500`
    Fixed(Int),
    /// `reserve: { json: max_tokens, default: 1000 }`
    Json(ReserveMap),
}

impl<'de> Deserialize<'de> for Reserve {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match Value::deserialize(deserializer)? {
            map @ Value::Mapping(_) => ReserveMap::deserialize(map)
                .map(Self::Json)
                .map_err(|e| de::Error::custom(tidy(&e.to_string()))),
            other => Int::deserialize(other).map(Self::Fixed).map_err(|e| {
                de::Error::custom(format_args!("{e}, or a mapping {{ json, default }}"))
            }),
        }
    }
}

/// `reserve: { json: max_tokens, default: 1000 }`
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields, expecting = "a mapping")]
pub struct ReserveMap {
    /// `json: max_tokens` — the request body's field holding the reservation
    pub json: Field<Text>,
    /// `default: 1000` — when the field is absent or the body is not read
    pub default: Field<Int>,
}

/// A settled cost's `from_body`: a preset's name, or the usage's fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FromBody {
    /// `from_body: openai` or `from_body: anthropic`
    Preset(Text),
    /// `from_body: { json: "usage.input_tokens + usage.output_tokens", stream: last }`
    Fields(FromBodyMap),
}

impl<'de> Deserialize<'de> for FromBody {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match Value::deserialize(deserializer)? {
            map @ Value::Mapping(_) => FromBodyMap::deserialize(map)
                .map(Self::Fields)
                .map_err(|e| de::Error::custom(tidy(&e.to_string()))),
            other => Text::deserialize(other).map(Self::Preset).map_err(|e| {
                de::Error::custom(format_args!(
                    "{e} (openai or anthropic), or a mapping {{ json, stream }}"
                ))
            }),
        }
    }
}

/// `from_body: { json: "usage.total_tokens", stream: last | sum }`
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields, expecting = "a mapping")]
pub struct FromBodyMap {
    /// `json: "usage.input_tokens + usage.output_tokens"` — a path, or a sum of paths
    pub json: Field<Text>,
    /// `stream: last | sum` — in an event stream, each path's last value, or
    /// the sum over the events
    #[schemars(extend("enum" = spellings(&Stream::SPELLINGS)))]
    pub stream: Field<Text>,
}
