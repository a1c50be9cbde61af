//! The store's part of the model: where counters live (in process or in
//! Redis, with its topology, TLS and secrets), what the gateway does when
//! Redis fails, and the breaker that stops asking it.

use std::time::Duration;

/// The limiter store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreConfig {
    /// Redis; `None` keeps all state in process.
    pub redis: Option<RedisConfig>,
    /// What to do when Redis cannot answer.
    pub on_error: OnError,
    /// Prefix of every Redis key tollgate writes.
    pub prefix: String,
    /// Counter keys in Redis name the identity in clear instead of by a
    /// digest (see [`StoreConfig::digest_keys`]).
    pub readable_keys: bool,
    /// Whose clock places requests in windows.
    pub clock: ClockSource,
    /// When to stop calling a failing Redis, and how often to probe it.
    pub breaker: BreakerConfig,
    /// Denied requests remembered in process (entries; 0 turns it off).
    pub deny_cache: usize,
}

impl Default for StoreConfig {
    /// No Redis: counters in process, `on_error: local`, prefix `tg:`.
    fn default() -> Self {
        Self {
            redis: None,
            on_error: OnError::Local,
            prefix: "tg:".to_owned(),
            readable_keys: false,
            clock: ClockSource::Gateway,
            breaker: BreakerConfig::default(),
            // Denied requests remembered in process: a few MB at most.
            deny_cache: 10_000,
        }
    }
}

impl StoreConfig {
    /// Whether counter keys carry digests of the identity and the limit
    /// rather than their text: with Redis, unless `readable_keys` is set.
    /// A key is then `<prefix>{<12 characters>}<4 characters>`, short enough
    /// for Redis to keep one identity and limit in under 150 bytes; the
    /// in-process store keeps readable keys (nothing to save there).
    pub fn digest_keys(&self) -> bool {
        self.redis.is_some() && !self.readable_keys
    }
}

/// Whose clock the Redis scripts use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ClockSource {
    /// The gateway's own clock, passed to every script call.
    #[default]
    Gateway,
    /// Redis `TIME`, read inside the script, so instances with skewed
    /// clocks agree.
    Redis,
}

impl ClockSource {
    /// Every spelling `store.clock` accepts, with its value. The loader
    /// and `tollgate schema` both read this table, so they cannot differ.
    pub const SPELLINGS: [(&'static str, Self); 2] =
        [("gateway", Self::Gateway), ("redis", Self::Redis)];
}

/// The circuit breaker in front of Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BreakerConfig {
    /// Consecutive failures or timeouts that open the breaker.
    pub failures: u32,
    /// How often an open breaker pings Redis in the background.
    pub probe_interval: Duration,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        Self {
            failures: 3,
            probe_interval: Duration::from_millis(200),
        }
    }
}

/// How to reach Redis: one server, a Cluster or a Sentinel-managed master.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisConfig {
    /// `redis://` or `rediss://[user:password@]host:port[/db]` for a
    /// standalone server; empty for [`RedisTopology::Cluster`] and
    /// [`RedisTopology::Sentinel`].
    pub url: String,
    /// Bound on one limiter call; past it the `on_error` policy decides.
    pub timeout: Duration,
    /// Which kind of deployment.
    pub topology: RedisTopology,
    /// ACL user; overrides the URL's.
    pub username: Option<String>,
    /// Password; overrides the URL's.
    pub password: Option<String>,
    /// Database number (standalone and Sentinel); overrides the URL's.
    pub database: Option<u8>,
    /// TLS to Redis; `rediss://` turns it on too.
    pub tls: Option<RedisTls>,
    /// Bound on opening one connection (TCP, TLS, AUTH).
    pub connect_timeout: Duration,
    /// How long the listeners, bound at start, wait for the store to
    /// answer (first connection made, script loaded) before they accept;
    /// past it requests are decided by `on_error`.
    pub startup_wait: Duration,
    /// First reconnect delay; doubled after each failed attempt.
    pub reconnect_min: Duration,
    /// Longest reconnect delay.
    pub reconnect_max: Duration,
    /// Random delay, up to this, added to each reconnect delay so a fleet
    /// does not reconnect in step.
    pub reconnect_jitter: Duration,
    /// Connections (each a multiplexed client) decisions are spread over.
    pub pool_size: usize,
    /// `sync` mode for every counter limit (sliding and fixed windows)
    /// that does not say otherwise: decided in process against the last
    /// known fleet total, with the counts exchanged with Redis every this
    /// often ([`crate::decision::sync`]). `None`: every decision in Redis.
    pub sync: Option<Duration>,
    /// How long a concurrency slot's lease lives in Redis unless renewed
    /// (`lease:`): live requests renew theirs every third of it,
    /// and the slots of a gateway that died free within it.
    pub lease: Duration,
}

impl Default for RedisConfig {
    fn default() -> Self {
        Self {
            url: String::new(),
            timeout: Duration::from_millis(25),
            topology: RedisTopology::Standalone,
            username: None,
            password: None,
            database: None,
            tls: None,
            connect_timeout: Duration::from_secs(1),
            startup_wait: Duration::from_secs(2),
            reconnect_min: Duration::from_millis(100),
            reconnect_max: Duration::from_secs(1),
            reconnect_jitter: Duration::from_millis(100),
            pool_size: 1,
            sync: None,
            lease: Duration::from_secs(10),
        }
    }
}

impl RedisConfig {
    /// Where Redis is, without credentials, for logs.
    pub fn describe(&self) -> String {
        match &self.topology {
            RedisTopology::Standalone => without_credentials(&self.url),
            RedisTopology::Cluster { seeds } => format!("cluster {}", join_hosts(seeds)),
            RedisTopology::Sentinel {
                service_name,
                nodes,
            } => format!("sentinel {service_name} via {}", join_hosts(nodes)),
        }
    }
}

/// `url` with what stands between its scheme and its last `@` (user and
/// password) written `***`, for logs and error messages.
pub fn without_credentials(url: &str) -> String {
    let start = url.find("://").map_or(0, |s| s + 3);
    match url.rfind('@') {
        Some(at) if at >= start => format!("{}***{}", &url[..start], &url[at..]),
        _ => url.to_owned(),
    }
}

fn join_hosts(hosts: &[(String, u16)]) -> String {
    let all: Vec<String> = hosts.iter().map(|(h, p)| format!("{h}:{p}")).collect();
    all.join(",")
}

/// The kind of Redis deployment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedisTopology {
    /// One server, at [`RedisConfig::url`].
    Standalone,
    /// A Redis Cluster, discovered from these seed nodes.
    Cluster {
        /// `(host, port)` of some cluster nodes.
        seeds: Vec<(String, u16)>,
    },
    /// The master Redis Sentinel names for `service_name`.
    Sentinel {
        /// The monitored master's name.
        service_name: String,
        /// `(host, port)` of the sentinels.
        nodes: Vec<(String, u16)>,
    },
}

/// TLS settings for the connection to Redis.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RedisTls {
    /// PEM file of the CA certificates to trust instead of the system's.
    pub ca_file: Option<std::path::PathBuf>,
}

/// Policy when the store fails or times out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnError {
    /// Fail open: admit the request.
    Allow,
    /// Fail closed: answer 503.
    Deny,
    /// Enforce the limits in process until Redis is back, each divided by
    /// the last known number of live gateway instances.
    Local,
}

impl OnError {
    /// Every spelling `store.on_error` and `routes[].on_error` accept, with
    /// its value; read by the loader and by `tollgate schema`.
    pub const SPELLINGS: [(&'static str, Self); 3] = [
        ("allow", Self::Allow),
        ("deny", Self::Deny),
        ("local", Self::Local),
    ];
}
