//! The admin API's input: the query of `/admin/callers` and
//! `DELETE /admin/overrides`, and the JSON body of `PUT /admin/overrides`.
//!
//! A first byte chooses which. Beyond "never panics", what is accepted
//! holds what the handlers rely on: a query names a caller; a body names
//! exactly one caller field, says what changes, and a quota is positive;
//! a refusal names a field.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tollgate::admin::request::{parse_override, parse_query};

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    if mode & 1 == 0 {
        match parse_query(rest) {
            Ok(q) => assert!(!q.caller.is_empty(), "a query without a caller: {q:?}"),
            Err(e) => assert!(!e.field.is_empty() || rest.contains(&b'='), "{e:?}"),
        }
        return;
    }
    match parse_override(rest) {
        Ok(b) => {
            assert!(b.caller.subject().is_ok(), "{b:?}");
            assert!(b.quota != Some(0), "{b:?}");
            assert!(b.quota.is_some() || b.window.is_some() || b.plan.is_some() || b.exempt);
            let _ = b.caller.describe();
        }
        Err(e) => assert!(!e.field.is_empty() || !e.detail.is_empty(), "{e:?}"),
    }
});
