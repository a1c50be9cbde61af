//! The mirror of `upstreams:`: one struct per mapping of a pool.

use schemars::JsonSchema;
use serde::Deserialize;
use serde::de::{self, Deserializer};
use yaml_serde::Value;

use super::leaf::{Field, Flag, Int, OneOrMany, Text, describe, tidy};
use super::shape::spellings;
use crate::config::Balance;

/// `upstreams.NAME:` — a pool of targets a route can forward to by name.
#[derive(Debug, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(default, expecting = "a mapping")]
#[schemars(deny_unknown_fields)]
pub struct UpstreamPool {
    /// `targets: [http://10.0.0.1:9000, { url: http://10.0.0.2:9000, weight: 2 }]`
    pub targets: Field<Vec<Field<Target>>>,
    /// `balance: least_request | round_robin | hash`
    #[schemars(extend("enum" = spellings(&Balance::SPELLINGS)))]
    pub balance: Field<Text>,
    /// `hash_key: "header:x-user"` (a limit key expression; for `balance: hash`)
    pub hash_key: Field<OneOrMany<Text>>,
    /// `health: { path, interval, timeout, unhealthy_after, healthy_after }`
    pub health: Field<Health>,
    /// `eject: { after, for, max_percent, ended_by_checks }`
    pub eject: Field<Eject>,
    /// `retries: 2`
    pub retries: Field<Int>,
    /// `per_try_timeout: 2s`
    #[schemars(transform = super::shape::duration)]
    pub per_try_timeout: Field<Text>,
    /// `ca: certs/internal-ca.pem` (for https targets)
    pub ca: Field<Text>,
}

/// One target of a pool: `http://host:port` or `{ url, weight }`.
///
/// Read from an owned value, so the mapping form checks its own unknown
/// fields with `deny_unknown_fields`, as [`Listen`](super::Listen) does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// `http://10.0.0.1:9000`
    Url(Text),
    /// `{ url, weight }`
    Map(TargetMap),
}

impl<'de> Deserialize<'de> for Target {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match Value::deserialize(deserializer)? {
            map @ Value::Mapping(_) => TargetMap::deserialize(map)
                .map(Self::Map)
                .map_err(|e| de::Error::custom(tidy(&e.to_string()))),
            seq @ Value::Sequence(_) => Err(de::Error::custom(format_args!(
                "expected a URL or a mapping {{ url, weight }}, found {}",
                describe(&seq)
            ))),
            other => Text::deserialize(other)
                .map(Self::Url)
                .map_err(|e| de::Error::custom(e.to_string())),
        }
    }
}

/// `upstreams.NAME.targets[i]: { url, weight }`
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields, expecting = "a mapping")]
pub struct TargetMap {
    /// `url: http://10.0.0.2:9000`
    pub url: Field<Text>,
    /// `weight: 2`
    pub weight: Field<Int>,
}

/// `upstreams.NAME.health:` — active checks.
#[derive(Debug, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(default, expecting = "a mapping")]
#[schemars(deny_unknown_fields)]
pub struct Health {
    /// `path: /healthz`
    pub path: Field<Text>,
    /// `interval: 5s`
    #[schemars(transform = super::shape::duration)]
    pub interval: Field<Text>,
    /// `timeout: 1s`
    #[schemars(transform = super::shape::duration)]
    pub timeout: Field<Text>,
    /// `unhealthy_after: 2` (consecutive failed checks)
    pub unhealthy_after: Field<Int>,
    /// `healthy_after: 1` (consecutive passed checks)
    pub healthy_after: Field<Int>,
}

/// `upstreams.NAME.eject:` — passive ejection.
#[derive(Debug, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(default, expecting = "a mapping")]
#[schemars(deny_unknown_fields)]
pub struct Eject {
    /// `after: 5` (consecutive failures)
    pub after: Field<Int>,
    /// `for: 30s` (doubling on each repeat, up to 10×)
    #[serde(rename = "for")]
    #[schemars(transform = super::shape::duration)]
    pub duration: Field<Text>,
    /// `max_percent: 50`
    pub max_percent: Field<Int>,
    /// `ended_by_checks: true` (passing active checks end an ejection)
    pub ended_by_checks: Field<Flag>,
}
