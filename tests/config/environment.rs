//! What the environment gives a configuration: `${VAR}` references, secrets
//! read from files, `TOLLGATE_CONFIG`; and that no secret is ever printed.

use std::process::{Command, Output};

use tollgate::config::Config;
use tollgate::config::load::{load_file, parse_str_with_env};

fn env(name: &str) -> Option<String> {
    match name {
        "REDIS_URL" => Some("redis://redis.test:6380/1".into()),
        "LIMIT" => Some("7".into()),
        "SHADOW" => Some("true".into()),
        "PREFIX" => Some("0042".into()),
        "EMPTY" => Some(String::new()),
        "YAML" => Some("{ name: x }\n# comment\n- 1".into()),
        "NOT_A_NUMBER" => Some("seven".into()),
        _ => None,
    }
}

fn load(src: &str) -> Config {
    parse_str_with_env(src, &env).unwrap_or_else(|e| panic!("expected a valid file, got:\n{e}"))
}

fn errors(src: &str) -> Vec<String> {
    match parse_str_with_env(src, &env) {
        Ok(_) => panic!("expected errors, the file was accepted:\n{src}"),
        Err(e) => e.0.iter().map(ToString::to_string).collect(),
    }
}

const ROUTE: &str = "routes:\n  - { name: a, respond: {}, limits: [ { name: l, key: ip, limit: 5, window: 1m } ] }\n";

#[test]
fn set_variables_and_defaults_are_expanded() {
    let c = load(&format!(
        "listen: ${{LISTEN:-127.0.0.1:0}}\nstore:\n  redis:\n    url: ${{REDIS_URL}}\n    timeout: ${{TIMEOUT:-40ms}}\n  prefix: \"${{EMPTY:-tg}}:\"\n{ROUTE}"
    ));
    assert_eq!(c.listen[0].addr.to_string(), "127.0.0.1:0");
    let redis = c.store.redis.expect("redis");
    assert_eq!(redis.url, "redis://redis.test:6380/1");
    assert_eq!(redis.timeout.as_millis(), 40);
    assert_eq!(c.store.prefix, "tg:");
}

#[test]
fn expanded_values_are_read_as_the_field_type() {
    let c = load(
        "listen: 127.0.0.1:0\nstore: { prefix: \"${PREFIX}\" }\nroutes:\n  - name: a\n    respond: {}\n    shadow: ${SHADOW}\n    limits:\n      - name: l\n        key: ip\n        limit: ${LIMIT}\n        window: 1m\n",
    );
    assert_eq!(c.routes[0].limits[0].limit.get(), 7);
    assert!(c.routes[0].shadow);
    // Text stays text exactly: a leading zero is kept.
    assert_eq!(c.store.prefix, "0042");
    assert_eq!(
        errors(
            "listen: 127.0.0.1:0\nroutes:\n  - name: a\n    respond: {}\n    limits:\n      - { name: l, key: ip, limit: \"${NOT_A_NUMBER}\", window: 1m }\n"
        ),
        [
            "routes[0].limits[0].limit: expected a whole number, found the string \"seven\" (line 6, col 36)"
        ]
    );
}

#[test]
fn an_expansion_that_looks_like_yaml_stays_a_string() {
    // The value is the text of one scalar: no mapping, list or comment.
    let c = load(&format!(
        "listen: 127.0.0.1:0\nstore:\n  prefix: ${{YAML}}\n{ROUTE}"
    ));
    assert_eq!(c.store.prefix, "{ name: x }\n# comment\n- 1");
    let e = errors(&format!(
        "listen: 127.0.0.1:0\nstore:\n  on_error: ${{YAML}}\n{ROUTE}"
    ));
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(
        e[0].starts_with("store.on_error: unknown value \"{ name: x }\\n# comment\\n- 1\""),
        "{e:?}"
    );
}

#[test]
fn unset_variables_are_errors_with_every_other_error() {
    assert_eq!(
        errors(
            "listen: 127.0.0.1:0\nstore:\n  redis: { url: \"${REDIS_ADDR}\", timeout: \"${T1}${T2:-x}${T3}\" }\nroutes:\n  - { name: a, respond: {}, cost: \"${COST}\" }\n  - { name: b, respond: {}, cost: 0 }\n"
        ),
        [
            "store.redis.url: environment variable ${REDIS_ADDR} is not set; set it, or write ${NAME:-default} (line 3, col 17)".to_owned(),
            "store.redis.timeout: environment variables ${T1}, ${T3} are not set; set them, or write ${NAME:-default} (line 3, col 43)".to_owned(),
            "routes[0].cost: environment variable ${COST} is not set; set it, or write ${NAME:-default} (line 5, col 35)".to_owned(),
            "routes[1].cost: must be at least 1, found 0 (line 6, col 35)".to_owned(),
        ]
    );
}

#[test]
fn dollars_are_escaped_by_doubling() {
    let c = load(&format!(
        "listen: 127.0.0.1:0\nstore:\n  redis: {{ url: \"redis://h:1\", password: \"p$$$$w$${{LIMIT}}$x\" }}\n{ROUTE}"
    ));
    assert_eq!(
        c.store.redis.expect("redis").password.as_deref(),
        Some("p$$w${LIMIT}$x")
    );
    assert_eq!(
        errors(&format!(
            "listen: 127.0.0.1:0\nstore: {{ prefix: \"${{LIMIT\" }}\n{ROUTE}"
        )),
        [
            "store.prefix: \"${LIMIT\" has no closing }; write ${NAME} or ${NAME:-default}, and $$ for a literal $ (line 2, col 18)"
        ]
    );
}

#[test]
fn keys_are_names_not_expanded() {
    let c = load(&format!(
        "listen: 127.0.0.1:0\nplans: {{ free: [ {{ name: m, limit: 1, window: 1m }} ] }}\napi_keys: {{ keys: {{ \"${{LIMIT}}\": free }} }}\n{ROUTE}"
    ));
    assert!(c.api_keys.keys.contains_key("${LIMIT}"));
}

/// A file in a fresh directory, with `contents`.
fn secret_file(dir: &tempfile::TempDir, name: &str, contents: &[u8]) -> String {
    let path = dir.path().join(name);
    std::fs::write(&path, contents).expect("write secret");
    path.display().to_string()
}

#[test]
fn secrets_are_read_from_files_without_their_line_end() {
    let dir = tempfile::tempdir().expect("temp dir");
    let user = secret_file(&dir, "user", b"gate\n");
    let pass = secret_file(&dir, "pass", b"s3cr$t\r\n");
    let jwt = secret_file(&dir, "jwt", b"0123456789abcdef0123456789abcdef\n\n");
    let c = load(&format!(
        "listen: 127.0.0.1:0\nstore:\n  redis: {{ url: \"redis://h:1\", username_file: {user}, password_file: {pass} }}\nusers: {{ jwt: {{ secret_file: {jwt} }} }}\n{ROUTE}"
    ));
    let redis = c.store.redis.expect("redis");
    assert_eq!(redis.username.as_deref(), Some("gate"));
    assert_eq!(redis.password.as_deref(), Some("s3cr$t"));
    assert!(c.users.jwt.is_some());
}

#[test]
fn a_relative_secret_file_is_beside_the_configuration() {
    let dir = tempfile::tempdir().expect("temp dir");
    secret_file(&dir, "pass", b"from-beside\n");
    let config = dir.path().join("gateway.yaml");
    std::fs::write(
        &config,
        format!("listen: 127.0.0.1:0\nstore:\n  redis: {{ url: \"redis://h:1\", password_file: pass }}\n{ROUTE}"),
    )
    .expect("write config");
    let c = load_file(&config).expect("valid");
    assert_eq!(
        c.store.redis.expect("redis").password.as_deref(),
        Some("from-beside")
    );
}

#[test]
fn missing_unreadable_empty_and_doubled_secrets_are_errors() {
    let dir = tempfile::tempdir().expect("temp dir");
    let missing = dir.path().join("missing").display().to_string();
    let empty = secret_file(&dir, "empty", b"\n");
    let pass = secret_file(&dir, "pass", b"hunter2-secret\n");
    // A directory cannot be read as a file, whoever runs the test (root
    // reads files whatever their mode).
    let unreadable = dir.path().display().to_string();
    let e = errors(&format!(
        "listen: 127.0.0.1:0\nstore:\n  redis:\n    url: \"redis://h:1\"\n    username_file: {missing}\n    password_file: {unreadable}\nusers:\n  jwt: {{ secret_file: {empty} }}\n{ROUTE}"
    ));
    assert_eq!(e.len(), 3, "{e:#?}");
    assert!(
        e[0].starts_with(&format!(
            "store.redis.username_file: cannot read {missing}: "
        )),
        "{e:?}"
    );
    assert!(e[0].ends_with("(line 5, col 20)"), "{e:?}");
    assert!(
        e[1].starts_with(&format!(
            "store.redis.password_file: cannot read {unreadable}: "
        )),
        "{e:?}"
    );
    assert_eq!(
        e[2],
        format!("users.jwt.secret_file: {empty} is empty (line 8, col 23)")
    );
    let e = errors(&format!(
        "listen: 127.0.0.1:0\nstore:\n  redis: {{ url: \"redis://h:1\", password: x, password_file: {pass} }}\n{ROUTE}"
    ));
    assert_eq!(
        e,
        ["store.redis: set either password or password_file, not both (line 3, col 10)"]
    );
    assert!(!e.concat().contains("hunter2"));
}

#[test]
fn a_short_jwt_secret_from_a_file_is_reported_at_the_file_field() {
    let dir = tempfile::tempdir().expect("temp dir");
    let short = secret_file(&dir, "short", b"tooshort-secret\n");
    let e = errors(&format!(
        "listen: 127.0.0.1:0\nusers: {{ jwt: {{ secret_file: {short} }} }}\n{ROUTE}"
    ));
    assert_eq!(e.len(), 1);
    assert!(
        e[0].starts_with("users.jwt.secret_file: is shorter than 32 bytes"),
        "{e:?}"
    );
    assert!(!e[0].contains("tooshort"), "{e:?}");
}

#[test]
fn redis_urls_the_client_refuses_are_refused_without_their_password() {
    for (url, why) in [
        ("redis://user:S3CRET@host:notaport", "InvalidPort"),
        ("redis://host:6379/abc", "Invalid integer string"),
        ("redis://user:S3CRET@host:6379/1/2", "Invalid database path"),
    ] {
        let e = errors(&format!(
            "listen: 127.0.0.1:0\nstore: {{ redis: {{ url: \"{url}\" }} }}\n{ROUTE}"
        ));
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(e[0].contains(why), "{url}: {e:?}");
        assert!(!e[0].contains("S3CRET"), "{e:?}");
    }
    let e = errors(&format!(
        "listen: 127.0.0.1:0\nstore: {{ redis: {{ url: \"http://user:S3CRET@host:6379\" }} }}\n{ROUTE}"
    ));
    assert_eq!(
        e,
        [
            "store.redis.url: \"http://***@host:6379\" is not a Redis URL; write redis://HOST:PORT, e.g. redis://127.0.0.1:6379 (line 2, col 24)"
        ]
    );
}

fn tollgate(args: &[&str], envs: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tollgate"));
    cmd.args(args).env_remove("TOLLGATE_CONFIG");
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd.output().expect("run tollgate")
}

#[test]
fn check_reads_the_environment_and_tollgate_config() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("env.yaml");
    std::fs::write(
        &path,
        "listen: ${TG_TEST_LISTEN}\nroutes: [ { name: a, respond: {} } ]\n",
    )
    .expect("write config");
    let path = path.display().to_string();
    let out = tollgate(
        &["check"],
        &[
            ("TOLLGATE_CONFIG", &path),
            ("TG_TEST_LISTEN", "127.0.0.1:0"),
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("ok (1 routes)"),
        "{out:?}"
    );

    let out = tollgate(&["check", &path], &[]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("listen: environment variable ${TG_TEST_LISTEN} is not set; set it, or write ${NAME:-default} (line 1, col 9)"),
        "{stderr}"
    );
}

#[test]
fn check_never_prints_a_secret() {
    let dir = tempfile::tempdir().expect("temp dir");
    let pass = secret_file(&dir, "pass", b"FILE-SECRET-1\n");
    let path = dir.path().join("secret.yaml");
    std::fs::write(
        &path,
        format!("listen: 127.0.0.1:0\nstore:\n  redis:\n    url: ${{TG_TEST_URL}}\n    password_file: {pass}\n  on_error: nope\nroutes: [ {{ name: a, respond: {{}} }} ]\n"),
    )
    .expect("write config");
    let path = path.display().to_string();
    for url in [
        "http://user:ENV-SECRET-2@host:6379",
        "redis://user:ENV-SECRET-2@host:notaport",
        "redis://user:ENV-SECRET-2@host:6379/abc",
    ] {
        let out = tollgate(&["check", &path], &[("TG_TEST_URL", url)]);
        assert_eq!(out.status.code(), Some(2), "{out:?}");
        let all = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(all.contains("store.redis.url: "), "{all}");
        assert!(all.contains("store.on_error: "), "{all}");
        assert!(!all.contains("SECRET"), "{all}");
    }
}

#[test]
fn without_a_configuration_file_the_error_names_both_ways_to_give_one() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .arg("check")
        .current_dir(dir.path())
        .env_remove("TOLLGATE_CONFIG")
        .output()
        .expect("run tollgate");
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("no configuration file at gateway.yaml; name one with --config FILE (or -c FILE) or the TOLLGATE_CONFIG environment variable"),
        "{stderr}"
    );
}

#[test]
fn listen_takes_an_address_or_a_name_that_resolves() {
    // A name that cannot resolve (RFC 6761 reserves .invalid) is refused
    // with what to write, before any file is read.
    let out = tollgate(&["--listen", "nowhere.invalid:8080", "check"], &[]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("\"nowhere.invalid:8080\" is not an address that resolves"),
        "{stderr}"
    );
    assert!(
        stderr.contains(
            "write IP:PORT or HOST:PORT, e.g. 127.0.0.1:8080, [::1]:8080 or localhost:8080"
        ),
        "{stderr}"
    );
}
