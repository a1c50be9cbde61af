//! The store-key builder on arbitrary identity values.
//!
//! Whatever the caller sends, the identity part of a key must stay short,
//! contain no `{`/`}` (the hash tag around it is the gateway's), and be made
//! of the safe alphabet or a digest.
#![no_main]

use http::{HeaderMap, HeaderName, HeaderValue};
use libfuzzer_sys::fuzz_target;
use tollgate::config::{KeySource, KeySpec};
use tollgate::identity::{self, Caller};

fuzz_target!(|data: &[u8]| {
    let mut parts = data.splitn(4, |&b| b == 0);
    let shape = parts.next().unwrap_or_default();
    let api_key = parts.next().filter(|v| !v.is_empty());
    let user = parts.next().filter(|v| !v.is_empty());
    let header = parts.next().unwrap_or_default();

    let name = HeaderName::from_static("x-tenant");
    let mut headers = HeaderMap::new();
    if let Ok(v) = HeaderValue::from_bytes(header) {
        headers.insert(name.clone(), v);
    }
    // The shape bytes choose the key spec: each byte is one source, a 0xff
    // byte starts a new compound part.
    let mut spec = KeySpec { parts: vec![Vec::new()] };
    for &b in shape.iter().take(16) {
        if b == 0xff {
            spec.parts.push(Vec::new());
            continue;
        }
        let source = match b % 4 {
            0 => KeySource::Ip,
            1 => KeySource::ApiKey,
            2 => KeySource::User,
            _ => KeySource::Header(name.clone()),
        };
        if let Some(last) = spec.parts.last_mut() {
            last.push(source);
        }
    }
    let ip = identity::group("2001:db8::1".parse().expect("literal address"), 64);
    let caller = Caller {
        ip,
        api_key,
        user: user.map(std::borrow::Cow::Borrowed),
        plan: None,
        headers: &headers,
        body: None,
    };
    let mut key = String::new();
    identity::write_key(&mut key, &spec, &caller);
    assert!(!key.contains('{') && !key.contains('}'), "{key}");
    // Per part: the longest prefix (`h:x-tenant=`) plus 64 raw bytes.
    assert!(key.len() <= spec.parts.len() * (11 + 64 + 1), "{key}");
    assert!(
        key.bytes().all(|b| b.is_ascii_alphanumeric() || b"._~:@/+=-#,".contains(&b)),
        "{key}"
    );
});
