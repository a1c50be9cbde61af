//! The `upstreams` section: named pools of targets, each with its balance,
//! `hash_key`, active `health` checks, passive `eject`ion, `retries`,
//! `per_try_timeout` and the `ca` of its https targets. Routes name a pool
//! in `upstream:` ([`routes`](super::routes) resolves the name).

use std::collections::BTreeMap;
use std::sync::Arc;

use http::uri::{Authority, PathAndQuery};

use super::check::{Check, Checked, Reported, choice, int, parse_timeout, positive, text};
use crate::config::file::{self, Field};
use crate::config::position::child_key;
use crate::config::{
    Balance, Eject, HealthCheck, KeySource, PoolTarget, TargetScheme, UpstreamPool,
};

/// A weight above this is a typo more likely than a share.
const MAX_WEIGHT: i64 = 10_000;

impl Check<'_> {
    pub(super) fn upstreams(
        &mut self,
        pools: &BTreeMap<String, Field<file::UpstreamPool>>,
        path: &str,
    ) -> Checked<Vec<Arc<UpstreamPool>>> {
        let read: Vec<Checked<Arc<UpstreamPool>>> = pools
            .iter()
            .map(|(name, pool)| {
                let path = child_key(path, name);
                match pool {
                    Field::Absent => Err(self.value_error(
                        &path,
                        "is empty; a pool needs targets, e.g. targets: [http://10.0.0.1:9000]",
                    )),
                    Field::Invalid(message) => Err(self.value_error(&path, message.clone())),
                    Field::Valid(pool) => self.pool(name, pool, &path).map(Arc::new),
                }
            })
            .collect();
        read.into_iter().collect()
    }

    fn pool(&mut self, name: &str, pool: &file::UpstreamPool, path: &str) -> Checked<UpstreamPool> {
        let targets = self.targets(pool, path);
        let balance_path = child_key(path, "balance");
        let balance = self.optional(&pool.balance, &balance_path, choice(&Balance::SPELLINGS));
        let key_path = child_key(path, "hash_key");
        let hash_key = self.optional(&pool.hash_key, &key_path, |check, key, path| {
            let key = check.key(key, path)?;
            if super::limits::is_route(&key) {
                return Err(check.value_error(
                    path,
                    "route is the same for every request, so every request would go to one target; hash on a caller's key, e.g. api_key | ip",
                ));
            }
            if key.parts.iter().flatten().any(|s| matches!(s, KeySource::Json(_))) {
                return Err(check.value_error(
                    path,
                    "json: reads the request body, which a pool does not read before it picks a target; hash on a caller's key, e.g. api_key | ip",
                ));
            }
            Ok(key)
        });
        let health = self.optional(&pool.health, &child_key(path, "health"), Self::health);
        let eject = self.optional(&pool.eject, &child_key(path, "eject"), Self::eject);
        let retries = self.optional(&pool.retries, &child_key(path, "retries"), int(0, 10));
        let per_try_timeout = self.optional(
            &pool.per_try_timeout,
            &child_key(path, "per_try_timeout"),
            text(parse_timeout),
        );
        let is_https =
            matches!(&targets, Ok(t) if t.iter().any(|t| t.scheme == TargetScheme::Https));
        let tls = self.optional(&pool.ca, &child_key(path, "ca"), |check, ca, path| {
            if !is_https {
                return Err(check.value_error(
                    path,
                    "applies only to pools of https:// targets; remove it or use https://",
                ));
            }
            crate::tls::client_config(Some(&check.file(&ca.0)))
                .map_err(|e| check.value_error(path, e.to_string()))
        });
        let balance = balance?.unwrap_or_default();
        let hash_key = hash_key?;
        match (balance, &hash_key) {
            (Balance::Hash, None) => {
                let pos = self.positions.value(&balance_path);
                return Err(self.push(
                    path,
                    "balance: hash needs a hash_key, e.g. hash_key: \"header:x-user\" or api_key | ip",
                    pos,
                ));
            }
            (Balance::LeastRequest | Balance::RoundRobin, Some(_)) => {
                return Err(self.value_error(
                    &key_path,
                    "applies only to balance: hash; remove it or set balance: hash",
                ));
            }
            _ => {}
        }
        let retries = retries?.map_or(Ok(DEFAULT_RETRIES), u32::try_from);
        Ok(UpstreamPool {
            name: Arc::from(name),
            targets: targets?,
            balance,
            hash_key,
            health: health?,
            eject: eject?.unwrap_or_default(),
            retries: retries.map_err(|_| Reported)?,
            per_try_timeout: per_try_timeout?,
            tls: tls?,
        })
    }

    fn targets(&mut self, pool: &file::UpstreamPool, path: &str) -> Checked<Vec<PoolTarget>> {
        let targets_path = child_key(path, "targets");
        let Some(items) = self.optional(&pool.targets, &targets_path, |check, items, path| {
            check.list(items, path, Self::target)
        })?
        else {
            let pos = self.positions.value(path);
            return Err(self.push(path, "missing required field \"targets\"", pos));
        };
        if items.is_empty() {
            return Err(
                self.value_error(&targets_path, "is empty; a pool needs at least one target")
            );
        }
        if items.iter().any(|t| t.scheme != items[0].scheme) {
            return Err(self.value_error(
                &targets_path,
                "mixes schemes (http://, https://, h2c://); a pool's targets share one scheme",
            ));
        }
        Ok(items)
    }

    fn target(&mut self, target: &file::Target, path: &str) -> Checked<PoolTarget> {
        let (url, weight) = match target {
            file::Target::Url(url) => (text(parse_target)(self, url, path), None),
            file::Target::Map(map) => {
                let url = self.required(&map.url, path, "url", text(parse_target));
                let weight = self.optional(&map.weight, &child_key(path, "weight"), |c, w, p| {
                    if w.0 == 0 {
                        return Err(c.value_error(
                            p,
                            "must be at least 1; leave the target out to send it nothing",
                        ));
                    }
                    int(1, MAX_WEIGHT)(c, w, p)
                });
                (url, weight?)
            }
        };
        let mut target = url?;
        target.weight = weight.map_or(1, |w| u32::try_from(w).unwrap_or(1));
        Ok(target)
    }

    fn health(&mut self, health: &file::Health, path: &str) -> Checked<HealthCheck> {
        let check_path = self.required(&health.path, path, "path", text(parse_check_path));
        let interval = self.optional(
            &health.interval,
            &child_key(path, "interval"),
            text(parse_timeout),
        );
        let timeout = self.optional(
            &health.timeout,
            &child_key(path, "timeout"),
            text(parse_timeout),
        );
        let unhealthy_after = self.optional(
            &health.unhealthy_after,
            &child_key(path, "unhealthy_after"),
            int(1, 100),
        );
        let healthy_after = self.optional(
            &health.healthy_after,
            &child_key(path, "healthy_after"),
            int(1, 100),
        );
        let as_count = |n: Option<i64>, default: u32| {
            n.map_or(default, |n| u32::try_from(n).unwrap_or(default))
        };
        Ok(HealthCheck {
            path: check_path?,
            interval: interval?.unwrap_or(HealthCheck::DEFAULT_INTERVAL),
            timeout: timeout?.unwrap_or(HealthCheck::DEFAULT_TIMEOUT),
            unhealthy_after: as_count(unhealthy_after?, 2),
            healthy_after: as_count(healthy_after?, 1),
        })
    }

    fn eject(&mut self, eject: &file::Eject, path: &str) -> Checked<Eject> {
        let defaults = Eject::default();
        let after = self.optional(&eject.after, &child_key(path, "after"), positive);
        let duration = self.optional(
            &eject.duration,
            &child_key(path, "for"),
            text(parse_timeout),
        );
        let max_percent = self.optional(
            &eject.max_percent,
            &child_key(path, "max_percent"),
            int(0, 100),
        );
        let ended_by_checks = self.optional(
            &eject.ended_by_checks,
            &child_key(path, "ended_by_checks"),
            |_: &mut Self, b: &file::Flag, _: &str| Ok(b.0),
        );
        Ok(Eject {
            after: after?.map_or(defaults.after, |n| u32::try_from(n).unwrap_or(u32::MAX)),
            duration: duration?.unwrap_or(defaults.duration),
            max_percent: max_percent?
                .map_or(defaults.max_percent, |n| u32::try_from(n).unwrap_or(100)),
            ended_by_checks: ended_by_checks?.unwrap_or(defaults.ended_by_checks),
        })
    }
}

/// Tries after the first when `retries` is not written.
pub const DEFAULT_RETRIES: u32 = 1;

/// `http://host:port`, `https://host[:port]` or `h2c://host:port`: a
/// target has no path.
fn parse_target(s: &str) -> Result<PoolTarget, String> {
    let example = "e.g. http://10.0.0.1:9000";
    let (scheme, rest) = if let Some(rest) = s.strip_prefix("http://") {
        (TargetScheme::Http, rest)
    } else if let Some(rest) = s.strip_prefix("https://") {
        (TargetScheme::Https, rest)
    } else if let Some(rest) = s.strip_prefix("h2c://") {
        (TargetScheme::H2c, rest)
    } else if s.contains("://") {
        return Err(format!("{s:?} has an unsupported scheme; write {example}"));
    } else {
        return Err(format!("{s:?} has no scheme; write http://{s}"));
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.contains(['/', '?', '#', '@']) {
        return Err(format!(
            "{s:?} has a path, query or user; a target is scheme://host:port"
        ));
    }
    let authority: Authority = rest
        .parse()
        .map_err(|_| format!("{s:?} is not a URL; write {example}"))?;
    if authority.host().is_empty() {
        return Err(format!("{s:?} has no host; write {example}"));
    }
    let default_port = match scheme {
        TargetScheme::Http | TargetScheme::H2c => 80,
        TargetScheme::Https => 443,
    };
    let port = authority.port_u16().unwrap_or(default_port);
    let host = authority.host();
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host)
        .to_owned();
    let authority = if authority.port().is_some() {
        authority
    } else {
        format!("{}:{port}", authority.host())
            .parse()
            .map_err(|_| format!("{s:?} is not a URL; write {example}"))?
    };
    Ok(PoolTarget {
        url: Arc::from(s.strip_suffix('/').unwrap_or(s)),
        scheme,
        authority,
        host,
        port,
        weight: 1,
    })
}

fn parse_check_path(s: &str) -> Result<PathAndQuery, String> {
    if !s.starts_with('/') {
        return Err(format!("{s:?} does not start with /; write \"/{s}\""));
    }
    s.parse()
        .map_err(|_| format!("{s:?} is not a URL path; write e.g. /healthz"))
}

/// Whether `upstream:` is written as a URL rather than a pool's name.
pub(super) fn is_url(s: &str) -> bool {
    s.contains("://")
}

/// Pool names as written, so routes naming one are checked even when the
/// pool has errors of its own.
pub(super) fn names(root: &file::Root) -> Vec<&str> {
    match &root.upstreams {
        Field::Valid(map) => map.keys().map(String::as_str).collect(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets() {
        let t = parse_target("http://10.0.0.1:9000").unwrap();
        assert_eq!(
            (t.host.as_str(), t.port, t.scheme),
            ("10.0.0.1", 9000, TargetScheme::Http)
        );
        let t = parse_target("https://api.internal").unwrap();
        assert_eq!((t.authority.as_str(), t.port), ("api.internal:443", 443));
        let t = parse_target("http://[::1]:81/").unwrap();
        assert_eq!(
            (t.host.as_str(), t.url.as_ref()),
            ("::1", "http://[::1]:81")
        );
        assert!(parse_target("http://x:1/base").is_err());
        assert!(parse_target("ftp://x").is_err());
        assert!(parse_target("x:1").is_err());
        assert!(parse_target("http://").is_err());
    }
}
