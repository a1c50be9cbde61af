//! The token rules and the refusals of bad input.

use http::{Method, StatusCode};

use super::{TOKEN, admin, call, start, with_token, yaml};

#[tokio::test]
async fn the_token_guards_the_support_api_and_nothing_else() {
    let gw = start(&yaml("", &with_token(), 3)).await;
    for path in ["/admin/callers?api_key=k1", "/admin/overrides"] {
        let none = admin(&gw, Method::GET, path, None, None).await;
        assert_eq!(none.status, StatusCode::UNAUTHORIZED, "{path}");
        assert_eq!(none.header("www-authenticate"), Some("Bearer"));
        assert_eq!(
            none.header("content-type"),
            Some("application/problem+json")
        );
        let wrong = admin(&gw, Method::GET, path, None, Some("s3cret-admin-toke")).await;
        assert_eq!(wrong.status, StatusCode::UNAUTHORIZED, "{path}");
        let longer = admin(&gw, Method::GET, path, None, Some(&format!("{TOKEN}x"))).await;
        assert_eq!(longer.status, StatusCode::UNAUTHORIZED, "{path}");
        let right = admin(&gw, Method::GET, path, None, Some(TOKEN)).await;
        assert_eq!(right.status, StatusCode::OK, "{path}: {}", right.text());
    }
    for open in ["/metrics", "/healthz", "/readyz"] {
        assert_eq!(gw.admin_get(open).await.status, StatusCode::OK, "{open}");
    }
}

#[tokio::test]
async fn without_a_token_configured_the_support_api_says_how_to_set_one() {
    let gw = start(&yaml("", "127.0.0.1:0", 3)).await;
    let r = admin(
        &gw,
        Method::GET,
        "/admin/callers?api_key=k1",
        None,
        Some(TOKEN),
    )
    .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert!(r.text().contains("token_file"), "{}", r.text());
    let r = admin(&gw, Method::PUT, "/admin/overrides", Some("{}"), None).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
}

#[tokio::test]
async fn bad_input_is_a_400_naming_the_field() {
    let gw = start(&yaml("", &with_token(), 3)).await;
    let cases: &[(Method, &str, Option<&str>, &str)] = &[
        (Method::GET, "/admin/callers?colour=red", None, "colour"),
        (Method::GET, "/admin/callers?ip=300.1.1.1", None, "ip"),
        (Method::GET, "/admin/callers?route=api", None, "caller"),
        (
            Method::DELETE,
            "/admin/callers?api_key=k1&api_key=k2",
            None,
            "api_key",
        ),
        (
            Method::PUT,
            "/admin/overrides",
            Some(r#"{"api_key":"k1","limit":"per_key","quota":0}"#),
            "quota",
        ),
        (
            Method::PUT,
            "/admin/overrides",
            Some(r#"{"api_key":"k1","limit":"per_key","quota":1.5}"#),
            "quota",
        ),
        (
            Method::PUT,
            "/admin/overrides",
            Some(r#"{"api_key":"k1","limit":"nope","quota":6}"#),
            "limit",
        ),
        (
            Method::PUT,
            "/admin/overrides",
            Some(r#"{"api_key":"k1","limit":"shared","quota":6}"#),
            "limit",
        ),
        (
            Method::PUT,
            "/admin/overrides",
            Some(r#"{"api_key":"k1","plan":"gold"}"#),
            "plan",
        ),
        (
            Method::PUT,
            "/admin/overrides",
            Some(r#"{"api_key":"k1","limit":"per_key","window":"a while","quota":6}"#),
            "window",
        ),
        (
            Method::PUT,
            "/admin/overrides",
            Some(r#"{"api_key":"k1","limt":"per_key"}"#),
            "limt",
        ),
        (
            Method::PUT,
            "/admin/overrides",
            Some(r#"{"api_key":"k1""#),
            "body",
        ),
        (Method::PUT, "/admin/overrides", Some("[1]"), "body"),
    ];
    for (method, path, body, field) in cases {
        let r = admin(&gw, method.clone(), path, *body, Some(TOKEN)).await;
        assert_eq!(
            r.status,
            StatusCode::BAD_REQUEST,
            "{path} {body:?}: {}",
            r.text()
        );
        assert_eq!(r.header("content-type"), Some("application/problem+json"));
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(v["field"], *field, "{path} {body:?}: {v}");
    }
    let big = format!(r#"{{"api_key":"{}","exempt":true}}"#, "k".repeat(70 * 1024));
    let r = admin(
        &gw,
        Method::PUT,
        "/admin/overrides",
        Some(&big),
        Some(TOKEN),
    )
    .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text());
    assert!(r.text().contains(r#""field":"body""#), "{}", r.text());
    // The ambiguous name is accepted with its route.
    let (status, v) = call(
        &gw,
        Method::PUT,
        "/admin/overrides",
        Some(r#"{"api_key":"k1","limit":"more/shared","quota":6}"#),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["override"]["route"], "more");
}

#[tokio::test]
async fn the_token_is_read_again_on_reload_and_the_command_line_keeps_it() {
    let dir = std::env::temp_dir().join(format!("tollgate-callers-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (token, file) = (dir.join("token"), dir.join("gateway.yaml"));
    std::fs::write(&token, "first-token\n").unwrap();
    let admin_field = format!("{{ addr: 127.0.0.1:0, token_file: {} }}", token.display());
    std::fs::write(&file, yaml("", &admin_field, 3)).unwrap();
    let config = tollgate::config::load::load_file(&file).expect("loads");

    // `--admin` replaces the address only.
    let mut replaced = config.clone();
    let cli = tollgate::reload::Overrides {
        admin: Some("127.0.0.1:9999".parse().unwrap()),
        ..Default::default()
    };
    cli.apply(&mut replaced);
    assert_eq!(replaced.admin, Some("127.0.0.1:9999".parse().unwrap()));
    assert_eq!(replaced.admin_token.as_deref(), Some("first-token"));

    let gw = start(&yaml("", &admin_field, 3)).await;
    let path = "/admin/overrides";
    assert_eq!(
        admin(&gw, Method::GET, path, None, Some("first-token"))
            .await
            .status,
        StatusCode::OK
    );
    std::fs::write(&token, "second-token\n").unwrap();
    tollgate::reload::reload_file(&gw.gateway, &file, &tollgate::reload::Overrides::default())
        .await
        .expect("reloads");
    assert_eq!(
        admin(&gw, Method::GET, path, None, Some("first-token"))
            .await
            .status,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        admin(&gw, Method::GET, path, None, Some("second-token"))
            .await
            .status,
        StatusCode::OK
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
