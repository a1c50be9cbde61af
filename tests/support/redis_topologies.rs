//! Real Redis deployments for tests: a Cluster (3 masters, with replicas
//! or without), a master with a
//! replica watched by a Sentinel, and a TLS-only server with a CA made by
//! rcgen. Every process runs on a free loopback port in its own temporary
//! directory and is killed on drop. Readiness is polled (a `PING` answered,
//! `cluster_state:ok`, a log line), never slept for.
#![allow(dead_code)] // each test crate uses a different part of this module

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a deployment may take to become ready.
const READY_WITHIN: Duration = Duration::from_secs(20);

/// A port nothing listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind 127.0.0.1:0")
        .port()
}

/// One `redis-server` process (plain, cluster node, sentinel or TLS).
pub struct Proc {
    pub port: u16,
    child: Option<Child>,
    pub dir: tempfile::TempDir,
}

impl Proc {
    /// Runs `redis-server` with `args` after the common ones (port, bind,
    /// no persistence, directory, log file). `config` is passed first when
    /// given (a sentinel needs a config file).
    fn spawn(port: u16, config: Option<&Path>, args: &[String]) -> Proc {
        let dir = tempfile::tempdir().expect("temporary directory for redis-server");
        Self::spawn_in(port, dir, config, args)
    }

    fn spawn_in(port: u16, dir: tempfile::TempDir, config: Option<&Path>, args: &[String]) -> Proc {
        let mut cmd = Command::new("redis-server");
        if let Some(c) = config {
            cmd.arg(c);
        }
        cmd.args(["--bind", "127.0.0.1"])
            .args(["--save", ""])
            .args(["--appendonly", "no"])
            .arg("--dir")
            .arg(dir.path())
            .arg("--logfile")
            .arg(dir.path().join("redis.log"))
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = cmd.spawn().expect("run redis-server");
        Proc {
            port,
            child: Some(child),
            dir,
        }
    }

    /// The server's log so far, for failure messages.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("redis.log")).unwrap_or_default()
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Sends `signal` (`STOP`, `CONT`, `KILL`) to the process with
    /// `kill -<signal>`.
    pub fn signal(&self, signal: &str) {
        let pid = self.pid().expect("the process runs");
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(pid.to_string())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{signal} {pid} failed");
    }

    /// Kills the process (as a crash would) and waits for it to end.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn exited(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(Some(_))),
            None => true,
        }
    }

    /// Starts the process `make` builds on a port picked for it, and waits
    /// until it is `ready`. A port is free when picked, but another process
    /// may take it (or a cluster node's bus port) before redis-server binds
    /// it: a start that fails to bind is tried again on new ports.
    async fn start(mut make: impl FnMut(u16) -> Proc, ready: Ready<'_>) -> Proc {
        let mut last = String::new();
        for _ in 0..5 {
            let mut proc = make(free_port());
            match proc.until(ready).await {
                Ok(()) => return proc,
                Err(log) if log.contains("Address already in use") => last = log,
                Err(log) => panic!("redis-server did not start:\n{log}"),
            }
        }
        panic!("redis-server found no free port in 5 tries:\n{last}");
    }

    /// Waits until the process is `ready`; the error says why not, with the
    /// server's log.
    async fn until(&mut self, ready: Ready<'_>) -> Result<(), String> {
        let deadline = Instant::now() + READY_WITHIN;
        loop {
            if self.exited() {
                return Err(format!("redis-server exited:\n{}", self.log()));
            }
            let done = match ready {
                Ready::Ping => query(self.port, &["PING"]).await.is_ok(),
                Ready::Logged(line) => self.log().contains(line),
            };
            if done {
                return Ok(());
            }
            if Instant::now() >= deadline {
                let what = match ready {
                    Ready::Ping => format!("no PONG on port {}", self.port),
                    Ready::Logged(line) => format!("{line:?} never logged"),
                };
                return Err(format!("{what}:\n{}", self.log()));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// What says a started process is ready.
#[derive(Clone, Copy)]
enum Ready<'a> {
    /// It answers `PING` on its plain port.
    Ping,
    /// Its log holds this line.
    Logged(&'a str),
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// One command on a fresh plain connection to `port`.
pub async fn query(port: u16, args: &[&str]) -> redis::RedisResult<redis::Value> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}"))?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query_async(&mut conn).await
}

/// `query` read as a string (bulk or status reply), `None` otherwise.
pub async fn query_string(port: u16, args: &[&str]) -> Option<String> {
    match query(port, args).await.ok()? {
        redis::Value::BulkString(b) => Some(String::from_utf8_lossy(&b).into_owned()),
        redis::Value::SimpleString(s) | redis::Value::VerbatimString { text: s, .. } => Some(s),
        _ => None,
    }
}

/// A Redis Cluster made with `redis-cli --cluster create`: masters, and
/// replicas of them when asked for.
pub struct RedisCluster {
    pub nodes: Vec<Proc>,
}

impl RedisCluster {
    /// Starts `n` (at least 3) cluster nodes and joins them as masters.
    pub async fn start(n: usize) -> RedisCluster {
        Self::start_with(n, 0, 2000).await
    }

    /// Starts `masters` (at least 3) masters with `replicas` replicas each,
    /// `cluster-node-timeout` `node_timeout_ms`, and waits until every node
    /// says `cluster_state:ok` and every replica's link to its master is up
    /// (so a failover can promote it).
    pub async fn start_with(masters: usize, replicas: usize, node_timeout_ms: u64) -> RedisCluster {
        let n = masters * (1 + replicas);
        let mut nodes = Vec::with_capacity(n);
        for _ in 0..n {
            let node = |port: u16| {
                Proc::spawn(
                    port,
                    None,
                    &[
                        "--port".into(),
                        port.to_string(),
                        "--cluster-enabled".into(),
                        "yes".into(),
                        "--cluster-config-file".into(),
                        "nodes.conf".into(),
                        "--cluster-node-timeout".into(),
                        node_timeout_ms.to_string(),
                        // The setting docs/redis.md recommends: a master marked
                        // failed stops only its own slots, not every node's.
                        "--cluster-require-full-coverage".into(),
                        "no".into(),
                        // The default bus port (port + 10000) may be taken or
                        // beyond 65535; pick a free one as well.
                        "--cluster-port".into(),
                        free_port().to_string(),
                    ],
                )
            };
            nodes.push(Proc::start(node, Ready::Ping).await);
        }
        let addrs: Vec<String> = nodes
            .iter()
            .map(|p| format!("127.0.0.1:{}", p.port))
            .collect();
        let out = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .expect("run redis-cli --cluster create");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let deadline = Instant::now() + READY_WITHIN;
        for node in &nodes {
            loop {
                let info = query_string(node.port, &["CLUSTER", "INFO"])
                    .await
                    .unwrap_or_default();
                let role = query_string(node.port, &["INFO", "replication"])
                    .await
                    .unwrap_or_default();
                let synced = role.contains("role:master") || role.contains("master_link_status:up");
                if info.contains("cluster_state:ok") && synced {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "cluster never ok:\n{info}\n{role}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        RedisCluster { nodes }
    }

    /// The node with `port`.
    pub fn node(&self, port: u16) -> &Proc {
        self.nodes
            .iter()
            .find(|p| p.port == port)
            .expect("a node of this cluster")
    }

    /// The port of the replica of the master at `master`, as that replica
    /// says (`INFO replication`'s `master_port`).
    pub async fn replica_of(&self, master: u16) -> Option<u16> {
        for node in &self.nodes {
            let role = query_string(node.port, &["INFO", "replication"])
                .await
                .unwrap_or_default();
            if role.contains("role:slave") && role.contains(&format!("master_port:{master}\r\n")) {
                return Some(node.port);
            }
        }
        None
    }

    /// `(host, port)` of every node.
    pub fn seeds(&self) -> Vec<(String, u16)> {
        self.nodes
            .iter()
            .map(|p| ("127.0.0.1".to_owned(), p.port))
            .collect()
    }

    /// Every node as `host:port`, comma-separated: the inside of a YAML
    /// flow list, `cluster: [{}]`.
    pub fn seed_list(&self) -> String {
        self.seeds()
            .iter()
            .map(|(h, p)| format!("{h}:{p}"))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The port of the node that owns `key`'s slot, and the key's value.
    pub async fn get(&self, key: &str) -> (u16, Option<String>) {
        for node in &self.nodes {
            match query(node.port, &["GET", key]).await {
                Ok(redis::Value::BulkString(b)) => {
                    return (node.port, Some(String::from_utf8_lossy(&b).into_owned()));
                }
                Ok(redis::Value::Nil) => return (node.port, None),
                _ => {} // MOVED: another node owns it
            }
        }
        panic!("no cluster node owns {key}");
    }
}

/// A master, one replica, and one Sentinel (or more) watching them as
/// `mymaster`.
pub struct SentinelSetup {
    pub master: Proc,
    pub replica: Proc,
    pub sentinel: Proc,
    /// Sentinels beside the first one ([`SentinelSetup::start_with`]).
    pub others: Vec<Proc>,
}

/// The service name the sentinel monitors.
pub const SERVICE: &str = "mymaster";

impl SentinelSetup {
    /// Starts all three and waits until the sentinel knows the replica.
    pub async fn start() -> SentinelSetup {
        Self::start_with(1, 400, 2000).await
    }

    /// Starts a master, a replica and `sentinels` sentinels (quorum: a
    /// majority) with `down-after-milliseconds` `down_after` and
    /// `failover-timeout` `failover_timeout`, and waits until every
    /// sentinel knows the replica and the other sentinels.
    pub async fn start_with(
        sentinels: usize,
        down_after: u64,
        failover_timeout: u64,
    ) -> SentinelSetup {
        let quorum = sentinels / 2 + 1;
        let plain = |port: u16| Proc::spawn(port, None, &["--port".into(), port.to_string()]);
        let master = Proc::start(plain, Ready::Ping).await;
        let mport = master.port;
        let replica_of_master = |port: u16| {
            Proc::spawn(
                port,
                None,
                &[
                    "--port".into(),
                    port.to_string(),
                    "--replicaof".into(),
                    "127.0.0.1".into(),
                    mport.to_string(),
                ],
            )
        };
        let replica = Proc::start(replica_of_master, Ready::Ping).await;
        let rport = replica.port;
        let deadline = Instant::now() + READY_WITHIN;
        loop {
            let info = query_string(rport, &["INFO", "replication"])
                .await
                .unwrap_or_default();
            if info.contains("master_link_status:up") {
                break;
            }
            assert!(Instant::now() < deadline, "replica never synced:\n{info}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }

        let mut procs = Vec::with_capacity(sentinels);
        for _ in 0..sentinels.max(1) {
            let sentinel = |sport: u16| {
                let dir = tempfile::tempdir().expect("temporary directory for the sentinel");
                let conf = dir.path().join("sentinel.conf");
                std::fs::write(
                    &conf,
                    format!(
                        "port {sport}\n\
                         sentinel monitor {SERVICE} 127.0.0.1 {mport} {quorum}\n\
                         sentinel down-after-milliseconds {SERVICE} {down_after}\n\
                         sentinel failover-timeout {SERVICE} {failover_timeout}\n\
                         sentinel parallel-syncs {SERVICE} 1\n"
                    ),
                )
                .expect("write sentinel.conf");
                Proc::spawn_in(sport, dir, Some(&conf), &["--sentinel".into()])
            };
            procs.push(Proc::start(sentinel, Ready::Ping).await);
        }
        let deadline = Instant::now() + READY_WITHIN;
        for sentinel in &procs {
            loop {
                let replicas = query(sentinel.port, &["SENTINEL", "REPLICAS", SERVICE]).await;
                let peers = query(sentinel.port, &["SENTINEL", "SENTINELS", SERVICE]).await;
                let known = match &peers {
                    Ok(redis::Value::Array(p)) => p.len(),
                    _ => 0,
                };
                if format!("{replicas:?}").contains(&rport.to_string()) && known + 1 >= procs.len()
                {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "sentinel never saw the replica and its peers: {replicas:?} {peers:?}\n{}",
                    sentinel.log()
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        let sentinel = procs.remove(0);
        SentinelSetup {
            master,
            replica,
            sentinel,
            others: procs,
        }
    }

    /// The port the sentinel names as the master right now.
    pub async fn master_port(&self) -> Option<u16> {
        match query(
            self.sentinel.port,
            &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE],
        )
        .await
        .ok()?
        {
            redis::Value::Array(parts) => match parts.get(1) {
                Some(redis::Value::BulkString(p)) => String::from_utf8_lossy(p).parse().ok(),
                _ => None,
            },
            _ => None,
        }
    }

    /// Every sentinel as `127.0.0.1:port`, comma-separated: the inside of
    /// a YAML flow list, `nodes: [{}]`.
    pub fn node_list(&self) -> String {
        std::iter::once(&self.sentinel)
            .chain(&self.others)
            .map(|s| format!("127.0.0.1:{}", s.port))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Kills the master and waits until the sentinel has promoted the
    /// replica (and the replica says it is a master).
    pub async fn fail_over(&mut self) {
        self.master.kill();
        self.wait_promoted().await;
    }

    /// Waits until the sentinel names the replica as the master and the
    /// replica says it is one.
    pub async fn wait_promoted(&self) {
        let deadline = Instant::now() + READY_WITHIN;
        loop {
            let promoted = self.master_port().await == Some(self.replica.port);
            let role = query_string(self.replica.port, &["INFO", "replication"])
                .await
                .unwrap_or_default();
            if promoted && role.contains("role:master") {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "no failover:\n{}",
                self.sentinel.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// The ACL user [`TlsRedis`] knows, and its password.
pub const TLS_USER: &str = "tollgate";
pub const TLS_PASSWORD: &str = "s3cret";

/// A `redis-server` that speaks only TLS, with a certificate for 127.0.0.1
/// issued by a CA made for the test, and an ACL user [`TLS_USER`].
pub struct TlsRedis {
    pub proc: Proc,
    /// PEM file of the test CA.
    pub ca_file: PathBuf,
    /// Keeps the certificate files while the server runs.
    _pki: super::pki::Pki,
}

impl TlsRedis {
    /// Makes the CA and server certificate, starts the server, and waits
    /// until it logs that it accepts connections.
    pub async fn start() -> TlsRedis {
        let pki = super::pki::new_pki();
        let (ca_file, cert_file, key_file) = (pki.ca.clone(), pki.cert.clone(), pki.key.clone());

        let path = |p: &Path| p.to_string_lossy().into_owned();
        let server = |port: u16| {
            let dir = tempfile::tempdir().expect("temporary directory for redis-server");
            Proc::spawn_in(
                port,
                dir,
                None,
                &[
                    "--port".into(),
                    "0".into(),
                    "--tls-port".into(),
                    port.to_string(),
                    "--tls-cert-file".into(),
                    path(&cert_file),
                    "--tls-key-file".into(),
                    path(&key_file),
                    "--tls-ca-cert-file".into(),
                    path(&ca_file),
                    "--tls-auth-clients".into(),
                    "no".into(),
                    // An ACL user besides `default`, for the ACL tests.
                    "--user".into(),
                    TLS_USER.into(),
                    "on".into(),
                    format!(">{TLS_PASSWORD}"),
                    "~*".into(),
                    "+@all".into(),
                ],
            )
        };
        let proc = Proc::start(server, Ready::Logged("Ready to accept connections")).await;
        TlsRedis {
            proc,
            ca_file,
            _pki: pki,
        }
    }
}
