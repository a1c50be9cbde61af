//! Request-path normalisation on arbitrary bytes.
//!
//! A first byte chooses the rules (escaped-slash policy, slash merging).
//! Beyond "never panics": a canonical path is a fixed point (normalising it
//! again changes nothing and allocates nothing), holds no `.` or `..`
//! segment, no `//` when slashes are merged, and is a valid URI path.
#![no_main]

use std::borrow::Cow;

use libfuzzer_sys::fuzz_target;
use tollgate::target::{EscapedSlashes, PathRules, canonical_path, without_parameters};

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
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
