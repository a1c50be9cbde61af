//! A real headless Chromium against a real gateway: a page served from
//! another origin (another port) calls an API past its limit, as a
//! browser-facing API's first user would.
//!
//! The page's script fetches five times with an API key; each fetch sends
//! a custom header, so each is preceded by a CORS preflight (`max_age: 0`
//! and five distinct URLs keep Chromium from reusing one). It writes what
//! it saw into the DOM (`--dump-dom`) and also POSTs it back to the page's
//! server, which the test waits on: a readiness signal rather than a
//! guess at how long the browser takes.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

use crate::support::gateway::{Gateway, Upstream};

/// The page: five fetches, one line each (`status|RateLimit|Retry-After|id`).
fn page(api: SocketAddr) -> String {
    format!(
        r#"<!doctype html><html><body><pre id="out">pending</pre><script>
(async () => {{
  const lines = [];
  for (let i = 1; i <= 5; i++) {{
    try {{
      const r = await fetch("http://{api}/api/item" + i, {{ headers: {{ "x-api-key": "page-key" }} }});
      lines.push([r.status, r.headers.get("ratelimit"), r.headers.get("retry-after"), r.headers.get("x-request-id")].join("|"));
    }} catch (e) {{
      lines.push("error " + e);
    }}
  }}
  const text = lines.join("\n");
  document.getElementById("out").textContent = text;
  await fetch("/result", {{ method: "POST", body: text }});
}})();
</script></body></html>"#
    )
}

/// Serves the page on 127.0.0.1:0 and sends each POSTed result to `results`.
async fn page_server(
    html: Arc<Mutex<String>>,
    results: mpsc::UnboundedSender<String>,
) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let html = html.clone();
            let results = results.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req: Request<Incoming>| {
                    let html = html.clone();
                    let results = results.clone();
                    async move {
                        let res = if req.uri().path() == "/result" {
                            let body = req.into_body().collect().await.map(|b| b.to_bytes());
                            let _ = results.send(
                                String::from_utf8_lossy(&body.unwrap_or_default()).into_owned(),
                            );
                            Response::new(Full::new(Bytes::new()))
                        } else {
                            let mut r =
                                Response::new(Full::new(Bytes::from(html.lock().unwrap().clone())));
                            r.headers_mut().insert(
                                "content-type",
                                "text/html; charset=utf-8".parse().unwrap(),
                            );
                            r
                        };
                        Ok::<_, Infallible>(res)
                    }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    addr
}

/// The browser binary: Debian's `chromium`, which `scripts/test.sh` installs.
pub fn chromium() -> String {
    for name in ["chromium", "chromium-browser", "google-chrome"] {
        let found = std::process::Command::new("sh")
            .args(["-c", &format!("command -v {name}")])
            .output()
            .is_ok_and(|o| o.status.success());
        if found {
            return name.to_owned();
        }
    }
    panic!("no chromium on PATH; scripts/test.sh installs it (apt-get install chromium)");
}

#[tokio::test]
async fn a_page_on_another_origin_sees_its_429s_and_their_headers() {
    let html = Arc::new(Mutex::new(String::new()));
    let (tx, mut results) = mpsc::unbounded_channel();
    let page_addr = page_server(html.clone(), tx).await;
    let up = Upstream::start().await;
    let yaml = format!(
        r#"
listen: 127.0.0.1:0
routes:
  - name: api
    match: {{ path_prefix: /api/ }}
    upstream: {up}
    cors:
      allow_origins: [ "http://{page_addr}" ]
      allow_headers: [ x-api-key ]
      max_age: 0s
    limits: [ {{ name: per_key, key: api_key, limit: 3, window: 1h }} ]
"#,
        up = up.url()
    );
    let gw = Gateway::start(&yaml).await;
    *html.lock().unwrap() = page(gw.addr);

    let profile = tempfile::tempdir().unwrap();
    let browser = tokio::process::Command::new(chromium())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--virtual-time-budget=30000",
            "--dump-dom",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(format!("http://{page_addr}/"))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("chromium starts");
    let result = tokio::time::timeout(Duration::from_secs(60), results.recv())
        .await
        .expect("the page reports within a minute")
        .expect("a result");
    let lines: Vec<Vec<&str>> = result.lines().map(|l| l.split('|').collect()).collect();
    let statuses: Vec<&str> = lines.iter().map(|l| l[0]).collect();
    assert_eq!(statuses, ["200", "200", "200", "429", "429"], "{result}");
    for (i, l) in lines.iter().enumerate() {
        // The page reads the exposed headers: RateLimit, and on a 429
        // Retry-After; every answer names its request id.
        let remaining = 2u64.saturating_sub(i as u64);
        assert!(
            l[1].starts_with(&format!("\"per_key\";r={remaining};t=")),
            "RateLimit of call {}: {result}",
            i + 1
        );
        assert_eq!(l[3].len(), 36, "request id of call {}: {result}", i + 1);
        if i >= 3 {
            let secs: u64 = l[2]
                .parse()
                .unwrap_or_else(|_| panic!("Retry-After: {result}"));
            // A sliding window of an hour restores past its end: at most two.
            assert!((1..=7200).contains(&secs), "{result}");
        }
    }
    // Five preflights, more than the limit, all answered without a count;
    // only the three admitted calls reached the upstream.
    assert_eq!(up.count(), 3);
    assert!(
        up.seen
            .lock()
            .unwrap()
            .iter()
            .all(|s| s.method == http::Method::GET)
    );
    // The DOM holds the same lines.
    let out = tokio::time::timeout(Duration::from_secs(60), browser.wait_with_output())
        .await
        .expect("chromium exits")
        .expect("chromium output");
    let dom = String::from_utf8_lossy(&out.stdout);
    assert!(dom.contains(lines_of(&result)), "{dom}");
}

fn lines_of(result: &str) -> &str {
    result.lines().next().unwrap_or("")
}
