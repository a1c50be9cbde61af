//! The limits operators configure, end to end: algorithms through the
//! gateway, costs, header modes and the deny cache — real gateways, a real
//! upstream-less `respond` route and a real `redis-server`.

#[path = "support/mod.rs"]
mod support;

#[path = "limits/concurrency.rs"]
mod concurrency;
#[path = "limits/delay.rs"]
mod delay;
#[path = "limits/held.rs"]
mod held;
#[path = "limits/settled.rs"]
mod settled;
#[path = "limits/tokens.rs"]
mod tokens;
#[path = "limits/written.rs"]
mod written;

use std::sync::Arc;

use http::StatusCode;
use tollgate::clock::ManualClock;

use support::gateway::{Gateway, get, send};
use support::redis::{RedisServer, command_calls};

/// A fixed instant at the start of a minute (and of a 10 s window).
const T0: u64 = 1_800_000_000_000;

fn clock() -> Arc<ManualClock> {
    Arc::new(ManualClock::new(T0))
}

/// One `respond` route at `/r` with `limits` (a YAML flow list), cost
/// `cost`, headers `headers`, and `store` (YAML, may be empty).
fn yaml(store: &str, headers: &str, cost: u64, limits: &str) -> String {
    format!(
        r#"
listen: 127.0.0.1:0
{store}
headers: {headers}
routes:
  - name: r
    match: {{ path_prefix: /r }}
    respond: {{ status: 200, body: "ok\n" }}
    cost: {cost}
    limits: {limits}
"#
    )
}

/// A `store:` block (YAML) for the Redis at `url`, with `on_error`.
fn redis_store(url: &str, on_error: &str) -> String {
    format!("store:\n  redis: {{ url: \"{url}\", timeout: 500ms }}\n  on_error: {on_error}\n")
}

#[tokio::test]
async fn a_denied_caller_costs_redis_nothing_until_retry_after() {
    let redis = RedisServer::start().await;
    let mut conn = redis.connection().await;
    let clock = clock();
    let limits = "[ { name: five, key: ip, limit: 5, window: 10s } ]";
    let gw = Gateway::start_with_clock(
        &yaml(&redis_store(&redis.url(), "local"), "ietf", 1, limits),
        clock.clone(),
    )
    .await;
    for _ in 0..5 {
        assert_eq!(send(gw.addr, get("/r", &[])).await.status, StatusCode::OK);
        clock.advance(1_000);
    }
    // Denied by Redis: five in window 0 at e = 5 s; 7 s to wait (see the
    // sliding-window arithmetic in tests/gateway.rs).
    let before = command_calls(&mut conn, "evalsha").await;
    let first = send(gw.addr, get("/r", &[])).await;
    assert_eq!(first.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(first.header("retry-after"), Some("7"));
    assert_eq!(command_calls(&mut conn, "evalsha").await, before + 1);

    // 1,000 more from the same caller before T: answered by the gateway.
    for i in 0..1_000u64 {
        if i % 100 == 0 {
            clock.advance(50);
        }
        let r = send(gw.addr, get("/r", &[])).await;
        assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    }
    assert_eq!(
        command_calls(&mut conn, "evalsha").await,
        before + 1,
        "denied requests before Retry-After must not reach Redis"
    );
    let metrics = gw.inner.metrics().render();
    assert!(
        metrics.contains("tollgate_deny_cache_hits_total 1000\n"),
        "deny-cache hits are exported:\n{metrics}"
    );
    // The replayed answer counts down like Redis's would: 7 s − 0.5 s.
    let r = send(gw.addr, get("/r", &[])).await;
    assert_eq!(r.header("retry-after"), Some("7"));
    assert_eq!(r.header("ratelimit"), Some(r#""five";r=0;t=7"#));
    clock.advance(1_000);
    let r = send(gw.addr, get("/r", &[])).await;
    assert_eq!(r.header("retry-after"), Some("6"));

    // At T (7 s after the first denial) the request reaches Redis and is
    // admitted.
    clock.set(T0 + 5_000 + 7_000);
    let r = send(gw.addr, get("/r", &[])).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(command_calls(&mut conn, "evalsha").await, before + 2);
}

#[tokio::test]
async fn the_deny_cache_never_answers_for_a_cheaper_request() {
    let redis = RedisServer::start().await;
    let mut conn = redis.connection().await;
    // Two routes on one shared counter, so the same caller sends requests
    // that differ only in cost: /dear costs 3, /cheap costs 1.
    let limit =
        "{ name: ten, key: ip, limit: 10, window: 1m, algorithm: fixed_window, share: ten }";
    let gw = Gateway::start_with_clock(
        &format!(
            r#"
listen: 127.0.0.1:0
{store}
headers: ietf
routes:
  - name: dear
    match: {{ path_prefix: /dear }}
    respond: {{ status: 200, body: "ok\n" }}
    cost: 3
    limits: [ {limit} ]
  - name: cheap
    match: {{ path_prefix: /cheap }}
    respond: {{ status: 200, body: "ok\n" }}
    cost: 1
    limits: [ {limit} ]
"#,
            store = redis_store(&redis.url(), "local")
        ),
        clock(),
    )
    .await;
    for _ in 0..3 {
        assert_eq!(
            send(gw.addr, get("/dear", &[])).await.status,
            StatusCode::OK
        );
    }
    // 9 used of 10: Redis denies a cost-3 request, and the gateway
    // remembers the denial...
    assert_eq!(
        send(gw.addr, get("/dear", &[])).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    let before = command_calls(&mut conn, "evalsha").await;
    assert_eq!(
        send(gw.addr, get("/dear", &[])).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        command_calls(&mut conn, "evalsha").await,
        before,
        "the cost-3 denial is answered from the deny cache"
    );
    // ...which does not answer for a cost-1 request on the same key: that
    // one fits, and only Redis can say so.
    let r = send(gw.addr, get("/cheap", &[])).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(command_calls(&mut conn, "evalsha").await, before + 1);
}

#[tokio::test]
async fn a_cost_above_the_limit_is_refused_for_good() {
    let limits = "[ { name: small, key: ip, limit: 5, window: 10s } ]";
    let gw = Gateway::start_with_clock(&yaml("", "ietf", 6, limits), clock()).await;
    let r = send(gw.addr, get("/r", &[])).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.header("retry-after"), None);
    assert_eq!(r.header("content-type"), Some("application/problem+json"));
    assert!(
        r.text().contains(
            r#""detail":"The request costs more than the limit small allows in a window; it can never be admitted""#
        ),
        "{}",
        r.text()
    );
}

#[tokio::test]
async fn every_algorithm_limits_through_the_gateway_on_redis() {
    let redis = RedisServer::start().await;
    for (alg, admitted) in [
        ("sliding_window", 3),
        ("fixed_window", 3),
        ("sliding_log", 3),
        ("gcra", 3),
        ("gcra, burst: 1", 1),
    ] {
        let limits =
            format!("[ {{ name: three, key: ip, limit: 3, window: 1m, algorithm: {alg} }} ]");
        let gw = Gateway::start_with_clock(
            &yaml(&redis_store(&redis.url(), "local"), "ietf", 1, &limits),
            clock(),
        )
        .await;
        let mut ok = 0;
        for _ in 0..6 {
            if send(gw.addr, get("/r", &[])).await.status == StatusCode::OK {
                ok += 1;
            }
        }
        assert_eq!(ok, admitted, "{alg}");
        gw.stop().await;
        let mut conn = redis.connection().await;
        let _: () = redis::cmd("FLUSHALL").query_async(&mut conn).await.unwrap();
    }
}

#[tokio::test]
async fn daily_and_monthly_quotas_sit_beside_a_per_second_limit() {
    let redis = RedisServer::start().await;
    let limits = "[ { name: per_second, key: ip, limit: 10, window: 1s }, { name: per_day, key: ip, limit: 3, window: 1d, algorithm: fixed_window }, { name: per_month, key: ip, limit: 5, window: month } ]";
    // T0 is 2027-01-15T08:00:00Z.
    let clock = clock();
    let gw = Gateway::start_with_clock(
        &yaml(&redis_store(&redis.url(), "local"), "ietf", 1, limits),
        clock.clone(),
    )
    .await;
    let r = send(gw.addr, get("/r", &[])).await;
    assert_eq!(
        r.header("ratelimit-policy"),
        Some(r#""per_second";q=10;w=1, "per_day";q=3;w=86400, "per_month";q=5;w=2592000"#)
    );
    // The day ends at midnight UTC (16 h), the month on Feb 1 (16 d 16 h).
    assert_eq!(
        r.header("ratelimit"),
        Some(r#""per_second";r=9;t=2, "per_day";r=2;t=57600, "per_month";r=4;t=1440000"#)
    );
    send(gw.addr, get("/r", &[])).await;
    send(gw.addr, get("/r", &[])).await;
    let r = send(gw.addr, get("/r", &[])).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.header("retry-after"), Some("57600"));
    // Next day: two more fit the month, then the month is spent.
    clock.advance(57_600_000);
    assert_eq!(send(gw.addr, get("/r", &[])).await.status, StatusCode::OK);
    assert_eq!(send(gw.addr, get("/r", &[])).await.status, StatusCode::OK);
    let r = send(gw.addr, get("/r", &[])).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.header("retry-after"), Some("1382400"));
}

#[tokio::test]
async fn github_headers_describe_the_limit_closest_to_exhaustion() {
    let limits = "[ { name: per_minute, key: ip, limit: 100, window: 1m }, { name: per_second, key: ip, limit: 2, window: 1s, algorithm: fixed_window } ]";
    let clock = clock();
    let gw = Gateway::start_with_clock(&yaml("", "github", 1, limits), clock.clone()).await;
    let r = send(gw.addr, get("/r", &[])).await;
    assert_eq!(r.status, StatusCode::OK);
    // per_second has 1 of 2 left (50 %), per_minute 99 of 100.
    assert_eq!(r.header("x-ratelimit-limit"), Some("2"));
    assert_eq!(r.header("x-ratelimit-remaining"), Some("1"));
    assert_eq!(r.header("x-ratelimit-used"), Some("1"));
    assert_eq!(r.header("x-ratelimit-resource"), Some("per_second"));
    // Epoch seconds: the fixed window ends at T0 + 1 s.
    let reset = (T0 + 1_000) / 1_000;
    assert_eq!(
        r.header("x-ratelimit-reset"),
        Some(reset.to_string().as_str())
    );
    assert_eq!(r.header("ratelimit"), None);
    assert_eq!(r.header("ratelimit-policy"), None);
    send(gw.addr, get("/r", &[])).await;
    let r = send(gw.addr, get("/r", &[])).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.header("x-ratelimit-resource"), Some("per_second"));
    assert_eq!(r.header("x-ratelimit-remaining"), Some("0"));
    assert_eq!(r.header("retry-after"), Some("1"));
}

#[tokio::test]
async fn legacy_headers() {
    let limits = "[ { name: per_10s, key: ip, limit: 3, window: 10s, algorithm: sliding_log } ]";
    let clock = clock();
    let gw = Gateway::start_with_clock(&yaml("", "legacy", 1, limits), clock.clone()).await;
    let r = send(gw.addr, get("/r", &[])).await;
    assert_eq!(r.header("ratelimit-limit"), Some("3"));
    assert_eq!(r.header("ratelimit-remaining"), Some("2"));
    assert_eq!(r.header("ratelimit-reset"), Some("10"));
    assert_eq!(r.header("ratelimit"), None);
    assert_eq!(r.header("x-ratelimit-limit"), None);
    clock.advance(2_500);
    send(gw.addr, get("/r", &[])).await;
    send(gw.addr, get("/r", &[])).await;
    let r = send(gw.addr, get("/r", &[])).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    // The first unit leaves at T0 + 10 s: 7.5 s from now, rounded up.
    assert_eq!(r.header("ratelimit-reset"), Some("8"));
    assert_eq!(r.header("retry-after"), Some("8"));
}

// --- plans ------------------------------------------------------------------

/// Plans free (2/min) and pro (5/min, and 1000/day), a route whose
/// per-caller limit comes from the plan, and `api_keys` as given.
fn plans_yaml(store: &str, api_keys: &str) -> String {
    format!(
        r#"
listen: 127.0.0.1:0
{store}
plans:
  free: [ {{ name: per_minute, limit: 2, window: 1m }} ]
  pro:
    - {{ name: per_minute, limit: 5, window: 1m }}
    - {{ name: per_day, limit: 1000, window: 1d, algorithm: fixed_window }}
api_keys: {api_keys}
routes:
  - name: api
    match: {{ path_prefix: /api }}
    respond: {{ status: 200, body: "ok\n" }}
    limits: [ {{ name: per_caller, key: api_key | ip, plan: true }} ]
"#
    )
}

/// How many of `n` requests with API key `key` are admitted.
async fn admitted(gw: &Gateway, key: Option<&str>, n: usize) -> usize {
    let mut ok = 0;
    for _ in 0..n {
        let headers: Vec<(&str, &str)> = key.map(|k| ("x-api-key", k)).into_iter().collect();
        if send(gw.addr, get("/api/x", &headers)).await.status == StatusCode::OK {
            ok += 1;
        }
    }
    ok
}

#[tokio::test]
async fn static_keys_select_their_plan_and_unknown_keys_the_unknown_plan() {
    let gw = Gateway::start_with_clock(
        &plans_yaml("", "{ keys: { k-pro: pro, k-free: free }, unknown: free }"),
        clock(),
    )
    .await;
    let r = send(gw.addr, get("/api/x", &[("x-api-key", "k-pro")])).await;
    assert_eq!(
        r.header("ratelimit-policy"),
        Some(r#""per_minute";q=5;w=60, "per_day";q=1000;w=86400"#)
    );
    assert_eq!(admitted(&gw, Some("k-pro"), 10).await, 4);
    assert_eq!(admitted(&gw, Some("k-free"), 10).await, 2);
    // Unknown keys get the free plan, each key its own bucket.
    let r = send(gw.addr, get("/api/x", &[("x-api-key", "nobody")])).await;
    assert_eq!(
        r.header("ratelimit-policy"),
        Some(r#""per_minute";q=2;w=60"#)
    );
    assert_eq!(admitted(&gw, Some("nobody"), 10).await, 1);
    // No key at all: the unknown plan, by IP.
    assert_eq!(admitted(&gw, None, 10).await, 2);
}

#[tokio::test]
async fn unknown_keys_can_be_rejected() {
    let gw = Gateway::start_with_clock(
        &plans_yaml("", "{ keys: { k-pro: pro }, unknown: reject }"),
        clock(),
    )
    .await;
    for headers in [vec![("x-api-key", "wrong")], vec![]] {
        let r = send(gw.addr, get("/api/x", &headers)).await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED);
        assert_eq!(r.header("content-type"), Some("application/problem+json"));
        assert_eq!(r.header("www-authenticate"), Some("Bearer"));
        assert!(r.text().contains("\"status\":401"), "{}", r.text());
    }
    // Authorization: Bearer works as well as the header.
    let r = send(gw.addr, get("/api/x", &[("authorization", "Bearer k-pro")])).await;
    assert_eq!(r.status, StatusCode::OK);
}

#[tokio::test]
async fn a_key_added_to_the_redis_hash_gets_its_plan_within_the_cache_time() {
    let redis = RedisServer::start().await;
    let mut conn = redis.connection().await;
    let clock = clock();
    let gw = Gateway::start_with_clock(
        &plans_yaml(
            &redis_store(&redis.url(), "local"),
            "{ redis_hash: true, cache: 5s, unknown: free }",
        ),
        clock.clone(),
    )
    .await;
    // Not in the hash yet: the free plan.
    let r = send(gw.addr, get("/api/x", &[("x-api-key", "k-new")])).await;
    assert_eq!(
        r.header("ratelimit-policy"),
        Some(r#""per_minute";q=2;w=60"#)
    );

    // The operator adds the key while the gateway runs.
    let _: () = redis::cmd("HSET")
        .arg("tg:keys")
        .arg("k-new")
        .arg("pro")
        .query_async(&mut conn)
        .await
        .unwrap();
    // Within the cache time the old answer may still be used ...
    clock.advance(4_999);
    let r = send(gw.addr, get("/api/x", &[("x-api-key", "k-new")])).await;
    assert_eq!(
        r.header("ratelimit-policy"),
        Some(r#""per_minute";q=2;w=60"#)
    );
    // ... and once it has passed, the new plan applies.
    clock.advance(1);
    let r = send(gw.addr, get("/api/x", &[("x-api-key", "k-new")])).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(
        r.header("ratelimit-policy"),
        Some(r#""per_minute";q=5;w=60, "per_day";q=1000;w=86400"#)
    );
    // Two used of pro's five (the counts carry over between plans).
    assert_eq!(admitted(&gw, Some("k-new"), 10).await, 2);

    // A busy key costs one HGET per cache period, not one per request.
    let before = command_calls(&mut conn, "hget").await;
    admitted(&gw, Some("k-new"), 20).await;
    assert_eq!(command_calls(&mut conn, "hget").await, before);

    // Re-planned down: free again after the cache time.
    let _: () = redis::cmd("HSET")
        .arg("tg:keys")
        .arg("k-new")
        .arg("free")
        .query_async(&mut conn)
        .await
        .unwrap();
    clock.advance(5_000);
    let r = send(gw.addr, get("/api/x", &[("x-api-key", "k-new")])).await;
    assert_eq!(
        r.header("ratelimit-policy"),
        Some(r#""per_minute";q=2;w=60"#)
    );
}

// --- users from JWTs --------------------------------------------------------

const SECRET: &str = "a-test-secret-that-is-32-bytes-long!";

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn claims(sub: &str, exp: u64) -> serde_json::Value {
    serde_json::json!({ "sub": sub, "exp": exp })
}

fn hs256(secret: &[u8], claims: &serde_json::Value) -> String {
    use jsonwebtoken::{EncodingKey, Header, encode};
    encode(
        &Header::default(),
        claims,
        &EncodingKey::from_secret(secret),
    )
    .unwrap()
}

fn signed(
    alg: jsonwebtoken::Algorithm,
    key: &jsonwebtoken::EncodingKey,
    claims: &serde_json::Value,
) -> String {
    jsonwebtoken::encode(&jsonwebtoken::Header::new(alg), claims, key).unwrap()
}

/// base64url without padding (RFC 7515 §2), for hand-made tokens.
fn b64url(data: &[u8]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..=chunk.len() {
            out.push(ABC[((n >> (18 - 6 * i)) & 63) as usize] as char);
        }
    }
    out
}

/// A route limited to one request per hour per `user | ip`.
fn jwt_yaml(jwt: &str) -> String {
    format!(
        r#"
listen: 127.0.0.1:0
users: {{ jwt: {jwt} }}
routes:
  - name: r
    match: {{ path_prefix: /r }}
    respond: {{ status: 200, body: "ok\n" }}
    limits: [ {{ name: one, key: user | ip, limit: 1, window: 1h }} ]
"#
    )
}

async fn status_with_token(gw: &Gateway, from: &str, token: &str) -> StatusCode {
    let auth = format!("Bearer {token}");
    support::gateway::send_from(
        from.parse().unwrap(),
        gw.addr,
        get("/r", &[("authorization", &auth)]),
    )
    .await
    .status
}

#[tokio::test]
async fn a_valid_hs256_token_limits_by_its_sub() {
    let gw =
        Gateway::start_with_clock(&jwt_yaml(&format!("{{ secret: \"{SECRET}\" }}")), clock()).await;
    let exp = now_secs() + 600;
    let alice = hs256(SECRET.as_bytes(), &claims("alice", exp));
    let bob = hs256(SECRET.as_bytes(), &claims("bob", exp));
    // Same IP, different users: separate buckets.
    assert_eq!(
        status_with_token(&gw, "127.0.0.1", &alice).await,
        StatusCode::OK
    );
    assert_eq!(
        status_with_token(&gw, "127.0.0.1", &bob).await,
        StatusCode::OK
    );
    // Alice from another IP is still alice.
    assert_eq!(
        status_with_token(&gw, "127.0.0.2", &alice).await,
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test]
async fn forged_expired_and_unsigned_tokens_never_become_a_user() {
    let gw =
        Gateway::start_with_clock(&jwt_yaml(&format!("{{ secret: \"{SECRET}\" }}")), clock()).await;
    let exp = now_secs() + 600;
    let forged = |sub: &str| hs256(b"another-secret-that-is-also-32-bytes!", &claims(sub, exp));
    let expired = |sub: &str| hs256(SECRET.as_bytes(), &claims(sub, now_secs() - 3_600));
    let unsigned = |sub: &str| {
        format!(
            "{}.{}.",
            b64url(br#"{"alg":"none","typ":"JWT"}"#),
            b64url(claims(sub, exp).to_string().as_bytes())
        )
    };
    let tampered = |sub: &str| {
        // A valid token for "x" whose payload is swapped for another sub.
        let good = hs256(SECRET.as_bytes(), &claims("x", exp));
        let parts: Vec<&str> = good.split('.').collect();
        format!(
            "{}.{}.{}",
            parts[0],
            b64url(claims(sub, exp).to_string().as_bytes()),
            parts[2]
        )
    };
    type Maker<'a> = &'a dyn Fn(&str) -> String;
    let makers: [(&str, Maker<'_>); 4] = [
        ("forged", &forged),
        ("expired", &expired),
        ("alg none", &unsigned),
        ("tampered", &tampered),
    ];
    for (i, (what, make)) in makers.iter().enumerate() {
        // Each kind from its own IP. Were the token believed, every new sub
        // would get a fresh bucket; it is not, so the chain falls through
        // to the IP, which allows one.
        let from = format!("127.0.1.{}", i + 1);
        assert_eq!(
            status_with_token(&gw, &from, &make("m1")).await,
            StatusCode::OK,
            "{what}"
        );
        assert_eq!(
            status_with_token(&gw, &from, &make("m2")).await,
            StatusCode::TOO_MANY_REQUESTS,
            "{what}: a token that does not verify must not become a user"
        );
    }
}

#[tokio::test]
async fn rs256_and_es256_tokens_verify_with_their_public_keys() {
    use jsonwebtoken::{Algorithm, EncodingKey};
    let dir = env!("CARGO_MANIFEST_DIR");
    let exp = now_secs() + 600;
    for (alg, name, private) in [
        (Algorithm::RS256, "RS256", "rs256"),
        (Algorithm::ES256, "ES256", "es256"),
    ] {
        let yaml = jwt_yaml(&format!(
            "{{ algorithm: {name}, public_key: \"{dir}/tests/fixtures/{private}-public.pem\", claim: uid }}"
        ));
        let gw = Gateway::start_with_clock(&yaml, clock()).await;
        let pem = std::fs::read(format!("{dir}/tests/fixtures/{private}-private.pem")).unwrap();
        let key = match alg {
            Algorithm::RS256 => EncodingKey::from_rsa_pem(&pem).unwrap(),
            _ => EncodingKey::from_ec_pem(&pem).unwrap(),
        };
        let token = |uid: &str| signed(alg, &key, &serde_json::json!({ "uid": uid, "exp": exp }));
        assert_eq!(
            status_with_token(&gw, "127.0.2.1", &token("u1")).await,
            StatusCode::OK,
            "{name}"
        );
        assert_eq!(
            status_with_token(&gw, "127.0.2.1", &token("u2")).await,
            StatusCode::OK,
            "{name}"
        );
        assert_eq!(
            status_with_token(&gw, "127.0.2.2", &token("u1")).await,
            StatusCode::TOO_MANY_REQUESTS,
            "{name}"
        );
        // Algorithm confusion: HS256 signed with the public key as secret.
        let public = std::fs::read(format!("{dir}/tests/fixtures/{private}-public.pem")).unwrap();
        let confused = |uid: &str| hs256(&public, &serde_json::json!({ "uid": uid, "exp": exp }));
        assert_eq!(
            status_with_token(&gw, "127.0.2.3", &confused("c1")).await,
            StatusCode::OK
        );
        assert_eq!(
            status_with_token(&gw, "127.0.2.3", &confused("c2")).await,
            StatusCode::TOO_MANY_REQUESTS,
            "{name}: an HS256 token must not verify against a public key"
        );
        gw.stop().await;
    }
}

// --- a 429 shows every limit without the refused request --------------------

/// A denied request consumes nothing, so on a 429 the `RateLimit`
/// entry of every limit, the ones that did not deny included, shows the
/// count without it — on both stores, and when the deny cache answers.
#[tokio::test]
async fn a_429_shows_every_limit_without_the_refused_request() {
    let redis = RedisServer::start().await;
    let mut conn = redis.connection().await;
    // (cost, burst limit, admitted before the 429, RateLimit on the 429,
    // per_minute once Retry-After has passed). per_minute: 100 per minute;
    // burst: per 10 s. T0 starts both windows.
    let cases = [
        // 3 admitted: per_minute keeps 97. burst: cur 3 + 1 > 3, past the
        // boundary until 3·(w − e') ≤ 2·w: 10 s + ceil(10/3 s).
        (1, 3, 3, r#""per_minute";r=97;t=120, "burst";r=0;t=14"#, 96),
        // 1 admitted at cost 10: per_minute keeps 90. burst: 10 + 10 > 15,
        // 5 left but not 10: 10 s + 10·(10 − 5)/10 s.
        (
            10,
            15,
            1,
            r#""per_minute";r=90;t=120, "burst";r=5;t=15"#,
            80,
        ),
    ];
    for store in [String::new(), redis_store(&redis.url(), "local")] {
        for (cost, burst, admitted, want, after) in cases {
            let limits = format!(
                "[ {{ name: per_minute, key: ip, limit: 100, window: 1m }}, {{ name: burst, key: ip, limit: {burst}, window: 10s }} ]"
            );
            let clock = clock();
            let gw = Gateway::start_with_clock(&yaml(&store, "ietf", cost, &limits), clock.clone())
                .await;
            for _ in 0..admitted {
                assert_eq!(send(gw.addr, get("/r", &[])).await.status, StatusCode::OK);
            }
            let what = if store.is_empty() { "memory" } else { "redis" };
            // The second 429 comes from the deny cache on Redis.
            for n in 0..2 {
                let r = send(gw.addr, get("/r", &[])).await;
                assert_eq!(
                    r.status,
                    StatusCode::TOO_MANY_REQUESTS,
                    "{what}, cost {cost}"
                );
                assert_eq!(
                    r.header("ratelimit"),
                    Some(want),
                    "{what}, cost {cost}, 429 #{n}"
                );
            }
            // Nothing was consumed: after Retry-After the next request is
            // admitted and per_minute counts it after the admitted ones.
            let retry: u64 = want.rsplit("t=").next().unwrap().parse().unwrap();
            clock.advance(retry * 1_000);
            let r = send(gw.addr, get("/r", &[])).await;
            assert_eq!(r.status, StatusCode::OK, "{what}, cost {cost}");
            let counted = format!(r#""per_minute";r={after};"#);
            assert!(
                r.header("ratelimit")
                    .is_some_and(|v| v.starts_with(&counted)),
                "{what}, cost {cost}: {:?}",
                r.header("ratelimit")
            );
            gw.stop().await;
            let _: () = redis::cmd("FLUSHALL").query_async(&mut conn).await.unwrap();
        }
    }
}
