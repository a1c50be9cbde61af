//! Log output that never holds up a request.
//!
//! Every log line — the `tracing` events and the access log — goes into a
//! bounded queue that one thread of its own empties into stderr
//! ([`stderr`]). When stderr is slow or nobody reads it (a full pipe, a
//! stalled collector), the queue fills and further lines are dropped and
//! counted ([`dropped_lines`], the `tollgate_log_lines_dropped_total`
//! series): a request never waits for its log line.
//!
//! The queue is a byte buffer that lines are appended to whole, under a
//! lock held for the copy only (for an access-log line, for its
//! rendering); the writer thread takes the whole buffer at
//! once, at most [`BATCH_DELAY`] after its first line, and writes it with
//! one call. A busy gateway's lines thus cost one wake-up and one `write`
//! per batch, not per line: with a queue of lines handed over one by one
//! (the `tracing-appender` crate's worker, used before), a gateway at
//! 40,000 requests a second spent an eighth of its CPU on the log thread,
//! two thirds of that parking, yielding and waking (`perf`,
//! docs/performance.md).
//!
//! The access-log line is the hottest: one per request. It is rendered by
//! hand straight into the queue's buffer ([`AccessLine`]), in the same
//! shape the `tracing` formatter gives every other event (text, or one
//! JSON object with `timestamp`, `level`, `fields` and `target`): no
//! formatter per field, no subscriber machinery, no buffer of its own to
//! copy from, and the fixed parts — the event's target and message, each
//! field's name — written whole as each format spells them ([`Event`],
//! [`Key`]). Its timestamp is reckoned from the `Instant` the request's
//! latency ends at ([`RESYNC`]).
//!
//! The queue is the process's, like stderr itself ([`stderr`] sets it up
//! once). The access log is a gateway's own ([`AccessWriter`], handed to it
//! with `server::Serve::access_log`): a gateway without one — the
//! in-process tests, unless they ask — writes no access-log line.

pub mod access;
mod queue;

pub use access::{AccessLine, AccessWriter, Event, HeldLine, Key, RESYNC};
pub use queue::{BATCH_DELAY, Flush, QUEUE_BYTES, Queue, dropped_lines, queue, stderr};
