//! The configuration loader on arbitrary text: it must answer with a
//! configuration or a list of errors, never panic, and every error must
//! carry a message.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Err(errors) = tollgate::config::load::parse_str(text) {
        assert!(!errors.0.is_empty());
        assert!(errors.0.iter().all(|e| !e.message.is_empty()));
    }
});
