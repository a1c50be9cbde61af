//! Log output that never holds up a request.
//!
//! Every log line — the `tracing` events and the access log — goes into a
//! bounded queue that one thread of its own empties into stderr
//! ([`stderr`]). When stderr is slow or nobody reads it (a full pipe, a
//! stalled collector), the queue fills and further lines are dropped and
//! counted ([`dropped_lines`], the `tollgate_log_lines_dropped_total`
//! series): a request never waits for its log line.
//!
//! The access-log line is the hottest: one per request. It is rendered by
//! hand into a buffer ([`AccessLine`]), in the same shape the `tracing`
//! formatter gives every other event (text, or one JSON object with
//! `timestamp`, `level`, `fields` and `target`), and handed to the queue
//! whole — no formatter per field, no subscriber machinery.
//!
//! The queue is the process's, like stderr itself ([`stderr`] sets it up
//! once). The access log is a gateway's own ([`AccessLog`], handed to it
//! with `server::Serve::access_log`): a gateway without one — the
//! in-process tests, unless they ask — writes no access-log line.

use std::io::Write as _;
use std::net::IpAddr;
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

use tracing_appender::non_blocking::{ErrorCounter, NonBlocking, NonBlockingBuilder, WorkerGuard};

/// Lines the queue holds before it drops: at ~200 bytes a line, about
/// 1.6 MB, several seconds of a busy gateway's access log.
pub const QUEUE_LINES: usize = 8192;

/// The access log's destination and format.
#[derive(Debug)]
pub struct AccessLog {
    writer: NonBlocking,
    json: bool,
}

static DROPPED: OnceLock<ErrorCounter> = OnceLock::new();

/// A writer into the bounded queue in front of stderr, for the `tracing`
/// subscriber and the access log. Lines written while the queue is full
/// are dropped and counted. Keep the guard until exit: dropping it writes
/// out what is queued (waiting at most a second).
pub fn stderr() -> (NonBlocking, WorkerGuard) {
    let (writer, guard) = NonBlockingBuilder::default()
        .lossy(true)
        .buffered_lines_limit(QUEUE_LINES)
        .thread_name("tollgate-log")
        .finish(std::io::stderr());
    let _ = DROPPED.set(writer.error_counter());
    (writer, guard)
}

/// Log lines dropped because the queue was full, since start.
pub fn dropped_lines() -> u64 {
    DROPPED.get().map_or(0, |c| c.dropped_lines() as u64)
}

/// One access-log line being rendered: `field` calls in order, then
/// [`AccessLine::write`].
pub struct AccessLine<'a> {
    log: &'a AccessLog,
    target: &'a str,
    buf: Vec<u8>,
}

impl AccessLog {
    /// An access log written to `writer` (from [`stderr`], or any other
    /// non-blocking writer), as one JSON object a line or as text.
    pub fn new(writer: NonBlocking, json: bool) -> Self {
        Self { writer, json }
    }

    /// Starts a line of event `message` for `target`, stamped now.
    pub fn line<'a>(&'a self, target: &'a str, message: &str) -> AccessLine<'a> {
        let mut buf = Vec::with_capacity(256);
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

    /// Ends the line and queues it; dropped (and counted) when the queue is
    /// full.
    pub fn write(mut self) {
        if self.log.json {
            self.buf.extend_from_slice(b"},\"target\":");
            json_str(&mut self.buf, self.target);
            self.buf.push(b'}');
        }
        self.buf.push(b'\n');
        let _ = self.log.writer.clone().write_all(&self.buf);
    }
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
    let (y, m, d) = civil(secs / 86_400);
    let s = secs % 86_400;
    let two = |buf: &mut Vec<u8>, v: u64| {
        buf.push(b'0' + (v / 10 % 10) as u8);
        buf.push(b'0' + (v % 10) as u8);
    };
    buf.extend_from_slice(itoa::Buffer::new().format(y).as_bytes());
    buf.push(b'-');
    two(buf, m);
    buf.push(b'-');
    two(buf, d);
    buf.push(b'T');
    two(buf, s / 3600);
    buf.push(b':');
    two(buf, s / 60 % 60);
    buf.push(b':');
    two(buf, s % 60);
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

/// Year, month and day of `days` since 1970-01-01 (the proleptic
/// Gregorian calendar, counted in 400-year eras).
fn civil(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + u64::from(m <= 2);
    (y, m, d)
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
    }

    #[test]
    fn json_strings_escape_what_json_must() {
        let mut b = Vec::new();
        json_str(&mut b, "a\"b\\c\nd\u{1}é");
        let back: String = serde_json::from_slice(&b).expect("valid JSON string");
        assert_eq!(back, "a\"b\\c\nd\u{1}é");
    }
}
