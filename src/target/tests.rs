use super::*;

fn canon(path: &str) -> Result<String, TargetError> {
    canonical_path(path, &PathRules::default()).map(Cow::into_owned)
}

fn with(path: &str, escaped: EscapedSlashes, merge: bool) -> Result<String, TargetError> {
    let rules = PathRules {
        normalize: true,
        merge_slashes: merge,
        escaped_slashes: escaped,
    };
    canonical_path(path, &rules).map(Cow::into_owned)
}

#[test]
fn spellings_of_one_path_become_one() {
    for spelled in [
        "/api/auth/login",
        "/api/auth/%6Cogin",
        "/api/auth/%6cogin",
        "/%61pi/auth/login",
        "/api/x/../auth/login",
        "/api/x/%2e%2E/auth/login",
        "/api/./auth/login",
        "//api/auth/login",
        "/api//auth///login",
        "/api/auth/x/y/../../login",
        "/../api/auth/login",
    ] {
        assert_eq!(
            canon(spelled).as_deref(),
            Ok("/api/auth/login"),
            "{spelled}"
        );
    }
}

#[test]
fn rfc3986_section_5_2_4_examples() {
    assert_eq!(
        with("/a/b/c/./../../g", EscapedSlashes::Reject, false).as_deref(),
        Ok("/a/g")
    );
    assert_eq!(canon("/mid/content=5/../6").as_deref(), Ok("/mid/6"));
    assert_eq!(canon("/a/b/..").as_deref(), Ok("/a/"));
    assert_eq!(canon("/a/b/.").as_deref(), Ok("/a/b/"));
    assert_eq!(canon("/..").as_deref(), Ok("/"));
    assert_eq!(canon("/.").as_deref(), Ok("/"));
    assert_eq!(canon("/").as_deref(), Ok("/"));
    assert_eq!(canon("//").as_deref(), Ok("/"));
    assert_eq!(canon("/a/").as_deref(), Ok("/a/"));
    assert_eq!(canon("/a//").as_deref(), Ok("/a/"));
}

#[test]
fn escapes_keep_upper_case_hex_and_raw_bytes_are_encoded() {
    assert_eq!(canon("/a%2cb").as_deref(), Ok("/a%2Cb"));
    assert_eq!(canon("/a%20b").as_deref(), Ok("/a%20b"));
    assert_eq!(canon("/%c3%a9").as_deref(), Ok("/%C3%A9"));
    assert_eq!(canon("/é").as_deref(), Ok("/%C3%A9"));
    assert_eq!(canon("/a{b}").as_deref(), Ok("/a%7Bb%7D"));
    assert_eq!(canon("/a%7e").as_deref(), Ok("/a~"));
    assert_eq!(canon("/.well-known/x").as_deref(), Ok("/.well-known/x"));
    assert_eq!(canon("/a..b/..c").as_deref(), Ok("/a..b/..c"));
}

#[test]
fn bad_escapes_and_nul_are_refused() {
    assert_eq!(canon("/a%zz"), Err(TargetError::BadPercent));
    assert_eq!(canon("/a%2"), Err(TargetError::BadPercent));
    assert_eq!(canon("/a%"), Err(TargetError::BadPercent));
    assert_eq!(canon("/a%00b"), Err(TargetError::Nul));
    assert_eq!(canon("/a\0b"), Err(TargetError::Nul));
}

/// The fuzz input `04 00 02 2d`: mode 4 (slashes kept, escaped slashes
/// refused) and the path `/\0\x02-`. A raw NUL is refused on the first pass,
/// so no canonical path is refused when normalised again.
#[test]
fn a_raw_nul_is_refused_on_the_first_pass() {
    assert_eq!(
        with("/\0\x02-", EscapedSlashes::Reject, false),
        Err(TargetError::Nul)
    );
    assert_eq!(
        with("/\x02-", EscapedSlashes::Reject, false).as_deref(),
        Ok("/%02-")
    );
}

#[test]
fn escaped_slashes_follow_the_policy() {
    assert_eq!(canon("/a%2Fb"), Err(TargetError::EscapedSlash));
    assert_eq!(canon("/a%5cb"), Err(TargetError::EscapedSlash));
    assert_eq!(canon("/a\\b"), Err(TargetError::Backslash));
    assert_eq!(
        with("/a%2fb/../c", EscapedSlashes::Keep, true).as_deref(),
        Ok("/c")
    );
    assert_eq!(
        with("/a%2fb", EscapedSlashes::Keep, true).as_deref(),
        Ok("/a%2Fb")
    );
    assert_eq!(
        with("/a\\b", EscapedSlashes::Keep, true).as_deref(),
        Ok("/a%5Cb")
    );
    assert_eq!(
        with("/a%2fb/..%5C..%5cc", EscapedSlashes::Decode, true).as_deref(),
        Ok("/c")
    );
    assert_eq!(
        with("/api\\admin", EscapedSlashes::Decode, true).as_deref(),
        Ok("/api/admin")
    );
}

#[test]
fn slashes_are_kept_when_merging_is_off() {
    assert_eq!(
        with("//a//b", EscapedSlashes::Reject, false).as_deref(),
        Ok("//a//b")
    );
}

#[test]
fn parameters_of_dot_segments_are_refused_and_others_ignored_by_matching() {
    assert_eq!(canon("/a/..;x/b"), Err(TargetError::DotParameters));
    assert_eq!(canon("/a/.;/b"), Err(TargetError::DotParameters));
    assert_eq!(canon("/a/%2e%2e;/b"), Err(TargetError::DotParameters));
    assert_eq!(canon("/a;x=1/b;y").as_deref(), Ok("/a;x=1/b;y"));
    assert_eq!(without_parameters("/a;x=1/b;y", true), "/a/b");
    assert_eq!(without_parameters("/login;jsessionid=1", true), "/login");
    assert_eq!(without_parameters("/a/;x/b", true), "/a/b");
    assert_eq!(without_parameters("/a/;x/b", false), "/a//b");
    assert_eq!(without_parameters("/a/b;x/", true), "/a/b/");
    assert_eq!(without_parameters("/;x", true), "/");
    assert_eq!(without_parameters("/a/b", true), "/a/b");
}

#[test]
fn canonical_paths_are_borrowed() {
    for p in ["/", "/api/v1/users", "/.well-known/x", "/a;b=c", "/a-b_c~d"] {
        assert!(matches!(
            canonical_path(p, &PathRules::default()),
            Ok(Cow::Borrowed(_))
        ));
    }
}

#[test]
fn the_fast_path_takes_only_canonical_authorities() {
    for ok in ["api.example.com", "127.0.0.1:8080", "a-b.c", "localhost:80"] {
        assert!(is_canonical_authority(ok.as_bytes()), "{ok}");
        assert!(matches!(canonical_authority(ok), Ok(Cow::Borrowed(_))));
    }
    for slow in [
        "Api.example.com",
        "example.com.",
        "a..b",
        "host:",
        "host:123456",
        "[::1]:80",
        "u@h",
        "",
        "a:b:c",
    ] {
        assert!(!is_canonical_authority(slow.as_bytes()), "{slow}");
    }
}

#[test]
fn authorities() {
    assert_eq!(
        canonical_authority("WWW.Example.COM.").as_deref(),
        Ok("www.example.com")
    );
    assert_eq!(
        canonical_authority("www.example.com.:8080").as_deref(),
        Ok("www.example.com:8080")
    );
    assert!(matches!(
        canonical_authority("api.example.com:80"),
        Ok(Cow::Borrowed(_))
    ));
    assert_eq!(
        canonical_authority("[::1]:8080").as_deref(),
        Ok("[::1]:8080")
    );
    assert_eq!(
        canonical_authority("[::A]:8080").as_deref(),
        Ok("[::a]:8080")
    );
    assert_eq!(canonical_authority("[v1.x:y]").as_deref(), Ok("[v1.x:y]"));
    for bad in [
        "user@host",
        "a b",
        "host:",
        "host:x",
        ".",
        "a..",
        "",
        "h/p",
        "[]",
        "[]:80",
        "[n]",
        "[api.example.com]",
        "[n]R33",
        "[::1]x",
        "[::1]:",
        "[v1]",
        "[vx.a]",
    ] {
        assert_eq!(
            canonical_authority(bad),
            Err(TargetError::BadHost),
            "{bad:?}"
        );
    }
    assert_eq!(strip_port("example.com:8080"), "example.com");
    assert_eq!(strip_port("[::1]:8080"), "::1");
    assert_eq!(strip_port("example.com"), "example.com");
}

proptest::proptest! {
    /// Canonical output is a fixed point and holds no dot segment and
    /// no doubled slash, whatever the input and the escape policy.
    #[test]
    fn canonical_paths_are_idempotent(
        raw in "/[a-zA-Z0-9%./;\\~_\x00-\x1f-]{0,40}",
        policy in 0..3u8,
        merge in proptest::bool::ANY,
    ) {
        let rules = PathRules {
            normalize: true,
            merge_slashes: merge,
            escaped_slashes: EscapedSlashes::SPELLINGS[usize::from(policy)].1,
        };
        if let Ok(once) = canonical_path(&raw, &rules) {
            let twice = canonical_path(&once, &rules).expect("canonical stays valid");
            proptest::prop_assert_eq!(&twice, &once);
            proptest::prop_assert!(matches!(twice, Cow::Borrowed(_)));
            let segments: Vec<&str> = once.split('/').collect();
            proptest::prop_assert!(!segments.contains(&".") && !segments.contains(&".."));
            proptest::prop_assert!(!merge || !once.contains("//"), "{}", once);
            proptest::prop_assert!(once.parse::<http::uri::PathAndQuery>().is_ok());
        }
    }
}

fn target(uri: &str, version: Version, host: Option<&str>) -> Result<String, TargetError> {
    let uri: Uri = uri.parse().unwrap();
    let mut headers = HeaderMap::new();
    if let Some(h) = host {
        headers.insert(HOST, h.parse().unwrap());
    }
    canonical(&uri, version, &headers, &PathRules::default())
        .map(|t| t.authority.unwrap_or_default().into_owned())
}

#[test]
fn the_request_target_authority_wins() {
    // HTTP/1.1 absolute-form: the Host header is ignored (RFC 9112 §3.2.2).
    assert_eq!(
        target(
            "http://www.example.com/",
            Version::HTTP_11,
            Some("admin.example.com")
        )
        .as_deref(),
        Ok("www.example.com")
    );
    // HTTP/2: a host header naming another authority is malformed.
    assert_eq!(
        target(
            "https://www.example.com/",
            Version::HTTP_2,
            Some("admin.example.com")
        ),
        Err(TargetError::HostMismatch)
    );
    assert_eq!(
        target(
            "https://www.example.com/",
            Version::HTTP_2,
            Some("WWW.example.com.")
        )
        .as_deref(),
        Ok("www.example.com")
    );
    assert_eq!(
        target("/", Version::HTTP_11, Some("Api.Example.com.")).as_deref(),
        Ok("api.example.com")
    );
}

#[test]
fn the_request_is_rewritten_only_where_it_is_not_canonical() {
    let rewritten = |uri: &str, host: Option<&str>| {
        let mut b = Request::builder().uri(uri);
        if let Some(h) = host {
            b = b.header(HOST, h);
        }
        let mut req = b.body(()).unwrap();
        let t = canonical(
            req.uri(),
            req.version(),
            req.headers(),
            &PathRules::default(),
        )
        .unwrap();
        let rewrite = Rewrite::of(t);
        let unchanged = rewrite.path.is_none() && rewrite.host.is_none();
        rewrite.apply(&mut req).unwrap();
        let host = req
            .headers()
            .get(HOST)
            .map(|h| h.to_str().unwrap().to_owned());
        (unchanged, req.uri().to_string(), host)
    };
    // A canonical path and Host: nothing to do.
    assert_eq!(
        rewritten("/a?q=1", Some("api.example.com")),
        (true, "/a?q=1".into(), Some("api.example.com".into()))
    );
    // Host as sent is not the canonical authority: replaced.
    assert_eq!(
        rewritten("/a", Some("Api.Example.com.")),
        (false, "/a".into(), Some("api.example.com".into()))
    );
    // Absolute form: Host follows the request target's authority.
    assert_eq!(
        rewritten("http://www.example.com/a", Some("admin.example.com")),
        (
            false,
            "http://www.example.com/a".into(),
            Some("www.example.com".into())
        )
    );
    assert_eq!(
        rewritten("http://www.example.com/a", None),
        (
            false,
            "http://www.example.com/a".into(),
            Some("www.example.com".into())
        )
    );
    // A path that is not canonical: rewritten, the query kept.
    assert_eq!(
        rewritten("/a//b/../c?x", Some("h")),
        (false, "/a/c?x".into(), Some("h".into()))
    );
}
