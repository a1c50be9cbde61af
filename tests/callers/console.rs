//! The operators' console on the admin listener: its page open under a
//! strict policy, its data behind the admin token, the history that a
//! burst moves, `simulate`'s reports behind tickets and a sandbox, and the
//! fleet's view merged through one real Redis.

use std::time::Duration;

use http::Method;
use serde_json::Value;

use super::support::admin::value;
use super::support::redis::RedisServer;
use super::support::wait::{self, until};
use super::{AdminGateway, TOKEN, admin, call, hit, start, with_token, yaml};

const SEEN_WITHIN: Duration = Duration::from_secs(20);

fn header<'a>(r: &'a super::Reply, name: &str) -> &'a str {
    r.header(name).unwrap_or_else(|| panic!("no {name} header"))
}

#[tokio::test]
async fn the_page_is_open_under_a_strict_policy_and_its_data_need_the_token() {
    let gw = start(&yaml("", &with_token(), 3)).await;
    let r = gw.admin_get("/").await;
    assert_eq!(r.status.as_u16(), 302);
    assert_eq!(header(&r, "location"), "/console/");
    for (path, kind) in [
        ("/console/", "text/html"),
        ("/console/console.js", "text/javascript"),
        ("/console/console.css", "text/css"),
    ] {
        let r = gw.admin_get(path).await;
        assert_eq!(r.status.as_u16(), 200, "{path}");
        assert!(header(&r, "content-type").starts_with(kind), "{path}");
        let csp = header(&r, "content-security-policy");
        assert!(
            csp.starts_with("default-src 'self'; script-src 'self'; style-src 'self';"),
            "{csp}"
        );
        assert!(!csp.contains("unsafe"), "{csp}");
        assert!(csp.contains("frame-ancestors 'none'"), "{csp}");
        assert_eq!(header(&r, "x-content-type-options"), "nosniff");
        assert!(r.header("set-cookie").is_none());
    }
    // No inline script: the only script element names its file.
    let html = gw.admin_get("/console/").await.text();
    assert_eq!(html.matches("<script").count(), 1, "{html}");
    assert!(html.contains("<script src=\"console.js\" defer></script>"));

    for path in [
        "/admin/console/now",
        "/admin/console/denied",
        "/admin/console/replays",
    ] {
        let r = admin(&gw, Method::GET, path, None, None).await;
        assert_eq!(r.status.as_u16(), 401, "{path}");
        let r = admin(&gw, Method::GET, path, None, Some("wrong")).await;
        assert_eq!(r.status.as_u16(), 401, "{path}");
        let (status, v) = call(&gw, Method::GET, path, None).await;
        assert_eq!(status, 200, "{path}: {v}");
    }
    let (_, now) = call(&gw, Method::GET, "/admin/console/now", None).await;
    assert_eq!(now["scope"], "gateway", "{now}");
    assert_eq!(now["store"]["kind"], "memory", "{now}");
    assert_eq!(now["history_seconds"], 900, "{now}");
    let (status, _) = call(&gw, Method::DELETE, "/admin/console/now", None).await;
    assert_eq!(status, 405);
    // Scrapers and probes need no token.
    for path in ["/metrics", "/healthz", "/readyz"] {
        assert_eq!(gw.admin_get(path).await.status.as_u16(), 200, "{path}");
    }

    // Without a token configured the data say how to set one; the page
    // itself still loads, to say the same.
    let open = start(&yaml("", "{ addr: 127.0.0.1:0 }", 3)).await;
    let r = admin(&open, Method::GET, "/admin/console/now", None, Some(TOKEN)).await;
    assert_eq!(r.status.as_u16(), 403);
    assert!(r.text().contains("token_file"), "{}", r.text());
    assert_eq!(open.admin_get("/console/").await.status.as_u16(), 200);
}

/// The limited requests of route `api` over the seconds `now` holds.
fn limited(now: &Value, ring: &str) -> u64 {
    now[ring]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|s| s["routes"].as_array().into_iter().flatten())
        .filter(|r| r["route"] == "api")
        .filter_map(|r| r["limited"].as_u64())
        .sum()
}

#[tokio::test]
async fn a_burst_shows_in_the_history_as_limited_per_second() {
    let gw = start(&yaml("", &with_token(), 2)).await;
    for _ in 0..7 {
        hit(&gw, "/api/x", "k1").await;
    }
    until(
        "five limited requests in the history",
        SEEN_WITHIN,
        || async {
            let (_, now) = call(&gw, Method::GET, "/admin/console/now", None).await;
            limited(&now, "local") == 5 && limited(&now, "fleet") == 5
        },
    )
    .await;
    // `since` leaves out what the page already holds.
    let (_, now) = call(&gw, Method::GET, "/admin/console/now", None).await;
    let last = now["local"]
        .as_array()
        .and_then(|a| a.last())
        .expect("a second")["at"]
        .clone();
    let (_, later) = call(
        &gw,
        Method::GET,
        &format!("/admin/console/now?since={last}"),
        None,
    )
    .await;
    assert_eq!(limited(&later, "local"), 0, "{later}");
    // Who was limited: the key by its digest, as the support API takes it.
    let (_, denied) = call(&gw, Method::GET, "/admin/console/denied", None).await;
    let one_minute = denied["limits"]
        .as_array()
        .and_then(|a| {
            a.iter()
                .find(|l| l["minutes"] == 1 && l["limit"] == "per_key")
        })
        .unwrap_or_else(|| panic!("{denied}"));
    let digest = tollgate::identity::digest(b"k1");
    assert_eq!(one_minute["top"][0][0], format!("key={digest}"), "{denied}");
    assert_eq!(one_minute["top"][0][1], 5, "{denied}");
    assert!(!denied.to_string().contains("\"k1"), "{denied}");
}

#[tokio::test]
async fn reports_open_only_by_their_ticket_and_in_a_sandbox() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("run-1.html"),
        "<html><body style=\"color:red\"><script>alert(1)</script>report</body></html>",
    )
    .unwrap();
    std::fs::write(dir.path().join("notes.txt"), "not a report").unwrap();
    let admin_yaml = format!(
        "{{ addr: 127.0.0.1:0, token: {TOKEN}, replays: '{}' }}",
        dir.path().display()
    );
    let gw = start(&yaml("", &admin_yaml, 3)).await;
    let (status, list) = call(&gw, Method::GET, "/admin/console/replays", None).await;
    assert_eq!(status, 200, "{list}");
    let reports = list["reports"].as_array().expect("reports");
    assert_eq!(reports.len(), 1, "{list}");
    assert_eq!(reports[0]["name"], "run-1.html");
    let url = reports[0]["url"].as_str().expect("url");
    assert!(
        url.starts_with("/console/replays/run-1.html?ticket="),
        "{url}"
    );

    // The report itself needs no bearer header (a new tab sends none),
    // only its ticket; it is served in a sandbox with no script.
    let r = gw.admin_get(url).await;
    assert_eq!(r.status.as_u16(), 200);
    assert!(r.text().contains("report"));
    let csp = header(&r, "content-security-policy");
    assert!(
        csp.starts_with("sandbox; default-src 'none'; style-src 'unsafe-inline';"),
        "{csp}"
    );
    assert!(
        !csp.contains("script-src") && !csp.contains("allow-"),
        "{csp}"
    );
    assert_eq!(header(&r, "referrer-policy"), "no-referrer");

    let tampered = url.replacen("run-1.html?", "run-2.html?", 1);
    let (head, sig) = url.rsplit_once('.').expect("a ticket");
    let last = if sig.ends_with('0') { '1' } else { '0' };
    let flipped = format!("{head}.{}{last}", &sig[..sig.len() - 1]);
    for bad in [
        "/console/replays/run-1.html",
        tampered.as_str(),
        flipped.as_str(),
        "/console/replays/notes.txt",
        "/console/replays/..%2Frun-1.html",
    ] {
        assert_eq!(gw.admin_get(bad).await.status.as_u16(), 404, "{bad}");
    }

    // A folder that is not one is refused at load, naming the field.
    let missing = yaml(
        "",
        "{ addr: 127.0.0.1:0, token: t, replays: /no/such/folder }",
        3,
    );
    let err = tollgate::config::load::parse_str(&missing).expect_err("no such folder");
    assert!(err.to_string().contains("admin.replays"), "{err}");
}

async fn redis_gateway(server: &RedisServer, url: &str) -> AdminGateway {
    let _ = server;
    let store = format!("store: {{ redis: {{ url: '{url}' }}, deny_cache: 1000 }}");
    start(&yaml(&store, &with_token(), 2)).await
}

#[tokio::test]
async fn the_fleet_view_merges_what_every_live_gateway_published() {
    let server = RedisServer::start().await;
    let a = redis_gateway(&server, &server.url()).await;
    let b = redis_gateway(&server, &server.url()).await;
    for _ in 0..5 {
        hit(&a, "/api/x", "k1").await;
    }
    hit(&b, "/api/x", "k2").await;
    hit(&b, "/api/x", "k2").await;
    hit(&b, "/api/x", "k2").await;
    let digest = tollgate::identity::digest(b"k1");
    let denied = wait::value("both gateways' denials on b", SEEN_WITHIN, || async {
        let (_, d) = call(&b, Method::GET, "/admin/console/denied", None).await;
        let found = d["gateways"] == 2
            && d["limits"].as_array().is_some_and(|a| {
                a.iter().any(|l| {
                    l["minutes"] == 15
                        && l["denied"] == 4
                        && l["top"][0][0] == format!("key={digest}")
                })
            });
        if found { Ok(d) } else { Err(d) }
    })
    .await;
    assert_eq!(denied["scope"], "fleet");
    until("the fleet's limited requests on b", SEEN_WITHIN, || async {
        let (_, now) = call(&b, Method::GET, "/admin/console/now", None).await;
        limited(&now, "fleet") == 4 && limited(&now, "local") == 1
    })
    .await;
    let published = value(&b.scrape().await, "tollgate_console_published_total").unwrap_or(0.0);
    assert!(published >= 1.0);

    // The keys: one hash beside the heartbeat's set, expiring.
    let mut conn = server.connection().await;
    let ttl: i64 = redis::cmd("PTTL")
        .arg("tg:{instances}console")
        .query_async(&mut conn)
        .await
        .expect("PTTL");
    assert!((1..=3000).contains(&ttl), "{ttl}");
}

#[tokio::test]
async fn a_refused_publication_is_counted_and_leaves_readyz_alone() {
    let server = RedisServer::start().await;
    let mut conn = server.connection().await;
    // Every command but one the console's script needs.
    let _: () = redis::cmd("ACL")
        .arg(
            &[
                "SETUSER", "tollgate", "on", ">s3cret", "~tg:*", "+@all", "-hkeys",
            ][..],
        )
        .query_async(&mut conn)
        .await
        .expect("ACL SETUSER");
    let url = format!("redis://tollgate:s3cret@127.0.0.1:{}", server.port());
    let gw = redis_gateway(&server, &url).await;
    wait::value("a refused publication counted", SEEN_WITHIN, || async {
        let text = gw.scrape().await;
        let failed = value(&text, "tollgate_console_publish_failures_total").unwrap_or(0.0);
        if failed >= 2.0 { Ok(()) } else { Err(text) }
    })
    .await;
    assert_eq!(gw.admin_get("/readyz").await.status.as_u16(), 200);
    assert_eq!(hit(&gw, "/api/x", "k1").await, 200);
    assert_eq!(hit(&gw, "/api/x", "k1").await, 200);
    assert_eq!(hit(&gw, "/api/x", "k1").await, 429);
    let ready = gw.admin_get("/readyz").await;
    assert_eq!(ready.status.as_u16(), 200, "{}", ready.text());
    // The console shows this gateway's own numbers meanwhile.
    until(
        "the gateway's own denial in its view",
        SEEN_WITHIN,
        || async {
            let (_, now) = call(&gw, Method::GET, "/admin/console/now", None).await;
            limited(&now, "fleet") == 1
        },
    )
    .await;
}
