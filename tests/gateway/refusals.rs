//! A refusal's head is the same from either HTTP/1.1 server: the native
//! one writes its fields from a list rather than from a header map where
//! nothing after the pipeline reads them, and must come to the same
//! fields and values as hyper's writes from the map.

use http::{HeaderMap, StatusCode};

use super::clock;
use crate::support::gateway::{Gateway, Reply, get, send};

/// The fields of `r` but `date`, and its `x-request-id` only as present
/// (each request makes its own), sorted by name.
fn fields(r: &Reply) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = r
        .headers
        .iter()
        .filter(|(n, _)| n.as_str() != "date")
        .map(|(n, v)| {
            let v = if n.as_str() == "x-request-id" {
                "(present)".to_owned()
            } else {
                String::from_utf8_lossy(v.as_bytes()).into_owned()
            };
            (n.as_str().to_owned(), v)
        })
        .collect();
    out.sort();
    out
}

/// A gateway's YAML, the path asked, the request's fields and the status
/// expected.
type Case<'a> = (String, &'a str, &'a [(&'a str, &'a str)], StatusCode);

/// The second request's answer (the first is admitted) on a gateway
/// started from `yaml` with `server.http1: mode`.
async fn second(yaml: &str, mode: &str, path: &str, headers: &[(&str, &str)]) -> Reply {
    let yaml = format!("listen: 127.0.0.1:0\nserver: {{ http1: {mode} }}\n{yaml}");
    let gw = Gateway::start_with_clock(&yaml, clock()).await;
    send(gw.addr, get(path, headers)).await;
    send(gw.addr, get(path, headers)).await
}

#[tokio::test]
async fn a_refusal_has_the_same_fields_from_either_server() {
    let route = r#"
routes:
  - name: limited
    match: { path_prefix: /limited }
    respond: { status: 200 }
    limits: [ { name: per_ip, key: ip, limit: 1, window: 1h }, { name: wide, key: ip, limit: 5, window: 1m } ]
"#;
    let ruled = r#"
routes:
  - name: limited
    match: { path_prefix: /limited }
    respond: { status: 200 }
    response_headers: { set: { x-served-by: tollgate }, remove: [ x-debug ] }
    limits: [ { name: per_ip, key: ip, limit: 1, window: 1h } ]
"#;
    let cors = r#"
cors: { allow_origins: [ "https://app.test" ], expose_headers: [ x-trace ] }
"#;
    let origin = [("origin", "https://app.test")];
    let cases: [Case; 6] = [
        (
            route.to_owned(),
            "/limited",
            &[],
            StatusCode::TOO_MANY_REQUESTS,
        ),
        (
            format!("headers: github\n{route}"),
            "/limited",
            &[],
            StatusCode::TOO_MANY_REQUESTS,
        ),
        (
            format!("headers: none\n{route}"),
            "/limited",
            &[],
            StatusCode::TOO_MANY_REQUESTS,
        ),
        (
            ruled.to_owned(),
            "/limited",
            &[],
            StatusCode::TOO_MANY_REQUESTS,
        ),
        (
            format!("{cors}{route}"),
            "/limited",
            &origin,
            StatusCode::TOO_MANY_REQUESTS,
        ),
        (route.to_owned(), "/nowhere", &[], StatusCode::NOT_FOUND),
    ];
    for (yaml, path, headers, status) in cases {
        let hyper = second(&yaml, "hyper", path, headers).await;
        let native = second(&yaml, "native", path, headers).await;
        assert_eq!(hyper.status, status, "{yaml}");
        assert_eq!(native.status, status, "{yaml}");
        assert_eq!(fields(&native), fields(&hyper), "{yaml}");
        if status == StatusCode::TOO_MANY_REQUESTS {
            assert!(native.header("retry-after").is_some(), "{yaml}");
        }
        if !yaml.contains("headers:") && status == StatusCode::TOO_MANY_REQUESTS {
            assert_eq!(
                native.header("ratelimit-policy"),
                Some(r#""per_ip";q=1;w=3600, "wide";q=5;w=60"#),
                "{yaml}"
            );
        }
        assert_eq!(only_id(&native.headers), 1, "{yaml}");
        let id = native.header("x-request-id").expect("an id");
        assert!(native.text().contains(id), "{}", native.text());
    }
}

/// How many `x-request-id` fields `headers` holds.
fn only_id(headers: &HeaderMap) -> usize {
    headers.get_all("x-request-id").iter().count()
}
