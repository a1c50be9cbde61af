//! A headless Chromium driven over the DevTools protocol, through the pipe
//! Chromium offers for it (`--remote-debugging-pipe`: it reads commands on
//! fd 3 and writes replies and events on fd 4, each message JSON ended by
//! a NUL byte) — no WebSocket client needed. The shell that starts it puts
//! the test's pipes on fds 3 and 4.

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::oneshot;

type Pending = Arc<Mutex<HashMap<u64, oneshot::Sender<Value>>>>;

/// A running browser; dropping it kills it.
pub struct Browser {
    _child: Child,
    stdin: tokio::sync::Mutex<ChildStdin>,
    next: AtomicU64,
    pending: Pending,
    events: Arc<Mutex<Vec<Value>>>,
    _profile: tempfile::TempDir,
}

/// One tab, attached (flat session).
pub struct Page<'a> {
    browser: &'a Browser,
    session: String,
}

impl Browser {
    /// Starts `chromium` headless with a fresh profile.
    pub async fn start(chromium: &str) -> Browser {
        let profile = tempfile::tempdir().unwrap();
        let command = format!(
            "exec {chromium} --headless --no-sandbox --disable-gpu --disable-background-networking \
             --disable-component-update --disable-sync --no-first-run --window-size=1280,900 \
             --user-data-dir='{}' --remote-debugging-pipe 3<&0 4>&1 0</dev/null 1>/dev/null",
            profile.path().display()
        );
        let mut child = Command::new("sh")
            .args(["-c", &command])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("chromium starts");
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let pending: Pending = Arc::default();
        let events: Arc<Mutex<Vec<Value>>> = Arc::default();
        let (p, e) = (pending.clone(), events.clone());
        tokio::spawn(async move {
            let mut reader = BufReader::new(stdout);
            let mut buf = Vec::new();
            loop {
                buf.clear();
                match reader.read_until(0, &mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
                if buf.last() == Some(&0) {
                    buf.pop();
                }
                let Ok(msg) = serde_json::from_slice::<Value>(&buf) else {
                    continue;
                };
                match msg["id"].as_u64() {
                    Some(id) => {
                        if let Some(tx) = p.lock().unwrap().remove(&id) {
                            let _ = tx.send(msg);
                        }
                    }
                    None => e.lock().unwrap().push(msg),
                }
            }
        });
        Browser {
            _child: child,
            stdin: tokio::sync::Mutex::new(stdin),
            next: AtomicU64::new(1),
            pending,
            events,
            _profile: profile,
        }
    }

    /// Sends `method` (to `session`, or the browser) and returns its result.
    pub async fn call(&self, session: Option<&str>, method: &str, params: Value) -> Value {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let mut msg = json!({ "id": id, "method": method, "params": params });
        if let Some(s) = session {
            msg["sessionId"] = s.into();
        }
        let (tx, rx) = oneshot::channel();
        self.pending.lock().unwrap().insert(id, tx);
        let mut bytes = serde_json::to_vec(&msg).unwrap();
        bytes.push(0);
        {
            let mut stdin = self.stdin.lock().await;
            stdin.write_all(&bytes).await.expect("write to chromium");
            stdin.flush().await.expect("flush to chromium");
        }
        let reply = tokio::time::timeout(Duration::from_secs(60), rx)
            .await
            .unwrap_or_else(|_| panic!("{method}: no reply within a minute"))
            .expect("chromium answered");
        assert!(reply.get("error").is_none(), "{method}: {reply}");
        reply["result"].clone()
    }

    /// A new tab with pages, scripts, network and dialogs reported.
    pub async fn page(&self) -> Page<'_> {
        let target = self
            .call(None, "Target.createTarget", json!({ "url": "about:blank" }))
            .await;
        let attached = self
            .call(
                None,
                "Target.attachToTarget",
                json!({ "targetId": target["targetId"], "flatten": true }),
            )
            .await;
        let session = attached["sessionId"].as_str().unwrap().to_owned();
        for domain in ["Page.enable", "Runtime.enable", "Network.enable"] {
            self.call(Some(&session), domain, json!({})).await;
        }
        Page {
            browser: self,
            session,
        }
    }

    /// Every event received so far named `method`.
    pub fn events(&self, method: &str) -> Vec<Value> {
        self.events
            .lock()
            .unwrap()
            .iter()
            .filter(|e| e["method"] == method)
            .cloned()
            .collect()
    }
}

impl Page<'_> {
    /// Calls `method` in this tab.
    pub async fn call(&self, method: &str, params: Value) -> Value {
        self.browser.call(Some(&self.session), method, params).await
    }

    /// Opens `url`.
    pub async fn navigate(&self, url: &str) {
        self.call("Page.navigate", json!({ "url": url })).await;
    }

    /// The value of `expression` (awaited if a promise).
    pub async fn eval(&self, expression: &str) -> Value {
        let r = self
            .call(
                "Runtime.evaluate",
                json!({ "expression": expression, "awaitPromise": true, "returnByValue": true }),
            )
            .await;
        assert!(
            r.get("exceptionDetails").is_none(),
            "{expression}: {}",
            r["exceptionDetails"]
        );
        r["result"]["value"].clone()
    }

    /// Waits until `expression` is truthy; its value then.
    pub async fn wait_for(&self, what: &str, expression: &str, within: Duration) -> Value {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let r = self
                .call(
                    "Runtime.evaluate",
                    json!({ "expression": expression, "returnByValue": true }),
                )
                .await;
            let v = r["result"]["value"].clone();
            let truthy = match &v {
                Value::Null => false,
                Value::Bool(b) => *b,
                Value::Number(n) => n.as_f64() != Some(0.0),
                Value::String(s) => !s.is_empty(),
                _ => true,
            };
            if truthy {
                return v;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{what}: not within {within:?}; last: {v}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}
