//! A streaming JSON scanner that keeps the numbers at wanted paths and
//! nothing else.
//!
//! It reads one JSON document fed in pieces of any size, checks its
//! structure (brackets, commas, colons, literals, the number grammar of
//! RFC 8259 §6, string escapes), and tracks, for the member being read,
//! which wanted paths its keys still match: one bit per path in a mask per
//! open container. A value at the end of a wanted path is recorded for the
//! path's term ([`Hits`]); everything else is only stepped over. State is
//! the container stack ([`MAX_DEPTH`] frames at most), one key of at most
//! [`MAX_SEGMENT`] bytes and one number: nothing grows with the document.
//!
//! What it checks and what it does not:
//! - keys are compared as written: a key spelled with escapes
//!   (`"\u0075sage"`) is not `usage` (so a byte search for `"usage"` finds
//!   every key the scanner would match);
//! - strings are not checked for UTF-8 or raw control characters;
//! - deeper than [`MAX_DEPTH`] containers: not JSON;
//! - values inside arrays are never at a wanted path (paths are keys only).

use super::spec::{MAX_SEGMENT, MAX_TERMS, Paths};

/// Containers open at once past which a document counts as not JSON
/// (serde_json's own recursion limit).
pub const MAX_DEPTH: usize = 128;

/// What one document said for each term.
#[derive(Debug, Clone, Copy, Default)]
pub struct Hits {
    /// Per term: the last value seen and how many were seen.
    pub terms: [Hit; MAX_TERMS],
}

/// One term's values in one document.
#[derive(Debug, Clone, Copy, Default)]
pub struct Hit {
    /// Numbers seen at any of the term's paths.
    pub count: u8,
    /// The last of them.
    pub value: u64,
    /// A value that is not a non-negative integer up to 2^63 − 1 (a
    /// string, a negative or fractional number, an exponent, `true`, an
    /// object, an array) sat at one of the term's paths.
    pub bad: bool,
}

impl Hits {
    /// Whether any term saw anything, good or bad.
    pub fn any(&self) -> bool {
        self.terms.iter().any(|h| h.count > 0 || h.bad)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Container {
    Object,
    Array,
}

#[derive(Debug, Clone, Copy)]
struct Frame {
    container: Container,
    /// Paths whose segments so far match the keys leading here.
    mask: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// A value is due (after `:`, `,` in an array, or at the start).
    Value,
    /// After `{`: a key or `}`.
    KeyOrClose,
    /// After `,` in an object: a key.
    Key,
    /// After a key: `:`.
    Colon,
    /// After `[`: a value or `]`.
    ValueOrClose,
    /// After a value inside a container: `,` or its close.
    Next,
    /// In a string; `key` when it is an object's key.
    Str { key: bool },
    /// After a backslash in a string.
    Escape { key: bool },
    /// Hex digits of a `\u` escape still due.
    Hex { key: bool, left: u8 },
    /// In a number.
    Number(Num),
    /// In `true`, `false` or `null`, this many bytes matched.
    Literal { word: &'static [u8], at: u8 },
    /// The document's value is complete: only whitespace may follow.
    Done,
    /// Not JSON; the rest is ignored.
    Failed,
}

/// Where a number is in RFC 8259's grammar.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Num {
    Minus,
    Zero,
    Int,
    FracStart,
    Frac,
    ExpStart,
    ExpSign,
    Exp,
}

/// The scanner; see the module docs.
#[derive(Debug, Clone)]
pub struct Scanner {
    stack: Vec<Frame>,
    state: State,
    /// The key being read, as written, and whether it outgrew the buffer
    /// (then it matches no path).
    key: [u8; MAX_SEGMENT],
    key_len: usize,
    key_long: bool,
    /// The member whose value is due: the mask its key left.
    value_mask: u64,
    /// The current number's paths that end at it, its value so far, and
    /// whether it is still a candidate (non-negative integer in range).
    num_mask: u64,
    num_value: u64,
    num_ok: bool,
    hits: Hits,
}

impl Scanner {
    /// A scanner at the start of a document, for `paths`.
    pub fn new(paths: &Paths) -> Self {
        Self {
            stack: Vec::new(),
            state: State::Value,
            key: [0; MAX_SEGMENT],
            key_len: 0,
            key_long: false,
            value_mask: paths.all(),
            num_mask: 0,
            num_value: 0,
            num_ok: false,
            hits: Hits::default(),
        }
    }

    /// Back to the start of a new document.
    pub fn reset(&mut self, paths: &Paths) {
        self.stack.clear();
        self.state = State::Value;
        self.value_mask = paths.all();
        self.hits = Hits::default();
    }

    /// What the document said so far.
    pub fn hits(&self) -> &Hits {
        &self.hits
    }

    /// Whether the document's value is complete and valid so far.
    pub fn complete(&self) -> bool {
        self.state == State::Done
    }

    /// Ends the document: whether it was one JSON value (a number at the
    /// top level ends here).
    pub fn end(&mut self, paths: &Paths) -> bool {
        if let State::Number(n) = self.state
            && self.stack.is_empty()
        {
            self.end_number(n, paths);
        }
        self.state == State::Done
    }

    /// Reads `data`, the next bytes of the document.
    pub fn feed(&mut self, data: &[u8], paths: &Paths) {
        let mut i = 0;
        while i < data.len() {
            match self.state {
                State::Failed => return,
                State::Str { key } => {
                    i = self.string(data, i, key);
                    continue;
                }
                _ => {}
            }
            if self.step(data[i], paths) {
                i += 1;
            }
        }
    }

    /// Steps over string bytes from `i` to the next quote or backslash;
    /// the index after what it read.
    fn string(&mut self, data: &[u8], i: usize, key: bool) -> usize {
        let rest = &data[i..];
        let (n, stop) = match memchr::memchr2(b'"', b'\\', rest) {
            Some(n) => (n, Some(rest[n])),
            None => (rest.len(), None),
        };
        if key {
            self.key_bytes(&rest[..n]);
        }
        match stop {
            Some(b'"') => {
                self.state = if key {
                    State::Colon
                } else {
                    self.after_value()
                };
            }
            Some(_) => {
                if key {
                    self.key_bytes(b"\\");
                }
                self.state = State::Escape { key };
            }
            None => return data.len(),
        }
        i + n + 1
    }

    fn key_bytes(&mut self, b: &[u8]) {
        if self.key_long {
            return;
        }
        match self.key.get_mut(self.key_len..self.key_len + b.len()) {
            Some(dst) => {
                dst.copy_from_slice(b);
                self.key_len += b.len();
            }
            None => self.key_long = true,
        }
    }

    /// Reads one byte outside a string's plain text; false when the byte
    /// ended a number and is to be read again in the state after it.
    fn step(&mut self, b: u8, paths: &Paths) -> bool {
        let ws = matches!(b, b' ' | b'\t' | b'\n' | b'\r');
        match self.state {
            State::Value | State::ValueOrClose if ws => {}
            State::ValueOrClose if b == b']' => self.close(Container::Array),
            State::Value | State::ValueOrClose => self.value_start(b, paths),
            State::KeyOrClose | State::Key | State::Colon | State::Next | State::Done if ws => {}
            State::KeyOrClose if b == b'}' => self.close(Container::Object),
            State::KeyOrClose | State::Key if b == b'"' => {
                self.key_len = 0;
                self.key_long = false;
                self.state = State::Str { key: true };
            }
            State::Colon if b == b':' => {
                self.value_mask = self.member_mask(paths);
                self.state = State::Value;
            }
            State::Next => self.next(b),
            State::Escape { key } => self.escape(b, key),
            State::Hex { key, left } => {
                if key {
                    self.key_bytes(&[b]);
                }
                self.state = match (b.is_ascii_hexdigit(), left) {
                    (false, _) => State::Failed,
                    (true, 1) => State::Str { key },
                    (true, _) => State::Hex {
                        key,
                        left: left - 1,
                    },
                };
            }
            State::Number(n) => return self.number(n, b, paths),
            State::Literal { word, at } => {
                let at = usize::from(at);
                self.state = if word.get(at) != Some(&b) {
                    State::Failed
                } else if at + 1 == word.len() {
                    self.after_value()
                } else {
                    State::Literal {
                        word,
                        at: (at + 1) as u8,
                    }
                };
            }
            State::KeyOrClose
            | State::Key
            | State::Colon
            | State::Done
            | State::Str { .. }
            | State::Failed => self.state = State::Failed,
        }
        true
    }

    /// The paths the member whose key was just read continues: those of
    /// its object whose next segment is that key.
    fn member_mask(&self, paths: &Paths) -> u64 {
        let Some(frame) = self.stack.last() else {
            return 0;
        };
        if frame.mask == 0 || self.key_long {
            return 0;
        }
        paths.step(frame.mask, self.stack.len() - 1, &self.key[..self.key_len])
    }

    /// The first byte of a value, with the mask of the member it is.
    fn value_start(&mut self, b: u8, paths: &Paths) {
        let depth = self.stack.len();
        let ends = paths.ending(self.value_mask, depth);
        let mut bad = ends;
        self.state = match b {
            b'{' | b'[' => {
                let container = if b == b'{' {
                    Container::Object
                } else {
                    Container::Array
                };
                let mask = match container {
                    Container::Object => self.value_mask & !ends,
                    Container::Array => 0,
                };
                if self.stack.len() == MAX_DEPTH {
                    State::Failed
                } else {
                    self.stack.push(Frame { container, mask });
                    match container {
                        Container::Object => State::KeyOrClose,
                        Container::Array => {
                            self.value_mask = 0;
                            State::ValueOrClose
                        }
                    }
                }
            }
            b'"' => State::Str { key: false },
            b't' => State::Literal {
                word: b"true",
                at: 1,
            },
            b'f' => State::Literal {
                word: b"false",
                at: 1,
            },
            b'n' => {
                bad = 0;
                State::Literal {
                    word: b"null",
                    at: 1,
                }
            }
            b'-' | b'0'..=b'9' => {
                bad = 0;
                self.num_mask = ends;
                self.num_value = 0;
                self.num_ok = b != b'-';
                match b {
                    b'-' => State::Number(Num::Minus),
                    b'0' => State::Number(Num::Zero),
                    _ => {
                        self.num_value = u64::from(b - b'0');
                        State::Number(Num::Int)
                    }
                }
            }
            _ => {
                bad = 0;
                State::Failed
            }
        };
        if self.state != State::Failed {
            self.mark_bad(bad, paths);
        }
    }

    fn mark_bad(&mut self, mask: u64, paths: &Paths) {
        for term in paths.terms_of(mask) {
            self.hits.terms[term].bad = true;
        }
    }

    /// A number's next byte; false when it ended the number.
    fn number(&mut self, n: Num, b: u8, paths: &Paths) -> bool {
        let next = match (n, b) {
            (Num::Minus, b'0') => Num::Zero,
            (Num::Minus, b'1'..=b'9') | (Num::Int, b'0'..=b'9') => {
                self.num_value = self
                    .num_value
                    .checked_mul(10)
                    .and_then(|v| v.checked_add(u64::from(b - b'0')))
                    .filter(|v| *v <= i64::MAX as u64)
                    .unwrap_or_else(|| {
                        self.num_ok = false;
                        0
                    });
                Num::Int
            }
            (Num::Zero | Num::Int, b'.') => Num::FracStart,
            (Num::FracStart | Num::Frac, b'0'..=b'9') => Num::Frac,
            (Num::Zero | Num::Int | Num::Frac, b'e' | b'E') => Num::ExpStart,
            (Num::ExpStart, b'+' | b'-') => Num::ExpSign,
            (Num::ExpStart | Num::ExpSign | Num::Exp, b'0'..=b'9') => Num::Exp,
            (Num::Zero | Num::Int | Num::Frac | Num::Exp, _) => {
                self.end_number(n, paths);
                return false;
            }
            _ => {
                self.state = State::Failed;
                return true;
            }
        };
        if matches!(next, Num::FracStart | Num::ExpStart) {
            self.num_ok = false;
        }
        self.state = State::Number(next);
        true
    }

    fn end_number(&mut self, n: Num, paths: &Paths) {
        if !matches!(n, Num::Zero | Num::Int | Num::Frac | Num::Exp) {
            self.state = State::Failed;
            return;
        }
        for term in paths.terms_of(self.num_mask) {
            let hit = &mut self.hits.terms[term];
            if self.num_ok {
                hit.count = hit.count.saturating_add(1);
                hit.value = self.num_value;
            } else {
                hit.bad = true;
            }
        }
        self.state = self.after_value();
    }

    fn escape(&mut self, b: u8, key: bool) {
        if key {
            self.key_bytes(&[b]);
        }
        self.state = match b {
            b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => State::Str { key },
            b'u' => State::Hex { key, left: 4 },
            _ => State::Failed,
        };
    }

    fn next(&mut self, b: u8) {
        let Some(frame) = self.stack.last() else {
            self.state = State::Failed;
            return;
        };
        self.state = match (frame.container, b) {
            (Container::Object, b',') => State::Key,
            (Container::Array, b',') => {
                self.value_mask = 0;
                State::Value
            }
            (Container::Object, b'}') => return self.close(Container::Object),
            (Container::Array, b']') => return self.close(Container::Array),
            _ => State::Failed,
        };
    }

    fn close(&mut self, container: Container) {
        match self.stack.pop() {
            Some(f) if f.container == container => self.state = self.after_value(),
            _ => self.state = State::Failed,
        }
    }

    /// The state after a complete value: the next member or element, or
    /// the document's end.
    fn after_value(&mut self) -> State {
        match self.stack.last() {
            None => State::Done,
            Some(f) => {
                if f.container == Container::Array {
                    self.value_mask = 0;
                }
                State::Next
            }
        }
    }
}
