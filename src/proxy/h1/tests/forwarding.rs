//! The forwarding fields as text ([`crate::proxy::Forwarding`]) against
//! the same fields inserted into the map: the native writer's bytes alike.

use super::super::write;

/// The head of `req` rewritten for `up` from `peer` as the native client
/// writes it: with the forwarding fields inserted into the map (`rewrite`)
/// and left out of it for the writer (`rewrite_for_native`), whichever
/// that chose.
fn written_heads(
    req: &http::Request<()>,
    up: &crate::config::Upstream,
    peer: &str,
    trusted: bool,
    scheme: &str,
) -> (Vec<u8>, Vec<u8>, bool) {
    use crate::proxy::body::UpstreamBody;
    use crate::proxy::{Hop, rewrite, rewrite_for_native};
    let user = http::HeaderName::from_static("x-user");
    let plan = http::HeaderName::from_static("x-plan");
    let hop = Hop {
        peer: peer.parse().unwrap(),
        trusted,
        scheme,
        user_header: &user,
        plan_header: Some(&plan),
    };
    let copy = || {
        let mut r = http::Request::new(UpstreamBody::empty());
        *r.method_mut() = req.method().clone();
        *r.uri_mut() = req.uri().clone();
        *r.headers_mut() = req.headers().clone();
        r
    };
    let mut mapped = copy();
    rewrite(&mut mapped, up, hop).unwrap();
    // As `Forwarder::send` tells a connection of its own.
    let pq = mapped.uri().path_and_query().unwrap().clone();
    *mapped.uri_mut() = http::Uri::from(pq);
    let mut out_mapped = Vec::new();
    write::head(&mapped, &mut out_mapped);

    let mut text = copy();
    let forwarding = rewrite_for_native(&mut text, up, hop).unwrap();
    let as_text = forwarding.is_some();
    let body = std::mem::replace(text.body_mut(), UpstreamBody::empty());
    *text.body_mut() = body.forwarding(forwarding);
    let mut out_text = Vec::new();
    write::head(&text, &mut out_text);

    // And materialized, as hyper's client would be given it.
    if let Some(f) = text.body_mut().take_forwarding() {
        f.materialize(text.headers_mut());
    }
    assert_eq!(text.headers(), mapped.headers());
    (out_mapped, out_text, as_text)
}

#[test]
fn forwarding_fields_as_text_are_written_as_the_map_would_have_them() {
    let up = |uri: &str| crate::config::Upstream {
        uri: uri.parse().unwrap(),
        timeout: std::time::Duration::from_secs(1),
        tls: None,
        upgrade: false,
        forward_proxy_authorization: false,
        pool: None,
    };
    let plain = up("http://127.0.0.1:9000");
    let based = up("http://127.0.0.1:9000/base/");
    for (i, (target, fields, peer, trusted, scheme, as_text)) in cases().iter().enumerate() {
        let mut b = http::Request::builder().uri(*target);
        for (n, v) in *fields {
            b = b.header(*n, *v);
        }
        let req = b.body(()).unwrap();
        for up in [&plain, &based] {
            let (mapped, text, was_text) = written_heads(&req, up, peer, *trusted, scheme);
            assert_eq!(
                String::from_utf8(text).unwrap(),
                String::from_utf8(mapped).unwrap(),
                "case {i}"
            );
            assert_eq!(was_text, *as_text, "case {i}");
        }
    }
}

/// The target, the fields, the peer, whether it is trusted, the scheme,
/// and whether the forwarding fields go as text.
type Case = (
    &'static str,
    &'static [(&'static str, &'static str)],
    &'static str,
    bool,
    &'static str,
    bool,
);

fn cases() -> &'static [Case] {
    &[
        (
            "/x",
            &[("host", "example.com")],
            "10.0.0.1",
            false,
            "http",
            true,
        ),
        (
            "/x?a=1",
            &[("host", "example.com"), ("x-request-id", "r1")],
            "::1",
            false,
            "https",
            true,
        ),
        (
            "/x",
            &[
                ("host", "example.com"),
                ("x-forwarded-for", "6.6.6.6"),
                ("x-forwarded-host", "evil"),
                ("x-forwarded-proto", "https"),
                ("x-user", "root"),
                ("accept", "*/*"),
            ],
            "192.168.1.20",
            false,
            "http",
            true,
        ),
        (
            "/x",
            &[
                ("host", "example.com"),
                ("connection", "keep-alive, x-a"),
                ("x-a", "1"),
                ("te", "gzip"),
            ],
            "10.0.0.1",
            false,
            "http",
            true,
        ),
        (
            "/x",
            &[
                ("proxy-authorization", "Basic x"),
                ("host", "example.com"),
                ("x-plan", "gold"),
            ],
            "10.0.0.1",
            false,
            "http",
            true,
        ),
        // `Connection` names `Host`: it is written again, in the map.
        (
            "/x",
            &[
                ("connection", "host"),
                ("host", "example.com"),
                ("accept", "*/*"),
            ],
            "10.0.0.1",
            false,
            "http",
            false,
        ),
        // Two `Host` lines, or none: the map.
        (
            "/x",
            &[("host", "a.example"), ("host", "b.example")],
            "10.0.0.1",
            false,
            "http",
            false,
        ),
        ("/x", &[("accept", "*/*")], "10.0.0.1", false, "http", false),
        (
            "http://example.com/y",
            &[],
            "10.0.0.1",
            false,
            "http",
            false,
        ),
        // A trusted proxy's fields are appended to: the map.
        (
            "/x",
            &[("host", "example.com"), ("x-forwarded-for", "1.1.1.1")],
            "10.0.0.1",
            true,
            "http",
            false,
        ),
    ]
}
