//! `tollgate simulate`'s reader of the gateway's own JSON access-log lines on arbitrary bytes: it answers
//! with a request, a skipped line or a reason, and never panics.
#![no_main]

#[path = "common/log_line.rs"]
mod log_line;

use libfuzzer_sys::fuzz_target;
use tollgate::simulate::InputFormat;

fuzz_target!(|data: &[u8]| log_line::check(InputFormat::Tollgate, data));
