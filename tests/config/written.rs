//! Limits that read as written: `key: route`, `share:`, `exempt:` and
//! `plans_from`, each accepted as the model says and refused, with the
//! reason, where it cannot mean what it says.

use tollgate::config::KeySource;

use super::{errors, valid};

/// One `respond` route per item of `limits` (YAML flow lists), named
/// `a`, `b`, … , after `head` (top-level YAML, may be empty).
fn routes(head: &str, limits: &[&str]) -> String {
    let mut src = format!("listen: 127.0.0.1:0\n{head}routes:\n");
    for (i, l) in limits.iter().enumerate() {
        let name = char::from(b'a' + u8::try_from(i).expect("few routes"));
        src.push_str(&format!(
            "  - name: {name}\n    respond: {{}}\n    limits: {l}\n"
        ));
    }
    src
}

#[test]
fn key_route_is_one_source_standing_alone() {
    let c = valid(&routes(
        "",
        &["[ { name: all, key: route, limit: 1000, window: 1s } ]"],
    ));
    assert_eq!(
        c.routes[0].limits[0].key.parts,
        vec![vec![KeySource::Route]]
    );
    let got = errors(&routes(
        "",
        &[
            "[ { name: a, key: api_key | route, limit: 1, window: 1s } ]",
            "[ { name: b, key: [route, ip], limit: 1, window: 1s } ]",
            "[ { name: c, key: route, plan: true } ]",
        ],
    ));
    assert_eq!(
        got,
        [
            r#"routes[0].limits[0].key: "api_key | route" puts route in a fallback chain; route counts every caller together, so the sources after it would never be read and those before it would count callers apart: write key: route alone (line 5, col 31)"#,
            "routes[1].limits[0].key: route counts every caller together and cannot be part of a compound key (each caller would be counted apart again); write key: route alone, or leave route out (line 8, col 31)",
            "routes[2].limits[0].key: route counts every caller together, and a plan is one caller's; give this limit its own limit and window, or a caller's key (line 11, col 31)",
        ]
    );
}

#[test]
fn a_pool_cannot_hash_on_the_route() {
    let src = "listen: 127.0.0.1:0
upstreams:
  api: { targets: [\"http://127.0.0.1:1\", \"http://127.0.0.1:2\"], balance: hash, hash_key: route }
routes:
  - { name: a, upstream: api }
";
    assert_eq!(
        errors(src),
        [
            "upstreams.api.hash_key: route is the same for every request, so every request would go to one target; hash on a caller's key, e.g. api_key | ip (line 3, col 90)"
        ]
    );
}

#[test]
fn shared_limits_agree_and_count_on_one_counter() {
    let ab = "[ { name: ab, key: ip, limit: 100, window: 1m, share: ab } ]";
    let c = valid(&routes("", &[ab, ab]));
    assert_eq!(c.routes[1].limits[0].share.as_deref(), Some("ab"));
    let got = errors(&routes(
        "",
        &[
            ab,
            "[ { name: ab, key: ip, limit: 200, window: 1m, share: ab } ]",
            "[ { name: x, key: api_key | ip, limit: 100, window: 1m, share: ab } ]",
            "[ { name: y, key: ip, limit: 100, window: 1h, share: ab } ]",
            "[ { name: z, key: ip, limit: 100, window: 1m, algorithm: sliding_log, share: ab } ]",
            "[ { name: c, key: ip, concurrency: 100, share: ab } ]",
            "[ { name: d, key: ip, limit: 1, window: 1m, share: cd }, { name: e, key: ip, limit: 1, window: 1m, share: cd } ]",
            "[ { name: p, key: ip, limit: 100, window: 1m, precision: 1s, share: ab } ]",
        ],
    ));
    let agree = "limits of one share count on one counter and must agree on key, limit, window and algorithm (and its precision)";
    assert_eq!(
        got,
        [
            format!(r#"routes[1].limits[0].limit: limit 200 differs from routes[0].limits[0] (line 5), which shares "ab" with limit 100; {agree} (line 8, col 43)"#),
            format!(r#"routes[2].limits[0].key: key api_key | ip differs from routes[0].limits[0] (line 5), which shares "ab" with key ip; {agree} (line 11, col 31)"#),
            format!(r#"routes[3].limits[0].window: window 1h differs from routes[0].limits[0] (line 5), which shares "ab" with window 1m; {agree} (line 14, col 55)"#),
            format!(r#"routes[4].limits[0].algorithm: algorithm sliding_log differs from routes[0].limits[0] (line 5), which shares "ab" with algorithm sliding_window; {agree} (line 17, col 70)"#),
            format!(r#"routes[5].limits[0].concurrency: concurrency 100 differs from routes[0].limits[0] (line 5), which shares "ab" with a rate; {agree} (line 20, col 48)"#),
            r#"routes[6].limits[1].share: routes[6].limits[0] of this route already shares "cd"; one request would be counted twice on one counter (line 23, col 119)"#.to_owned(),
            format!(r#"routes[7].limits[0].precision: algorithm sliding_window, precision 1000ms differs from routes[0].limits[0] (line 5), which shares "ab" with algorithm sliding_window; {agree} (line 26, col 70)"#),
        ]
    );
}

#[test]
fn a_share_is_a_name_and_never_a_plan() {
    let got = errors(&routes(
        "",
        &[
            "[ { name: f, key: ip, plan: true, share: ab } ]",
            "[ { name: g, key: ip, limit: 1, window: 1m, share: 'a b' } ]",
        ],
    ));
    assert_eq!(
        got,
        [
            "routes[0].limits[0].share: a limit with plan: true takes its numbers from each caller's plan and cannot share a counter; share a limit with its own limit and window (line 5, col 54)",
            r#"routes[1].limits[0].share: "a b" is not a valid share name; use letters, digits, '_', '.' and '-' (line 8, col 64)"#,
        ]
    );
}

#[test]
fn exempt_top_level_is_the_default_a_route_replaces() {
    let c = valid(
        "listen: 127.0.0.1:0
exempt: { ips: [10.0.0.0/8, 192.0.2.7], api_keys: [internal-batch] }
routes:
  - { name: a, respond: {} }
  - { name: b, respond: {}, exempt: { api_keys: [other] } }
",
    );
    let a = c.routes[0].exempt.as_deref().expect("inherited");
    assert_eq!(
        a.ips,
        [
            "10.0.0.0/8".parse().unwrap(),
            "192.0.2.7/32".parse().unwrap()
        ] as [ipnet::IpNet; 2]
    );
    assert_eq!(a.api_keys, [Box::from(&b"internal-batch"[..])]);
    let b = c.routes[1].exempt.as_deref().expect("its own");
    assert!(b.ips.is_empty());
    assert_eq!(b.api_keys, [Box::from(&b"other"[..])]);
    let got = errors(
        "listen: 127.0.0.1:0
exempt: { ips: [10.0.0.1/8], api_keys: [''], proxies: [] }
routes:
  - { name: a, respond: {}, exempt: { ips: nowhere } }
",
    );
    assert_eq!(
        got,
        [
            r#"exempt.ips[0]: "10.0.0.1/8" has host bits set; write 10.0.0.0/8 (or 10.0.0.1/32 for one address) (line 2, col 17)"#,
            "exempt.api_keys[0]: an API key cannot be empty (line 2, col 41)",
            r#"exempt: unknown field "proxies"; expected one of ips, api_keys (line 2, col 46)"#,
            r#"routes[0].exempt.ips: "nowhere" is not an IP address or CIDR network; write e.g. 10.0.0.0/8, 192.0.2.7 or ::1 (line 4, col 44)"#,
        ]
    );
}

#[test]
fn plans_from_names_a_claim_a_header_or_the_api_key() {
    use tollgate::config::PlansFrom;
    let plans = "plans: { free: [ { name: m, limit: 1, window: 1m } ] }\n";
    let jwt = "users: { jwt: { secret: \"a-test-secret-that-is-32-bytes-long!\" } }\n";
    let c = valid(&routes(
        &format!("{plans}{jwt}plans_from: \"claim:tier\"\n"),
        &["[]"],
    ));
    assert_eq!(c.plans_from, PlansFrom::Claim("tier".into()));
    let verifier = c.users.jwt.as_ref().expect("a verifier");
    assert_eq!(verifier.plan_claim(), Some("tier"));
    let c = valid(&routes(
        &format!("{plans}plans_from: \"header:X-Plan\"\n"),
        &["[]"],
    ));
    assert_eq!(
        c.plans_from,
        PlansFrom::Header(http::HeaderName::from_static("x-plan"))
    );
    assert_eq!(valid(&routes("", &["[]"])).plans_from, PlansFrom::ApiKey);
    let got = errors(&routes(
        &format!("{plans}plans_from: \"claim:tier\"\napi_keys: {{ keys: {{ k1: free }} }}\n"),
        &["[]"],
    ));
    assert_eq!(
        got,
        [
            "plans_from: claim:tier reads a verified JWT, and users.jwt is not set; configure users.jwt, or take the plan from header:NAME set by a trusted proxy (line 3, col 13)",
            "api_keys.keys: plans_from chooses plans by something other than the API key, so the plans of keys would never be read; remove this, or write plans_from: api_key (line 4, col 19)",
        ]
    );
    assert_eq!(
        errors(&routes("plans_from: \"header:x-plan\"\n", &["[]"])),
        ["plans_from: no plans are defined; add plans: for this to choose from (line 2, col 13)"]
    );
    assert_eq!(
        errors(&routes("plans_from: cookie\n", &["[]"])),
        [
            r#"plans_from: "cookie" is not a plan source; write api_key, claim:NAME (a verified JWT claim) or header:NAME (set by a trusted proxy) (line 2, col 13)"#
        ]
    );
}

#[test]
fn check_warns_of_a_small_sliding_window_and_still_passes() {
    let src = "listen: 127.0.0.1:0
plans: { free: [ { name: per_minute, limit: 3, window: 1m } ] }
routes:
  - name: a
    respond: {}
    limits:
      - { name: two, key: ip, limit: 2, window: 1m }
      - { name: one, key: ip, limit: 1, window: 10s }
      - { name: four, key: ip, limit: 4, window: 1m }
      - { name: exact, key: ip, limit: 2, window: 1m, algorithm: sliding_log }
";
    let expected = [
        r#"warning: routes[0].limits[0] ("two"): a sliding_window limit of 2 per 1m can tell a burst to wait up to 1m30s (w + w/L, 1.5 windows); write algorithm: sliding_log for a wait of at most one window"#,
        r#"warning: routes[0].limits[1] ("one"): a sliding_window limit of 1 per 10s can tell a burst to wait up to 20s (w + w/L, 2 windows); write algorithm: sliding_log for a wait of at most one window"#,
        r#"warning: plans.free[0] ("per_minute"): a sliding_window limit of 3 per 1m can tell a burst to wait up to 1m20s (w + w/L, 1.33 windows); write algorithm: sliding_log for a wait of at most one window"#,
    ];
    assert_eq!(tollgate::config::load::advice(&valid(src)), expected);

    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("small.yaml");
    std::fs::write(&path, src).expect("write the file");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .arg("check")
        .arg(&path)
        .output()
        .expect("run tollgate check");
    assert_eq!(out.status.code(), Some(0));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines[..3], expected, "{stdout}");
    assert_eq!(lines[3], format!("{}: ok (1 routes)", path.display()));

    // The example file warns of nothing.
    let example = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("gateway.yaml");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .arg("check")
        .arg(&example)
        .output()
        .expect("run tollgate check");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!stdout.contains("warning"), "{stdout}");
}
