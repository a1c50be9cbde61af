//! Who the caller is: `client_ip` (trusted proxies, IPv6 grouping),
//! `api_keys` (header, static keys, the Redis hash), `plans` (the limits of
//! each tier, read with the limit rules of [`limits`](super::limits)) and
//! `users` (the header, or a verified JWT). Whether the plans named exist
//! is checked once the whole file is read, in [`load`](super).

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::num::NonZeroU64;
use std::sync::Arc;

use http::HeaderName;
use ipnet::IpNet;

use super::check::{Check, Checked, Reported, choice, int, parse_timeout, positive, text};
use super::limits::{is_month, parse_limit_name, parse_window};
use crate::config::file::{self, Field, Text};
use crate::config::position::child_key;
use crate::config::{
    ApiKeyConfig, ClientIpConfig, Plan, PlanLimit, PlansFrom, UnknownKey, UserConfig,
};
use crate::jwt::{JwtAlgorithm, JwtVerifier};

impl Check<'_> {
    pub(super) fn client_ip(
        &mut self,
        client_ip: &file::ClientIp,
        path: &str,
    ) -> Checked<ClientIpConfig> {
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

    pub(super) fn plans(
        &mut self,
        plans: &BTreeMap<String, Field<Vec<Field<file::PlanLimit>>>>,
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
        let algorithm = self.precision(&limit.precision, algorithm, &window, path);
        let sync = self.sync(&limit.sync, &algorithm, &window, path);
        let delay = self.delay(&limit.on_limit, &limit.max_delay, path);
        Ok(PlanLimit {
            name: name?,
            limit: NonZeroU64::new(max?).ok_or(Reported)?,
            window_ms: window?,
            algorithm: algorithm?,
            sync: sync?,
            delay: delay?,
        })
    }

    pub(super) fn api_keys(&mut self, keys: &file::ApiKeys, path: &str) -> Checked<ApiKeyConfig> {
        let defaults = ApiKeyConfig::default();
        let header = self.optional(
            &keys.header,
            &child_key(path, "header"),
            text(parse_header_name),
        );
        let map = self.optional(&keys.keys, &child_key(path, "keys"), Self::key_plans);
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

    /// `api_keys.keys`: `{ KEY: PLAN }`.
    fn key_plans(
        &mut self,
        map: &BTreeMap<String, Field<Text>>,
        path: &str,
    ) -> Checked<HashMap<String, Arc<str>>> {
        let read: Vec<Checked<(String, Arc<str>)>> = map
            .iter()
            .map(|(key, plan)| {
                let key_path = child_key(path, key);
                if key.is_empty() {
                    return Err(self.value_error(&key_path, "an API key must not be empty"));
                }
                match plan {
                    Field::Valid(Text(plan)) => Ok((key.clone(), Arc::from(plan.as_str()))),
                    Field::Invalid(m) => Err(self.value_error(&key_path, m.clone())),
                    Field::Absent => Err(self.value_error(&key_path, "needs a plan name")),
                }
            })
            .collect();
        read.into_iter().collect()
    }

    pub(super) fn users(&mut self, users: &file::Users, path: &str) -> Checked<UserConfig> {
        let header = self.optional(
            &users.header,
            &child_key(path, "header"),
            text(parse_header_name),
        );
        let jwt = self.optional(&users.jwt, &child_key(path, "jwt"), Self::jwt);
        Ok(UserConfig {
            header: header?.unwrap_or_else(|| UserConfig::default().header),
            jwt: jwt?,
        })
    }

    fn jwt(&mut self, jwt: &file::Jwt, path: &str) -> Checked<JwtVerifier> {
        let alg_path = child_key(path, "algorithm");
        let algorithm = self.optional(&jwt.algorithm, &alg_path, choice(&JwtAlgorithm::SPELLINGS));
        let secret = self.secret(&jwt.secret, &jwt.secret_file, path, "secret");
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
        let secret_field = if jwt.secret_file.is_absent() {
            "secret"
        } else {
            "secret_file"
        };
        let (alg, key) = self.jwt_key(path, secret_field, algorithm?, secret?, public_key?)?;
        JwtVerifier::new(alg, &key, &claim).map_err(|m| self.value_error(&key_path, m))
    }

    /// The algorithm and key of `users.jwt` from what was written: an HS256
    /// secret, or an RS256 or ES256 public key (PEM, already read).
    fn jwt_key(
        &mut self,
        path: &str,
        secret_field: &str,
        algorithm: Option<JwtAlgorithm>,
        secret: Option<String>,
        public_key: Option<Vec<u8>>,
    ) -> Checked<(JwtAlgorithm, Vec<u8>)> {
        Ok(match (algorithm, secret, public_key) {
            (None | Some(JwtAlgorithm::Hs256), Some(secret), None) => {
                if secret.len() < 32 {
                    return Err(self.value_error(
                        &child_key(path, secret_field),
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
        })
    }
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

/// `10.0.0.0/8`, `::1/128`, or a bare address (a /32 or /128 network).
///
/// A network with host bits set (`10.0.0.1/8`) is refused rather than
/// truncated: it is a list of whom to believe, and the writer meant either
/// the one proxy `10.0.0.1` or all of `10.0.0.0/8`. Guessing the network
/// would trust sixteen million addresses to write `X-Forwarded-For` when
/// one was meant; the error names both readings.
pub(super) fn parse_ip_net(s: &str) -> Result<IpNet, String> {
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

/// `plans_from`: `api_key`, `claim:NAME` or `header:NAME`.
pub(super) fn parse_plans_from(s: &str) -> Result<PlansFrom, String> {
    if s == "api_key" {
        return Ok(PlansFrom::ApiKey);
    }
    if let Some(claim) = s.strip_prefix("claim:") {
        let claim = claim.trim();
        if claim.is_empty() {
            return Err(format!("{s:?} names no claim; write e.g. claim:tier"));
        }
        return Ok(PlansFrom::Claim(Arc::from(claim)));
    }
    if let Some(name) = s.strip_prefix("header:") {
        return HeaderName::from_bytes(name.trim().as_bytes())
            .map(PlansFrom::Header)
            .map_err(|_| format!("{name:?} is not a valid header name; write e.g. header:x-plan"));
    }
    Err(format!(
        "{s:?} is not a plan source; write api_key, claim:NAME (a verified JWT claim) or header:NAME (set by a trusted proxy)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trusted_networks() {
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
    }
}
