//! Configuration loading through the library API: a full valid file mapped
//! onto the model, and bad files whose every error is checked word for word
//! with its field path, line and column. Nothing here binds or connects:
//! addresses and URLs in these files are values to parse (port 0 where the
//! value itself does not matter).

#[path = "config/environment.rs"]
mod environment;
#[path = "config/written.rs"]
mod written;

use std::net::SocketAddr;
use std::num::NonZeroU64;
use std::time::Duration;

use http::{HeaderName, Method, StatusCode};
use tollgate::config::load::{load_file, parse_str};
use tollgate::config::{
    Action, Config, HeaderMode, KeySource, OnError, PathMatch, Respond, Upstream,
};

/// Every error `src` produces, rendered as the CLI prints them.
fn errors(src: &str) -> Vec<String> {
    match parse_str(src) {
        Ok(_) => panic!("expected errors, the file was accepted:\n{src}"),
        Err(e) => e.0.iter().map(ToString::to_string).collect(),
    }
}

/// The single error `src` produces.
fn error(src: &str) -> String {
    let mut all = errors(src);
    assert_eq!(all.len(), 1, "expected one error, got {all:#?}");
    all.remove(0)
}

fn valid(src: &str) -> Config {
    parse_str(src).unwrap_or_else(|e| panic!("expected a valid file, got:\n{e}"))
}

fn header(name: &'static str) -> HeaderName {
    HeaderName::from_static(name)
}

fn nz(n: u64) -> NonZeroU64 {
    NonZeroU64::new(n).expect("test values are not zero")
}

const FULL: &str = r#"
listen: [127.0.0.1:0, "[::1]:0"]
store:
  redis: { url: "redis://redis.test:6379/2", timeout: 40ms }
  on_error: allow
  prefix: "tg:"
client_ip:
  trusted_proxies: [127.0.0.1/32, 10.0.0.0/8, "::1"]
  ipv6_prefix: 56
headers: none
api_keys: { header: X-Key }
users: { header: x-auth-user }
timeouts: { header_read: 2s, upstream_connect: 250ms, upstream_response: 1m }
routes:
  - name: login
    match: { host: API.Example.com, path: /api/auth/login, methods: [post, GET] }
    upstream: http://upstream.test:9000
    timeout: 5s
    limits:
      - { name: login_ip, key: ip, limit: 5, window: 5m }
      - { name: login_user_ip, key: [ip, "header:X-Username"], limit: 3, window: 1h, cost: 2 }
  - name: api
    match: { host: "*.example.com", path_prefix: /api/ }
    upstream: http://upstream.test:9000/base
    cost: 3
    limits:
      - name: per.caller-1
        key: api_key | user | ip
        limit: 600
        window: 1d
  - name: demo
    respond: { status: 418, body: "hello\n", content_type: text/html }
  - name: fallback
    respond: {}
"#;

#[test]
fn full_file_maps_onto_the_model() {
    let c = valid(FULL);
    assert_eq!(
        c.listen.iter().map(|l| l.addr).collect::<Vec<_>>(),
        [
            "127.0.0.1:0".parse::<SocketAddr>().expect("addr"),
            "[::1]:0".parse().expect("addr")
        ]
    );

    let redis = c.store.redis.as_ref().expect("redis is configured");
    assert_eq!(redis.url, "redis://redis.test:6379/2");
    assert_eq!(redis.timeout, Duration::from_millis(40));
    assert_eq!(c.store.on_error, OnError::Allow);
    assert_eq!(c.store.prefix, "tg:");

    let proxies: Vec<String> = c
        .client_ip
        .trusted_proxies
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(proxies, ["127.0.0.1/32", "10.0.0.0/8", "::1/128"]);
    assert_eq!(c.client_ip.ipv6_prefix, 56);
    assert_eq!(c.headers, HeaderMode::None);
    assert_eq!(c.api_keys.header, header("x-key"));
    assert_eq!(c.users.header, header("x-auth-user"));
    assert_eq!(c.timeouts.header_read, Duration::from_secs(2));
    assert_eq!(c.timeouts.upstream_connect, Duration::from_millis(250));
    assert_eq!(c.timeouts.upstream_response, Duration::from_secs(60));

    assert_eq!(c.routes.len(), 4);
    let login = &c.routes[0];
    assert_eq!(&*login.name, "login");
    assert_eq!(login.matcher.host.as_deref(), Some("api.example.com"));
    assert!(matches!(&login.matcher.path, PathMatch::Exact(p) if p == "/api/auth/login"));
    assert_eq!(login.matcher.methods, [Method::POST, Method::GET]);
    let Action::Upstream(Upstream { uri, timeout, .. }) = &login.action else {
        panic!("login forwards: {:?}", login.action)
    };
    assert_eq!(uri.to_string(), "http://upstream.test:9000/");
    assert_eq!(*timeout, Duration::from_secs(5));
    assert_eq!(login.cost, 1);
    assert_eq!(login.limits.len(), 2);
    let ip = &login.limits[0];
    assert_eq!(&*ip.name, "login_ip");
    assert_eq!(ip.key.parts, [vec![KeySource::Ip]]);
    assert_eq!(ip.limit, nz(5));
    assert_eq!(ip.window_ms, nz(300_000));
    assert_eq!(ip.cost, None);
    let user_ip = &login.limits[1];
    assert_eq!(
        user_ip.key.parts,
        [
            vec![KeySource::Ip],
            vec![KeySource::Header(header("x-username"))]
        ]
    );
    assert_eq!(user_ip.limit, nz(3));
    assert_eq!(user_ip.window_ms, nz(3_600_000));
    assert_eq!(user_ip.cost, Some(2));

    let api = &c.routes[1];
    assert_eq!(api.matcher.host.as_deref(), Some("*.example.com"));
    assert!(matches!(&api.matcher.path, PathMatch::Prefix(p) if p == "/api/"));
    assert!(api.matcher.methods.is_empty());
    let Action::Upstream(Upstream { uri, timeout, .. }) = &api.action else {
        panic!("api forwards: {:?}", api.action)
    };
    assert_eq!(uri.to_string(), "http://upstream.test:9000/base");
    assert_eq!(
        *timeout,
        Duration::from_secs(60),
        "timeouts.upstream_response"
    );
    assert_eq!(api.cost, 3);
    let caller = &api.limits[0];
    assert_eq!(&*caller.name, "per.caller-1");
    assert_eq!(
        caller.key.parts,
        [vec![KeySource::ApiKey, KeySource::User, KeySource::Ip]]
    );
    assert_eq!(caller.limit, nz(600));
    assert_eq!(caller.window_ms, nz(86_400_000));

    let demo = &c.routes[2];
    assert!(matches!(demo.matcher.path, PathMatch::Any));
    assert!(demo.limits.is_empty());
    let Action::Respond(Respond {
        status,
        body,
        content_type,
    }) = &demo.action
    else {
        panic!("demo responds: {:?}", demo.action)
    };
    assert_eq!(*status, StatusCode::IM_A_TEAPOT);
    assert_eq!(&body[..], b"hello\n");
    assert_eq!(content_type, "text/html");

    let Action::Respond(fallback) = &c.routes[3].action else {
        panic!("fallback responds: {:?}", c.routes[3].action)
    };
    assert_eq!(fallback.status, StatusCode::OK);
    assert!(fallback.body.is_empty());
    assert_eq!(fallback.content_type, "text/plain; charset=utf-8");
}

#[test]
fn defaults() {
    let c = valid("listen: 0.0.0.0:80\nroutes: [{ name: a, upstream: 'http://up' }]\n");
    assert!(c.store.redis.is_none());
    assert_eq!(c.store.on_error, OnError::Local);
    assert_eq!(c.store.prefix, "tg:");
    assert!(!c.store.readable_keys);
    assert!(c.client_ip.trusted_proxies.is_empty());
    assert_eq!(c.client_ip.ipv6_prefix, 64);
    assert_eq!(c.headers, HeaderMode::Ietf);
    assert_eq!(c.api_keys.header, header("x-api-key"));
    assert_eq!(c.users.header, header("x-user"));
    assert_eq!(c.timeouts.header_read, Duration::from_secs(10));
    assert_eq!(c.timeouts.upstream_connect, Duration::from_secs(5));
    assert_eq!(c.timeouts.upstream_response, Duration::from_secs(30));
    let Action::Upstream(up) = &c.routes[0].action else {
        panic!("forwards")
    };
    assert_eq!(up.timeout, Duration::from_secs(30));

    let c = valid(
        "listen: 0.0.0.0:80\nstore: { redis: { url: 'redis://r' } }\nroutes: [{ name: a, respond: {} }]\n",
    );
    let redis = c.store.redis.expect("redis is configured");
    assert_eq!(redis.timeout, Duration::from_millis(25));
}

#[test]
fn h2c_upstreams_are_accepted() {
    let c = valid(
        "listen: 127.0.0.1:1\nroutes:\n  - name: grpc\n    match: { path_prefix: /demo.Echo/ }\n    upstream: \"h2c://10.0.0.5:50051\"\n",
    );
    let Action::Upstream(up) = &c.routes[0].action else {
        panic!("forwards")
    };
    assert_eq!(up.uri, "h2c://10.0.0.5:50051/");
    assert_eq!(
        tollgate::proxy::Protocol::of(&up.uri),
        tollgate::proxy::Protocol::H2c
    );
}

#[test]
fn merge_keys_share_settings() {
    let c = valid(
        "listen: 127.0.0.1:1
routes:
  - name: a
    upstream: http://up
    limits:
      - &per_ip { name: per_ip, key: ip, limit: 10, window: 1s }
  - name: b
    upstream: http://up
    limits: [ { <<: *per_ip, limit: 20 } ]
",
    );
    let merged = &c.routes[1].limits[0];
    assert_eq!(&*merged.name, "per_ip");
    assert_eq!(merged.key.parts, [vec![KeySource::Ip]]);
    assert_eq!(merged.limit, nz(20));
    assert_eq!(merged.window_ms, nz(1000));
}

const HEAD: &str = "listen: 127.0.0.1:0\nroutes:\n";

#[test]
fn bad_duration() {
    let src = format!(
        "{HEAD}  - name: api
    upstream: http://upstream.test
    limits:
      - {{ name: per_ip, key: ip, limit: 100, window: 5 minutes }}
"
    );
    assert_eq!(
        error(&src),
        r#"routes[0].limits[0].window: "5 minutes" is not a duration; write 5m or 300s (line 6, col 54)"#
    );
}

#[test]
fn unknown_top_level_field() {
    let src = "listen: 127.0.0.1:0\nlisen: 127.0.0.1:0\nroutes: [{ name: a, respond: {} }]\n";
    assert_eq!(
        error(src),
        r#"unknown field "lisen"; expected one of listen, admin, store, client_ip, headers, plans, api_keys, plans_from, users, timeouts, upstreams, routes, limits, server, access_log, tracing, request_id, cors, request_headers, response_headers, exempt (line 2, col 1)"#
    );
}

#[test]
fn a_concurrency_limit_refuses_the_fields_of_a_rate() {
    let src = format!(
        "{HEAD}  - name: api
    upstream: http://upstream.test
    limits:
      - name: at_once
        key: ip
        concurrency: 3
        window: 1m
      - name: zero
        key: ip
        concurrency: 0
"
    );
    let errs = errors(&src);
    assert_eq!(errs.len(), 2, "{errs:?}");
    assert!(
        errs[0].starts_with("routes[0].limits[0].window: a concurrency limit caps requests in flight and has no window")
            && errs[0].ends_with("(line 9, col 17)"),
        "{errs:?}"
    );
    assert!(
        errs[1].starts_with("routes[0].limits[1].concurrency:"),
        "{errs:?}"
    );
}

#[test]
fn store_redis_lease_is_bounded() {
    let src = format!(
        "store:\n  redis: {{ url: redis://127.0.0.1:1, lease: 100ms }}\n{HEAD}  - name: api\n    upstream: http://upstream.test\n"
    );
    let errs = errors(&src);
    assert!(
        errs.iter()
            .any(|e| e.starts_with("store.redis.lease: \"100ms\" is out of range")),
        "{errs:?}"
    );
}

#[test]
fn unknown_fields_nested_in_a_route_and_a_limit() {
    let src = format!(
        "{HEAD}  - name: api
    upstrem: http://upstream.test
    upstream: http://upstream.test
    limits:
      - name: per_ip
        key: ip
        limit: 100
        window: 1m
        bursts: 5
"
    );
    assert_eq!(
        errors(&src),
        [
            r#"routes[0]: unknown field "upstrem"; expected one of name, match, upstream, respond, timeout, cost, limits, upstream_ca, upgrade, forward_proxy_authorization, shadow, on_error, max_queue, cors, request_headers, response_headers, exempt (line 4, col 5)"#,
            r#"routes[0].limits[0]: unknown field "bursts"; expected one of name, key, limit, window, cost, bytes, shadow, algorithm, burst, precision, plan, sync, on_limit, max_delay, concurrency, share (line 11, col 9)"#,
        ]
    );
}

#[test]
fn missing_required_fields() {
    let src = format!(
        "{HEAD}  - upstream: http://upstream.test
    limits:
      - {{ name: a, key: ip, limit: 1 }}
"
    );
    assert_eq!(
        errors(&src),
        [
            r#"routes[0]: missing required field "name" (line 3, col 5)"#,
            r#"routes[0].limits[0]: missing required field "window" (line 5, col 9)"#,
        ]
    );
    assert_eq!(
        errors("# nothing here\n"),
        [
            r#"missing required field "listen""#,
            r#"missing required field "routes""#,
        ]
    );
}

#[test]
fn upstream_and_respond_together() {
    let src = format!(
        "{HEAD}  - name: api
    upstream: http://upstream.test
    respond: {{ status: 204 }}
"
    );
    assert_eq!(
        error(&src),
        "routes[0]: set either upstream or respond, not both (line 5, col 5)"
    );
}

#[test]
fn neither_upstream_nor_respond() {
    let src = format!("{HEAD}  - name: api\n    cost: 2\n");
    assert_eq!(
        error(&src),
        "routes[0]: missing upstream or respond; a route forwards to an upstream or answers itself (line 3, col 5)"
    );
}

#[test]
fn bad_cidr() {
    let src = format!(
        "client_ip:\n  trusted_proxies: [10.0.0.0/8, 10.0.0.0/33]\n{HEAD}  - {{ name: a, respond: {{}} }}\n"
    );
    assert_eq!(
        error(&src),
        r#"client_ip.trusted_proxies[1]: "10.0.0.0/33" is not an IP address or CIDR network; write e.g. 10.0.0.0/8, 192.0.2.7 or ::1 (line 2, col 33)"#
    );
}

#[test]
fn bad_header_name_in_key() {
    let src = format!(
        "{HEAD}  - name: api
    respond: {{}}
    limits: [ {{ name: a, key: [ip, 'header:x user'], limit: 1, window: 1s }} ]
"
    );
    assert_eq!(
        error(&src),
        r#"routes[0].limits[0].key[1]: "x user" is not a valid header name; use letters, digits and '-', e.g. header:x-client-id (line 5, col 36)"#
    );
}

#[test]
fn unknown_key_source() {
    let src = format!(
        "{HEAD}  - name: api
    respond: {{}}
    limits: [ {{ name: a, key: api_key | cookie | ip, limit: 1, window: 1s }} ]
"
    );
    assert_eq!(
        error(&src),
        r#"routes[0].limits[0].key: unknown key source "cookie"; expected ip, api_key, user, header:NAME, json:FIELD or route (line 5, col 31)"#
    );
}

#[test]
fn duplicate_route_name() {
    let src = format!(
        "{HEAD}  - {{ name: api, upstream: 'http://a' }}\n  - {{ name: web, respond: {{}} }}\n  - {{ name: api, respond: {{}} }}\n"
    );
    assert_eq!(
        error(&src),
        r#"routes[2].name: duplicate route name "api"; it is already used by routes[0] (line 5, col 13)"#
    );
}

#[test]
fn duplicate_limit_name() {
    let src = format!(
        "{HEAD}  - name: api
    respond: {{}}
    limits:
      - {{ name: per_ip, key: ip, limit: 1, window: 1s }}
      - {{ name: per_ip, key: user, limit: 2, window: 1m }}
"
    );
    assert_eq!(
        error(&src),
        r#"routes[0].limits[1].name: duplicate limit name "per_ip"; it is already used by routes[0].limits[0] (line 7, col 17)"#
    );
}

#[test]
fn algorithms_and_burst() {
    use tollgate::limit::Algorithm;
    let src = format!(
        "{HEAD}  - name: api
    respond: {{}}
    limits:
      - {{ name: a, key: ip, limit: 5, window: 1s }}
      - {{ name: b, key: ip, limit: 5, window: 1s, algorithm: fixed_window }}
      - {{ name: c, key: ip, limit: 5, window: 1s, algorithm: sliding_log }}
      - {{ name: d, key: ip, limit: 5, window: 1s, algorithm: gcra }}
      - {{ name: e, key: ip, limit: 5, window: 1s, algorithm: gcra, burst: 20 }}
      - {{ name: f, key: ip, limit: 5, window: 1s, algorithm: sliding_window }}
      - {{ name: g, key: ip, limit: 5, window: month }}
      - {{ name: h, key: ip, limit: 5, window: month, algorithm: fixed_window }}
"
    );
    let algs: Vec<Algorithm> = valid(&src).routes[0]
        .limits
        .iter()
        .map(|l| l.algorithm)
        .collect();
    assert_eq!(
        algs,
        [
            Algorithm::SlidingWindow,
            Algorithm::FixedWindow,
            Algorithm::SlidingLog,
            Algorithm::Gcra { burst: 5 },
            Algorithm::Gcra { burst: 20 },
            Algorithm::SlidingWindow,
            Algorithm::CalendarMonth,
            Algorithm::CalendarMonth,
        ]
    );
    assert_eq!(
        error(&format!(
            "{HEAD}  - name: api\n    respond: {{}}\n    limits: [ {{ name: m, key: ip, limit: 5, window: month, algorithm: gcra }} ]\n"
        )),
        "routes[0].limits[0].algorithm: a window of one calendar month is counted as a fixed window; remove gcra, or write a window like 30d (line 5, col 71)"
    );

    let src = format!(
        "{HEAD}  - name: api
    respond: {{}}
    limits:
      - {{ name: a, key: ip, limit: 5, window: 1s, algorithm: leaky }}
      - {{ name: b, key: ip, limit: 5, window: 1s, burst: 3 }}
      - {{ name: c, key: ip, limit: 5, window: 1s, algorithm: gcra, burst: 0 }}
      - {{ name: d, key: ip, limit: 200000, window: 1s, algorithm: sliding_log }}
      - {{ name: e, key: ip, limit: 5, window: 30d, algorithm: gcra, burst: 100000000 }}
      - {{ name: f, key: ip, limit: 5, window: 1s, algorithm: fixed_window, burst: 2 }}
"
    );
    assert_eq!(
        errors(&src),
        [
            r#"routes[0].limits[0].algorithm: unknown value "leaky"; expected one of sliding_window, fixed_window, sliding_log, gcra (line 6, col 62)"#,
            "routes[0].limits[1].burst: only a gcra limit takes a burst; this one is sliding_window (line 7, col 58)",
            "routes[0].limits[2].burst: must be at least 1, found 0 (line 8, col 75)",
            "routes[0].limits[3].limit: is too large for sliding_log, which keeps one entry per unit (at most 100000); use sliding_window or gcra (line 9, col 36)",
            "routes[0].limits[4].burst: is too large for this window (limit × window in ms must stay below 3·10^15); use a shorter window or a smaller limit, or algorithm: fixed_window, which has no such bound (line 10, col 76)",
            "routes[0].limits[5].burst: only a gcra limit takes a burst; this one is fixed_window (line 11, col 83)",
        ]
    );
}

#[test]
fn precision_buckets() {
    use tollgate::limit::Algorithm;
    let src = format!(
        "{HEAD}  - name: api
    respond: {{}}
    limits:
      - {{ name: a, key: ip, limit: 5, window: 1m, precision: 1s }}
      - {{ name: b, key: ip, limit: 5, window: 1m, algorithm: sliding_window, precision: 10s }}
plans:
  pro: [ {{ name: p, limit: 5, window: 1h, precision: 1m }} ]
"
    );
    let cfg = valid(&src);
    let algs: Vec<Algorithm> = cfg.routes[0].limits.iter().map(|l| l.algorithm).collect();
    let buckets = |precision_ms| Algorithm::SlidingBuckets { precision_ms };
    assert_eq!(algs, [buckets(1_000), buckets(10_000)]);
    assert_eq!(cfg.plans[0].limits[0].algorithm, buckets(60_000));

    let src = format!(
        "{HEAD}  - name: api
    respond: {{}}
    limits:
      - {{ name: a, key: ip, limit: 5, window: 1m, precision: 7s }}
      - {{ name: b, key: ip, limit: 5, window: 2m, precision: 1s }}
      - {{ name: c, key: ip, limit: 5, window: 1m, algorithm: gcra, precision: 1s }}
      - {{ name: d, key: ip, limit: 5, window: month, precision: 1d }}
      - {{ name: e, key: ip, limit: 5, window: 1m, precision: 0s }}
      - {{ name: f, key: ip, concurrency: 5, precision: 1s }}
"
    );
    assert_eq!(
        errors(&src),
        [
            "routes[0].limits[0].precision: 7000ms does not divide the window (60000ms) into whole buckets; write a precision the window is a whole multiple of (line 6, col 62)",
            "routes[0].limits[1].precision: makes 120 buckets of the window (120000ms), and a limit keeps at most 60; write a precision of at least 2000ms (line 7, col 62)",
            "routes[0].limits[2].precision: only a sliding_window limit counts in buckets of a precision; this one is gcra: remove precision (line 8, col 79)",
            "routes[0].limits[3].precision: only a sliding_window limit counts in buckets of a precision; this one is calendar_month: remove precision (line 9, col 65)",
            r#"routes[0].limits[4].precision: "0s" is not a precision; write a duration of at least 1ms, e.g. 1s (line 10, col 62)"#,
            "routes[0].limits[5].precision: a concurrency limit caps requests in flight and has no precision; remove this, or write the rate as a limit of its own (line 11, col 56)",
        ]
    );

    // sync mode exchanges two counts per window, which buckets are not.
    let src = "listen: 127.0.0.1:0
store: { redis: { url: \"redis://127.0.0.1:1\" } }
routes:
  - name: api
    respond: {}
    limits: [ { name: a, key: ip, limit: 5, window: 1m, precision: 1s, sync: 100ms } ]
";
    assert_eq!(
        error(src),
        "routes[0].limits[0].sync: sync exchanges a window's count and the one before it, and a sliding_window with a precision counts per bucket, which Redis decides on every request: remove sync, or remove precision (line 6, col 78)"
    );
}

#[test]
fn plans_and_api_keys() {
    let src = r#"listen: 127.0.0.1:1
plans:
  free: [ { name: per_minute, limit: 2, window: 1m } ]
  pro: [ { name: per_minute, limit: 5, window: 1m, algorithm: gcra, burst: 9 } ]
api_keys: { keys: { k1: pro }, unknown: free, cache: 2s }
routes:
  - name: api
    respond: {}
    limits: [ { name: caller, key: api_key | ip, plan: true } ]
"#;
    let cfg = valid(src);
    assert_eq!(cfg.plans.len(), 2);
    assert_eq!(cfg.api_keys.keys.get("k1").map(|p| &**p), Some("pro"));
    assert_eq!(cfg.api_keys.cache, Duration::from_secs(2));
    assert!(cfg.routes[0].limits[0].plan);

    let src = r#"listen: 127.0.0.1:1
plans:
  free: [ { name: per_minute, limit: 2, window: 1m, key: ip } ]
  "bad plan": [ { name: a, limit: 1, window: 1s } ]
api_keys: { keys: { k1: gold }, unknown: silver, redis_hash: true }
routes:
  - name: api
    respond: {}
    limits: [ { name: caller, key: api_key, plan: true, limit: 5 } ]
"#;
    assert_eq!(
        errors(src),
        [
            r#"plans.free[0]: unknown field "key"; expected one of name, limit, window, algorithm, burst, precision, sync, on_limit, max_delay (line 3, col 53)"#,
            r#"plans.bad plan: "bad plan" is not a valid plan name; use letters, digits, '_', '.' and '-' (and not "reject") (line 4, col 15)"#,
            r#"api_keys.keys.k1: plan "gold" is not defined under plans (line 5, col 25)"#,
            r#"api_keys.unknown: plan "silver" is not defined under plans; name a plan or write reject (line 5, col 42)"#,
            "api_keys.redis_hash: needs store.redis: the key hash lives in Redis (line 5, col 62)",
            "routes[0].limits[0].limit: a limit with plan: true takes its numbers from the caller's plan; remove this (line 9, col 64)",
        ]
    );
    assert_eq!(
        error(
            "listen: 127.0.0.1:1\nroutes: [ { name: a, respond: {}, limits: [ { name: c, key: ip, plan: true } ] } ]\n"
        ),
        "routes[0].limits[0].plan: no plans are defined; add plans: or give this limit its own limit and window (line 2, col 71)"
    );
}

#[test]
fn jwt_settings() {
    let route = "routes: [{ name: a, respond: {} }]\n";
    let dir = env!("CARGO_MANIFEST_DIR");
    let ok = format!(
        "listen: 127.0.0.1:1\nusers: {{ jwt: {{ algorithm: ES256, public_key: \"{dir}/tests/fixtures/es256-public.pem\" }} }}\n{route}"
    );
    assert!(valid(&ok).users.jwt.is_some());
    let cases: &[(&str, &str)] = &[
        (
            "users: { jwt: { secret: short } }\n",
            "users.jwt.secret: is shorter than 32 bytes; an HS256 secret should be at least as long as its hash (RFC 7518 §3.2) (line 2, col 25)",
        ),
        (
            "users: { jwt: { algorithm: RS256 } }\n",
            "users.jwt: RS256 and ES256 need public_key: the path of a PEM public key (line 2, col 15)",
        ),
        (
            "users: { jwt: { public_key: /nonexistent.pem } }\n",
            r#"users.jwt.public_key: cannot read "/nonexistent.pem": No such file or directory (os error 2) (line 2, col 29)"#,
        ),
        (
            "users: { jwt: { algorithm: PS512, secret: x } }\n",
            r#"users.jwt.algorithm: unknown value "PS512"; expected one of HS256, RS256, ES256 (line 2, col 28)"#,
        ),
        (
            "users: { jwt: { secret: 0123456789012345678901234567890123, claims: sub } }\n",
            r#"users.jwt: unknown field "claims"; expected one of algorithm, secret, secret_file, public_key, claim (line 2, col 61)"#,
        ),
    ];
    for (users, expected) in cases {
        let src = format!("listen: 127.0.0.1:1\n{users}{route}");
        assert_eq!(errors(&src).join("\n"), *expected, "for:\n{src}");
    }
    let not_pem = format!(
        "listen: 127.0.0.1:1\nusers: {{ jwt: {{ algorithm: RS256, public_key: \"{dir}/Cargo.toml\" }} }}\n{route}"
    );
    assert!(error(&not_pem).starts_with("users.jwt.public_key: not an RSA public key in PEM"));
}

#[test]
fn limit_zero() {
    let src = format!(
        "{HEAD}  - name: api
    respond: {{}}
    limits:
      - name: per_ip
        key: ip
        limit: 0
        window: 1s
"
    );
    assert_eq!(
        error(&src),
        "routes[0].limits[0].limit: must be at least 1, found 0 (line 8, col 16)"
    );
}

#[test]
fn bad_listen_address() {
    assert_eq!(
        error("listen: localhost:8080\nroutes: [{ name: a, respond: {} }]\n"),
        r#"listen: "localhost:8080" is not a socket address; write IP:PORT, e.g. 127.0.0.1:8080 or [::1]:8080 (line 1, col 9)"#
    );
    assert_eq!(
        error("listen: [127.0.0.1:80, 127.0.0.1]\nroutes: [{ name: a, respond: {} }]\n"),
        r#"listen[1]: "127.0.0.1" is not a socket address; write IP:PORT, e.g. 127.0.0.1:8080 or [::1]:8080 (line 1, col 24)"#
    );
}

#[test]
fn bad_on_error() {
    let src = format!("store:\n  on_error: drop\n{HEAD}  - {{ name: a, respond: {{}} }}\n");
    assert_eq!(
        error(&src),
        r#"store.on_error: unknown value "drop"; expected one of allow, deny, local (line 2, col 13)"#
    );
}

#[test]
fn wrong_type_does_not_hide_later_errors() {
    let src = format!(
        "{HEAD}  - name: api
    upstream: {{ url: http://upstream.test }}
    limits:
      - {{ name: per_ip, key: ip, limit: 100, window: 1 minute }}
"
    );
    assert_eq!(
        errors(&src),
        [
            "routes[0].upstream: expected a string, found a mapping (line 4, col 15)",
            r#"routes[0].limits[0].window: "1 minute" is not a duration; write 1m or 60s (line 6, col 54)"#,
        ]
    );
    // A list where a mapping belongs, and a mapping where a list belongs.
    assert_eq!(
        errors("listen: 127.0.0.1:1\nstore: [redis]\nroutes: { name: a }\nheaders: gitlab\n"),
        [
            "store: expected a mapping, found a list (line 2, col 8)",
            "routes: expected a list, found a mapping (line 3, col 9)",
            r#"headers: unknown value "gitlab"; expected one of ietf, github, legacy, none (line 4, col 10)"#,
        ]
    );
}

#[test]
fn yaml_syntax_error() {
    let src = format!("{HEAD}  - name: api\n    upstream: http://a: b\n");
    assert_eq!(
        error(&src),
        "invalid YAML: mapping values are not allowed in this context (line 4, col 23)"
    );
    let err = parse_str("listen: [1\n").expect_err("unclosed list");
    assert_eq!(err.0.len(), 1);
    assert_eq!((err.0[0].line, err.0[0].column), (Some(2), Some(1)));
}

#[test]
fn three_mistakes_three_errors() {
    let src = "listen: 127.0.0.1:0
headers: gitlab
routes:
  - name: api
    upstream: http://upstream.test
    limits:
      - { name: per_ip, key: ip, limit: 100, window: 5 minutes }
  - name: other
    respond: { status: 200 }
    cost: 0
";
    let err = parse_str(src).expect_err("three mistakes");
    assert_eq!(
        err.to_string(),
        r#"headers: unknown value "gitlab"; expected one of ietf, github, legacy, none (line 2, col 10)
routes[0].limits[0].window: "5 minutes" is not a duration; write 5m or 300s (line 7, col 54)
routes[1].cost: must be at least 1, found 0 (line 10, col 11)"#
    );
    assert_eq!(err.0.len(), 3);
    let first = &err.0[0];
    assert_eq!(first.path, "headers");
    assert_eq!((first.line, first.column), (Some(2), Some(10)));
}

#[test]
fn more_rules() {
    let cases: &[(&str, &str)] = &[
        (
            "  - { name: a, upstream: 'ftp://secure:443' }\n",
            r#"routes[0].upstream: "ftp://secure:443" has unsupported scheme "ftp"; write e.g. http://127.0.0.1:9000 (HTTP/1.1), https://… (TLS) or h2c://… (cleartext HTTP/2) (line 3, col 26)"#,
        ),
        (
            "  - { name: a, upstream: 'h2c://up:50051', upgrade: true }\n",
            "routes[0].upgrade: an h2c:// upstream speaks HTTP/2, which cannot pass an Upgrade; use http:// for this route (line 3, col 53)",
        ),
        (
            "  - { name: a, upstream: 'h2c://up:50051', upstream_ca: ca.pem }\n",
            "routes[0].upstream_ca: applies only to https:// upstreams; remove it or use https:// (line 3, col 57)",
        ),
        (
            "  - { name: a, upstream: 'http://up:80', upstream_ca: ca.pem }\n",
            "routes[0].upstream_ca: applies only to https:// upstreams; remove it or use https:// (line 3, col 55)",
        ),
        (
            "  - { name: a, upstream: 'https://up', upstream_ca: /nonexistent/ca.pem }\n",
            "routes[0].upstream_ca: cannot read /nonexistent/ca.pem: No such file or directory (os error 2) (line 3, col 53)",
        ),
        (
            "  - { name: a, respond: {}, upgrade: true }\n",
            "routes[0].upgrade: applies only to routes with an upstream; remove it or use upstream (line 3, col 29)",
        ),
        (
            "  - { name: a, upstream: 'http://up', upgrade: yes }\n",
            r#"routes[0].upgrade: expected true or false, found the string "yes" (line 3, col 48)"#,
        ),
        (
            "  - { name: a, upstream: '127.0.0.1:9000' }\n",
            r#"routes[0].upstream: "127.0.0.1:9000" has no scheme; write http://127.0.0.1:9000 (line 3, col 26)"#,
        ),
        (
            "  - { name: a, respond: {}, timeout: 5s }\n",
            "routes[0].timeout: applies only to routes with an upstream; remove it or use upstream (line 3, col 29)",
        ),
        (
            "  - { name: a, respond: {}, match: { path: /a, path_prefix: /b } }\n",
            "routes[0].match: set either path or path_prefix, not both (line 3, col 48)",
        ),
        (
            "  - { name: a, respond: {}, match: { path_prefix: api/ } }\n",
            r#"routes[0].match.path_prefix: "api/" does not start with /; write "/api/" (line 3, col 51)"#,
        ),
        (
            "  - { name: a, respond: {}, match: { methods: [GET, GTE] } }\n",
            r#"routes[0].match.methods[1]: "GTE" is not an HTTP method; expected one of GET, HEAD, POST, PUT, DELETE, PATCH, OPTIONS, TRACE, CONNECT (line 3, col 53)"#,
        ),
        (
            "  - { name: a, respond: {}, match: { host: 'a.example.com:80' } }\n",
            r#"routes[0].match.host: "a.example.com:80" is not a host name; write e.g. api.example.com or *.example.com, without scheme, port or path (line 3, col 44)"#,
        ),
        (
            "  - { name: a, respond: { status: 99 } }\n",
            "routes[0].respond.status: must be between 100 and 599, found 99 (line 3, col 35)",
        ),
        (
            "  - { name: a, respond: {}, limits: [ { name: 'per ip', key: ip, limit: 1, window: 1s } ] }\n",
            r#"routes[0].limits[0].name: "per ip" is not a valid limit name; use letters, digits, '_', '.' and '-' (line 3, col 47)"#,
        ),
        (
            "  - { name: a, respond: {}, limits: [ { name: b, key: ip, limit: 1, window: 500ms } ] }\n",
            r#"routes[0].limits[0].window: "500ms" is too short; a window must be at least 1s (line 3, col 77)"#,
        ),
        (
            "  - { name: a, respond: {}, limits: [ { name: b, key: ip, limit: 1.5, window: 60 } ] }\n",
            "routes[0].limits[0].limit: expected a whole number, found the number 1.5 (line 3, col 66)\n\
             routes[0].limits[0].window: \"60\" is not a duration; write 60s or 60ms (a unit is required) (line 3, col 79)",
        ),
        (
            "  - { name: a, respond: {}, limits: [ { name: b, key: [], limit: 1, window: 1s } ] }\n",
            "routes[0].limits[0].key: needs at least one source, e.g. ip (line 3, col 55)",
        ),
        (
            "  - { name: a, respond: {}, limits: [ ~ ] }\n",
            "routes[0].limits[0]: empty entry (line 3, col 39)",
        ),
    ];
    for (routes, expected) in cases {
        let src = format!("{HEAD}{routes}");
        assert_eq!(errors(&src).join("\n"), *expected, "for:\n{src}");
    }
}

#[test]
fn more_top_level_rules() {
    let route = "routes: [{ name: a, respond: {} }]\n";
    let cases: &[(&str, &str)] = &[
        (
            "listen: []\n",
            "listen: needs at least one address (line 1, col 9)",
        ),
        (
            "listen: 127.0.0.1:1\nstore: { redis: { url: 'http://r:6379' } }\n",
            r#"store.redis.url: "http://r:6379" is not a Redis URL; write redis://HOST:PORT, e.g. redis://127.0.0.1:6379 (line 2, col 24)"#,
        ),
        (
            "listen: 127.0.0.1:1\nstore: { redis: { timeout: 1s } }\n",
            r#"store.redis: missing required field "url" (or cluster, or sentinel) (line 2, col 17)"#,
        ),
        (
            "listen: 127.0.0.1:1\nclient_ip: { ipv6_prefix: 129 }\n",
            "client_ip.ipv6_prefix: must be between 1 and 128, found 129 (line 2, col 27)",
        ),
        (
            "listen: 127.0.0.1:1\napi_keys: { header: 'x api key' }\n",
            r#"api_keys.header: "x api key" is not a valid header name; use letters, digits and '-', e.g. x-api-key (line 2, col 21)"#,
        ),
        (
            "listen: 127.0.0.1:1\nstore: { deny_cache: -1 }\n",
            "store.deny_cache: must be between 0 and 10000000, found -1 (line 2, col 22)",
        ),
        (
            "listen: 127.0.0.1:1\nheaders: gitlab\n",
            r#"headers: unknown value "gitlab"; expected one of ietf, github, legacy, none (line 2, col 10)"#,
        ),
        (
            "listen: 127.0.0.1:1\ntimeouts: { upstream_connect: 0s }\n",
            r#"timeouts.upstream_connect: "0s" is too short; a timeout must be more than 0 (line 2, col 31)"#,
        ),
        (
            "listen: 127.0.0.1:1\ntimeouts: { idle: 1 minute, drain: -1s }\n",
            "timeouts.idle: \"1 minute\" is not a duration; write 1m or 60s (line 2, col 19)\n\
             timeouts.drain: \"-1s\" is not a duration; write a whole number and a unit (ms, s, m, h or d), e.g. 5m or 300s (line 2, col 36)",
        ),
        (
            "listen: 127.0.0.1:1\nserver: { max_connections: 0, max_header_size: 1KiB, max_body_size: 10MB, nope: 1 }\n",
            "server.max_connections: must be between 1 and 1000000, found 0 (line 2, col 28)\n\
             server.max_header_size: \"1KiB\" is out of range; write 8KiB to 16MiB (line 2, col 48)\n\
             server.max_body_size: \"10MB\" is not a size; write bytes or a whole number with KiB, MiB or GiB, e.g. 64KiB (line 2, col 69)\n\
             server: unknown field \"nope\"; expected one of max_connections, backlog, max_header_size, max_uri_size, max_body_size, path, http1 (line 2, col 75)",
        ),
        (
            "listen: [ 127.0.0.1:1, { addr: 127.0.0.1:2, tls: { cert: /nonexistent/c.pem } }, { adr: x }, [1] ]\n",
            "listen[1].tls: missing required field \"key\" (line 1, col 50)\n\
             listen[2]: unknown field `adr`, expected `addr` or `tls` (line 1, col 82)\n\
             listen[3]: expected an address or a mapping { addr, tls }, found a list (line 1, col 94)",
        ),
        (
            "listen: { addr: 127.0.0.1:2, tls: { cert: /nonexistent/c.pem, key: /nonexistent/k.pem } }\n",
            "listen.tls: cannot read /nonexistent/c.pem: No such file or directory (os error 2) (line 1, col 35)",
        ),
    ];
    for (top, expected) in cases {
        let src = format!("{top}{route}");
        assert_eq!(errors(&src).join("\n"), *expected, "for:\n{src}");
    }
    assert_eq!(
        error("listen: 127.0.0.1:1\nroutes: []\n"),
        "routes: needs at least one route (line 2, col 9)"
    );
    assert_eq!(
        error("- listen\n"),
        "expected a mapping, found a list (line 1, col 1)"
    );
}

#[test]
fn load_file_reads_and_reports() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("gateway.yaml");
    std::fs::write(&path, FULL).expect("write config");
    assert_eq!(load_file(&path).expect("valid").routes.len(), 4);

    let missing = dir.path().join("missing.yaml");
    let err = load_file(&missing).expect_err("no such file");
    assert_eq!(err.0.len(), 1);
    assert!(err.0[0].message.starts_with("cannot read "), "{err}");
    assert_eq!(err.0[0].line, None);
}
#[test]
fn odd_inputs() {
    // A byte order mark, as some editors write one.
    valid("\u{feff}listen: 127.0.0.1:1\nroutes:\n  - { name: a, respond: {} }\n");
    // A key that is not a string spoils its own mapping, not its siblings.
    assert_eq!(
        errors(
            "listen: 127.0.0.1:1\nroutes:\n  - { name: a, respond: {}, 1: x }\n  - { name: b, cost: 0, respond: {} }\n"
        ),
        [
            "routes[0]: expected a field name, found the number 1 (line 3, col 5)",
            "routes[1].cost: must be at least 1, found 0 (line 4, col 22)",
        ]
    );
    assert_eq!(
        error(
            "listen: 127.0.0.1:1\nroutes: [{ name: a, respond: {} }]\n---\nlisten: 127.0.0.1:2\n"
        ),
        "invalid YAML: deserializing from YAML containing more than one document is not supported"
    );
    assert_eq!(
        error("listen: 127.0.0.1:1\nlisten: 127.0.0.1:2\nroutes: [{ name: a, respond: {} }]\n"),
        r#"invalid YAML: duplicate entry with key "listen" (line 1, col 1)"#
    );
}

// --- Redis topologies, failure policy, breaker, clock ---------------------

#[test]
fn redis_cluster_sentinel_and_failure_policy() {
    use tollgate::config::{ClockSource, RedisTopology};
    let c = valid(
        "listen: 127.0.0.1:1
store:
  redis:
    cluster: [127.0.0.1:7000, '[::1]:7001']
    username: tollgate
    password: s3cret
    tls: { ca_file: /etc/tollgate/redis-ca.pem }
    timeout: 10ms
    connect_timeout: 2s
    reconnect: { min: 50ms, max: 2s, jitter: 0ms }
    pool_size: 4
  on_error: deny
  clock: redis
  breaker: { failures: 5, probe_interval: 100ms }
routes:
  - { name: a, respond: {}, on_error: local }
  - { name: b, respond: {} }
",
    );
    let r = c.store.redis.as_ref().expect("redis");
    assert_eq!(
        r.topology,
        RedisTopology::Cluster {
            seeds: vec![("127.0.0.1".into(), 7000), ("::1".into(), 7001)]
        }
    );
    assert_eq!(r.username.as_deref(), Some("tollgate"));
    assert_eq!(r.password.as_deref(), Some("s3cret"));
    assert_eq!(
        r.tls.as_ref().and_then(|t| t.ca_file.as_ref()),
        Some(&std::path::PathBuf::from("/etc/tollgate/redis-ca.pem"))
    );
    assert_eq!(r.timeout, Duration::from_millis(10));
    assert_eq!(r.connect_timeout, Duration::from_secs(2));
    assert_eq!(r.reconnect_min, Duration::from_millis(50));
    assert_eq!(r.reconnect_max, Duration::from_secs(2));
    assert_eq!(r.reconnect_jitter, Duration::ZERO);
    assert_eq!(r.pool_size, 4);
    assert!(!r.describe().contains("s3cret"));
    assert_eq!(c.store.on_error, OnError::Deny);
    assert_eq!(c.store.clock, ClockSource::Redis);
    assert_eq!(c.store.breaker.failures, 5);
    assert_eq!(c.store.breaker.probe_interval, Duration::from_millis(100));
    assert_eq!(c.routes[0].on_error, Some(OnError::Local));
    assert_eq!(c.routes[1].on_error, None);

    let c = valid(
        "listen: 127.0.0.1:1
store:
  redis:
    sentinel: { service_name: mymaster, nodes: [127.0.0.1:26379, 127.0.0.1:26380] }
    database: 3
routes: [{ name: a, respond: {} }]
",
    );
    let r = c.store.redis.as_ref().expect("redis");
    assert_eq!(
        r.topology,
        RedisTopology::Sentinel {
            service_name: "mymaster".into(),
            nodes: vec![("127.0.0.1".into(), 26379), ("127.0.0.1".into(), 26380)]
        }
    );
    assert_eq!(r.database, Some(3));
    assert_eq!(r.timeout, Duration::from_millis(25), "the default timeout");
    assert_eq!(r.pool_size, 1);
    assert_eq!(c.store.clock, ClockSource::Gateway);

    let c = valid(
        "listen: 127.0.0.1:1\nstore: { redis: { url: 'rediss://u:p@127.0.0.1:6380/1' } }\nroutes: [{ name: a, respond: {} }]\n",
    );
    let r = c.store.redis.as_ref().expect("redis");
    assert_eq!(r.topology, RedisTopology::Standalone);
    assert_eq!(r.describe(), "rediss://***@127.0.0.1:6380/1");
}

#[test]
fn bad_redis_topologies_are_all_reported() {
    let src = "listen: 127.0.0.1:1
store:
  redis:
    url: redis://127.0.0.1:6379
    cluster: [127.0.0.1, 'h:0']
    database: 300
    tls: { ca_file: '', verify: no }
    reconnect: { min: 2s, max: 1s }
    pool_size: 0
  clock: server
  breaker: { failures: 0, probe_interval: soon }
routes: [{ name: a, respond: {}, on_error: ignore }]
";
    assert_eq!(
        errors(src),
        [
            "store.redis: set one of url, cluster and sentinel, not url and cluster (line 4, col 5)",
            r#"store.redis.cluster[0]: "127.0.0.1" is not HOST:PORT; write e.g. 127.0.0.1:7000 (line 5, col 15)"#,
            r#"store.redis.cluster[1]: "h:0" is not HOST:PORT; write e.g. 127.0.0.1:7000 (line 5, col 26)"#,
            "store.redis.database: must be between 0 and 255, found 300 (line 6, col 15)",
            "store.redis.tls.ca_file: must not be empty; write the path of a PEM file (line 7, col 21)",
            r#"store.redis.tls: unknown field "verify"; expected one of ca_file (line 7, col 25)"#,
            "store.redis.reconnect.min: 2s is longer than max 1s (line 8, col 23)",
            "store.redis.pool_size: must be between 1 and 64, found 0 (line 9, col 16)",
            r#"store.clock: unknown value "server"; expected one of gateway, redis (line 10, col 10)"#,
            "store.breaker.failures: must be between 1 and 1000000, found 0 (line 11, col 24)",
            r#"store.breaker.probe_interval: "soon" is not a duration; write a whole number and a unit (ms, s, m, h or d), e.g. 5m or 300s (line 11, col 43)"#,
            r#"routes[0].on_error: unknown value "ignore"; expected one of allow, deny, local (line 12, col 44)"#,
        ]
    );
    let cases: &[(&str, &str)] = &[
        (
            "store: { redis: { sentinel: { nodes: [] } } }\n",
            "store.redis.sentinel: missing required field \"service_name\" (line 2, col 29)\nstore.redis.sentinel.nodes: needs at least one sentinel (line 2, col 38)",
        ),
        (
            "store: { redis: { cluster: [127.0.0.1:7000], database: 1 } }\n",
            "store.redis.database: a Redis Cluster has only database 0 (line 2, col 56)",
        ),
        (
            "store: { redis: { url: 'redis://127.0.0.1:1', tls: {} } }\n",
            "store.redis.tls: applies to rediss:// URLs; write the url as rediss://HOST:PORT (line 2, col 52)",
        ),
    ];
    for (store, expected) in cases {
        let src = format!("listen: 127.0.0.1:1\n{store}routes: [{{ name: a, respond: {{}} }}]\n");
        assert_eq!(errors(&src).join("\n"), *expected, "for:\n{src}");
    }
}

#[test]
fn edge_fields_map_onto_the_model() {
    let c = valid(
        "listen: [ { addr: 127.0.0.1:1 }, 127.0.0.1:2 ]
timeouts: { idle: 5s, drain: 250ms }
server: { max_connections: 3, max_header_size: 16KiB, max_body_size: 1MiB }
routes:
  - { name: a, upstream: 'https://api.example:8443/v1', upgrade: true }
",
    );
    let addrs: Vec<SocketAddr> = c.listen.iter().map(|l| l.addr).collect();
    assert_eq!(
        addrs,
        [
            "127.0.0.1:1".parse::<SocketAddr>().expect("addr"),
            "127.0.0.1:2".parse().expect("addr")
        ]
    );
    assert!(c.listen.iter().all(|l| l.tls.is_none()));
    assert_eq!(c.timeouts.idle, Duration::from_secs(5));
    assert_eq!(c.timeouts.drain, Duration::from_millis(250));
    assert_eq!(c.server.max_connections, 3);
    assert_eq!(c.server.max_header_size, 16 * 1024);
    assert_eq!(c.server.max_body_size, Some(1024 * 1024));
    let Action::Upstream(up) = &c.routes[0].action else {
        panic!("an upstream route")
    };
    assert_eq!(up.uri, "https://api.example:8443/v1");
    assert!(up.upgrade);
    assert!(up.tls.is_none(), "no upstream_ca: the webpki roots");

    // Defaults.
    let c = valid("listen: 127.0.0.1:1\nroutes: [{ name: a, upstream: 'http://up' }]\n");
    assert_eq!(c.timeouts.idle, Duration::from_secs(60));
    assert_eq!(c.timeouts.drain, Duration::from_secs(30));
    assert_eq!(c.server.max_connections, 10_000);
    assert_eq!(c.server.max_header_size, 128 * 1024);
    assert_eq!(c.server.max_body_size, None);
    let Action::Upstream(up) = &c.routes[0].action else {
        panic!("an upstream route")
    };
    assert!(!up.upgrade);
}

#[test]
fn admin_token_inline_or_from_a_file() {
    let c = valid(
        "listen: 127.0.0.1:0\nadmin: { addr: 127.0.0.1:9090, token: t0k }\nroutes: [ { name: a, respond: {} } ]\n",
    );
    assert_eq!(c.admin, Some("127.0.0.1:9090".parse().unwrap()));
    assert_eq!(c.admin_token.as_deref(), Some("t0k"));
    let dir = std::env::temp_dir().join(format!("tollgate-admin-token-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("token");
    std::fs::write(&file, "from-a-file\n").unwrap();
    let c = valid(&format!(
        "listen: 127.0.0.1:0\nadmin: {{ addr: 127.0.0.1:9090, token_file: {} }}\nroutes: [ {{ name: a, respond: {{}} }} ]\n",
        file.display()
    ));
    assert_eq!(c.admin_token.as_deref(), Some("from-a-file"));
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(
        valid("listen: 127.0.0.1:0\nadmin: 127.0.0.1:9090\nroutes: [ { name: a, respond: {} } ]\n")
            .admin_token,
        None
    );
    assert_eq!(
        errors(
            "listen: 127.0.0.1:0\nadmin: { addr: 127.0.0.1:9090, token: a, token_file: /nonexistent/t }\nroutes: [ { name: a, respond: {} } ]\n"
        ),
        [
            "admin.token_file: cannot read /nonexistent/t: No such file or directory (os error 2) (line 2, col 54)",
        ]
    );
    assert_eq!(
        errors("listen: 127.0.0.1:0\nadmin: { addr: 127.0.0.1:9090, tokn: a }\nroutes: [ { name: a, respond: {} } ]\n").len(),
        1
    );
    assert_eq!(
        errors("listen: 127.0.0.1:0\nadmin: { token: a }\nroutes: [ { name: a, respond: {} } ]\n")
            .len(),
        1
    );
}

#[test]
fn admin_and_shadow_fields() {
    let c = valid(
        "listen: 127.0.0.1:0\nadmin: 127.0.0.1:9090\nroutes:\n  - name: a\n    respond: {}\n    shadow: true\n    limits:\n      - { name: l, key: ip, limit: 1, window: 1s, shadow: false }\n      - { name: m, key: ip, limit: 1, window: 1s, shadow: true }\n",
    );
    assert_eq!(c.admin, Some("127.0.0.1:9090".parse().unwrap()));
    assert!(c.routes[0].shadow);
    assert!(!c.routes[0].limits[0].shadow);
    assert!(c.routes[0].limits[1].shadow);
    let d = valid(
        "listen: 127.0.0.1:0\nroutes: [ { name: a, respond: {}, limits: [ { name: l, key: ip, limit: 1, window: 1s } ] } ]\n",
    );
    assert_eq!(d.admin, None);
    assert!(!d.routes[0].shadow && !d.routes[0].limits[0].shadow);

    assert_eq!(
        errors(
            "listen: 127.0.0.1:0\nadmin: localhost:9090\nroutes:\n  - name: a\n    respond: {}\n    shadow: yes\n    limits:\n      - { name: l, key: ip, limit: 1, window: 1s, shadow: [true] }\n"
        ),
        [
            r#"admin: "localhost:9090" is not a socket address; write IP:PORT, e.g. 127.0.0.1:8080 or [::1]:8080 (line 2, col 8)"#,
            r#"routes[0].shadow: expected true or false, found the string "yes" (line 6, col 13)"#,
            r#"routes[0].limits[0].shadow: expected true or false, found a list (line 8, col 59)"#,
        ]
    );
}

#[test]
fn schema_covers_the_edge_fields() {
    let schema = serde_json::to_value(tollgate::config::schema::schema()).expect("schema is JSON");
    let validator = jsonschema::validator_for(&schema).expect("a valid JSON Schema");
    let yaml = |src: &str| -> serde_json::Value { yaml_serde::from_str(src).expect("YAML parses") };
    let good =
        "listen: [ 127.0.0.1:8080, { addr: 127.0.0.1:8443, tls: { cert: c.pem, key: k.pem } } ]
timeouts: { idle: 60s, drain: 30s }
server: { max_connections: 100, max_header_size: 64KiB, max_body_size: 1048576 }
routes:
  - { name: a, upstream: 'https://up', upstream_ca: ca.pem, upgrade: true }
";
    let errors: Vec<String> = validator
        .iter_errors(&yaml(good))
        .map(|e| format!("{e} at {}", e.instance_path()))
        .collect();
    assert!(errors.is_empty(), "{errors:#?}");
    for bad in [
        "listen: [ { adr: 127.0.0.1:1 } ]\nroutes: [ { name: a, respond: {} } ]\n",
        "listen: { addr: 127.0.0.1:1, tls: { cert: c, key: k, ca: x } }\nroutes: [ { name: a, respond: {} } ]\n",
        "listen: 127.0.0.1:1\nserver: { max_body_size: 10MB }\nroutes: [ { name: a, respond: {} } ]\n",
        "listen: 127.0.0.1:1\nserver: { max_conns: 1 }\nroutes: [ { name: a, respond: {} } ]\n",
        "listen: 127.0.0.1:1\ntimeouts: { idle: 1 minute }\nroutes: [ { name: a, respond: {} } ]\n",
        "listen: 127.0.0.1:1\nroutes: [ { name: a, upstream: 'http://up', upgrade: yes } ]\n",
    ] {
        assert!(!validator.is_valid(&yaml(bad)), "accepted:\n{bad}");
    }
}

#[test]
fn upstream_idle_and_forward_proxy_authorization() {
    let forwarding = |c: &Config, i: usize| match &c.routes[i].action {
        Action::Upstream(up) => up.forward_proxy_authorization,
        Action::Respond(_) => panic!("route {i} forwards"),
    };
    let c = valid("listen: 127.0.0.1:0\nroutes: [ { name: a, upstream: 'http://up:1' } ]\n");
    assert_eq!(c.timeouts.upstream_idle, Duration::from_secs(4));
    assert!(!forwarding(&c, 0));

    let c = valid(
        "listen: 127.0.0.1:0
timeouts: { upstream_idle: 90s }
routes:
  - { name: a, upstream: 'http://up:1', forward_proxy_authorization: true }
  - { name: b, upstream: 'http://up:1', forward_proxy_authorization: false }
",
    );
    assert_eq!(c.timeouts.upstream_idle, Duration::from_secs(90));
    assert!(forwarding(&c, 0));
    assert!(!forwarding(&c, 1));

    assert_eq!(
        errors(
            "listen: 127.0.0.1:0
timeouts: { upstream_idle: 0s }
routes:
  - { name: a, respond: {}, forward_proxy_authorization: true }
  - { name: b, upstream: 'http://up:1', forward_proxy_authorization: yes }
"
        ),
        [
            r#"timeouts.upstream_idle: "0s" is too short; a timeout must be more than 0 (line 2, col 28)"#,
            "routes[0].forward_proxy_authorization: applies only to routes with an upstream; remove it or use upstream (line 4, col 29)",
            r#"routes[1].forward_proxy_authorization: expected true or false, found the string "yes" (line 5, col 70)"#,
        ]
    );

    let schema = serde_json::to_value(tollgate::config::schema::schema()).expect("schema is JSON");
    let validator = jsonschema::validator_for(&schema).expect("a valid JSON Schema");
    let yaml = |src: &str| -> serde_json::Value { yaml_serde::from_str(src).expect("YAML parses") };
    assert!(validator.is_valid(&yaml(
        "listen: 127.0.0.1:1\ntimeouts: { upstream_idle: 4s }\nroutes: [ { name: a, upstream: 'http://up', forward_proxy_authorization: true } ]\n"
    )));
    assert!(!validator.is_valid(&yaml(
        "listen: 127.0.0.1:1\ntimeouts: { upstream_idle: 4 seconds }\nroutes: [ { name: a, respond: {} } ]\n"
    )));
    assert!(!validator.is_valid(&yaml(
        "listen: 127.0.0.1:1\nroutes: [ { name: a, upstream: 'http://up', forward_proxy_authorization: 'yes' } ]\n"
    )));
}

#[test]
fn trusted_proxies_with_host_bits_are_refused_with_both_readings() {
    let src = format!(
        "client_ip:\n  trusted_proxies: [127.0.0.1/32, 10.0.0.1/8, \"2001:db8::1/64\", 192.0.2.7, \"::1\"]\n{HEAD}  - {{ name: a, respond: {{}} }}\n"
    );
    assert_eq!(
        errors(&src),
        [
            r#"client_ip.trusted_proxies[1]: "10.0.0.1/8" has host bits set; write 10.0.0.0/8 (or 10.0.0.1/32 for one address) (line 2, col 35)"#,
            r#"client_ip.trusted_proxies[2]: "2001:db8::1/64" has host bits set; write 2001:db8::/64 (or 2001:db8::1/128 for one address) (line 2, col 47)"#,
        ]
    );
    // What the errors suggest loads.
    let c = valid(&format!(
        "client_ip:\n  trusted_proxies: [10.0.0.0/8, 10.0.0.1/32, \"2001:db8::/64\", 0.0.0.0/0]\n{HEAD}  - {{ name: a, respond: {{}} }}\n"
    ));
    let nets: Vec<String> = c
        .client_ip
        .trusted_proxies
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        nets,
        ["10.0.0.0/8", "10.0.0.1/32", "2001:db8::/64", "0.0.0.0/0"]
    );
}

#[test]
fn a_tab_in_the_indentation_is_named_with_its_line_and_column() {
    // A tab where a list item's indentation belongs.
    let src = "listen: 127.0.0.1:8080\nroutes:\n\t- name: a\n\t  respond: {}\n";
    assert_eq!(
        error(src),
        "invalid YAML: a tab character; YAML indents with spaces only (line 3, col 1)"
    );
    // A tab after spaces, deeper in the file.
    let src = "listen: 127.0.0.1:8080\nroutes:\n  - name: a\n  \t  respond: {}\n";
    assert_eq!(
        error(src),
        "invalid YAML: a tab character; YAML indents with spaces only (line 4, col 3)"
    );
    // In a nested mapping, seven lines down.
    let src = "listen: 127.0.0.1:8080\nstore:\n  on_error: allow\nroutes:\n  - name: a\n    limits:\n\t- { name: l, key: ip, limit: 1, window: 1s }\n    respond: {}\n";
    assert_eq!(
        error(src),
        "invalid YAML: a tab character; YAML indents with spaces only (line 7, col 1)"
    );
    // A tab between a key and its value is YAML's separator, not indentation.
    let c = valid("listen:\t127.0.0.1:8080\nroutes: [ { name: a, respond: {} } ]\n");
    assert_eq!(c.routes.len(), 1);
    // Other syntax errors keep the parser's words.
    assert_eq!(
        error("listen: [1\n"),
        "invalid YAML: did not find expected ',' or ']', while parsing a flow sequence at line 1 column 9 (line 2, col 1)"
    );
}

#[test]
fn an_unquoted_reference_in_a_flow_mapping_is_told_to_be_quoted() {
    // Its braces end the mapping early, and the error says to quote it.
    let hint = "; a ${NAME} inside { … } or [ … ] must be quoted, as its braces are YAML's own: write \"${NAME:-default}\"";
    let src = "listen: 127.0.0.1:8080\nroutes:\n  - name: a\n    respond: {}\n    limits: [ { name: l, key: ip, limit: ${DEMO_LIMIT:-3}, window: 1m } ]\n";
    assert_eq!(
        error(src),
        format!(
            "invalid YAML: did not find expected ',' or '}}', while parsing a flow mapping at line 5 column 15{hint} (line 5, col 43)"
        )
    );
    // Quoted, it is read.
    let quoted = src.replace("${DEMO_LIMIT:-3}", "\"${TG_TEST_NEVER_SET:-3}\"");
    assert_eq!(valid(&quoted).routes[0].limits[0].limit.get(), 3);
    // Over several lines, from the mapping's first line.
    let src = "listen: 127.0.0.1:8080\nroutes: [ { name: a, respond: {},\n  limits: [ { name: l, key: ip, limit: ${X}, window: 1m } ] } ]\n";
    assert!(error(src).contains(hint), "{}", error(src));
    // A quoted reference is not what went wrong: no hint.
    let src = "listen: 127.0.0.1:8080\nroutes: [ { name: a, respond: {}, upstream: \"http://${H}\" x } ]\n";
    assert!(!error(src).contains(hint), "{}", error(src));
}

#[test]
fn backlog_and_uri_size_map_onto_the_model_and_are_checked() {
    let c = valid(
        "listen: 127.0.0.1:1\nserver: { backlog: 100, max_uri_size: 2KiB }\nroutes: [ { name: a, respond: {} } ]\n",
    );
    assert_eq!(c.server.backlog, 100);
    assert_eq!(c.server.max_uri_size, 2048);
    // Defaults: above std's and tokio's 128 (see docs/proxying.md), and a URI cap
    // under hyper's own 64 KiB stop.
    let d = valid("listen: 127.0.0.1:1\nroutes: [ { name: a, respond: {} } ]\n");
    assert_eq!(d.server.backlog, 4096);
    assert_eq!(d.server.max_uri_size, 16 * 1024);
    assert_eq!(
        errors(
            "listen: 127.0.0.1:1\nserver:\n  backlog: 0\n  max_uri_size: 64KiB\nroutes: [ { name: a, respond: {} } ]\n"
        ),
        [
            "server.backlog: must be between 1 and 2147483647, found 0 (line 3, col 12)",
            r#"server.max_uri_size: "64KiB" is out of range; write 1KiB to 63KiB (hyper refuses targets over 64 KiB by itself) (line 4, col 17)"#,
        ]
    );
    assert_eq!(
        error(
            "listen: 127.0.0.1:1\nserver: { backlog: many }\nroutes: [ { name: a, respond: {} } ]\n"
        ),
        r#"server.backlog: expected a whole number, found the string "many" (line 2, col 20)"#
    );
}

#[test]
fn schema_knows_backlog_and_uri_size() {
    let schema = serde_json::to_value(tollgate::config::schema::schema()).expect("schema is JSON");
    let validator = jsonschema::validator_for(&schema).expect("a valid JSON Schema");
    let yaml = |src: &str| -> serde_json::Value { yaml_serde::from_str(src).expect("YAML parses") };
    let good = "listen: 127.0.0.1:1\nserver: { backlog: 1024, max_uri_size: 8KiB }\nroutes: [ { name: a, respond: {} } ]\n";
    let errors: Vec<String> = validator
        .iter_errors(&yaml(good))
        .map(|e| format!("{e} at {}", e.instance_path()))
        .collect();
    assert!(errors.is_empty(), "{errors:#?}");
    for bad in [
        "listen: 127.0.0.1:1\nserver: { backlog: lots }\nroutes: [ { name: a, respond: {} } ]\n",
        "listen: 127.0.0.1:1\nserver: { max_uri_size: 8KB }\nroutes: [ { name: a, respond: {} } ]\n",
    ] {
        assert!(!validator.is_valid(&yaml(bad)), "accepted:\n{bad}");
    }
}

// The loader and `tollgate schema` agree: every spelling of every enum
// field is accepted by both or by neither, and every example the
// documentation shows is accepted by both.

/// `tollgate schema`, compiled.
fn schema_validator() -> jsonschema::Validator {
    let schema = serde_json::to_value(tollgate::config::schema::schema()).expect("schema is JSON");
    jsonschema::validator_for(&schema).expect("a valid JSON Schema")
}

/// What the schema says about `src`: empty when it is valid.
fn schema_errors(validator: &jsonschema::Validator, src: &str) -> Vec<String> {
    let value: serde_json::Value = yaml_serde::from_str(src).expect("YAML parses");
    validator
        .iter_errors(&value)
        .map(|e| format!("{e} at {}", e.instance_path()))
        .collect()
}

/// Asserts that the loader and the schema both accept `src`.
fn accepted_by_both(validator: &jsonschema::Validator, src: &str, what: &str) {
    if let Err(e) = parse_str(src) {
        panic!("{what}: the loader refuses it:\n{e}\n---\n{src}");
    }
    let refused = schema_errors(validator, src);
    assert!(
        refused.is_empty(),
        "{what}: the schema refuses it: {refused:#?}\n---\n{src}"
    );
}

/// Every property of the schema that lists its values (`enum`), by the
/// path a reader writes (`routes[].limits[].algorithm`, `plans.*[].algorithm`),
/// with the values listed (`null` left out).
fn schema_enums() -> std::collections::BTreeMap<String, Vec<String>> {
    fn walk(
        root: &serde_json::Value,
        node: &serde_json::Value,
        path: &str,
        found: &mut std::collections::BTreeMap<String, Vec<String>>,
    ) {
        if let Some(name) = node["$ref"].as_str() {
            let name = name.trim_start_matches("#/$defs/");
            walk(root, &root["$defs"][name], path, found);
        }
        if let Some(values) = node["enum"].as_array() {
            let values = values.iter().filter_map(|v| v.as_str().map(str::to_owned));
            found.insert(path.to_owned(), values.collect());
        }
        for one in node["anyOf"].as_array().into_iter().flatten() {
            walk(root, one, path, found);
        }
        if node["items"].is_object() {
            walk(root, &node["items"], &format!("{path}[]"), found);
        }
        if node["additionalProperties"].is_object() {
            let inner = &node["additionalProperties"];
            walk(root, inner, &format!("{path}.*"), found);
        }
        for (key, child) in node["properties"].as_object().into_iter().flatten() {
            let child_path = if path.is_empty() {
                key.clone()
            } else {
                format!("{path}.{key}")
            };
            walk(root, child, &child_path, found);
        }
    }
    let schema = serde_json::to_value(tollgate::config::schema::schema()).expect("schema is JSON");
    let mut found = std::collections::BTreeMap::new();
    walk(&schema, &schema, "", &mut found);
    found
}

/// One enum field: its path in the schema's terms, its path in the
/// loader's errors, the spellings table the loader reads, and a whole file
/// with a value (YAML text) in that field.
struct EnumField {
    schema_path: &'static str,
    error_path: &'static str,
    spellings: Vec<&'static str>,
    file: fn(&str) -> String,
}

fn names<T>(table: &[(&'static str, T)]) -> Vec<&'static str> {
    table.iter().map(|(name, _)| *name).collect()
}

fn enum_fields() -> Vec<EnumField> {
    use tollgate::config::{ClockSource, HeaderMode};
    use tollgate::jwt::JwtAlgorithm;
    use tollgate::limit::Algorithm;
    use tollgate::target::EscapedSlashes;
    const ROUTE: &str = "routes: [ { name: a, respond: {} } ]\n";
    vec![
        EnumField {
            schema_path: "headers",
            error_path: "headers",
            spellings: names(&HeaderMode::SPELLINGS),
            file: |v| format!("listen: 127.0.0.1:0\nheaders: {v}\n{ROUTE}"),
        },
        EnumField {
            schema_path: "upstreams.*.balance",
            error_path: "upstreams.api.balance",
            spellings: names(&tollgate::config::Balance::SPELLINGS),
            file: |v| {
                let key = if v == "hash" { ", hash_key: ip" } else { "" };
                format!(
                    "listen: 127.0.0.1:0\nupstreams: {{ api: {{ targets: [http://127.0.0.1:1], balance: {v}{key} }} }}\n{ROUTE}"
                )
            },
        },
        EnumField {
            schema_path: "store.on_error",
            error_path: "store.on_error",
            spellings: names(&OnError::SPELLINGS),
            file: |v| format!("listen: 127.0.0.1:0\nstore: {{ on_error: {v} }}\n{ROUTE}"),
        },
        EnumField {
            schema_path: "request_id.keep_from",
            error_path: "request_id.keep_from",
            spellings: names(&tollgate::config::KeepFrom::SPELLINGS),
            file: |v| format!("listen: 127.0.0.1:0\nrequest_id: {{ keep_from: {v} }}\n{ROUTE}"),
        },
        EnumField {
            schema_path: "store.clock",
            error_path: "store.clock",
            spellings: names(&ClockSource::SPELLINGS),
            file: |v| format!("listen: 127.0.0.1:0\nstore: {{ clock: {v} }}\n{ROUTE}"),
        },
        EnumField {
            schema_path: "routes[].on_error",
            error_path: "routes[0].on_error",
            spellings: names(&OnError::SPELLINGS),
            file: |v| {
                format!(
                    "listen: 127.0.0.1:0\nroutes: [ {{ name: a, respond: {{}}, on_error: {v} }} ]\n"
                )
            },
        },
        EnumField {
            schema_path: "server.http1",
            error_path: "server.http1",
            spellings: names(&tollgate::config::Http1::SPELLINGS),
            file: |v| format!("listen: 127.0.0.1:0\nserver: {{ http1: {v} }}\n{ROUTE}"),
        },
        EnumField {
            schema_path: "server.path.escaped_slashes",
            error_path: "server.path.escaped_slashes",
            spellings: names(&EscapedSlashes::SPELLINGS),
            file: |v| {
                format!(
                    "listen: 127.0.0.1:0\nserver: {{ path: {{ escaped_slashes: {v} }} }}\n{ROUTE}"
                )
            },
        },
        EnumField {
            schema_path: "routes[].limits[].bytes",
            error_path: "routes[0].limits[0].bytes",
            spellings: names(&tollgate::limit::settle::Bytes::SPELLINGS),
            file: |v| {
                format!(
                    "listen: 127.0.0.1:0\nroutes:\n  - name: a\n    respond: {{}}\n    limits: [ {{ name: l, key: ip, limit: 10, window: 1m, bytes: {v} }} ]\n"
                )
            },
        },
        EnumField {
            schema_path: "routes[].limits[].cost.from_body",
            error_path: "routes[0].limits[0].cost.from_body",
            spellings: tollgate::limit::settle::BodyUsage::PRESETS.to_vec(),
            file: |v| {
                format!(
                    "listen: 127.0.0.1:0\nroutes:\n  - name: a\n    respond: {{}}\n    limits: [ {{ name: l, key: ip, limit: 10, window: 1m, cost: {{ reserve: 1, from_body: {v} }} }} ]\n"
                )
            },
        },
        EnumField {
            schema_path: "routes[].limits[].cost.from_body.stream",
            error_path: "routes[0].limits[0].cost.from_body.stream",
            spellings: names(&tollgate::limit::usage::Stream::SPELLINGS),
            file: |v| {
                format!(
                    "listen: 127.0.0.1:0\nroutes:\n  - name: a\n    respond: {{}}\n    limits: [ {{ name: l, key: ip, limit: 10, window: 1m, cost: {{ reserve: 1, from_body: {{ json: usage.total_tokens, stream: {v} }} }} }} ]\n"
                )
            },
        },
        EnumField {
            schema_path: "routes[].limits[].algorithm",
            error_path: "routes[0].limits[0].algorithm",
            spellings: names(&Algorithm::SPELLINGS),
            file: |v| {
                format!(
                    "listen: 127.0.0.1:0\nroutes:\n  - name: a\n    respond: {{}}\n    limits: [ {{ name: l, key: ip, limit: 10, window: 1m, algorithm: {v} }} ]\n"
                )
            },
        },
        EnumField {
            schema_path: "plans.*[].algorithm",
            error_path: "plans.free[0].algorithm",
            spellings: names(&Algorithm::SPELLINGS),
            file: |v| {
                format!(
                    "listen: 127.0.0.1:0\nplans: {{ free: [ {{ name: l, limit: 10, window: 1m, algorithm: {v} }} ] }}\n{ROUTE}"
                )
            },
        },
        EnumField {
            schema_path: "routes[].limits[].on_limit",
            error_path: "routes[0].limits[0].on_limit",
            spellings: names(&tollgate::config::OnLimit::SPELLINGS),
            file: |v| {
                format!(
                    "listen: 127.0.0.1:0\nroutes:\n  - name: a\n    respond: {{}}\n    limits: [ {{ name: l, key: ip, limit: 10, window: 1m, on_limit: {v} }} ]\n"
                )
            },
        },
        EnumField {
            schema_path: "plans.*[].on_limit",
            error_path: "plans.free[0].on_limit",
            spellings: names(&tollgate::config::OnLimit::SPELLINGS),
            file: |v| {
                format!(
                    "listen: 127.0.0.1:0\nplans: {{ free: [ {{ name: l, limit: 10, window: 1m, on_limit: {v} }} ] }}\n{ROUTE}"
                )
            },
        },
        EnumField {
            schema_path: "users.jwt.algorithm",
            error_path: "users.jwt.algorithm",
            spellings: names(&JwtAlgorithm::SPELLINGS),
            file: |v| {
                // Each algorithm with the key it needs.
                let dir = env!("CARGO_MANIFEST_DIR");
                let key = match v {
                    "RS256" => format!("public_key: \"{dir}/tests/fixtures/rs256-public.pem\""),
                    "ES256" => format!("public_key: \"{dir}/tests/fixtures/es256-public.pem\""),
                    _ => "secret: 0123456789abcdef0123456789abcdef".to_owned(),
                };
                format!(
                    "listen: 127.0.0.1:0\nusers: {{ jwt: {{ algorithm: {v}, {key} }} }}\n{ROUTE}"
                )
            },
        },
    ]
}

/// Values near a field's spellings that are none of them, as YAML text.
fn near_misses(spellings: &[&str]) -> Vec<String> {
    let first = spellings[0];
    let mut capitalised = first.to_ascii_lowercase();
    capitalised[..1].make_ascii_uppercase();
    let candidates = [
        first.to_ascii_uppercase(),
        first.to_ascii_lowercase(),
        capitalised,
        format!("{first}s"),
        format!(" {first}"),
        first.replace('_', "-"),
        String::new(),
        "nope".to_owned(),
    ];
    let mut misses: Vec<String> = candidates
        .into_iter()
        .filter(|c| !spellings.contains(&c.as_str()))
        .map(|c| format!("{c:?}"))
        .collect();
    // Not strings at all.
    misses.extend(["1".to_owned(), "true".to_owned(), "[a]".to_owned()]);
    misses.sort();
    misses.dedup();
    misses
}

#[test]
fn every_enum_spelling_is_accepted_by_both_the_loader_and_the_schema_or_by_neither() {
    let validator = schema_validator();
    let fields = enum_fields();

    for field in &fields {
        for spelling in &field.spellings {
            let src = (field.file)(spelling);
            accepted_by_both(
                &validator,
                &src,
                &format!("{}: {spelling}", field.schema_path),
            );
        }
        for miss in near_misses(&field.spellings) {
            let src = (field.file)(&miss);
            let loader = parse_str(&src).err().map(|e| e.to_string());
            assert!(
                loader
                    .as_deref()
                    .is_some_and(|e| e.contains(&format!("{}: ", field.error_path))),
                "{}: {miss} is not refused at the field by the loader: {loader:?}\n---\n{src}",
                field.schema_path
            );
            assert!(
                !schema_errors(&validator, &src).is_empty(),
                "{}: {miss} is accepted by the schema\n---\n{src}",
                field.schema_path
            );
        }
    }

    // The schema lists values for exactly these fields, and lists the
    // loader's spellings, no more and no fewer.
    let listed = schema_enums();
    let known: Vec<&str> = fields.iter().map(|f| f.schema_path).collect();
    let listed_paths: Vec<&str> = listed.keys().map(String::as_str).collect();
    let mut expected = known.clone();
    expected.sort_unstable();
    assert_eq!(
        listed_paths, expected,
        "fields whose values the schema lists, against the loader's enum fields"
    );
    for field in &fields {
        let mut ours: Vec<&str> = field.spellings.clone();
        ours.sort_unstable();
        let mut theirs: Vec<&str> = listed[field.schema_path]
            .iter()
            .map(String::as_str)
            .collect();
        theirs.sort_unstable();
        assert_eq!(theirs, ours, "{}: schema against loader", field.schema_path);
    }
}

#[test]
fn the_configuration_reference_names_every_spelling() {
    let readme = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docs/configuration.md"
    ))
    .unwrap();
    let rows = reference_rows(&readme);
    for field in enum_fields() {
        let row_name = field.schema_path;
        // `plans` describes its limits' fields by reference.
        let Some((_, _, meaning)) = rows.iter().find(|(name, _, _)| name == row_name) else {
            assert!(
                row_name.starts_with("plans.*[]."),
                "no README row for {row_name}"
            );
            continue;
        };
        for spelling in &field.spellings {
            assert!(
                meaning.contains(&format!("`{spelling}`")),
                "README's row for {row_name} does not name `{spelling}`: {meaning}"
            );
        }
    }
}

/// The rows of the configuration reference table (docs/configuration.md): field, default and
/// meaning, with the backticks around the field name removed.
fn reference_rows(readme: &str) -> Vec<(String, String, String)> {
    let start = readme
        .find("## Configuration reference")
        .expect("docs/configuration.md has a configuration reference");
    let section = &readme[start..];
    let end = section[3..].find("\n#").map_or(section.len(), |i| i + 3);
    section[..end]
        .lines()
        .filter(|line| line.starts_with("| `"))
        .map(|line| {
            // `a \| b` inside a cell is a pipe, not a cell border.
            let cells: Vec<String> = line
                .replace("\\|", "\u{0}")
                .split('|')
                .map(|c| c.trim().replace('\u{0}', "|"))
                .collect();
            (
                cells[1].trim_matches('`').to_owned(),
                cells[2].clone(),
                cells[3].clone(),
            )
        })
        .collect()
}

/// Completes a documentation fragment into a whole file: its top-level
/// keys replace those of a small file with a listener, a Redis store (only
/// parsed here, never connected) and one route; a bare `limits:` list
/// becomes that route's limits.
fn complete(fragment: &str) -> String {
    let base = "listen: 127.0.0.1:0\nstore: { redis: { url: \"redis://127.0.0.1:6379\" } }\nroutes: [ { name: example, upstream: \"http://127.0.0.1:9000\" } ]\n";
    let mut doc: yaml_serde::Value = yaml_serde::from_str(base).expect("base parses");
    let fragment: yaml_serde::Value = yaml_serde::from_str(fragment).expect("example parses");
    let Some(fragment) = fragment.as_mapping() else {
        panic!("an example that is not a mapping: {fragment:?}");
    };
    for (key, value) in fragment {
        if key.as_str() == Some("limits") {
            doc["routes"][0]
                .as_mapping_mut()
                .expect("base route")
                .insert(key.clone(), value.clone());
        } else {
            doc.as_mapping_mut()
                .expect("base file")
                .insert(key.clone(), value.clone());
        }
    }
    yaml_serde::to_string(&doc).expect("YAML serialises")
}

#[test]
fn every_documented_example_is_accepted_by_both_the_loader_and_the_schema() {
    let validator = schema_validator();
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));

    // The shipped file, as it is and with each one-line alternative it
    // shows in a comment (`# redis: { cluster: … }`) written in.
    let shipped = std::fs::read_to_string(root.join("gateway.yaml")).unwrap();
    accepted_by_both(&validator, &shipped, "gateway.yaml");
    let lines: Vec<&str> = shipped.lines().collect();
    let mut alternatives = 0;
    for (i, line) in lines.iter().enumerate() {
        let trimmed = line.trim_start();
        let indent = &line[..line.len() - trimmed.len()];
        let Some(text) = trimmed.strip_prefix("# ") else {
            continue;
        };
        let Some((key, value)) = text.split_once(": ") else {
            continue;
        };
        if !key.chars().all(|c| c.is_ascii_lowercase() || c == '_') || value.trim().is_empty() {
            continue;
        }
        let mut variant = lines.clone();
        let uncommented = format!("{indent}{text}");
        variant[i] = &uncommented;
        let src = variant.join("\n");
        accepted_by_both(&validator, &src, &format!("gateway.yaml line {}", i + 1));
        alternatives += 1;
    }
    assert!(alternatives >= 5, "only {alternatives} alternatives found");

    // Every YAML block of the README and the docs, completed into a file.
    let mut documents = vec![root.join("README.md")];
    for entry in std::fs::read_dir(root.join("docs")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "md") {
            documents.push(path);
        }
    }
    let mut blocks = 0;
    for path in documents {
        let text = std::fs::read_to_string(&path).unwrap();
        for (n, block) in text.split("```yaml\n").skip(1).enumerate() {
            let block = block.split("```").next().unwrap_or_default();
            let what = format!("{} yaml block {}", path.display(), n + 1);
            accepted_by_both(&validator, &complete(block), &what);
            blocks += 1;
        }
    }
    assert!(blocks >= 4, "only {blocks} YAML blocks found");
}

#[test]
fn every_default_in_the_configuration_reference_is_the_loaders() {
    let validator = schema_validator();
    let readme = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docs/configuration.md"
    ))
    .unwrap();
    let rows = reference_rows(&readme);
    let fields: Vec<&str> = rows.iter().map(|(name, _, _)| name.as_str()).collect();
    let base = "listen: 127.0.0.1:0
store: { redis: { url: \"redis://127.0.0.1:6379\" } }
users: { jwt: { secret: 0123456789abcdef0123456789abcdef } }
upstreams: { \"*\": { targets: [ { url: \"http://upstream.test:1\" } ] } }
routes:
  - name: example
    upstream: http://upstream.test
    limits: [ { name: example, key: ip, limit: 10, window: 1m } ]
";
    let base: yaml_serde::Value = yaml_serde::from_str(base).expect("base parses");
    let mut checked = 0;
    for (field, default, _) in &rows {
        // Only defaults written as one value: not `required`, `none`,
        // prose, or the name of the field the default comes from.
        let Some(value) = default
            .strip_prefix('`')
            .and_then(|d| d.strip_suffix('`'))
            .filter(|d| !d.contains('`') && !fields.contains(d))
        else {
            continue;
        };
        let value: yaml_serde::Value = if value.starts_with(['{', '[']) {
            yaml_serde::from_str(value).expect("default parses")
        } else if let Ok(n) = value.parse::<i64>() {
            n.into()
        } else if let Ok(b) = value.parse::<bool>() {
            b.into()
        } else {
            value.into()
        };
        let (mut with, mut without) = (base.clone(), base.clone());
        set_path(&mut with, field, Some(value));
        set_path(&mut without, field, None);
        let with = yaml_serde::to_string(&with).expect("YAML serialises");
        let without = yaml_serde::to_string(&without).expect("YAML serialises");
        accepted_by_both(&validator, &with, &format!("{field}: {default}"));
        assert_eq!(
            format!("{:?}", valid(&with)),
            format!("{:?}", valid(&without)),
            "README's default of {field}, {default}, is not the loader's"
        );
        checked += 1;
    }
    assert!(checked >= 40, "only {checked} defaults checked");
}

/// Sets (or with `None` removes) the field at a reference path such as
/// `routes[].limits[].algorithm` in `doc`: `[]` is the first item of an
/// existing list; missing mappings on the way are made.
fn set_path(doc: &mut yaml_serde::Value, path: &str, value: Option<yaml_serde::Value>) {
    let parts: Vec<&str> = path.split('.').collect();
    let mut node = doc;
    for (i, part) in parts.iter().enumerate() {
        let last = i + 1 == parts.len();
        let (key, item) = match part.strip_suffix("[]") {
            Some(key) => (key, !last),
            None => (*part, false),
        };
        let map = node.as_mapping_mut().expect("a mapping on the way");
        if last {
            match value {
                Some(v) => {
                    map.insert(key.into(), v);
                }
                None => {
                    map.remove(key);
                }
            }
            return;
        }
        if map.get(key).is_none() {
            map.insert(key.into(), yaml_serde::Mapping::new().into());
        }
        node = map.get_mut(key).expect("just made");
        if item {
            node = node.get_mut(0).expect("the base file has an item there");
        }
    }
}

#[test]
fn windows_sizes_and_durations_have_the_same_shape_for_both() {
    let validator = schema_validator();
    type File = fn(&str) -> String;
    let files: [(&str, File); 4] = [
        ("routes[].limits[].window", |v| {
            format!(
                "listen: 127.0.0.1:0\nroutes: [ {{ name: a, respond: {{}}, limits: [ {{ name: l, key: ip, limit: 1, window: {v} }} ] }} ]\n"
            )
        }),
        ("plans.*[].window", |v| {
            format!(
                "listen: 127.0.0.1:0\nplans: {{ free: [ {{ name: l, limit: 1, window: {v} }} ] }}\nroutes: [ {{ name: a, respond: {{}} }} ]\n"
            )
        }),
        ("server.max_body_size", |v| {
            format!(
                "listen: 127.0.0.1:0\nserver: {{ max_body_size: {v} }}\nroutes: [ {{ name: a, respond: {{}} }} ]\n"
            )
        }),
        ("api_keys.cache", |v| {
            format!(
                "listen: 127.0.0.1:0\napi_keys: {{ cache: {v} }}\nroutes: [ {{ name: a, respond: {{}} }} ]\n"
            )
        }),
    ];
    let values = [
        "1m",
        "month",
        "10s",
        "\"5 minutes\"",
        "5",
        "monthly",
        "1MiB",
        "\"8 KiB\"",
        "1048576",
        "10MB",
    ];
    for (field, file) in files {
        for value in values {
            let src = file(value);
            let loader = parse_str(&src).is_ok();
            let schema = schema_errors(&validator, &src).is_empty();
            assert_eq!(
                loader, schema,
                "{field}: {value}: loader accepts: {loader}, schema accepts: {schema}"
            );
        }
    }
}

/// `sync` mode: `store.redis.sync` is the default of every
/// sliding- and fixed-window limit (calendar months too), a limit's own
/// `sync` overrides it (`off` opts out), plan limits take it as route
/// limits do, and gcra and sliding_log limits stay exact.
#[test]
fn sync_intervals_resolve_per_limit() {
    let src = r#"listen: 127.0.0.1:0
store:
  redis: { url: "redis://redis.test:6379", sync: 100ms }
plans:
  free: [ { name: per_minute, limit: 100, window: 1m, sync: 250ms }, { name: per_day, limit: 1000, window: 1d } ]
api_keys: { unknown: free }
routes:
  - name: api
    respond: {}
    limits:
      - { name: a, key: ip, limit: 5, window: 1m }
      - { name: b, key: ip, limit: 5, window: 1m, algorithm: fixed_window, sync: 1s }
      - { name: c, key: ip, limit: 5, window: month }
      - { name: d, key: ip, limit: 5, window: 1m, sync: off }
      - { name: e, key: ip, limit: 5, window: 1m, algorithm: gcra }
      - { name: f, key: ip, limit: 5, window: 1m, algorithm: sliding_log }
      - { name: g, key: api_key, plan: true }
"#;
    let c = valid(src);
    assert_eq!(
        c.store.redis.as_ref().and_then(|r| r.sync),
        Some(Duration::from_millis(100))
    );
    let ms = |d: Option<Duration>| d.map(|d| d.as_millis() as u64);
    let sync: Vec<Option<u64>> = c.routes[0].limits.iter().map(|l| ms(l.sync)).collect();
    assert_eq!(
        sync,
        [Some(100), Some(1000), Some(100), None, None, None, None]
    );
    let plan: Vec<Option<u64>> = c.plans[0].limits.iter().map(|l| ms(l.sync)).collect();
    assert_eq!(plan, [Some(250), Some(100)]);
    // Without store.redis.sync, limits are exact unless they say otherwise.
    let c = valid(&src.replace(", sync: 100ms", ""));
    let sync: Vec<Option<u64>> = c.routes[0].limits.iter().map(|l| ms(l.sync)).collect();
    assert_eq!(sync, [None, Some(1000), None, None, None, None, None]);
}

#[test]
fn sync_is_refused_where_it_cannot_count() {
    let src = r#"listen: 127.0.0.1:0
store:
  redis: { url: "redis://redis.test:6379", sync: 2s }
routes:
  - name: api
    respond: {}
    limits:
      - { name: a, key: ip, limit: 5, window: 1m, algorithm: gcra, sync: 100ms }
      - { name: b, key: ip, limit: 5, window: 1m, algorithm: sliding_log, sync: 100ms }
      - { name: c, key: ip, limit: 5, window: 1s }
      - { name: d, key: ip, limit: 5, window: 1m, sync: 1m }
      - { name: e, key: ip, limit: 5, window: 1m, sync: 5ms }
      - { name: f, key: ip, limit: 5, window: 1m, sync: sometimes }
      - { name: g, key: api_key, plan: true, sync: 100ms }
"#;
    assert_eq!(
        errors(src),
        [
            "routes[0].limits[0].sync: sync applies to sliding_window and fixed_window limits, whose counts gateways can add up; a gcra limit is decided in Redis on every request: remove sync, or count with sliding_window (line 8, col 74)",
            "routes[0].limits[1].sync: sync applies to sliding_window and fixed_window limits, whose counts gateways can add up; a sliding_log limit is decided in Redis on every request: remove sync, or count with sliding_window (line 9, col 81)",
            "routes[0].limits[2].window: is not longer than store.redis.sync (2s); give this limit sync: off, or a shorter sync (line 10, col 47)",
            "routes[0].limits[3].sync: 60s is not shorter than the limit's window (60s); sync much more often than the window, e.g. 100ms (line 11, col 57)",
            r#"routes[0].limits[4].sync: "5ms" is out of range; sync takes 10ms to 1m, e.g. 100ms, or off (line 12, col 57)"#,
            r#"routes[0].limits[5].sync: "sometimes" is not a duration; write a whole number and a unit (ms, s, m, h or d), e.g. 5m or 300s, or off (line 13, col 57)"#,
            "routes[0].limits[6].sync: a limit with plan: true takes its limits from the caller's plan; set sync on the plan's limits (line 14, col 52)",
        ]
    );
    // Without Redis there is nothing to sync with.
    assert_eq!(
        error(
            "listen: 127.0.0.1:0\nroutes:\n  - name: api\n    respond: {}\n    limits: [ { name: a, key: ip, limit: 5, window: 1m, sync: 100ms } ]\n"
        ),
        "routes[0].limits[0].sync: sync shares counts through Redis, and this file has no store.redis; remove sync (line 5, col 63)"
    );
    assert_eq!(
        error(
            "listen: 127.0.0.1:0\nstore: { redis: { url: \"redis://redis.test:6379\", sync: 0ms } }\nroutes: [ { name: r, respond: {} } ]\n"
        ),
        r#"store.redis.sync: "0ms" is out of range; sync takes 10ms to 1m, e.g. 100ms (line 2, col 57)"#
    );
}

#[test]
fn settled_costs_and_byte_quotas_are_checked() {
    let src = r#"
listen: 127.0.0.1:0
routes:
  - name: api
    respond: {}
    limits:
      - { name: a, key: ip, limit: 5, window: 1m, cost: { reserve: 2, from_header: x-tokens-used } }
      - { name: b, key: ip, limit: 5, window: 1m, cost: { reserve: 2 } }
      - { name: c, key: ip, limit: 5, window: 1m, cost: { from_header: "bad header" } }
      - { name: d, key: ip, limit: 5, window: 1m, cost: { reserve: 1, from_header: x, from_trailer: y } }
      - { name: e, key: ip, limit: 5, window: 1m, algorithm: sliding_log, bytes: response }
      - { name: f, key: ip, limit: 5, window: 1m, bytes: sideways }
      - { name: g, key: ip, limit: 5, window: 1m, bytes: both, cost: 3 }
      - { name: h, key: ip, limit: 5, window: 1m, cost: { reserve: 1, from: x } }
"#;
    let errs = errors(src);
    assert_eq!(errs.len(), 7, "{errs:#?}");
    for (i, want) in [
        (
            1,
            "routes[0].limits[1].cost: a settled cost names where the final cost comes from",
        ),
        (
            2,
            "routes[0].limits[2].cost.from_header: \"bad header\" is not a valid header name",
        ),
        (
            3,
            "routes[0].limits[3].cost.from_trailer: a cost is settled from one place",
        ),
        (
            4,
            "routes[0].limits[4].bytes: a sliding_log limit cannot be settled",
        ),
        (5, "routes[0].limits[5].bytes:"),
        (
            6,
            "routes[0].limits[6].bytes: a byte quota reserves the request's Content-Length",
        ),
        (7, "routes[0].limits[7].cost: unknown field `from`"),
    ] {
        assert!(
            errs.iter()
                .any(|e| e.starts_with(want) && e.contains("(line ")),
            "limit {i}: no error starting {want:?} in {errs:#?}"
        );
    }
    let schema = tollgate::config::schema::json();
    for field in ["from_header", "from_trailer", "reserve", "\"bytes\""] {
        assert!(schema.contains(field), "schema lacks {field}");
    }
}

#[test]
fn token_limits_read_the_bodies() {
    use tollgate::config::KeySource;
    use tollgate::limit::settle::Source;
    let c = valid(
        r#"
listen: 127.0.0.1:0
routes:
  - name: chat
    match: { path_prefix: /v1/ }
    upstream: http://127.0.0.1:8000
    limits:
      - { name: rpm, key: api_key, limit: 60, window: 1m }
      - { name: tpm, key: [ api_key, "json:model" ], limit: 100000, window: 1m, algorithm: fixed_window,
          cost: { reserve: { json: max_tokens, default: 1000 }, from_body: openai } }
      - { name: month, key: "json:user | api_key", limit: 10000000000, window: month,
          cost: { reserve: 500, from_body: anthropic } }
      - { name: sum, key: api_key, limit: 10000000000, window: 30d, algorithm: fixed_window,
          cost: { reserve: 1, from_body: { json: "usage.input_tokens + usage.output_tokens", stream: sum } } }
"#,
    );
    let limits = &c.routes[0].limits;
    let tpm = &limits[1];
    assert_eq!(tpm.key.parts.len(), 2);
    assert!(matches!(&tpm.key.parts[1][..], [KeySource::Json(f)] if &*f.name == "model"));
    assert_eq!(tpm.cost, Some(1000));
    assert_eq!(
        tpm.reserve_from.as_ref().map(|f| &*f.name),
        Some("max_tokens")
    );
    assert!(matches!(&tpm.settle, Some(Source::Body(u)) if &*u.written == "openai"));
    assert!(matches!(&limits[2].key.parts[0][0], KeySource::Json(f) if &*f.name == "user"));
    assert_eq!(limits[2].limit.get(), 10_000_000_000);
    assert_eq!(limits[2].cost, Some(500));
    assert!(matches!(&limits[3].settle, Some(Source::Body(u)) if u.written.contains("sum")));

    let errs = errors(
        r#"
listen: 127.0.0.1:0
routes:
  - name: api
    respond: {}
    limits:
      - { name: a, key: "json:", limit: 5, window: 1m }
      - { name: b, key: ip, limit: 5, window: 1m, cost: { reserve: { json: max_tokens }, from_body: openai } }
      - { name: c, key: ip, limit: 5, window: 1m, cost: { reserve: 1, from_body: gemini } }
      - { name: d, key: ip, limit: 5, window: 1m, cost: { reserve: 1, from_body: { json: "usage..x" } } }
      - { name: e, key: ip, limit: 5, window: 1m, cost: { reserve: 1, from_body: { json: usage.t, stream: max } } }
      - { name: f, key: ip, limit: 5, window: 1m, cost: { reserve: 1, from_header: x, from_body: openai } }
      - { name: g, key: ip, limit: 10000000000, window: 1h, cost: { reserve: 1, from_body: openai } }
      - { name: h, key: ip, limit: 5, window: 1m, cost: { reserve: { json: "a b", default: 1 }, from_body: openai } }
"#,
    );
    for (i, want) in [
        (0, "routes[0].limits[0].key: \"\" is not a JSON field"),
        (
            1,
            "routes[0].limits[1].cost.reserve: missing required field \"default\"",
        ),
        (
            2,
            "routes[0].limits[2].cost.from_body: unknown preset \"gemini\"",
        ),
        (
            3,
            "routes[0].limits[3].cost.from_body.json: \"usage..x\" is not a sum of JSON paths",
        ),
        (
            4,
            "routes[0].limits[4].cost.from_body.stream: unknown value \"max\"; expected one of last, sum (line 11, col 107)",
        ),
        (
            5,
            "routes[0].limits[5].cost.from_body: a cost is settled from one place",
        ),
        (6, "routes[0].limits[6].limit: is too large for this window"),
        (
            7,
            "routes[0].limits[7].cost.reserve.json: \"a b\" is not a JSON field",
        ),
    ] {
        assert!(
            errs.iter()
                .any(|e| e.starts_with(want) && e.contains("(line ")),
            "limit {i}: no error starting {want:?} in {errs:#?}"
        );
    }
    let schema = tollgate::config::schema::json();
    for field in ["from_body", "\"stream\"", "anthropic"] {
        assert!(schema.contains(field), "schema lacks {field}");
    }
}

#[test]
fn startup_wait() {
    let redis = |extra: &str| {
        format!(
            "listen: 127.0.0.1:1\nstore: {{ redis: {{ url: \"redis://h:1\"{extra} }} }}\nroutes: [ {{ name: a, respond: {{}} }} ]\n"
        )
    };
    let wait = |c: Config| c.store.redis.expect("redis").startup_wait;
    assert_eq!(wait(valid(&redis(""))), Duration::from_secs(2));
    assert_eq!(wait(valid(&redis(", startup_wait: 0s"))), Duration::ZERO);
    assert_eq!(
        error(&redis(", startup_wait: 2m")),
        r#"store.redis.startup_wait: "2m" is longer than 1m; write at most 1m (line 2, col 53)"#
    );
}

#[test]
fn a_pool_maps_onto_the_model() {
    let c = valid(
        "listen: 127.0.0.1:0
upstreams:
  api:
    targets:
      - http://10.0.0.1:9000
      - { url: http://10.0.0.2:9000, weight: 2 }
      - http://api.internal:9000
    balance: hash
    hash_key: \"header:x-user\"
    health: { path: /healthz, interval: 5s, timeout: 1s, unhealthy_after: 3, healthy_after: 2 }
    eject: { after: 4, for: 10s, max_percent: 30 }
    retries: 2
    per_try_timeout: 2s
routes:
  - name: api
    upstream: api
  - name: one
    upstream: http://127.0.0.1:0
",
    );
    let pool = &c.upstreams[0];
    assert_eq!(&*pool.name, "api");
    let weights: Vec<u32> = pool.targets.iter().map(|t| t.weight).collect();
    assert_eq!(weights, [1, 2, 1]);
    assert_eq!(pool.targets[2].host, "api.internal");
    assert_eq!(pool.balance, tollgate::config::Balance::Hash);
    assert_eq!(
        pool.hash_key.as_ref().map(|k| k.parts.clone()),
        Some(vec![vec![KeySource::Header(header("x-user"))]])
    );
    let health = pool.health.as_ref().expect("health");
    assert_eq!((health.unhealthy_after, health.healthy_after), (3, 2));
    assert_eq!(pool.eject.after, 4);
    assert_eq!(pool.eject.duration, Duration::from_secs(10));
    assert_eq!(pool.eject.max_percent, 30);
    assert_eq!(
        (pool.retries, pool.per_try_timeout),
        (2, Some(Duration::from_secs(2)))
    );
    let Action::Upstream(up) = &c.routes[0].action else {
        panic!("an upstream route")
    };
    assert_eq!(up.pool.as_ref().map(|p| &*p.name), Some("api"));
    let Action::Upstream(up) = &c.routes[1].action else {
        panic!("an upstream route")
    };
    assert!(up.pool.is_none());
}

#[test]
fn pool_mistakes_are_named_with_their_place() {
    let src = "listen: 127.0.0.1:0
upstreams:
  empty:
    targets: []
  heavy:
    targets:
      - { url: http://10.0.0.1:9000, weight: 0 }
  hashed:
    targets: [http://10.0.0.1:9000]
    balance: hash
    hash_key: \"cookie:sid\"
routes:
  - name: api
    upstream: apii
";
    assert_eq!(
        errors(src),
        [
            "upstreams.empty.targets: is empty; a pool needs at least one target (line 4, col 14)",
            "upstreams.heavy.targets[0].weight: must be at least 1; leave the target out to send it nothing (line 7, col 46)",
            r#"upstreams.hashed.hash_key: unknown key source "cookie:sid"; expected ip, api_key, user, header:NAME, json:FIELD or route (line 11, col 15)"#,
            r#"routes[0].upstream: "apii" is neither a URL nor a pool under upstreams (the pools are empty, hashed, heavy); write e.g. http://127.0.0.1:9000 or a pool's name (line 14, col 15)"#,
        ]
    );
}
