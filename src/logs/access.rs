//! The access log: lines rendered by hand straight into the log queue's
//! buffer ([`super`]), in the shape `tracing`'s formatter gives every
//! other event, and their timestamps.

use std::cell::RefCell;
use std::io::Write as _;
use std::net::IpAddr;
use std::sync::MutexGuard;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::queue::{QUEUE_BYTES, Queue, State, lock};

/// The access log's destination and format.
#[derive(Debug)]
pub struct AccessWriter {
    writer: Queue,
    json: bool,
}

/// The fixed parts of an access-log line's event, made with
/// [`access_event!`](crate::access_event): its target and message as each
/// format writes them, so that a line copies them whole.
#[derive(Debug, Clone, Copy)]
pub struct Event {
    /// Text: after the timestamp, up to the first field.
    pub text: &'static str,
    /// JSON: after the timestamp, up to the first field.
    pub json: &'static str,
    /// JSON: after the last field, with the line's end.
    pub json_end: &'static str,
}

/// An access-log field's name as each format introduces it, made with
/// [`access_key!`](crate::access_key).
#[derive(Debug, Clone, Copy)]
pub struct Key {
    /// Text: ` name=`.
    pub text: &'static str,
    /// JSON: `,"name":`.
    pub json: &'static str,
}

/// The [`Event`] of target `$target` and message `$message`, two string
/// literals that JSON needs no escape in.
#[macro_export]
macro_rules! access_event {
    ($target:literal, $message:literal) => {
        $crate::logs::access::Event {
            text: concat!("Z  INFO ", $target, ": ", $message),
            json: concat!(
                "Z\",\"level\":\"INFO\",\"fields\":{\"message\":\"",
                $message,
                "\""
            ),
            json_end: concat!("},\"target\":\"", $target, "\"}\n"),
        }
    };
}

/// The [`Key`] named `$name`, a string literal that JSON needs no escape
/// in.
#[macro_export]
macro_rules! access_key {
    ($name:literal) => {
        $crate::logs::access::Key {
            text: concat!(" ", $name, "="),
            json: concat!(",\"", $name, "\":"),
        }
    };
}

/// One access-log line being rendered: field calls in order, then
/// [`AccessLine::write`] (or [`AccessLine::hold`]).
///
/// The line is rendered straight into the queue's buffer, under the
/// queue's lock, with no buffer or copy of its own: the lock is held for
/// the rendering of one line, about as long as the copy of a rendered
/// line would take, and the writer thread takes it only to swap the
/// buffer out. The field calls are inlined into their caller, where each
/// field's name is a constant of known length.
pub struct AccessLine<'a> {
    log: &'a AccessWriter,
    event: Event,
    /// The queue, locked for the line.
    state: MutexGuard<'a, State>,
    /// Where the line starts in the queue's buffer.
    start: usize,
}

/// Room reserved for a line before it is rendered, so that its fields
/// are appended without the buffer growing between them.
const LINE_ROOM: usize = 512;

impl AccessWriter {
    /// An access log written to `writer` (from [`stderr`], or any other
    /// [`queue`]), as one JSON object a line or as text.
    pub fn new(writer: Queue, json: bool) -> Self {
        Self { writer, json }
    }

    /// Starts a line of `event` stamped at `at`, to be ended with
    /// [`AccessLine::write`] or [`AccessLine::hold`].
    #[inline]
    pub fn line(&self, event: Event, at: Instant) -> AccessLine<'_> {
        let mut state = lock(&self.writer.shared.state);
        let start = state.buf.len();
        let buf = &mut state.buf;
        buf.reserve(LINE_ROOM);
        if self.json {
            buf.extend_from_slice(b"{\"timestamp\":\"");
            timestamp(buf, at);
            buf.extend_from_slice(event.json.as_bytes());
        } else {
            timestamp(buf, at);
            buf.extend_from_slice(event.text.as_bytes());
        }
        AccessLine {
            log: self,
            event,
            state,
            start,
        }
    }
}

impl AccessLine<'_> {
    #[inline(always)]
    fn key(&mut self, key: Key) -> &mut Vec<u8> {
        let json = self.log.json;
        let buf = &mut self.state.buf;
        buf.extend_from_slice(if json { key.json } else { key.text }.as_bytes());
        buf
    }

    /// A text field.
    #[must_use]
    #[inline(always)]
    pub fn str(mut self, key: Key, value: &str) -> Self {
        let json = self.log.json;
        let buf = self.key(key);
        if json {
            json_str(buf, value);
        } else {
            buf.extend_from_slice(value.as_bytes());
        }
        self
    }

    /// A whole number.
    #[must_use]
    #[inline(always)]
    pub fn u64(mut self, key: Key, value: u64) -> Self {
        self.key(key)
            .extend_from_slice(itoa::Buffer::new().format(value).as_bytes());
        self
    }

    /// A text field when there is one.
    #[must_use]
    #[inline(always)]
    pub fn opt_str(self, key: Key, value: Option<&str>) -> Self {
        match value {
            Some(v) => self.str(key, v),
            None => self,
        }
    }

    /// An IP address, as text (only on replayable lines:
    /// `access_log.replay`).
    #[must_use]
    pub fn ip(self, key: Key, ip: IpAddr) -> Self {
        self.shown(key, ip)
    }

    /// An IP address when there is one.
    #[must_use]
    pub fn opt_ip(self, key: Key, ip: Option<IpAddr>) -> Self {
        match ip {
            Some(ip) => self.ip(key, ip),
            None => self,
        }
    }

    /// A socket address, as text.
    #[must_use]
    pub fn addr(self, key: Key, addr: std::net::SocketAddr) -> Self {
        self.shown(key, addr)
    }

    /// A value as its `Display` writes it, quoted in JSON: for values
    /// with no character to escape.
    fn shown(mut self, key: Key, value: impl std::fmt::Display) -> Self {
        let quote = self.log.json;
        let buf = self.key(key);
        if quote {
            buf.push(b'"');
        }
        let _ = write!(buf, "{value}");
        if quote {
            buf.push(b'"');
        }
        self
    }

    /// Microseconds, written as milliseconds with three decimals.
    #[must_use]
    #[inline(always)]
    pub fn micros_as_ms(mut self, key: Key, micros: u64) -> Self {
        let buf = self.key(key);
        buf.extend_from_slice(itoa::Buffer::new().format(micros / 1000).as_bytes());
        let frac = micros % 1000;
        buf.extend_from_slice(&[
            b'.',
            b'0' + (frac / 100) as u8,
            b'0' + (frac / 10 % 10) as u8,
            b'0' + (frac % 10) as u8,
        ]);
        self
    }

    /// The line so far, to be ended later ([`HeldLine`]): for a request
    /// whose last fields are known only when its response body ends.
    pub fn hold(mut self) -> HeldLine {
        // Rendered in the queue like any other (lines to hold are few):
        // moved out of it.
        let buf = self.state.buf.split_off(self.start);
        drop(self.state);
        HeldLine {
            writer: self.log.writer.clone(),
            json: self.log.json,
            json_end: self.event.json_end,
            buf,
        }
    }

    /// Ends the line and queues it; dropped (and counted) when the queue is
    /// full.
    pub fn write(self) {
        let Self {
            log,
            event,
            mut state,
            start,
        } = self;
        if log.json {
            state.buf.extend_from_slice(event.json_end.as_bytes());
        } else {
            state.buf.push(b'\n');
        }
        if state.buf.len() > QUEUE_BYTES {
            state.buf.truncate(start);
            drop(state);
            log.writer.shared.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        drop(state);
        if start == 0 {
            log.writer.shared.ready.notify_one();
        }
    }
}

/// An access-log line held until the last of its fields are known: text
/// fields added, then [`HeldLine::write`].
#[derive(Debug)]
pub struct HeldLine {
    writer: Queue,
    json: bool,
    json_end: &'static str,
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
            self.buf.extend_from_slice(self.json_end.as_bytes());
        } else {
            self.buf.push(b'\n');
        }
        self.writer.push(&self.buf);
    }
}

thread_local! {
    /// The second of the last timestamp and its text up to the seconds
    /// (`2026-11-23T21:50:22`), which lines within the same second share.
    static SECOND: RefCell<(u64, Vec<u8>)> = const { RefCell::new((u64::MAX, Vec::new())) };
    /// The wall clock at an instant: the thread's timestamps are that plus
    /// the monotonic time since, for up to [`RESYNC`].
    static ANCHOR: std::cell::Cell<Option<(Instant, u64)>> = const { std::cell::Cell::new(None) };
}

/// How long a thread's timestamps are reckoned from one reading of the
/// wall clock: a step of the wall clock shows in them within this.
pub const RESYNC: Duration = Duration::from_secs(1);

/// Microseconds since the Unix epoch at `at`: the wall clock read at
/// most [`RESYNC`] before, plus the monotonic time since, so that a line
/// costs its request one clock reading (the `Instant` its latency ends
/// at), not two. Both clocks are slewed alike by NTP, so within a second
/// they part by no more than a step of the wall clock would.
fn wall_micros(at: Instant) -> u64 {
    if let Some((anchor, micros)) = ANCHOR.get()
        && let Some(since) = at.checked_duration_since(anchor)
        && since < RESYNC
    {
        return micros + since.as_micros() as u64;
    }
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let micros = now.as_secs() * 1_000_000 + u64::from(now.subsec_micros());
    ANCHOR.set(Some((at, micros)));
    micros
}

/// `value` as a JSON string: quoted, with `"`, `\` and control characters
/// escaped.
fn json_str(buf: &mut Vec<u8>, value: &str) {
    buf.push(b'"');
    let bytes = value.as_bytes();
    // Runs that need no escape are copied whole.
    let mut run = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let escaped: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0..0x20 => b"",
            _ => continue,
        };
        buf.extend_from_slice(&bytes[run..i]);
        run = i + 1;
        if escaped.is_empty() {
            const HEX: &[u8; 16] = b"0123456789abcdef";
            buf.extend_from_slice(b"\\u00");
            buf.push(HEX[usize::from(b >> 4)]);
            buf.push(HEX[usize::from(b & 0xf)]);
        } else {
            buf.extend_from_slice(escaped);
        }
    }
    buf.extend_from_slice(&bytes[run..]);
    buf.push(b'"');
}

/// RFC 3339 UTC with microseconds, as `tracing`'s formatter writes it,
/// but for the `Z` (the line's [`Event`] begins with it):
/// `2026-11-23T21:50:22.123456`.
fn timestamp(buf: &mut Vec<u8>, at: Instant) {
    let micros = wall_micros(at);
    time_text(buf, micros / 1_000_000, (micros % 1_000_000) as u32);
}

/// `secs` and `micros` since the epoch as [`timestamp`] writes them.
fn time_text(buf: &mut Vec<u8>, secs: u64, micros: u32) {
    SECOND.with_borrow_mut(|(second, text)| {
        if *second != secs {
            text.clear();
            date_time(text, secs);
            *second = secs;
        }
        buf.extend_from_slice(text);
    });
    let mut digits = [b'.', b'0', b'0', b'0', b'0', b'0', b'0'];
    let mut v = micros;
    for c in digits[1..].iter_mut().rev() {
        *c = b'0' + (v % 10) as u8;
        v /= 10;
    }
    buf.extend_from_slice(&digits);
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
    use super::super::queue::queue;
    use super::super::queue::tests::Gate;
    use super::*;
    use std::sync::atomic::Ordering;
    use std::sync::{Arc, Mutex};

    #[test]
    fn timestamps_are_rfc3339_utc() {
        let mut b = Vec::new();
        time_text(&mut b, 0, 0);
        assert_eq!(b, b"1970-01-01T00:00:00.000000");
        b.clear();
        // 2024-02-29T12:34:56.000789Z, a leap day.
        time_text(&mut b, 1_709_210_096, 789);
        assert_eq!(b, b"2024-02-29T12:34:56.000789");
        b.clear();
        time_text(&mut b, 4_102_444_799, 999_999);
        assert_eq!(b, b"2099-12-31T23:59:59.999999");
        // The same second again: its text is reused, the fraction is new.
        b.clear();
        time_text(&mut b, 4_102_444_799, 5);
        assert_eq!(b, b"2099-12-31T23:59:59.000005");
        // A five-digit year.
        b.clear();
        time_text(&mut b, 253_402_300_800, 0);
        assert_eq!(b, b"10000-01-01T00:00:00.000000");
        b.clear();
        time_text(&mut b, 1_709_210_096, 789);
        assert_eq!(b, b"2024-02-29T12:34:56.000789");
    }

    #[test]
    fn the_wall_time_of_an_instant_is_the_wall_clocks() {
        let micros = |t: SystemTime| t.duration_since(UNIX_EPOCH).unwrap().as_micros() as u64;
        let before = micros(SystemTime::now());
        let first = wall_micros(Instant::now());
        // Reckoned from the anchor the first set.
        let second = wall_micros(Instant::now());
        let after = micros(SystemTime::now());
        // A millisecond of slack for the two clocks' readings apart.
        assert!(
            before <= first + 1_000 && first <= after + 1_000,
            "{before} {first} {after}"
        );
        assert!(
            first <= second && second <= after + 1_000,
            "{first} {second} {after}"
        );
    }

    /// What a gateway's access log would write for one line of each shape.
    fn rendered(json: bool, held: bool) -> String {
        let sink = Arc::new(Mutex::new(Vec::new()));
        struct Sink(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Sink {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let (q, flush) = queue(Sink(Arc::clone(&sink)));
        let log = AccessWriter::new(q, json);
        let line = log
            .line(access_event!("tollgate::access", "request"), Instant::now())
            .str(access_key!("route"), "a \"b\"")
            .u64(access_key!("status"), 200)
            .micros_as_ms(access_key!("latency_ms"), 12_345)
            .opt_str(access_key!("none"), None)
            .ip(access_key!("peer"), IpAddr::from([127, 0, 0, 1]))
            .addr(access_key!("upstream_addr"), "[::1]:8080".parse().unwrap());
        if held {
            let mut held = line.hold();
            held.str("settled", "tpm:12");
            held.write();
        } else {
            line.write();
        }
        drop(flush);
        String::from_utf8(sink.lock().unwrap().clone()).unwrap()
    }

    #[test]
    fn access_lines_have_tracings_shape() {
        for held in [false, true] {
            let text = rendered(false, held);
            let (ts, rest) = text.split_once("Z  INFO ").unwrap();
            assert_eq!(ts.len(), 26, "{text}");
            let settled = if held { " settled=tpm:12" } else { "" };
            assert_eq!(
                rest,
                format!(
                    "tollgate::access: request route=a \"b\" status=200 latency_ms=12.345 \
                     peer=127.0.0.1 upstream_addr=[::1]:8080{settled}\n"
                )
            );
            let json = rendered(true, held);
            assert!(json.ends_with('\n') && json.matches('\n').count() == 1);
            let v: serde_json::Value = serde_json::from_str(&json).unwrap();
            let mut fields = serde_json::json!({
                "message": "request", "route": "a \"b\"", "status": 200,
                "latency_ms": 12.345, "peer": "127.0.0.1", "upstream_addr": "[::1]:8080",
            });
            if held {
                fields["settled"] = "tpm:12".into();
            }
            assert_eq!(v["fields"], fields, "{json}");
            assert_eq!(v["level"], "INFO");
            assert_eq!(v["target"], "tollgate::access");
            let ts = v["timestamp"].as_str().unwrap();
            assert!(ts.len() == 27 && ts.ends_with('Z'), "{ts}");
            // The fields in order, as written.
            assert!(json.starts_with("{\"timestamp\":\""));
            assert!(
                json.contains(
                    "\",\"level\":\"INFO\",\"fields\":{\"message\":\"request\",\"route\""
                )
            );
        }
    }

    #[test]
    fn json_strings_escape_what_json_must() {
        for s in ["a\"b\\c\nd\u{1}é", "", "plain", "\"", "end\t", "\u{1f}x\r"] {
            let mut b = Vec::new();
            json_str(&mut b, s);
            let back: String = serde_json::from_slice(&b).expect("valid JSON string");
            assert_eq!(back, s);
        }
    }

    #[test]
    fn a_full_queue_drops_whole_access_lines_and_counts_them() {
        let gate = Gate::default();
        let (q, flush) = queue(gate.clone());
        let log = AccessWriter::new(q.clone(), false);
        let value = "v".repeat(400);
        let mut written = 0;
        for _ in 0..4 * QUEUE_BYTES / 400 {
            let before = q.dropped_lines();
            log.line(access_event!("t", "m"), Instant::now())
                .str(access_key!("k"), &value)
                .write();
            if q.dropped_lines() == before {
                written += 1;
            }
        }
        assert!(q.dropped_lines() > 0, "a full queue drops");
        gate.open.store(true, Ordering::SeqCst);
        drop(flush);
        let out = String::from_utf8(gate.out.lock().unwrap().clone()).unwrap();
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), written, "every line not dropped is written");
        let whole = format!("Z  INFO t: m k={value}");
        assert!(
            lines
                .iter()
                .all(|l| l.len() == 26 + whole.len() && l.ends_with(&whole)),
            "whole lines only"
        );
    }
}
