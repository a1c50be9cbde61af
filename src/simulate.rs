//! `tollgate simulate`: replay recorded traffic through the gateway's own
//! routing, identity and limiter code on a clock that follows the log, and
//! report what the limits would have done.
//!
//! The replay ([`replay`]) reads the logs ([`input`]: combined, tollgate's
//! JSON access log, JSON lines; gzip or not) on a thread of their own
//! (`reader.rs`), builds a [`Gateway`] per configuration on the in-process
//! store with a manual clock, and runs every line through
//! [`Gateway::decide_only`] — the pipeline's guard, route and decide
//! phases, the very ones a served request goes through — at the line's
//! time. [`tally`] counts what they decided; [`report`] turns that into the
//! report, which [`table`], JSON (`serde_json`) and [`html`] render.
//! docs/simulate.md is the manual.
//!
//! [`Gateway`]: crate::pipeline::Gateway
//! [`Gateway::decide_only`]: crate::pipeline::Gateway::decide_only

pub mod html;
pub mod input;
pub mod options;
mod reader;
pub mod replay;
pub mod report;
pub mod table;
pub mod tally;
pub mod time;
pub mod trace;

pub use options::{InputFormat, Options, OutputFormat, SimError};
pub use report::Report;

/// Replays `opts.logs` and returns the report.
///
/// # Errors
/// A configuration does not load, a log cannot be read.
pub fn simulate(opts: &Options) -> Result<Report, SimError> {
    let replayed = replay::replay(opts)?;
    let against = opts.against.as_ref().map(|p| p.display().to_string());
    Ok(report::build(
        &opts.config.display().to_string(),
        against.as_deref(),
        &replayed,
        opts.top,
    ))
}

/// The report in `format`.
pub fn render(report: &Report, format: OutputFormat) -> String {
    match format {
        OutputFormat::Table => table::render(report),
        OutputFormat::Json => {
            let mut s = serde_json::to_string_pretty(report).unwrap_or_default();
            s.push('\n');
            s
        }
        OutputFormat::Html => html::render(report),
    }
}
