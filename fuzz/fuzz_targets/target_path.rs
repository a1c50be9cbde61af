//! Request-path and authority normalisation on arbitrary bytes.
//!
//! A first byte chooses the rules (escaped-slash policy, slash merging).
//! Beyond "never panics": a canonical path is a fixed point (normalising it
//! again changes nothing and allocates nothing), holds no `.` or `..`
//! segment, no `//` when slashes are merged, and is a valid URI path.
//! The same bytes as a `Host`: a canonical authority is a fixed point
//! too (taken as it is, borrowed, when made canonical again), lower case,
//! a valid URI authority, and has a host.
#![no_main]

use std::borrow::Cow;

use libfuzzer_sys::fuzz_target;
use tollgate::target::{
    EscapedSlashes, PathRules, canonical_authority, canonical_path, strip_port, without_parameters,
};

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    authority(text);
    let path = format!("/{text}");
    let rules = PathRules {
        normalize: true,
        merge_slashes: mode & 4 == 0,
        escaped_slashes: EscapedSlashes::SPELLINGS[usize::from(mode & 3) % 3].1,
    };
    let Ok(once) = canonical_path(&path, &rules) else {
        return;
    };
    let twice = canonical_path(&once, &rules).expect("a canonical path stays valid");
    assert_eq!(twice, once, "not idempotent for {path:?}");
    assert!(matches!(twice, Cow::Borrowed(_)), "{once:?} not seen as canonical");
    assert!(
        !once.split('/').any(|s| s == "." || s == ".."),
        "dot segment in {once:?} from {path:?}"
    );
    assert!(
        !rules.merge_slashes || !once.contains("//"),
        "// in {once:?} from {path:?}"
    );
    assert!(once.parse::<http::uri::PathAndQuery>().is_ok(), "{once:?}");
    let matched = without_parameters(&once, rules.merge_slashes);
    assert!(!matched.contains(';'));
    assert!(!rules.merge_slashes || !matched.contains("//"), "{matched:?}");
});

fn authority(text: &str) {
    let Ok(once) = canonical_authority(text) else {
        return;
    };
    let twice = canonical_authority(&once).expect("a canonical authority stays valid");
    assert_eq!(twice, once, "not idempotent for {text:?}");
    assert!(matches!(twice, Cow::Borrowed(_)), "{once:?} not seen as canonical");
    assert!(!once.bytes().any(|b| b.is_ascii_uppercase()), "{once:?}");
    assert!(once.parse::<http::uri::Authority>().is_ok(), "{once:?}");
    let host = strip_port(&once);
    assert!(!host.is_empty(), "no host in {once:?}");
    assert!(once.starts_with('[') || once.starts_with(host), "{once:?}");
}
