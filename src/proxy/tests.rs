use std::net::IpAddr;

use http::header::{CONNECTION, HOST, HeaderName, HeaderValue, TE};
use http::{HeaderMap, Request};

use super::hop_by_hop::hop_fields;
use super::rewrite::Names;
use super::*;

#[test]
fn connection_named_headers_are_removed() {
    let mut h = HeaderMap::new();
    h.insert(CONNECTION, HeaderValue::from_static("keep-alive, X-Secret"));
    h.insert("x-secret", HeaderValue::from_static("1"));
    h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
    h.insert("x-kept", HeaderValue::from_static("1"));
    strip_hop_by_hop(&mut h);
    assert_eq!(h.len(), 1);
    assert!(h.contains_key("x-kept"));

    let mut h = HeaderMap::new();
    h.insert(CONNECTION, HeaderValue::from_static("close, te"));
    h.append(CONNECTION, HeaderValue::from_static("x-a ,, X-B"));
    h.insert("te", HeaderValue::from_static("trailers"));
    h.insert("x-a", HeaderValue::from_static("1"));
    h.insert("x-b", HeaderValue::from_static("1"));
    h.insert("upgrade", HeaderValue::from_static("websocket"));
    h.insert("transfer-encoding", HeaderValue::from_static("chunked"));
    h.insert("x-kept", HeaderValue::from_static("1"));
    strip_hop_by_hop(&mut h);
    assert_eq!(h.keys().collect::<Vec<_>>(), ["x-kept"]);
}

#[test]
fn requests_keep_te_trailers_and_nothing_else_of_te() {
    for (te, connection, kept) in [
        ("trailers", None, true),
        ("Trailers", Some("te"), true),
        ("gzip;q=0.5, trailers", Some("TE, x-a"), true),
        ("trailers;q=1", None, true),
        ("gzip", None, false),
        ("deflate, chunked", Some("te"), false),
    ] {
        let mut h = HeaderMap::new();
        h.insert(TE, HeaderValue::from_static(te));
        h.insert("x-a", HeaderValue::from_static("1"));
        if let Some(c) = connection {
            h.insert(CONNECTION, HeaderValue::from_static(c));
        }
        let mut response = h.clone();
        strip_request_hop_by_hop(&mut h);
        assert_eq!(
            h.get(TE).map(|v| v.to_str().unwrap()),
            kept.then_some("trailers"),
            "{te}"
        );
        assert!(!h.contains_key(CONNECTION));
        let named = connection.is_some_and(|c| c.contains("x-a"));
        assert_eq!(h.contains_key("x-a"), !named, "{te}");
        strip_hop_by_hop(&mut response);
        assert!(!response.contains_key(TE), "{te}");
    }
}

/// A route's upstream at `uri`, with the defaults the tests start from.
fn upstream(uri: &str) -> Upstream {
    Upstream {
        uri: uri.parse().unwrap(),
        timeout: Duration::from_secs(1),
        tls: None,
        upgrade: false,
        forward_proxy_authorization: false,
        pool: None,
    }
}

#[test]
fn h2c_upstreams_are_http_on_the_wire_and_addressed_by_their_name() {
    let up = upstream("h2c://127.0.0.1:50051");
    assert_eq!(Protocol::of(&up.uri), Protocol::H2c);
    assert!(keep_alive(&up, &Timeouts::default(), crate::config::Http1::Hyper).is_none());
    let user = HeaderName::from_static("x-user");
    let hop = Hop {
        peer: "1.2.3.4".parse().unwrap(),
        trusted: false,
        scheme: "http",
        user_header: &user,
        plan_header: None,
    };
    let mut req = Request::builder()
        .uri("/demo.Echo/Say")
        .header(HOST, "gateway.test")
        .header(TE, "trailers")
        .body(())
        .unwrap();
    rewrite(&mut req, &up, hop).unwrap();
    assert_eq!(req.uri(), "http://127.0.0.1:50051/demo.Echo/Say");
    assert!(!req.headers().contains_key("host"), ":authority only");
    assert_eq!(req.headers()["x-forwarded-host"], "gateway.test");
    assert_eq!(req.headers()["te"], "trailers");
    for (uri, protocol) in [
        ("http://a:1", Protocol::Http1),
        ("https://a", Protocol::Https),
        ("h2c://a:1", Protocol::H2c),
    ] {
        assert_eq!(Protocol::of(&uri.parse().unwrap()), protocol, "{uri}");
    }
}

#[test]
fn addresses_render_as_display_does() {
    for ip in [
        "0.0.0.0",
        "1.2.3.4",
        "10.20.30.40",
        "100.200.255.9",
        "255.255.255.255",
        "::1",
        "2001:db8::8a2e:370:7334",
        "::ffff:192.0.2.1",
    ] {
        let ip: IpAddr = ip.parse().unwrap();
        let mut buf = [0u8; 48];
        assert_eq!(
            crate::identity::render_ip(ip, &mut buf),
            ip.to_string().as_bytes()
        );
    }
}

#[test]
fn rewrite_sets_forwarding_headers() {
    let up = upstream("http://127.0.0.1:9000/base/");
    let user = HeaderName::from_static("x-user");
    let mut req = Request::builder()
        .uri("/a?b=1")
        .header(HOST, "example.com")
        .header("x-forwarded-for", "6.6.6.6")
        .header("x-user", "admin")
        .body(())
        .unwrap();
    let hop = Hop {
        peer: "1.2.3.4".parse().unwrap(),
        trusted: false,
        scheme: "http",
        user_header: &user,
        plan_header: None,
    };
    rewrite(&mut req, &up, hop).unwrap();
    assert_eq!(req.uri(), "http://127.0.0.1:9000/base/a?b=1");
    assert_eq!(req.headers()["x-forwarded-for"], "1.2.3.4");
    assert_eq!(req.headers()["x-forwarded-host"], "example.com");
    assert_eq!(req.headers()["host"], "example.com");
    assert!(!req.headers().contains_key("x-user"));

    let mut req = Request::builder()
        .uri("/a")
        .header("x-forwarded-for", "6.6.6.6")
        .header("x-forwarded-for", "7.7.7.7")
        .body(())
        .unwrap();
    let hop = Hop {
        trusted: true,
        ..hop
    };
    rewrite(&mut req, &up, hop).unwrap();
    assert_eq!(
        req.headers()["x-forwarded-for"],
        "6.6.6.6, 7.7.7.7, 1.2.3.4"
    );
}

#[test]
fn rewrite_keeps_one_host_from_the_client_or_the_authority() {
    let up = upstream("http://127.0.0.1:9000");
    let user = HeaderName::from_static("x-user");
    let hop = Hop {
        peer: "1.2.3.4".parse().unwrap(),
        trusted: true,
        scheme: "https",
        user_header: &user,
        plan_header: None,
    };
    let hosts = |req: &Request<()>| {
        let all = req.headers().get_all(HOST).iter();
        all.map(|v| v.to_str().unwrap().to_owned())
            .collect::<Vec<_>>()
    };
    // `Connection` naming `host` removes the line; the client's host is
    // written back.
    let mut req = Request::builder()
        .uri("/a")
        .header(HOST, "example.com")
        .header("connection", "host")
        .body(())
        .unwrap();
    rewrite(&mut req, &up, hop).unwrap();
    assert_eq!(hosts(&req), ["example.com"]);
    assert_eq!(req.headers()["x-forwarded-proto"], "https");
    // Several lines become the first.
    let mut req = Request::builder()
        .uri("/a")
        .header(HOST, "a.example")
        .header(HOST, "b.example")
        .body(())
        .unwrap();
    rewrite(&mut req, &up, hop).unwrap();
    assert_eq!(hosts(&req), ["a.example"]);
    assert_eq!(req.headers()["x-forwarded-host"], "a.example");
    // No `Host` (HTTP/2): the authority's; a forwarded host and proto
    // from a trusted proxy stay.
    let mut req = Request::builder()
        .uri("http://c.example/a")
        .header("x-forwarded-host", "public.example")
        .header("x-forwarded-proto", "http")
        .body(())
        .unwrap();
    rewrite(&mut req, &up, hop).unwrap();
    assert_eq!(hosts(&req), ["c.example"]);
    assert_eq!(req.headers()["x-forwarded-host"], "public.example");
    assert_eq!(req.headers()["x-forwarded-proto"], "http");
}

#[test]
fn proxy_authorization_is_stripped_unless_the_route_forwards_it() {
    let user = HeaderName::from_static("x-user");
    let hop = Hop {
        peer: "1.2.3.4".parse().unwrap(),
        trusted: true,
        scheme: "http",
        user_header: &user,
        plan_header: None,
    };
    let mut up = upstream("http://127.0.0.1:9000");
    let request = || {
        Request::builder()
            .uri("/a")
            .header(HOST, "example.com")
            .header("proxy-authorization", "Basic cHJveHk6c2VjcmV0")
            .header("authorization", "Bearer for-the-upstream")
            .body(())
            .unwrap()
    };
    let mut req = request();
    rewrite(&mut req, &up, hop).unwrap();
    assert!(!req.headers().contains_key("proxy-authorization"));
    assert_eq!(req.headers()["authorization"], "Bearer for-the-upstream");

    up.forward_proxy_authorization = true;
    let mut req = request();
    rewrite(&mut req, &up, hop).unwrap();
    assert_eq!(
        req.headers()["proxy-authorization"],
        "Basic cHJveHk6c2VjcmV0"
    );
}

#[test]
fn names_finds_each_hop_by_hop_field_at_its_bit() {
    let user = HeaderName::from_static("x-user");
    let plan = HeaderName::from_static("x-plan");
    let hop = Hop {
        peer: "1.2.3.4".parse().unwrap(),
        trusted: false,
        scheme: "http",
        user_header: &user,
        plan_header: Some(&plan),
    };
    for (i, name) in HOP_HEADERS.iter().enumerate() {
        let mut h = HeaderMap::new();
        h.insert(name.clone(), HeaderValue::from_static("1"));
        h.insert("x-other", HeaderValue::from_static("1"));
        let names = Names::of(&h, &hop);
        assert_eq!(names.hop, 1 << i, "{name}");
        assert_eq!(names.hop, hop_fields(&h), "{name}");
        assert!(!names.claims && !names.proxy_authorization, "{name}");
    }
    for (name, claims) in [
        ("x-forwarded-for", true),
        ("x-forwarded-proto", true),
        ("x-forwarded-host", true),
        ("forwarded", true),
        ("x-user", true),
        ("x-plan", true),
        ("x-forwarded", false),
        ("proxy-authorization", false),
    ] {
        let mut h = HeaderMap::new();
        h.insert(HOST, HeaderValue::from_static("a"));
        h.append(HOST, HeaderValue::from_static("b"));
        h.append(HOST, HeaderValue::from_static("c"));
        h.insert(HeaderName::from_static(name), HeaderValue::from_static("1"));
        let names = Names::of(&h, &hop);
        assert_eq!(names.claims, claims, "{name}");
        assert_eq!(names.proxy_authorization, name == "proxy-authorization");
        assert_eq!((names.hop, names.hosts), (0, 2), "{name}");
    }
}
