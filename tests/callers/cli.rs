//! `tollgate callers` and `tollgate overrides`: the built binary calls the
//! same API, with the token from TOLLGATE_ADMIN_TOKEN, and prints tables.

use std::process::Output;

use super::{TOKEN, hit, start, with_token, yaml};

/// Runs the binary with `args` against the admin listener of `admin`.
async fn tollgate(admin: std::net::SocketAddr, token: &str, args: &[&str]) -> Output {
    let mut all: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    all.extend(["--admin".to_owned(), admin.to_string()]);
    let token = token.to_owned();
    tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .args(&all)
            .env("TOLLGATE_ADMIN_TOKEN", token)
            .output()
            .expect("the binary runs")
    })
    .await
    .expect("joined")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[tokio::test]
async fn the_command_line_shows_resets_and_overrides_a_caller() {
    let gw = start(&yaml("", &with_token(), 3)).await;
    assert_eq!(hit(&gw, "/api/x", "k1").await, 200);
    assert_eq!(hit(&gw, "/api/x", "k1").await, 200);

    let o = tollgate(
        gw.admin,
        TOKEN,
        &["callers", "show", "api_key=k1", "route=api"],
    )
    .await;
    assert!(o.status.success(), "{o:?}");
    let lines: Vec<String> = stdout(&o).lines().map(str::to_owned).collect();
    assert!(
        lines[0].starts_with("ROUTE  LIMIT    ALGORITHM"),
        "{lines:?}"
    );
    assert!(
        lines[1].starts_with("api    per_key  sliding_window  3      3600s   2     1 "),
        "{lines:?}"
    );

    let o = tollgate(
        gw.admin,
        TOKEN,
        &["overrides", "set", "api_key=k1", "limit=per_key", "quota=6"],
    )
    .await;
    assert!(o.status.success(), "{o:?}");
    assert!(stdout(&o).contains("quota=6"), "{o:?}");
    let o = tollgate(gw.admin, TOKEN, &["overrides", "list"]).await;
    assert!(
        stdout(&o).contains("api    per_key  quota=6  never"),
        "{o:?}"
    );

    let o = tollgate(gw.admin, TOKEN, &["callers", "reset", "api_key=k1"]).await;
    assert!(o.status.success(), "{o:?}");
    assert!(stdout(&o).contains("counters deleted: 1"), "{o:?}");

    let o = tollgate(
        gw.admin,
        TOKEN,
        &["overrides", "rm", "api_key=k1", "limit=per_key"],
    )
    .await;
    assert!(o.status.success(), "{o:?}");
    let o = tollgate(gw.admin, TOKEN, &["overrides", "list"]).await;
    assert_eq!(stdout(&o).lines().count(), 1, "{o:?}");

    // Refusals: the detail on stderr, status 1.
    let o = tollgate(
        gw.admin,
        TOKEN,
        &["overrides", "set", "api_key=k1", "limit=per_key", "quota=0"],
    )
    .await;
    assert_eq!(o.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("quota: is not a positive integer"),
        "{o:?}"
    );
    let o = tollgate(gw.admin, "wrong", &["overrides", "list"]).await;
    assert_eq!(o.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains("401"), "{o:?}");
    assert!(
        stderr.contains("the token in TOLLGATE_ADMIN_TOKEN is not the gateway's admin token"),
        "{stderr}"
    );
    // Without the variable, the hint says to set it.
    let admin = gw.admin.to_string();
    let o = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .args(["callers", "show", "api_key=k1", "--admin", &admin])
            .env_remove("TOLLGATE_ADMIN_TOKEN")
            .output()
            .expect("the binary runs")
    })
    .await
    .expect("joined");
    assert_eq!(o.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        stderr.contains(
            "TOLLGATE_ADMIN_TOKEN, which is not set: export TOLLGATE_ADMIN_TOKEN=<admin token>"
        ),
        "{stderr}"
    );
}

/// Every place a person sees API key `k1` — `/admin/top`, the support
/// API's answers, the command line's tables, the audit line, the access
/// log — shows the one digest, and the support API takes it for the key.
#[tokio::test]
async fn one_digest_names_an_api_key_everywhere_and_stands_for_it() {
    use std::time::Duration;
    // printf %s k1 | sha256sum | cut -c1-16
    const K1: &str = "sha256:6ab9f1eb8f7d3388";
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("gateway.yaml");
    let text = yaml("", &with_token(), 2).replace(
        "listen: 127.0.0.1:0\n",
        "listen: 127.0.0.1:0\naccess_log: { replay: true }\n",
    );
    std::fs::write(&file, text).expect("written");
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"));
    cmd.arg("--config").arg(&file);
    let mut started = super::support::binary::spawn_listening(cmd, 2, None);
    let (addr, admin_addr) = (started.proxy[0], started.admin.expect("admin"));
    let get = |path: &str| super::support::gateway::get(path, &[("x-api-key", "k1")]);
    for want in [200, 200, 429] {
        let r = super::support::gateway::send(addr, get("/api/x")).await;
        assert_eq!(r.status.as_u16(), want);
    }
    let wait = Duration::from_secs(10);
    let access = started.next_line_with("caller=", wait).await;
    let access = access.expect("an access line with its caller");
    assert!(access.contains(K1) && !access.contains("k1"), "{access}");

    let admin = |method: &str, path: &str, body: Option<&str>| {
        let mut b = http::Request::builder()
            .method(method)
            .uri(path)
            .header("host", "admin.test")
            .header("authorization", format!("Bearer {TOKEN}"));
        if body.is_some() {
            b = b.header("content-type", "application/json");
        }
        let body = http_body_util::Full::new(bytes::Bytes::from(body.unwrap_or("").to_owned()));
        super::support::gateway::send(admin_addr, b.body(body).expect("request"))
    };
    let top = admin("GET", "/admin/top", None).await.text();
    assert!(top.contains(&format!("\"key={K1}\"")), "{top}");
    // Looked up by the digest: the same caller, its key never echoed.
    let by_key = admin("GET", "/admin/callers?api_key=k1&route=api", None).await;
    let by_digest = admin(
        "GET",
        &format!("/admin/callers?api_key={K1}&route=api"),
        None,
    )
    .await;
    assert_eq!(by_digest.status.as_u16(), 200, "{}", by_digest.text());
    let v: serde_json::Value = serde_json::from_slice(&by_key.body).expect("JSON");
    let mut w: serde_json::Value = serde_json::from_slice(&by_digest.body).expect("JSON");
    w["limits"][0]["reset_s"] = v["limits"][0]["reset_s"].clone();
    assert_eq!(v, w);
    assert_eq!(v["limits"][0]["identity"], format!("key={K1}"), "{v}");
    assert_eq!(v["limits"][0]["used"], 2, "{v}");
    assert!(!by_key.text().contains("k1"), "{}", by_key.text());
    let body = format!(r#"{{"api_key":"{K1}","limit":"per_key","quota":6}}"#);
    let put = admin("PUT", "/admin/overrides", Some(&body)).await;
    assert_eq!(put.status.as_u16(), 200, "{}", put.text());
    assert!(
        put.text().contains(&format!("\"api_key\":\"{K1}\"")),
        "{}",
        put.text()
    );
    let audit = started
        .next_line_with("overrides.put", wait)
        .await
        .expect("audit line");
    assert!(
        audit.contains(&format!("api_key={K1}")) && !audit.contains("k1"),
        "{audit}"
    );
    // A digest of no key it knows is refused, naming the field.
    let unknown = admin(
        "GET",
        "/admin/callers?api_key=sha256:0000000000000000",
        None,
    )
    .await;
    assert_eq!(unknown.status.as_u16(), 400, "{}", unknown.text());
    assert!(unknown.text().contains("api_key"), "{}", unknown.text());

    // The command line: the same digest, and a reset by it.
    let o = tollgate(
        admin_addr,
        TOKEN,
        &["callers", "show", &format!("api_key={K1}"), "route=api"],
    )
    .await;
    assert!(stdout(&o).contains(&format!("key={K1}")), "{o:?}");
    let o = tollgate(admin_addr, TOKEN, &["overrides", "list"]).await;
    assert!(stdout(&o).contains(&format!("api_key={K1}")), "{o:?}");
    let o = tollgate(
        admin_addr,
        TOKEN,
        &["callers", "reset", &format!("api_key={K1}")],
    )
    .await;
    assert!(stdout(&o).contains("counters deleted: 1"), "{o:?}");
    let r = super::support::gateway::send(addr, get("/api/x")).await;
    assert_eq!(r.status.as_u16(), 200);

    // A caller known by its IP only: a row of an API-key limit is the
    // bucket shared by callers without a key, and says so.
    let o = tollgate(
        admin_addr,
        TOKEN,
        &["callers", "show", "ip=192.0.2.7", "route=api"],
    )
    .await;
    assert!(stdout(&o).contains("every caller without api_key"), "{o:?}");
    let _ = started.child.kill();
    let _ = started.child.wait();
}
