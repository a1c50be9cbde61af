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
    assert!(String::from_utf8_lossy(&o.stderr).contains("401"), "{o:?}");
}
