//! The built binary, started as the README says and ready when it says so.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// Starts `cmd` (the tollgate binary with its arguments) and returns once it
/// has logged `listeners` "listening" lines: each proxy and admin listener
/// logs one after it is bound, so the process is ready then — no polling.
/// Its stderr is copied line by line to `tee` when given, else drained.
///
/// # Panics
/// When the process does not report ready within 30 s.
pub fn spawn_listening(mut cmd: Command, listeners: usize, tee: Option<&Path>) -> Child {
    cmd.env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("start tollgate");
    let stderr = child.stderr.take().expect("piped stderr");
    let mut file = tee.map(|p| std::fs::File::create(p).expect("log file"));
    let (ready, is_ready) = mpsc::channel();
    std::thread::spawn(move || {
        let mut seen = 0;
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if let Some(f) = file.as_mut() {
                let _ = writeln!(f, "{line}");
            }
            if line.contains("listening") {
                seen += 1;
                if seen == listeners {
                    let _ = ready.send(());
                }
            }
        }
    });
    if is_ready.recv_timeout(Duration::from_secs(30)).is_err() {
        let _ = child.kill();
        panic!("tollgate did not report its listeners");
    }
    child
}
