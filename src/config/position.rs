//! Field path → line/column index of a YAML document.
//!
//! serde sees values, not places, so error positions come from a second,
//! independent pass over the text: [`Positions::index`] walks the event
//! stream of `yaml_rust2`'s parser and records, for every node, the field
//! path that leads to it (`routes[1].limits[0].window`) with the 1-based
//! line and column of the value and, for mapping entries, of the key.
//!
//! The path syntax is the one every error message uses: mapping keys are
//! joined with `.`, sequence indices are written `[i]`, the root is `""`.
//! [`child_key`] and [`child_index`] build it so the two stages and this
//! index always agree.
//!
//! `yaml_rust2` markers have a 1-based line but a 0-based column; both are
//! made 1-based here (tested below). A block mapping's start marker points at
//! the colon after its first key, so a mapping's position is the earlier of
//! its start marker and its first key: the `{` of a flow mapping, the first
//! key of a block one. An empty plain scalar (`key:` with nothing after it)
//! has no position of its own; lookups fall back to its key.
//!
//! The index is best effort: it stops at the first syntax error (the YAML
//! loader reports that one), ignores complex keys, and knows nothing of the
//! nodes an alias or a merge key copies in. [`Positions::value`] and
//! [`Positions::key`] therefore fall back to the nearest recorded ancestor.

use std::collections::HashMap;

use yaml_rust2::parser::{Event, Parser};
use yaml_rust2::scanner::{Marker, TScalarStyle};

/// A 1-based place in the source text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Pos {
    /// 1-based line.
    pub line: usize,
    /// 1-based column (in characters).
    pub col: usize,
}

impl Pos {
    fn from_marker(marker: Marker) -> Self {
        Self {
            line: marker.line(),
            col: marker.col() + 1,
        }
    }
}

/// Where one node was written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Entry {
    /// The key, for an entry of a mapping.
    key: Option<Pos>,
    /// The value node; `None` for an empty plain scalar.
    value: Option<Pos>,
}

/// Field path → position of every node in the first document.
#[derive(Debug, Default)]
pub(crate) struct Positions {
    entries: HashMap<String, Entry>,
}

/// The path of a mapping entry below `parent`.
pub(crate) fn child_key(parent: &str, key: &str) -> String {
    if parent.is_empty() {
        key.to_owned()
    } else {
        format!("{parent}.{key}")
    }
}

/// The path of a sequence item below `parent`.
pub(crate) fn child_index(parent: &str, index: usize) -> String {
    format!("{parent}[{index}]")
}

/// The path one level up; `None` for the root.
fn parent_of(path: &str) -> Option<&str> {
    if path.is_empty() {
        return None;
    }
    if path.ends_with(']') {
        if let Some(i) = path.rfind('[') {
            return Some(&path[..i]);
        }
    }
    Some(path.rfind('.').map_or("", |i| &path[..i]))
}

/// An open mapping or sequence while walking the events.
#[derive(Debug)]
enum Frame {
    Mapping {
        /// `None` inside a complex key, whose nodes are not indexed.
        path: Option<String>,
        /// The key just read, waiting for its value.
        key: Option<(Option<String>, Pos)>,
        /// Whether the first key has been seen (see the module docs).
        seen_key: bool,
    },
    Sequence {
        path: Option<String>,
        next: usize,
    },
}

impl Positions {
    /// Indexes `src`, stopping quietly at the first syntax error.
    pub(crate) fn index(src: &str) -> Self {
        let mut index = Self::default();
        let mut stack: Vec<Frame> = Vec::new();
        let mut parser = Parser::new_from_str(src);
        while let Ok((event, marker)) = parser.next_token() {
            let pos = Pos::from_marker(marker);
            match event {
                Event::StreamEnd | Event::DocumentEnd => break,
                Event::Nothing | Event::StreamStart | Event::DocumentStart => {}
                Event::MappingEnd | Event::SequenceEnd => {
                    stack.pop();
                }
                Event::Scalar(text, style, ..) => {
                    let empty = text.is_empty() && style == TScalarStyle::Plain;
                    let value = (!empty).then_some(pos);
                    index.node(&mut stack, pos, value, Some(text));
                }
                Event::Alias(_) => {
                    index.node(&mut stack, pos, Some(pos), None);
                }
                Event::MappingStart(..) => {
                    let path = index.node(&mut stack, pos, Some(pos), None);
                    stack.push(Frame::Mapping {
                        path,
                        key: None,
                        seen_key: false,
                    });
                }
                Event::SequenceStart(..) => {
                    let path = index.node(&mut stack, pos, Some(pos), None);
                    stack.push(Frame::Sequence { path, next: 0 });
                }
            }
        }
        index
    }

    /// Records a node that starts at `pos` and returns its path (`None` when
    /// it is a key or lies inside a complex key). `text` is a scalar's value,
    /// used when the node turns out to be a mapping key.
    fn node(
        &mut self,
        stack: &mut [Frame],
        pos: Pos,
        value: Option<Pos>,
        text: Option<String>,
    ) -> Option<String> {
        let (path, key) = match stack.last_mut() {
            None => (Some(String::new()), None),
            Some(Frame::Sequence { path, next }) => {
                let item = path.as_deref().map(|p| child_index(p, *next));
                *next += 1;
                (item, None)
            }
            Some(Frame::Mapping {
                path,
                key: pending @ None,
                seen_key,
            }) => {
                // This node is a key. A mapping's position is the earlier of
                // its start marker and its first key.
                if !*seen_key {
                    *seen_key = true;
                    if let Some(entry) = path.as_deref().and_then(|p| self.entries.get_mut(p)) {
                        entry.value = entry.value.map(|v| v.min(pos)).or(Some(pos));
                    }
                }
                *pending = Some((text, pos));
                // The nodes of a complex key are not indexed.
                return None;
            }
            Some(Frame::Mapping {
                path,
                key: pending @ Some(_),
                ..
            }) => {
                let (name, key_pos) = pending.take()?;
                let item = match (path.as_deref(), name) {
                    (Some(p), Some(name)) => Some(child_key(p, &name)),
                    _ => None,
                };
                (item, Some(key_pos))
            }
        };
        if let Some(path) = &path {
            self.entries.insert(path.clone(), Entry { key, value });
        }
        path
    }

    /// The position of the value at `path`, else of its key, else of the
    /// nearest ancestor that has one.
    pub(crate) fn value(&self, path: &str) -> Option<Pos> {
        let mut path = Some(path);
        while let Some(p) = path {
            if let Some(entry) = self.entries.get(p) {
                if let Some(pos) = entry.value.or(entry.key) {
                    return Some(pos);
                }
            }
            path = parent_of(p);
        }
        None
    }

    /// The position of the key of the mapping entry at `path`, else as
    /// [`Positions::value`].
    pub(crate) fn key(&self, path: &str) -> Option<Pos> {
        self.entries
            .get(path)
            .and_then(|entry| entry.key)
            .or_else(|| self.value(path))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(line: usize, col: usize) -> Option<Pos> {
        Some(Pos { line, col })
    }

    const DOC: &str = "\
listen: 127.0.0.1:8080
store:
  redis: { url: \"redis://x\", timeout: 25ms }
routes:
  - name: api
    match:
      path: /x
    limits:
      - name: a
        key: [ip, 'header:x']
      -
        name: b
    empty:
    last: 1
";

    #[test]
    fn lines_and_columns_are_one_based() {
        let index = Positions::index(DOC);
        assert_eq!(index.value("listen"), p(1, 9));
        assert_eq!(index.key("listen"), p(1, 1));
        assert_eq!(index.key("store.redis"), p(3, 3));
    }

    #[test]
    fn flow_nodes_point_at_their_opening_bracket_and_quotes() {
        let index = Positions::index(DOC);
        assert_eq!(index.value("store.redis"), p(3, 10));
        assert_eq!(index.value("store.redis.url"), p(3, 17));
        assert_eq!(index.key("store.redis.timeout"), p(3, 30));
        assert_eq!(index.value("store.redis.timeout"), p(3, 39));
        assert_eq!(index.value("routes[0].limits[0].key"), p(10, 14));
        assert_eq!(index.value("routes[0].limits[0].key[1]"), p(10, 19));
    }

    #[test]
    fn block_mappings_point_at_their_first_key() {
        let index = Positions::index(DOC);
        assert_eq!(index.value(""), p(1, 1));
        assert_eq!(index.value("store"), p(3, 3));
        assert_eq!(index.value("routes"), p(5, 3));
        assert_eq!(index.value("routes[0]"), p(5, 5));
        assert_eq!(index.value("routes[0].match"), p(7, 7));
        assert_eq!(index.value("routes[0].limits[1]"), p(12, 9));
        assert_eq!(index.value("routes[0].limits[1].name"), p(12, 15));
    }

    #[test]
    fn empty_values_fall_back_to_their_key() {
        let index = Positions::index(DOC);
        assert_eq!(index.value("routes[0].empty"), p(13, 5));
        assert_eq!(index.value("routes[0].last"), p(14, 11));
    }

    #[test]
    fn unknown_paths_fall_back_to_the_nearest_ancestor() {
        let index = Positions::index(DOC);
        assert_eq!(index.value("routes[0].limits[1].window"), p(12, 9));
        assert_eq!(index.key("routes[0].limits[1].window"), p(12, 9));
        assert_eq!(index.value("routes[7]"), p(5, 3));
        assert_eq!(index.value("nowhere.at.all"), p(1, 1));
    }

    #[test]
    fn aliases_point_at_the_alias() {
        let index = Positions::index("a: &x {k: v}\nb: *x\n");
        assert_eq!(index.value("a.k"), p(1, 11));
        assert_eq!(index.value("b"), p(2, 4));
        assert_eq!(index.value("b.k"), p(2, 4));
    }

    #[test]
    fn complex_keys_are_skipped() {
        let index = Positions::index("? [a, b]\n: 1\nc: 2\n");
        assert_eq!(index.value("c"), p(3, 4));
        assert!(!index.entries.keys().any(|k| k.contains('a')));
    }

    #[test]
    fn indexing_stops_at_a_syntax_error() {
        let index = Positions::index("a: 1\nb: [2\nc: 3\n");
        assert_eq!(index.value("a"), p(1, 4));
        assert_eq!(index.value("c"), p(1, 1));
        assert_eq!(Positions::index("").value("x"), None);
    }

    #[test]
    fn only_the_first_document_is_indexed() {
        let index = Positions::index("a: 1\n---\nb: 2\n");
        assert_eq!(index.value("a"), p(1, 4));
        assert_eq!(index.entries.get("b"), None);
    }

    #[test]
    fn parents() {
        assert_eq!(
            parent_of("routes[1].limits[0].window"),
            Some("routes[1].limits[0]")
        );
        assert_eq!(parent_of("routes[1].limits[0]"), Some("routes[1].limits"));
        assert_eq!(parent_of("routes"), Some(""));
        assert_eq!(parent_of(""), None);
        assert_eq!(child_key("", "routes"), "routes");
        assert_eq!(child_key("routes[0]", "name"), "routes[0].name");
        assert_eq!(child_index("routes", 2), "routes[2]");
    }
}
