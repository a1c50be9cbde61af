//! Server-Sent Events split into the `data` of each event, as the HTML
//! standard's event-stream parser does it ("Parsing an event stream"):
//! lines end with CRLF, LF or CR; a leading byte-order mark is dropped; a
//! line starting with `:` is a comment; `data:` with or without one space
//! after the colon appends its value and a line feed to the event's data;
//! other fields (`event`, `id`, `retry`) and unknown ones are ignored; a
//! blank line dispatches the event. An event the stream ends in the middle
//! of, before its blank line, is not dispatched.
//!
//! The splitter holds no line: it only remembers where in a line it is, so
//! a line split across chunks at any byte reads as the whole line would,
//! and the data bytes go straight to the [`Events`] sink.
//!
//! [`Skim`] puts the splitter behind a search: most events of a stream
//! hold no wanted key, and a chunk without one is passed over whole, with
//! one search for the key and one look back for the last blank line; only
//! the event the chunk ends in the middle of is kept, raw, until a later
//! chunk ends it. The splitter reads an event only when the key is in its
//! raw bytes (a superset of its data: a key is never split across lines,
//! as a JSON string holds no line end), or when it outgrows
//! [`EVENT_BUFFER`]. After a blank line the splitter's state is
//! known without reading what came before (see [`blank`]), so passing
//! over events changes no answer.

/// Where the data of the stream's events goes.
pub trait Events {
    /// More bytes of the current event's data (the line feed that joins
    /// two `data` lines included).
    fn data(&mut self, bytes: &[u8]);
    /// A blank line: the current event is complete.
    fn dispatch(&mut self);
}

/// The raw bytes of an open SSE event held for the search (and of a read
/// event's data, before the scan) before it is scanned as it streams
/// instead.
pub const EVENT_BUFFER: usize = 16 * 1024;

const BOM: [u8; 3] = [0xEF, 0xBB, 0xBF];
const DATA: &[u8] = b"data";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Line {
    /// At the start of a line, or in a field name that is so far a prefix
    /// of `data` (this many bytes of it).
    Name(u8),
    /// In a `data` line's value; `fresh` right after the colon, where one
    /// space is dropped.
    Value { fresh: bool },
    /// In a line that is ignored (a comment, another field).
    Ignore,
}

/// The splitter; see the module docs.
#[derive(Debug, Clone)]
pub struct Splitter {
    line: Line,
    /// The last line ended with CR: a LF next belongs to it.
    after_cr: bool,
    /// Bytes of the byte-order mark matched at the start; 3 once past it.
    bom: u8,
}

impl Default for Splitter {
    fn default() -> Self {
        Self {
            line: Line::Name(0),
            after_cr: false,
            bom: 0,
        }
    }
}

impl Splitter {
    /// The state right after a blank line whose last byte was a CR when
    /// `after_cr`.
    fn after_blank(after_cr: bool) -> Self {
        Self {
            line: Line::Name(0),
            after_cr,
            bom: 3,
        }
    }

    /// Reads the next bytes of the stream.
    pub fn feed<E: Events>(&mut self, mut data: &[u8], sink: &mut E) {
        while self.bom < 3 {
            let Some(&b) = data.first() else { return };
            if b == BOM[usize::from(self.bom)] {
                self.bom += 1;
                data = &data[1..];
            } else {
                // A partial mark starts the first line with a byte no
                // field name has.
                if self.bom > 0 {
                    self.line = Line::Ignore;
                }
                self.bom = 3;
            }
        }
        while let Some(&b) = data.first() {
            if self.after_cr {
                self.after_cr = false;
                if b == b'\n' {
                    data = &data[1..];
                    continue;
                }
            }
            data = match self.line {
                Line::Name(n) => {
                    self.name(n, b, sink);
                    &data[1..]
                }
                Line::Value { fresh } => {
                    let data = if fresh && b == b' ' { &data[1..] } else { data };
                    self.line = Line::Value { fresh: false };
                    self.rest_of_line(data, Some(&mut *sink))
                }
                Line::Ignore => self.rest_of_line(data, None::<&mut E>),
            };
        }
    }

    /// One byte of a field name, the line's first bytes.
    fn name(&mut self, n: u8, b: u8, sink: &mut impl Events) {
        let n = usize::from(n);
        self.line = match b {
            b'\n' | b'\r' => {
                self.after_cr = b == b'\r';
                if n == 0 {
                    sink.dispatch();
                } else if n == DATA.len() {
                    // `data` alone: a data line with an empty value.
                    sink.data(b"\n");
                }
                Line::Name(0)
            }
            b':' if n == DATA.len() => Line::Value { fresh: true },
            _ if DATA.get(n) == Some(&b) => Line::Name(n as u8 + 1),
            _ => Line::Ignore,
        };
    }

    /// The bytes of a line up to its end, to `sink` when given; what
    /// follows the line's end.
    fn rest_of_line<'a, E: Events>(&mut self, data: &'a [u8], sink: Option<&mut E>) -> &'a [u8] {
        match memchr::memchr2(b'\n', b'\r', data) {
            None => {
                if let Some(sink) = sink {
                    sink.data(data);
                }
                &[]
            }
            Some(end) => {
                if let Some(sink) = sink {
                    sink.data(&data[..end]);
                    sink.data(b"\n");
                }
                self.after_cr = data[end] == b'\r';
                self.line = Line::Name(0);
                &data[end + 1..]
            }
        }
    }
}

fn is_eol(b: u8) -> bool {
    b == b'\n' || b == b'\r'
}

/// Whether the line ends `a` then `b` end a blank line: any two line-end
/// bytes in a row do, except a CR and the LF that belongs to it. (The first
/// ends a line, or is the LF of a CRLF that did; the second ends an empty
/// line.) Right after them the splitter is at the start of a line with the
/// event dispatched, whatever came before.
fn blank(a: u8, b: u8) -> bool {
    is_eol(a) && is_eol(b) && !(a == b'\r' && b == b'\n')
}

/// The index past the last blank line of `data`; `prev` is the byte
/// before `data`.
fn last_blank(prev: u8, data: &[u8]) -> Option<usize> {
    let mut end = data.len();
    while let Some(i) = memchr::memrchr2(b'\n', b'\r', &data[..end]) {
        let before = if i == 0 { prev } else { data[i - 1] };
        if blank(before, data[i]) {
            return Some(i + 1);
        }
        end = i;
    }
    None
}

/// The index past the first blank line of `data`; `prev` is the byte
/// before `data`.
fn first_blank(prev: u8, data: &[u8]) -> Option<usize> {
    let mut start = 0;
    while let Some(off) = memchr::memchr2(b'\n', b'\r', &data[start..]) {
        let i = start + off;
        let before = if i == 0 { prev } else { data[i - 1] };
        if blank(before, data[i]) {
            return Some(i + 1);
        }
        start = i + 1;
    }
    None
}

/// What the skim looks for: the wanted keys as they appear in raw bytes.
pub trait Needle {
    /// Where the first key starts in `hay`.
    fn find(&self, hay: &[u8]) -> Option<usize>;
    /// The longest key, in bytes (a key across two chunks is found in
    /// this many bytes either side of the join, less one).
    fn reach(&self) -> usize;
}

/// The most bytes of a key across a join looked at either side of it.
const MAX_REACH: usize = 128;

/// The splitter behind a search; see the module docs.
#[derive(Debug, Clone, Default)]
pub struct Skim {
    splitter: Splitter,
    /// In the middle of an event the splitter reads (one with a key, or
    /// past the buffer), until its blank line.
    reading: bool,
    /// Not reading: the raw bytes since the last blank line, without a
    /// key; the splitter's state is the one after that blank line.
    tail: Vec<u8>,
    /// The last byte seen (0 before the first).
    prev: u8,
}

impl Skim {
    /// Reads the next bytes of the stream: the events with a key in them
    /// go to `sink`.
    pub fn feed<E: Events>(&mut self, mut data: &[u8], sink: &mut E, needle: &impl Needle) {
        while let Some(&last) = data.last() {
            if self.reading {
                let Some(end) = first_blank(self.prev, data) else {
                    self.splitter.feed(data, sink);
                    self.prev = last;
                    return;
                };
                self.splitter.feed(&data[..end], sink);
                self.reading = false;
                self.prev = data[end - 1];
                data = &data[end..];
                continue;
            }
            if self.across(data, needle) {
                self.read_tail(sink);
                continue;
            }
            if let Some(at) = needle.find(data) {
                // The key's event starts at the last blank line before it,
                // or in the tail.
                match last_blank(self.prev, &data[..at]) {
                    Some(start) => {
                        self.pass(data[start - 1]);
                        self.prev = data[start - 1];
                        data = &data[start..];
                        self.reading = true;
                    }
                    None => self.read_tail(sink),
                }
                continue;
            }
            let open = match last_blank(self.prev, data) {
                Some(start) => {
                    self.pass(data[start - 1]);
                    &data[start..]
                }
                None => data,
            };
            if self.tail.len() + open.len() > EVENT_BUFFER {
                self.read_tail(sink);
                self.splitter.feed(open, sink);
            } else {
                self.tail.extend_from_slice(open);
            }
            self.prev = last;
            return;
        }
    }

    /// Reads the next bytes of the stream without the search: every event
    /// goes to `sink`, as the skim's reference (tests, the fuzz target).
    pub fn feed_unskimmed<E: Events>(&mut self, data: &[u8], sink: &mut E) {
        self.splitter.feed(data, sink);
    }

    /// Passes over the tail and what follows it up to a blank line whose
    /// last byte is `end`.
    fn pass(&mut self, end: u8) {
        self.tail.clear();
        self.splitter = Splitter::after_blank(end == b'\r');
    }

    /// The splitter reads the tail and what follows, up to a blank line.
    fn read_tail<E: Events>(&mut self, sink: &mut E) {
        self.splitter.feed(&self.tail, sink);
        self.tail.clear();
        self.reading = true;
    }

    /// Whether a key starts in the tail and ends in `data`.
    fn across(&self, data: &[u8], needle: &impl Needle) -> bool {
        let reach = needle.reach().clamp(1, MAX_REACH) - 1;
        if self.tail.is_empty() || reach == 0 {
            return false;
        }
        let before = &self.tail[self.tail.len().saturating_sub(reach)..];
        let after = &data[..data.len().min(reach)];
        let mut join = [0u8; 2 * MAX_REACH];
        join[..before.len()].copy_from_slice(before);
        join[before.len()..before.len() + after.len()].copy_from_slice(after);
        needle
            .find(&join[..before.len() + after.len()])
            .is_some_and(|at| at < before.len())
    }
}
