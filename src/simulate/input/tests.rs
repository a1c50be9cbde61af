//! The three formats read, and what a bad line is told.

use http::{HeaderName, HeaderValue, Method};

use super::{InputFormat, Line, Parsed, Parser, detect};

fn parser(format: InputFormat, fields: &[&str]) -> Parser {
    let fields: Vec<HeaderName> = fields
        .iter()
        .map(|f| HeaderName::from_bytes(f.as_bytes()).unwrap())
        .collect();
    Parser::new(
        format,
        &fields,
        Some(HeaderValue::from_static("api.test")),
        HeaderName::from_static("x-api-key"),
        HeaderName::from_static("x-user"),
    )
}

fn line(p: &Parser, s: &str) -> Line {
    match p.parse(s.as_bytes()) {
        Ok(Parsed::Request(l)) => l,
        other => panic!("{s}: {other:?}"),
    }
}

#[test]
fn combined_with_extra_fields() {
    let p = parser(
        InputFormat::Combined,
        &["x-forwarded-for", "-", "x-api-key"],
    );
    let l = line(
        &p,
        r#"10.0.0.1 - - [10/Oct/2000:13:55:36 -0700] "POST /api/x?y=1 HTTP/1.1" 200 12 "-" "curl/8 \"q\"" "203.0.113.9, 10.0.0.2" "skip" "k\x22x""#,
    );
    assert_eq!(l.ts_ms, 971_211_336_000);
    assert_eq!(l.peer.ip().to_string(), "10.0.0.1");
    assert_eq!(l.req.method(), Method::POST);
    assert_eq!(l.req.uri(), "/api/x?y=1");
    let h = l.req.headers();
    assert_eq!(h["x-forwarded-for"], "203.0.113.9, 10.0.0.2");
    assert_eq!(h["x-api-key"], "k\"x");
    assert_eq!(h["host"], "api.test");
    assert_eq!(h.len(), 3);
}

#[test]
fn a_host_field_takes_the_place_of_the_default_host() {
    let p = parser(InputFormat::Combined, &["host"]);
    let logged =
        r#"10.0.0.1 - - [10/Oct/2000:13:55:36 -0700] "GET / HTTP/1.1" 200 1 "-" "ua" "www.test""#;
    let h = line(&p, logged).req.headers().clone();
    assert_eq!(h.get_all("host").iter().count(), 1);
    assert_eq!(h["host"], "www.test");
    // Logged as `-`: the default host stands.
    let unlogged = logged.replace("\"www.test\"", "\"-\"");
    assert_eq!(line(&p, &unlogged).req.headers()["host"], "api.test");
}

#[test]
fn combined_bad_lines_say_why() {
    let p = parser(InputFormat::Combined, &[]);
    for (s, why) in [
        ("garbage", "one field only"),
        ("1.2.3.4 - - [x] \"GET / HTTP/1.1\" 200 1", "time"),
        (
            "nope - - [10/Oct/2000:13:55:36 -0700] \"GET /\"",
            "IP address",
        ),
        (
            "1.2.3.4 - - [10/Oct/2000:13:55:36 -0700] \"-\" 400 0",
            "request line",
        ),
    ] {
        let e = p.parse(s.as_bytes()).unwrap_err();
        assert!(e.contains(why), "{s}: {e}");
    }
    // The common format reads when no extra field is wanted.
    let l = line(
        &p,
        "1.2.3.4 - - [10/Oct/2000:13:55:36 -0700] \"GET /a HTTP/1.0\" 200 1",
    );
    assert_eq!(l.req.uri(), "/a");
    let p = parser(InputFormat::Combined, &["x-api-key"]);
    let e = p
        .parse(b"1.2.3.4 - - [10/Oct/2000:13:55:36 -0700] \"GET /a HTTP/1.0\" 200 1 \"-\" \"ua\"")
        .unwrap_err();
    assert!(e.contains("1 extra quoted field(s)"), "{e}");
}

#[test]
fn jsonl_lines() {
    let p = parser(InputFormat::Jsonl, &[]);
    let l = line(
        &p,
        r#"{"ts": 1700000000123, "method": "PUT", "host": "h.test", "path": "/p", "peer": "192.0.2.1:4000", "headers": {"x-a": ["1", "2"], "x-b": "3"}}"#,
    );
    assert_eq!(l.ts_ms, 1_700_000_000_123);
    assert_eq!(l.peer.to_string(), "192.0.2.1:4000");
    assert_eq!(l.req.headers()["host"], "h.test");
    assert_eq!(l.req.headers().get_all("x-a").iter().count(), 2);
    let l = line(
        &p,
        r#"{"ts": "2023-11-14T22:13:20.5Z", "path": "/", "peer": "::1"}"#,
    );
    assert_eq!(l.ts_ms, 1_700_000_000_500);
    assert_eq!(l.req.method(), Method::GET);
    assert_eq!(l.req.headers()["host"], "api.test");
    let l = line(&p, r#"{"ts": 1700000000.25, "path": "/", "peer": "::1"}"#);
    assert_eq!(l.ts_ms, 1_700_000_000_250);
    assert!(p.parse(b"{\"ts\": 1}").is_err());
}

#[test]
fn tollgate_lines() {
    let p = parser(InputFormat::Tollgate, &[]);
    let l = line(
        &p,
        r#"{"timestamp":"x","level":"INFO","fields":{"message":"request","route":"api","method":"GET","status":200,"identity":"api_key","decision":"allowed","ts":1700000000000,"peer":"10.0.0.1","client":"203.0.113.9","host":"api.test","path":"/api/a","caller":"00ff00ff00ff00ff"},"target":"tollgate::access"}"#,
    );
    assert_eq!(l.ts_ms, 1_700_000_000_000);
    assert_eq!(l.req.headers()["x-forwarded-for"], "203.0.113.9");
    assert_eq!(l.req.headers()["x-api-key"], "00ff00ff00ff00ff");
    assert!(matches!(
        p.parse(br#"{"fields":{"message":"listening"},"target":"tollgate::server"}"#),
        Ok(Parsed::Skip)
    ));
    let e = p
        .parse(br#"{"fields":{"message":"request","method":"GET"},"target":"tollgate::access"}"#)
        .unwrap_err();
    assert!(e.contains("access_log.replay"), "{e}");
}

#[test]
fn detection() {
    assert_eq!(detect(b"1.2.3.4 - - [...]"), InputFormat::Combined);
    assert_eq!(detect(br#"{"ts":1,"path":"/"}"#), InputFormat::Jsonl);
    assert_eq!(
        detect(br#"{"fields":{},"target":"tollgate::access"}"#),
        InputFormat::Tollgate
    );
}
