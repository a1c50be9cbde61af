//! The built binary, started as the README says and ready when it says so.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

/// A started binary and the addresses it reported.
pub struct Started {
    pub child: Child,
    /// Proxy listeners, in the order they were reported.
    pub proxy: Vec<SocketAddr>,
    /// The admin listener, when there is one.
    pub admin: Option<SocketAddr>,
    /// Every line it writes, from the first: what it logs while it starts
    /// (the Redis connection, made before it accepts) may come before the
    /// listening lines.
    pub lines: tokio::sync::mpsc::UnboundedReceiver<String>,
    /// For [`spawn_unread`]: the stderr pipe stays open, unread, while
    /// this is held.
    _unread: Option<mpsc::Sender<()>>,
}

impl Started {
    /// The next line containing `needle`, when one comes within `within`;
    /// the lines before it are taken and passed over. A line is in the
    /// `tee` file before it is sent here, so the file holds it by then.
    pub async fn next_line_with(&mut self, needle: &str, within: Duration) -> Option<String> {
        let found = async {
            while let Some(line) = self.lines.recv().await {
                if line.contains(needle) {
                    return Some(line);
                }
            }
            None
        };
        tokio::time::timeout(within, found).await.ok().flatten()
    }

    /// Waits for a line containing `needle`; whether one came within
    /// `within`.
    pub async fn wait_for_line(&mut self, needle: &str, within: Duration) -> bool {
        self.next_line_with(needle, within).await.is_some()
    }
}

/// Starts `cmd` (the tollgate binary with its arguments) and returns once it
/// has logged `listeners` "listening" lines: each proxy and admin listener
/// logs one, with its address, after it is bound, so the process is ready
/// then — no polling — and the tests can bind port 0 and read the port
/// from the line instead of guessing a free one. Its stderr is copied line
/// by line to `tee` when given, else drained.
///
/// # Panics
/// When the process does not report ready within 30 s, or exits first; the
/// message carries what it wrote.
pub fn spawn_listening(cmd: Command, listeners: usize, tee: Option<&Path>) -> Started {
    spawn(cmd, listeners, tee, false)
}

/// As [`spawn_listening`], but once the listeners are reported nobody
/// reads its stderr again: the pipe stays open and fills up, as when a
/// log collector stalls. Nothing arrives on [`Started::lines`].
pub fn spawn_unread(cmd: Command, listeners: usize) -> Started {
    spawn(cmd, listeners, None, true)
}

fn spawn(mut cmd: Command, listeners: usize, tee: Option<&Path>, unread: bool) -> Started {
    cmd.env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("start tollgate");
    let stderr = child.stderr.take().expect("piped stderr");
    let mut file = tee.map(|p| std::fs::File::create(p).expect("log file"));
    let (ready, is_ready) = mpsc::channel();
    let (more, lines) = tokio::sync::mpsc::unbounded_channel();
    let seen_lines = Arc::new(Mutex::new(Vec::new()));
    let written = Arc::clone(&seen_lines);
    let (hold, held) = mpsc::channel::<()>();
    std::thread::spawn(move || {
        let mut found = Vec::new();
        let mut reported = false;
        let mut reader = BufReader::new(stderr);
        let mut line = String::new();
        while !(reported && unread) {
            line.clear();
            match reader.read_line(&mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            let line = line.trim_end_matches(['\n', '\r']).to_owned();
            if let Some(f) = file.as_mut() {
                let _ = writeln!(f, "{line}");
            }
            if reported {
                let _ = more.send(line);
                continue;
            }
            written.lock().unwrap().push(line.clone());
            if !unread {
                let _ = more.send(line.clone());
            }
            if line.contains("listening") {
                found.push((line.contains("admin listening"), address_in(&line)));
                if found.len() == listeners {
                    reported = true;
                    let _ = ready.send(std::mem::take(&mut found));
                }
            }
        }
        // Unread from here on: hold the pipe open until the test is done.
        let _ = held.recv();
        drop(reader);
    });
    let Ok(found) = is_ready.recv_timeout(Duration::from_secs(30)) else {
        let _ = child.kill();
        let status = child.wait().ok();
        panic!(
            "tollgate did not report its listeners (exit: {status:?}); it wrote:\n{}",
            seen_lines.lock().unwrap().join("\n")
        );
    };
    let mut started = Started {
        child,
        proxy: Vec::new(),
        admin: None,
        lines,
        _unread: unread.then_some(hold),
    };
    for (admin, addr) in found {
        let addr = addr.expect("a listening line names its address");
        if admin {
            started.admin = Some(addr);
        } else {
            started.proxy.push(addr);
        }
    }
    started
}

/// The address after `addr=` (text log) or `"addr":"` (JSON log). The
/// binary writes no colour codes to a pipe.
fn address_in(line: &str) -> Option<SocketAddr> {
    let rest = line
        .split_once("addr=")
        .or_else(|| line.split_once("\"addr\":\""))?
        .1;
    let end = rest
        .find(|c: char| c.is_whitespace() || c == '"' || c == ',')
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}
