//! A throwaway `redis-server` for integration tests.
//!
//! Each [`RedisServer`] runs its own process on a free port, without
//! persistence, in a temporary directory, and is killed when dropped. It is
//! ready when [`RedisServer::start`] returns: readiness is a `PING` answered,
//! polled against a deadline, never a sleep.
#![allow(dead_code)] // each test crate uses a different part of this module

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;

/// How long a server may take to answer its first `PING`.
const READY_WITHIN: Duration = Duration::from_secs(10);

/// A running `redis-server`, killed on drop.
pub struct RedisServer {
    port: u16,
    child: Option<Child>,
    dir: tempfile::TempDir,
    /// `--requirepass`, when started with one.
    password: Option<String>,
}

impl RedisServer {
    /// Starts a server on a free port and waits until it answers `PING`.
    ///
    /// # Panics
    /// When `redis-server` cannot be started or never becomes ready.
    pub async fn start() -> RedisServer {
        Self::start_with(None).await
    }

    /// Starts a server with `--requirepass password`; [`Self::connection`]
    /// and the readiness check authenticate.
    ///
    /// # Panics
    /// As [`Self::start`].
    pub async fn start_with_password(password: &str) -> RedisServer {
        Self::start_with(Some(password.to_owned())).await
    }

    async fn start_with(password: Option<String>) -> RedisServer {
        // The port is free when picked, but another process may take it
        // before redis-server binds it: try a few.
        let mut last_error = String::new();
        for _ in 0..5 {
            let mut server = RedisServer {
                port: free_port(),
                child: None,
                dir: tempfile::tempdir().expect("temporary directory for redis-server"),
                password: password.clone(),
            };
            match server.spawn_and_wait().await {
                Ok(()) => return server,
                Err(e) => last_error = e, // dropping `server` kills its process
            }
        }
        panic!("redis-server did not start: {last_error}");
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The port the server listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The URL with the `--requirepass` password, if any, for the test's
    /// own connections.
    fn admin_url(&self) -> String {
        match &self.password {
            Some(pw) => format!("redis://:{pw}@127.0.0.1:{}", self.port),
            None => self.url(),
        }
    }

    /// A fresh connection for inspecting or tampering with the server
    /// (authenticated when the server requires a password).
    ///
    /// # Panics
    /// When the server cannot be reached.
    pub async fn connection(&self) -> MultiplexedConnection {
        redis::Client::open(self.admin_url())
            .expect("redis url")
            .get_multiplexed_async_connection()
            .await
            .expect("connection to the test redis-server")
    }

    /// Kills the server (as a crash would) and waits for the process to end.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port, with empty data.
    ///
    /// # Panics
    /// When it does not become ready.
    pub async fn restart(&mut self) {
        self.stop();
        if let Err(e) = self.spawn_and_wait().await {
            panic!("redis-server did not restart on port {}: {e}", self.port);
        }
    }

    async fn answering_pid(&self, conn: &mut MultiplexedConnection) -> Option<u32> {
        let info: String = redis::cmd("INFO")
            .arg("server")
            .query_async(conn)
            .await
            .ok()?;
        info.lines()
            .find_map(|l| l.strip_prefix("process_id:"))
            .and_then(|pid| pid.trim().parse().ok())
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("redis.log")
    }

    async fn spawn_and_wait(&mut self) -> Result<(), String> {
        let mut cmd = Command::new("redis-server");
        if let Some(pw) = &self.password {
            cmd.args(["--requirepass", pw]);
        }
        let child = cmd
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1"])
            .args(["--save", ""])
            .args(["--appendonly", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .arg("--logfile")
            .arg(self.log_path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot run redis-server: {e}"))?;
        self.child = Some(child);

        let client = redis::Client::open(self.admin_url()).map_err(|e| e.to_string())?;
        let deadline = Instant::now() + READY_WITHIN;
        loop {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    let log = std::fs::read_to_string(self.log_path()).unwrap_or_default();
                    return Err(format!("exited with {status}:\n{log}"));
                }
            }
            if let Ok(mut conn) = client.get_multiplexed_async_connection().await {
                let pong: redis::RedisResult<String> =
                    redis::cmd("PING").query_async(&mut conn).await;
                if pong.is_ok() {
                    // Answered — but by ours, or by a server that took the
                    // port first?
                    return match self.answering_pid(&mut conn).await {
                        Some(pid) if Some(pid) == self.child.as_ref().map(Child::id) => Ok(()),
                        other => Err(format!("port {} answered by process {other:?}", self.port)),
                    };
                }
            }
            if Instant::now() > deadline {
                return Err(format!("no PONG within {READY_WITHIN:?}"));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A port nothing listens on right now.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind 127.0.0.1:0")
        .port()
}

/// How many times the server ran `command` (from `INFO commandstats`; the
/// commands a script runs count too).
pub async fn command_calls(conn: &mut MultiplexedConnection, command: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .expect("INFO commandstats");
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}
