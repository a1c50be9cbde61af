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
//! lock held for the copy only; the writer thread takes the whole buffer at
//! once, at most [`BATCH_DELAY`] after its first line, and writes it with
//! one call. A busy gateway's lines thus cost one wake-up and one `write`
//! per batch, not per line: with a queue of lines handed over one by one
//! (the `tracing-appender` crate's worker, used before), a gateway at
//! 40,000 requests a second spent an eighth of its CPU on the log thread,
//! two thirds of that parking, yielding and waking (`perf`,
//! docs/performance.md).
//!
//! The access-log line is the hottest: one per request. It is rendered by
//! hand into a buffer ([`AccessLine`]), in the same shape the `tracing`
//! formatter gives every other event (text, or one JSON object with
//! `timestamp`, `level`, `fields` and `target`), and handed to the queue
//! whole — no formatter per field, no subscriber machinery.
//!
//! The queue is the process's, like stderr itself ([`stderr`] sets it up
//! once). The access log is a gateway's own ([`AccessWriter`], handed to it
//! with `server::Serve::access_log`): a gateway without one — the
//! in-process tests, unless they ask — writes no access-log line.

use std::cell::RefCell;
use std::io::Write as _;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Bytes the queue holds before it drops lines: about 7,000 access-log
/// lines of 150 bytes, a few seconds of a busy gateway's log.
pub const QUEUE_BYTES: usize = 1 << 20;

/// How long the writer lets lines gather after the first of a batch: the
/// most a line waits in the queue when stderr keeps up.
pub const BATCH_DELAY: Duration = Duration::from_millis(10);

/// The access log's destination and format.
#[derive(Debug)]
pub struct AccessWriter {
    writer: Queue,
    json: bool,
}

/// Lines dropped by the process's queue ([`stderr`]).
static DROPPED: OnceLock<Arc<Shared>> = OnceLock::new();

/// A writer into a bounded queue that a thread of its own empties into its
/// destination. Clones share the queue. Each `write` is one line (or
/// several, whole): appended whole, or dropped and counted when the queue
/// is full.
#[derive(Debug, Clone)]
pub struct Queue {
    shared: Arc<Shared>,
}

#[derive(Debug, Default)]
struct Shared {
    state: Mutex<State>,
    /// Signalled when a batch starts (the buffer was empty) and at close.
    ready: Condvar,
    dropped: AtomicU64,
}

#[derive(Debug, Default)]
struct State {
    buf: Vec<u8>,
    closed: bool,
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Writes out what is queued when dropped (waiting at most a second), and
/// stops the writer thread.
#[derive(Debug)]
pub struct Flush {
    shared: Arc<Shared>,
    done: std::sync::mpsc::Receiver<()>,
}

impl Drop for Flush {
    fn drop(&mut self) {
        lock(&self.shared.state).closed = true;
        self.shared.ready.notify_one();
        let _ = self.done.recv_timeout(Duration::from_secs(1));
    }
}

/// A queue in front of `out`, emptied by a thread named `tollgate-log`.
///
/// # Panics
/// When the thread cannot be started.
pub fn queue(out: impl std::io::Write + Send + 'static) -> (Queue, Flush) {
    let shared = Arc::new(Shared::default());
    let (done_tx, done) = std::sync::mpsc::channel();
    let worker = Arc::clone(&shared);
    std::thread::Builder::new()
        .name("tollgate-log".into())
        .spawn(move || {
            drain(&worker, out);
            let _ = done_tx.send(());
        })
        .expect("the log writer thread starts");
    (
        Queue {
            shared: Arc::clone(&shared),
        },
        Flush { shared, done },
    )
}

/// The writer thread: waits for a batch's first line, lets the batch
/// gather, then writes it whole, until closed and empty.
fn drain(shared: &Shared, mut out: impl std::io::Write) {
    let mut batch = Vec::new();
    loop {
        let mut state = lock(&shared.state);
        while state.buf.is_empty() && !state.closed {
            state = shared
                .ready
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
        if !state.closed {
            drop(state);
            std::thread::sleep(BATCH_DELAY);
            state = lock(&shared.state);
        }
        let closed = state.closed;
        std::mem::swap(&mut batch, &mut state.buf);
        drop(state);
        // A destination that fails (closed, full disk) loses the batch; the
        // gateway goes on.
        let _ = out.write_all(&batch).and_then(|()| out.flush());
        batch.clear();
        if closed && lock(&shared.state).buf.is_empty() {
            return;
        }
    }
}

impl Queue {
    /// Lines this queue dropped because it was full, since start.
    pub fn dropped_lines(&self) -> u64 {
        self.shared.dropped.load(Ordering::Relaxed)
    }

    fn push(&self, line: &[u8]) {
        let mut state = lock(&self.shared.state);
        if state.buf.len() + line.len() > QUEUE_BYTES {
            drop(state);
            self.shared.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let first = state.buf.is_empty();
        state.buf.extend_from_slice(line);
        drop(state);
        if first {
            self.shared.ready.notify_one();
        }
    }
}

impl std::io::Write for Queue {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.push(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(feature = "gateway")]
impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Queue {
    type Writer = Queue;

    fn make_writer(&'a self) -> Queue {
        self.clone()
    }
}

/// The process's queue in front of stderr, for the `tracing` subscriber
/// and the access log. Keep the [`Flush`] until exit.
pub fn stderr() -> (Queue, Flush) {
    let (writer, flush) = queue(std::io::stderr());
    let _ = DROPPED.set(Arc::clone(&writer.shared));
    (writer, flush)
}

/// Log lines the process's queue dropped because it was full, since start.
pub fn dropped_lines() -> u64 {
    DROPPED
        .get()
        .map_or(0, |s| s.dropped.load(Ordering::Relaxed))
}

/// One access-log line being rendered: `field` calls in order, then
/// [`AccessLine::write`].
pub struct AccessLine<'a> {
    log: &'a AccessWriter,
    target: &'a str,
    buf: Vec<u8>,
}

impl AccessWriter {
    /// An access log written to `writer` (from [`stderr`], or any other
    /// [`queue`]), as one JSON object a line or as text.
    pub fn new(writer: Queue, json: bool) -> Self {
        Self { writer, json }
    }

    /// Starts a line of event `message` for `target`, stamped now.
    pub fn line<'a>(&'a self, target: &'a str, message: &str) -> AccessLine<'a> {
        // The thread's last line's buffer, emptied: one allocation per
        // thread rather than per line.
        let mut buf = LINE.with_borrow_mut(std::mem::take);
        buf.clear();
        buf.reserve(256);
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        if self.json {
            buf.extend_from_slice(b"{\"timestamp\":\"");
            timestamp(&mut buf, now.as_secs(), now.subsec_micros());
            buf.extend_from_slice(b"\",\"level\":\"INFO\",\"fields\":{\"message\":");
            json_str(&mut buf, message);
        } else {
            timestamp(&mut buf, now.as_secs(), now.subsec_micros());
            buf.extend_from_slice(b"  INFO ");
            buf.extend_from_slice(target.as_bytes());
            buf.extend_from_slice(b": ");
            buf.extend_from_slice(message.as_bytes());
        }
        AccessLine {
            log: self,
            target,
            buf,
        }
    }
}

impl AccessLine<'_> {
    fn key(&mut self, key: &str) {
        if self.log.json {
            self.buf.extend_from_slice(b",\"");
            self.buf.extend_from_slice(key.as_bytes());
            self.buf.extend_from_slice(b"\":");
        } else {
            self.buf.push(b' ');
            self.buf.extend_from_slice(key.as_bytes());
            self.buf.push(b'=');
        }
    }

    /// A text field.
    #[must_use]
    pub fn str(mut self, key: &str, value: &str) -> Self {
        self.key(key);
        if self.log.json {
            json_str(&mut self.buf, value);
        } else {
            self.buf.extend_from_slice(value.as_bytes());
        }
        self
    }

    /// A whole number.
    #[must_use]
    pub fn u64(mut self, key: &str, value: u64) -> Self {
        self.key(key);
        self.buf
            .extend_from_slice(itoa::Buffer::new().format(value).as_bytes());
        self
    }

    /// A text field when there is one.
    #[must_use]
    pub fn opt_str(self, key: &str, value: Option<&str>) -> Self {
        match value {
            Some(v) => self.str(key, v),
            None => self,
        }
    }

    /// An IP address, as text.
    #[must_use]
    pub fn ip(mut self, key: &str, ip: IpAddr) -> Self {
        self.key(key);
        let quote = self.log.json;
        if quote {
            self.buf.push(b'"');
        }
        // Only on replayable lines (`access_log.replay`).
        let _ = write!(self.buf, "{ip}");
        if quote {
            self.buf.push(b'"');
        }
        self
    }

    /// An IP address when there is one.
    #[must_use]
    pub fn opt_ip(self, key: &str, ip: Option<IpAddr>) -> Self {
        match ip {
            Some(ip) => self.ip(key, ip),
            None => self,
        }
    }

    /// Microseconds, written as milliseconds with three decimals.
    #[must_use]
    pub fn micros_as_ms(mut self, key: &str, micros: u64) -> Self {
        self.key(key);
        let mut n = itoa::Buffer::new();
        self.buf
            .extend_from_slice(n.format(micros / 1000).as_bytes());
        let frac = micros % 1000;
        self.buf.push(b'.');
        self.buf.push(b'0' + (frac / 100) as u8);
        self.buf.push(b'0' + (frac / 10 % 10) as u8);
        self.buf.push(b'0' + (frac % 10) as u8);
        self
    }

    /// The line so far, to be ended later ([`HeldLine`]): for a request
    /// whose last fields are known only when its response body ends.
    pub fn hold(mut self) -> HeldLine {
        HeldLine {
            writer: self.log.writer.clone(),
            json: self.log.json,
            target: self.target.to_owned(),
            buf: std::mem::take(&mut self.buf),
        }
    }

    /// Ends the line and queues it; dropped (and counted) when the queue is
    /// full.
    pub fn write(mut self) {
        if self.log.json {
            self.buf.extend_from_slice(b"},\"target\":");
            json_str(&mut self.buf, self.target);
            self.buf.push(b'}');
        }
        self.buf.push(b'\n');
        self.log.writer.push(&self.buf);
        let buf = std::mem::take(&mut self.buf);
        LINE.with_borrow_mut(|line| *line = buf);
    }
}

/// An access-log line held until the last of its fields are known: text
/// fields added, then [`HeldLine::write`].
#[derive(Debug)]
pub struct HeldLine {
    writer: Queue,
    json: bool,
    target: String,
    buf: Vec<u8>,
}

impl HeldLine {
    /// A text field.
    pub fn str(&mut self, key: &str, value: &str) {
        if self.json {
            self.buf.extend_from_slice(b",\"");
            self.buf.extend_from_slice(key.as_bytes());
            self.buf.extend_from_slice(b"\":");
            json_str(&mut self.buf, value);
        } else {
            self.buf.push(b' ');
            self.buf.extend_from_slice(key.as_bytes());
            self.buf.push(b'=');
            self.buf.extend_from_slice(value.as_bytes());
        }
    }

    /// Ends the line and queues it, as [`AccessLine::write`].
    pub fn write(mut self) {
        if self.json {
            self.buf.extend_from_slice(b"},\"target\":");
            json_str(&mut self.buf, &self.target);
            self.buf.push(b'}');
        }
        self.buf.push(b'\n');
        self.writer.push(&self.buf);
    }
}

thread_local! {
    /// The buffer an access-log line is rendered in, kept for the thread's
    /// next line.
    static LINE: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    /// The second of the last timestamp and its text up to the seconds
    /// (`2026-11-23T21:50:22`), which lines within the same second share.
    static SECOND: RefCell<(u64, Vec<u8>)> = const { RefCell::new((u64::MAX, Vec::new())) };
}

/// `value` as a JSON string: quoted, with `"`, `\` and control characters
/// escaped.
fn json_str(buf: &mut Vec<u8>, value: &str) {
    buf.push(b'"');
    for &b in value.as_bytes() {
        match b {
            b'"' => buf.extend_from_slice(b"\\\""),
            b'\\' => buf.extend_from_slice(b"\\\\"),
            b'\n' => buf.extend_from_slice(b"\\n"),
            b'\r' => buf.extend_from_slice(b"\\r"),
            b'\t' => buf.extend_from_slice(b"\\t"),
            0..0x20 => {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                buf.extend_from_slice(b"\\u00");
                buf.push(HEX[usize::from(b >> 4)]);
                buf.push(HEX[usize::from(b & 0xf)]);
            }
            _ => buf.push(b),
        }
    }
    buf.push(b'"');
}

/// RFC 3339 UTC with microseconds, as `tracing`'s formatter writes it:
/// `2026-11-23T21:50:22.123456Z`.
fn timestamp(buf: &mut Vec<u8>, secs: u64, micros: u32) {
    SECOND.with_borrow_mut(|(second, text)| {
        if *second != secs {
            text.clear();
            date_time(text, secs);
            *second = secs;
        }
        buf.extend_from_slice(text);
    });
    buf.push(b'.');
    let mut digits = [b'0'; 6];
    let mut v = micros;
    for c in digits.iter_mut().rev() {
        *c = b'0' + (v % 10) as u8;
        v /= 10;
    }
    buf.extend_from_slice(&digits);
    buf.push(b'Z');
}

/// `secs` since the epoch as RFC 3339 UTC up to the seconds.
fn date_time(buf: &mut Vec<u8>, secs: u64) {
    let (y, m, d) = crate::clock::civil_from_days((secs / 86_400) as i64);
    let s = secs % 86_400;
    let two = |buf: &mut Vec<u8>, v: u64| {
        buf.push(b'0' + (v / 10 % 10) as u8);
        buf.push(b'0' + (v % 10) as u8);
    };
    buf.extend_from_slice(itoa::Buffer::new().format(y).as_bytes());
    buf.push(b'-');
    two(buf, u64::from(m));
    buf.push(b'-');
    two(buf, u64::from(d));
    buf.push(b'T');
    two(buf, s / 3600);
    buf.push(b':');
    two(buf, s / 60 % 60);
    buf.push(b':');
    two(buf, s % 60);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_rfc3339_utc() {
        let mut b = Vec::new();
        timestamp(&mut b, 0, 0);
        assert_eq!(b, b"1970-01-01T00:00:00.000000Z");
        b.clear();
        // 2024-02-29T12:34:56.000789Z, a leap day.
        timestamp(&mut b, 1_709_210_096, 789);
        assert_eq!(b, b"2024-02-29T12:34:56.000789Z");
        b.clear();
        timestamp(&mut b, 4_102_444_799, 999_999);
        assert_eq!(b, b"2099-12-31T23:59:59.999999Z");
        // The same second again: its text is reused, the fraction is new.
        b.clear();
        timestamp(&mut b, 4_102_444_799, 5);
        assert_eq!(b, b"2099-12-31T23:59:59.000005Z");
        // A five-digit year.
        b.clear();
        timestamp(&mut b, 253_402_300_800, 0);
        assert_eq!(b, b"10000-01-01T00:00:00.000000Z");
        b.clear();
        timestamp(&mut b, 1_709_210_096, 789);
        assert_eq!(b, b"2024-02-29T12:34:56.000789Z");
    }

    /// A destination that takes bytes only once `open` is set.
    #[derive(Clone, Default)]
    struct Gate {
        open: Arc<std::sync::atomic::AtomicBool>,
        out: Arc<Mutex<Vec<u8>>>,
    }

    impl std::io::Write for Gate {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            while !self.open.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(1));
            }
            self.out.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn lines_go_out_whole_and_in_order_and_a_full_queue_drops_and_counts() {
        let gate = Gate::default();
        let (q, flush) = queue(gate.clone());
        let line = [b'x'; 1023];
        let mut sent = 0;
        // The destination is shut: the writer holds at most one batch, the
        // queue fills, and the rest is dropped — never waited for.
        for i in 0..4 * QUEUE_BYTES / 1024 {
            let mut l = line.to_vec();
            l.extend_from_slice(format!("{i:08}\n").as_bytes());
            let before = q.dropped_lines();
            q.push(&l);
            if q.dropped_lines() == before {
                sent += 1;
            }
        }
        assert!(q.dropped_lines() > 0, "a full queue drops");
        gate.open.store(true, Ordering::SeqCst);
        drop(flush);
        let out = gate.out.lock().unwrap().clone();
        let lines: Vec<&[u8]> = out
            .split(|&b| b == b'\n')
            .filter(|l| !l.is_empty())
            .collect();
        assert_eq!(lines.len(), sent, "every queued line is written at exit");
        assert!(lines.iter().all(|l| l.len() == 1031), "whole lines only");
        let numbers: Vec<u64> = lines
            .iter()
            .map(|l| std::str::from_utf8(&l[1023..]).unwrap().parse().unwrap())
            .collect();
        assert!(numbers.windows(2).all(|w| w[0] < w[1]), "in order");
    }

    #[test]
    fn json_strings_escape_what_json_must() {
        let mut b = Vec::new();
        json_str(&mut b, "a\"b\\c\nd\u{1}é");
        let back: String = serde_json::from_slice(&b).expect("valid JSON string");
        assert_eq!(back, "a\"b\\c\nd\u{1}é");
    }
}
