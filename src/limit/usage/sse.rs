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

/// Where the data of the stream's events goes.
pub trait Events {
    /// More bytes of the current event's data (the line feed that joins
    /// two `data` lines included).
    fn data(&mut self, bytes: &[u8]);
    /// A blank line: the current event is complete.
    fn dispatch(&mut self);
}

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
