//! `${VAR}` expansion of one scalar on arbitrary text, with an environment
//! that sets some names and leaves others unset. Beyond never panicking:
//! text with every `$` doubled comes back as written; a value is used as
//! it is, never expanded again; and text without `$` is left alone.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tollgate::config::expand::{ExpandError, escape, expand, has_references};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    // The first line is the value of every variable whose name starts with
    // `S`; the rest is the scalar.
    let (value, scalar) = text.split_once('\n').unwrap_or(("", text));
    let env = |name: &str| name.starts_with('S').then(|| value.to_owned());

    assert_eq!(expand(&escape(scalar), &env).as_deref(), Ok(scalar));
    assert_eq!(expand("${SET}", &env).as_deref(), Ok(value));
    assert_eq!(
        expand(&format!("{}${{SET}}", escape(scalar)), &env).as_deref(),
        Ok(format!("{scalar}{value}").as_str())
    );
    if !scalar.contains('$') {
        assert!(!has_references(scalar));
        assert_eq!(expand(scalar, &env).as_deref(), Ok(scalar));
    }
    match expand(scalar, &env) {
        Ok(out) => {
            // Nothing but the variables' values adds text.
            if !has_references(scalar) {
                assert_eq!(out, scalar);
            }
        }
        Err(ExpandError::Unset(names)) => {
            assert!(!names.is_empty());
            assert!(names.iter().all(|n| !n.starts_with('S')));
        }
        Err(ExpandError::Malformed { reference, .. }) => {
            assert!(reference.starts_with("${"));
            assert!(scalar.contains(&reference));
        }
    }
});
