//! A test that cannot run here — a tool it drives is not installed — says
//! so beside its result. It still passes (the suite runs on machines
//! without the tool), but never silently.

use std::io::Write;

/// Reports that the running test skips its checks because of `why`.
///
/// The line goes straight to the process's stderr: `eprintln!` is captured
/// by the test harness and shown only for a failing test, which a skipped
/// test is not.
pub fn skipped(why: &str) {
    let thread = std::thread::current();
    let test = thread.name().filter(|n| *n != "main").unwrap_or("a test");
    // Nothing is left to report to when stderr itself is gone.
    let _ = writeln!(std::io::stderr().lock(), "SKIPPED {test}: {why}");
}
