//! What a usage reader reads: dotted paths into JSON ([`JsonPath`]), the
//! sum of terms a cost is made of ([`UsageSpec`], with the OpenAI and
//! Anthropic presets), and the same paths as the scanner walks them
//! ([`Paths`]: one bit per path in a `u64` mask).

use std::fmt;

use memchr::memmem::Finder;

/// The most terms a spec sums.
pub const MAX_TERMS: usize = 8;
/// The most paths a spec names, all terms together.
pub const MAX_PATHS: usize = 64;
/// The most segments of one path.
pub const MAX_SEGMENTS: usize = 16;
/// The longest segment, in bytes.
pub const MAX_SEGMENT: usize = 64;
/// A dotted path into a JSON document: object keys from the top
/// (`usage.total_tokens`). Segments are letters, digits, `_` and `-`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct JsonPath {
    pub(super) segments: Vec<Box<str>>,
}

impl JsonPath {
    /// Reads `usage.total_tokens`.
    ///
    /// # Errors
    /// The reason, for the loader's message.
    pub fn parse(text: &str) -> Result<Self, String> {
        let text = text.trim();
        if text.is_empty() {
            return Err("an empty path; write a dotted path such as usage.total_tokens".into());
        }
        let mut segments = Vec::new();
        for seg in text.split('.') {
            if seg.is_empty() {
                return Err(format!(
                    "`{text}` has an empty segment; write a dotted path such as usage.total_tokens"
                ));
            }
            if let Some(c) = seg
                .chars()
                .find(|c| !(c.is_ascii_alphanumeric() || *c == '_' || *c == '-'))
            {
                return Err(format!(
                    "`{text}`: a path segment holds letters, digits, `_` and `-`, not `{c}`"
                ));
            }
            if seg.len() > MAX_SEGMENT {
                return Err(format!(
                    "`{text}`: a segment is at most {MAX_SEGMENT} bytes"
                ));
            }
            segments.push(seg.into());
        }
        if segments.len() > MAX_SEGMENTS {
            return Err(format!(
                "`{text}`: a path has at most {MAX_SEGMENTS} segments"
            ));
        }
        Ok(Self { segments })
    }

    /// The keys from the top.
    pub fn segments(&self) -> impl Iterator<Item = &str> {
        self.segments.iter().map(|s| &**s)
    }
}

impl fmt::Display for JsonPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, s) in self.segments.iter().enumerate() {
            if i > 0 {
                f.write_str(".")?;
            }
            f.write_str(s)?;
        }
        Ok(())
    }
}

/// How a term reads a stream that reports it more than once.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Stream {
    /// The last value seen (`stream: last`): cumulative reports.
    #[default]
    Last,
    /// The sum of every value seen (`stream: sum`): per-event deltas.
    Sum,
}

/// What a response's usage is read from; see the module docs.
#[derive(Debug, Clone)]
pub struct UsageSpec {
    pub(super) terms: Vec<Vec<JsonPath>>,
    pub(super) stream: Stream,
    pub(super) paths: Paths,
    /// The quoted last segments of the paths, each once: an SSE event with
    /// none of them holds no wanted key.
    needles: Vec<Finder<'static>>,
}

impl PartialEq for UsageSpec {
    fn eq(&self, other: &Self) -> bool {
        self.terms == other.terms && self.stream == other.stream
    }
}

impl Eq for UsageSpec {}

impl UsageSpec {
    /// Reads `usage.input_tokens + usage.output_tokens`: terms separated by
    /// `+`, each a path or alternative paths separated by `|`
    /// (`usage.input_tokens | message.usage.input_tokens`).
    ///
    /// # Errors
    /// The reason, for the loader's message.
    pub fn parse(text: &str, stream: Stream) -> Result<Self, String> {
        let mut terms = Vec::new();
        for term in text.split('+') {
            let mut alternatives = Vec::new();
            for alt in term.split('|') {
                let path = JsonPath::parse(alt)?;
                if !alternatives.contains(&path) {
                    alternatives.push(path);
                }
            }
            terms.push(alternatives);
        }
        Self::new(terms, stream)
    }

    fn new(terms: Vec<Vec<JsonPath>>, stream: Stream) -> Result<Self, String> {
        if terms.len() > MAX_TERMS {
            return Err(format!("at most {MAX_TERMS} terms are summed"));
        }
        let paths = Paths::new(&terms);
        if paths.list.len() > MAX_PATHS {
            return Err(format!("at most {MAX_PATHS} paths are read"));
        }
        let mut needles: Vec<Vec<u8>> = Vec::new();
        for p in &paths.list {
            if let Some(last) = p.segments.last() {
                let quoted = [b"\"", &last[..], b"\""].concat();
                if !needles.contains(&quoted) {
                    needles.push(quoted);
                }
            }
        }
        let needles = needles
            .iter()
            .map(|n| Finder::new(n).into_owned())
            .collect();
        Ok(Self {
            terms,
            stream,
            paths,
            needles,
        })
    }

    fn of(terms: &[&[&str]]) -> Self {
        let terms = terms
            .iter()
            .map(|alts| {
                alts.iter()
                    .filter_map(|p| JsonPath::parse(p).ok())
                    .collect()
            })
            .collect();
        match Self::new(terms, Stream::Last) {
            Ok(spec) => spec,
            Err(_) => unreachable!("the presets are within the bounds"),
        }
    }

    /// `from_body: openai`: `usage.total_tokens` of a chat completion, in
    /// its JSON body or in the last chunk of its stream (sent when the
    /// client asks `stream_options: {include_usage: true}`; the chunks
    /// before carry `"usage": null`); and `response.usage.total_tokens` of
    /// the Responses API's `response.completed` event.
    pub fn openai() -> Self {
        Self::of(&[&["usage.total_tokens", "response.usage.total_tokens"]])
    }

    /// `from_body: anthropic`: input plus output tokens of the Messages
    /// API, from the top-level `usage` of a JSON body or of a stream's
    /// `message_delta` events (cumulative), or the `message.usage` of its
    /// `message_start` event; the last seen of each.
    pub fn anthropic() -> Self {
        Self::of(&[
            &["usage.input_tokens", "message.usage.input_tokens"],
            &["usage.output_tokens", "message.usage.output_tokens"],
        ])
    }

    /// How each term reads a stream.
    pub fn stream(&self) -> Stream {
        self.stream
    }

    /// The terms, each its alternative paths.
    pub fn terms(&self) -> &[Vec<JsonPath>] {
        &self.terms
    }

    /// Whether an SSE event's data can hold a wanted key.
    pub(super) fn wanted(&self, event: &[u8]) -> bool {
        self.needles.iter().any(|n| n.find(event).is_some())
    }
}

impl fmt::Display for UsageSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, term) in self.terms.iter().enumerate() {
            if i > 0 {
                f.write_str(" + ")?;
            }
            for (j, path) in term.iter().enumerate() {
                if j > 0 {
                    f.write_str(" | ")?;
                }
                write!(f, "{path}")?;
            }
        }
        Ok(())
    }
}

/// Every path of a spec, each with its term, as the scanner walks them:
/// one bit per path in a `u64` mask.
#[derive(Debug, Clone)]
pub(super) struct Paths {
    list: Vec<PathEntry>,
}

#[derive(Debug, Clone)]
struct PathEntry {
    segments: Vec<Box<[u8]>>,
    term: usize,
}

impl Paths {
    fn new(terms: &[Vec<JsonPath>]) -> Self {
        let list = terms
            .iter()
            .enumerate()
            .flat_map(|(term, alts)| {
                alts.iter().map(move |p| PathEntry {
                    segments: p.segments.iter().map(|s| s.as_bytes().into()).collect(),
                    term,
                })
            })
            .collect();
        Self { list }
    }

    /// Every path.
    pub(super) fn all(&self) -> u64 {
        match self.list.len() {
            64.. => u64::MAX,
            n => (1u64 << n) - 1,
        }
    }

    fn bits(mask: u64) -> impl Iterator<Item = usize> {
        let mut m = mask;
        std::iter::from_fn(move || {
            if m == 0 {
                return None;
            }
            let i = m.trailing_zeros() as usize;
            m &= m - 1;
            Some(i)
        })
    }

    /// The paths of `mask` whose segment `index` is `key`.
    pub(super) fn step(&self, mask: u64, index: usize, key: &[u8]) -> u64 {
        let mut out = 0;
        for i in Self::bits(mask) {
            if self.list[i]
                .segments
                .get(index)
                .is_some_and(|s| **s == *key)
            {
                out |= 1 << i;
            }
        }
        out
    }

    /// The paths of `mask` that have `depth` segments: they end at the
    /// value at that depth.
    pub(super) fn ending(&self, mask: u64, depth: usize) -> u64 {
        let mut out = 0;
        for i in Self::bits(mask) {
            if self.list[i].segments.len() == depth {
                out |= 1 << i;
            }
        }
        out
    }

    /// The terms of the paths of `mask`.
    pub(super) fn terms_of(&self, mask: u64) -> impl Iterator<Item = usize> + '_ {
        Self::bits(mask).map(|i| self.list[i].term)
    }
}
