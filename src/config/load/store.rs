//! The `store` section: Redis (standalone, Cluster or Sentinel, with its
//! credentials, TLS, timeouts, reconnect delays and pool), the failure
//! policy, the key prefix, the clock, the breaker and the deny cache.
//! Defaults live beside the types: [`StoreConfig`], [`RedisConfig`],
//! [`BreakerConfig`].

use std::time::Duration;

use super::check::{
    Check, Checked, choice, int, parse_duration, parse_lease, parse_sync, parse_timeout, text,
};
use crate::config::file;
use crate::config::position::child_key;
use crate::config::{
    BreakerConfig, ClockSource, OnError, RedisConfig, RedisTls, RedisTopology, StoreConfig,
    without_credentials,
};

impl Check<'_> {
    pub(super) fn store(&mut self, store: &file::Store, path: &str) -> Checked<StoreConfig> {
        let defaults = StoreConfig::default();
        let redis = self.optional(&store.redis, &child_key(path, "redis"), Self::redis);
        let on_error = self.optional(
            &store.on_error,
            &child_key(path, "on_error"),
            choice(&OnError::SPELLINGS),
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
        let clock = self.optional(
            &store.clock,
            &child_key(path, "clock"),
            choice(&ClockSource::SPELLINGS),
        );
        let breaker = self.optional(&store.breaker, &child_key(path, "breaker"), Self::breaker);
        let deny_cache = self.optional(
            &store.deny_cache,
            &child_key(path, "deny_cache"),
            int(0, 10_000_000),
        );
        Ok(StoreConfig {
            redis: redis?,
            on_error: on_error?.unwrap_or(defaults.on_error),
            prefix: prefix?.unwrap_or(defaults.prefix),
            readable_keys: readable_keys?.map_or(defaults.readable_keys, |file::Flag(b)| b),
            deny_cache: deny_cache?.map_or(defaults.deny_cache, |n| n as usize),
            clock: clock?.unwrap_or(defaults.clock),
            breaker: breaker?.unwrap_or(defaults.breaker),
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

    /// `store.redis`: where Redis is ([`Check::redis_topology`]), how to
    /// log in, and the timeouts and pool of the connection.
    fn redis(&mut self, redis: &file::Redis, path: &str) -> Checked<RedisConfig> {
        let defaults = RedisConfig::default();
        let url = self.optional(&redis.url, &child_key(path, "url"), text(parse_redis_url));
        let topology = self.redis_topology(redis, path);
        let username = self.secret(&redis.username, &redis.username_file, path, "username");
        let password = self.secret(&redis.password, &redis.password_file, path, "password");
        let database = self.optional(&redis.database, &child_key(path, "database"), int(0, 255));
        let tls = self.optional(&redis.tls, &child_key(path, "tls"), Self::redis_tls);
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
        let startup_wait = self.optional(
            &redis.startup_wait,
            &child_key(path, "startup_wait"),
            text(parse_startup_wait),
        );
        let reconnect = self.optional(
            &redis.reconnect,
            &child_key(path, "reconnect"),
            Self::reconnect,
        );
        let pool_size = self.optional(&redis.pool_size, &child_key(path, "pool_size"), int(1, 64));
        let sync = self.optional(&redis.sync, &child_key(path, "sync"), text(parse_sync));
        let lease = self.optional(&redis.lease, &child_key(path, "lease"), text(parse_lease));

        self.one_redis(redis, path)?;
        let (url, topology, tls) = (url?, topology?, tls?);
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
            startup_wait: startup_wait?.unwrap_or(defaults.startup_wait),
            reconnect_min: reconnect.map_or(defaults.reconnect_min, |r| r.0),
            reconnect_max: reconnect.map_or(defaults.reconnect_max, |r| r.1),
            reconnect_jitter: reconnect.map_or(defaults.reconnect_jitter, |r| r.2),
            pool_size: pool_size?
                .and_then(|n| usize::try_from(n).ok())
                .unwrap_or(defaults.pool_size),
            sync: sync?,
            lease: lease?.unwrap_or(defaults.lease),
        })
    }

    /// `cluster` or `sentinel` as written; neither is a standalone server
    /// (at `url`, read by [`Check::redis`]).
    fn redis_topology(&mut self, redis: &file::Redis, path: &str) -> Checked<RedisTopology> {
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
        Ok(match (cluster?, sentinel?) {
            (Some(seeds), _) => RedisTopology::Cluster { seeds },
            (None, Some((service_name, nodes))) => RedisTopology::Sentinel {
                service_name,
                nodes,
            },
            (None, None) => RedisTopology::Standalone,
        })
    }

    /// Exactly one of `url`, `cluster` and `sentinel`, and no `database`
    /// for a Cluster.
    fn one_redis(&mut self, redis: &file::Redis, path: &str) -> Checked<()> {
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
        Ok(())
    }

    fn redis_tls(&mut self, tls: &file::RedisTls, path: &str) -> Checked<RedisTls> {
        let ca_file = self.optional(
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
    }

    /// `store.redis.reconnect`: `(min, max, jitter)`, each defaulted.
    fn reconnect(
        &mut self,
        reconnect: &file::Reconnect,
        path: &str,
    ) -> Checked<(Duration, Duration, Duration)> {
        let defaults = RedisConfig::default();
        let min = self.optional(&reconnect.min, &child_key(path, "min"), text(parse_timeout));
        let max = self.optional(&reconnect.max, &child_key(path, "max"), text(parse_timeout));
        let jitter = self.optional(
            &reconnect.jitter,
            &child_key(path, "jitter"),
            text(parse_duration),
        );
        let (min, max, jitter) = (
            min?.unwrap_or(defaults.reconnect_min),
            max?.unwrap_or(defaults.reconnect_max),
            jitter?.unwrap_or(defaults.reconnect_jitter),
        );
        if min > max {
            return Err(self.value_error(
                &child_key(path, "min"),
                format!("{min:?} is longer than max {max:?}"),
            ));
        }
        Ok((min, max, jitter))
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
}

/// A `redis://` or `rediss://` URL that the Redis client reads: the same
/// parser decides here and when the store connects, so `check` refuses
/// every URL the client would. Errors show the URL with its credentials
/// replaced by `***`.
fn parse_redis_url(s: &str) -> Result<String, String> {
    let shown = without_credentials(s);
    let rest = s
        .strip_prefix("redis://")
        .or_else(|| s.strip_prefix("rediss://"))
        .ok_or_else(|| {
            format!(
                "{shown:?} is not a Redis URL; write redis://HOST:PORT, e.g. redis://127.0.0.1:6379"
            )
        })?;
    if rest.is_empty() || rest.starts_with('/') {
        return Err(format!("{shown:?} has no host; write redis://HOST:PORT"));
    }
    // TLS is the store's to set up from `tls`; the client reads the rest of
    // the URL alike for both schemes.
    let plain = s.replacen("rediss://", "redis://", 1);
    fred::types::config::Config::from_url_centralized(&plain).map_err(|e| {
        format!(
            "{shown:?} is not a Redis URL: {}; write redis://[USER:PASSWORD@]HOST[:PORT][/DB]",
            e.details().trim_end_matches('.')
        )
    })?;
    Ok(s.to_owned())
}

/// `startup_wait`: a duration of at most a minute (a gateway that waits
/// longer for Redis is better off serving by `on_error`).
fn parse_startup_wait(s: &str) -> Result<Duration, String> {
    let wait = parse_duration(s)?;
    if wait > Duration::from_secs(60) {
        return Err(format!("{s:?} is longer than 1m; write at most 1m"));
    }
    Ok(wait)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redis_urls_and_host_ports() {
        assert!(parse_startup_wait("0s").is_ok());
        assert!(parse_startup_wait("61s").is_err());
        assert!(parse_redis_url("redis://").is_err());
        assert!(parse_redis_url("rediss://h:6380").is_ok());
        assert!(parse_redis_url("redis://u:p@h:6380/3").is_ok());
        for bad in [
            "redis://user:pw@host:notaport",
            "redis://host:6379/abc",
            "redis://host:6379/1/2",
            "redis://host:99999",
            "http://user:pw@host:6379",
            "redis://user:pw@",
        ] {
            let e = parse_redis_url(bad).expect_err(bad);
            assert!(!e.contains("pw"), "{e}");
        }
        assert_eq!(parse_host_port("[::1]:7000"), Ok(("::1".into(), 7000)));
        assert_eq!(parse_host_port("h:7000"), Ok(("h".into(), 7000)));
        for bad in ["h", "h:0", ":7000", "h:x", "h:70000"] {
            assert!(parse_host_port(bad).is_err(), "{bad}");
        }
    }
}
