//! `--decisions FILE`: every replayed request's decision, one JSON object
//! a line, for checking a replay request by request (the exactness test
//! holds it against a live gateway's answers) or for a diff in CI.
//!
//! ```text
//! {"request":1,"ts":1714521600000,"route":"api","decision":"allowed","retry_after":null,
//!  "limits":[{"name":"per_caller","verdict":"allowed","remaining":99}]}
//! ```
//!
//! `decision` is `allowed`, `limited` (429), `shadow_limited`, `rejected`
//! (401), `exempt` (an exempt caller, no limit asked), `unrouted` (404) or `refused` (any other refusal before a
//! decision); a limit's `verdict` is `allowed`, `limited`,
//! `shadow_limited`, or `read` when it was only read (an enforced limit
//! denied first). `remaining` is what the `RateLimit` header's `r` shows;
//! `retry_after` the `Retry-After` seconds of a 429.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::Path;

use serde::Serialize;

use super::options::SimError;
use crate::limit::Verdict;
use crate::pipeline::Rehearsal;
use crate::problem::GatewayError;

/// The `--decisions` file, written as the replay goes.
pub struct Trace {
    path: String,
    out: BufWriter<File>,
}

impl Trace {
    /// Creates (or empties) the file at `path`.
    ///
    /// # Errors
    /// The file cannot be created.
    pub fn create(path: &Path) -> Result<Self, SimError> {
        let file = File::create(path).map_err(|e| SimError::io(path.display(), e))?;
        Ok(Self {
            path: path.display().to_string(),
            out: BufWriter::new(file),
        })
    }

    /// Writes request number `n`'s decision, made at `ts`.
    ///
    /// # Errors
    /// The file cannot be written.
    pub fn record(&mut self, n: u64, ts: u64, r: &Rehearsal) -> Result<(), SimError> {
        write(&mut self.out, n, ts, r).map_err(|e| SimError::io(&self.path, e))
    }

    /// Writes out what is buffered.
    ///
    /// # Errors
    /// The file cannot be written.
    pub fn finish(mut self) -> Result<(), SimError> {
        self.out.flush().map_err(|e| SimError::io("--decisions", e))
    }
}

#[derive(Serialize)]
struct Decision<'a> {
    request: u64,
    ts: u64,
    route: Option<&'a str>,
    decision: &'static str,
    retry_after: Option<u64>,
    limits: Vec<LimitDecision<'a>>,
}

#[derive(Serialize)]
struct LimitDecision<'a> {
    name: &'a str,
    verdict: &'static str,
    remaining: Option<u64>,
}

/// Writes request number `n`'s decision, made at `ts`.
///
/// # Errors
/// The writer fails.
pub fn write(out: &mut impl Write, n: u64, ts: u64, r: &Rehearsal) -> io::Result<()> {
    let ex = &r.exchange;
    let decision = match &r.refusal {
        Some(GatewayError::Limited { .. }) => "limited",
        Some(GatewayError::UnknownApiKey) => "rejected",
        Some(GatewayError::NoRoute { .. }) => "unrouted",
        Some(_) => "refused",
        None if ex.exempt => "exempt",
        None if ex.decision().is_some_and(|d| d.shadow_denied()) => "shadow_limited",
        None => "allowed",
    };
    let retry_after = match &r.refusal {
        Some(GatewayError::Limited { retry_after, .. }) => *retry_after,
        _ => None,
    };
    let mut limits = Vec::new();
    if let Some(checked) = &ex.checked
        && let crate::decision::Decision::Decided(d) = &checked.decision
    {
        for (i, l) in checked.limits().iter().enumerate() {
            let verdict = d
                .verdicts
                .get(i)
                .copied()
                .flatten()
                .map_or("read", Verdict::as_str);
            let remaining = d
                .outcomes
                .as_ref()
                .and_then(|o| o.get(i))
                .map(|o| o.remaining);
            limits.push(LimitDecision {
                name: &l.name,
                verdict,
                remaining,
            });
        }
    }
    let d = Decision {
        request: n,
        ts,
        route: ex.route.as_ref().map(|c| &*c.route.name),
        decision,
        retry_after,
        limits,
    };
    serde_json::to_writer(&mut *out, &d)?;
    out.write_all(b"\n")
}
