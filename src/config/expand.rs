//! `${VAR}` references in the text of one YAML scalar, replaced by the
//! values of environment variables.
//!
//! The loader calls [`expand`] on every scalar of the parsed document
//! (`load/environment.rs`), never on the file's text, so a value can only
//! ever become the text of the scalar it stands in: a variable holding
//! `{a: 1}`, `x # y` or a newline adds no structure and no comment.
//!
//! The spellings, the same as Docker Compose's for these forms:
//!
//! | written | becomes |
//! |---|---|
//! | `${NAME}` | the variable's value; an error when it is not set |
//! | `${NAME:-default}` | the value, or `default` when the variable is unset or empty |
//! | `$$` | one `$` |
//! | `$` before anything else | itself (`^/api$` stays as written) |
//!
//! `NAME` is a letter or `_` followed by letters, digits and `_`. The
//! default runs to the first `}`; `$$` in it is one `$`, and it holds no
//! other reference. A value is used as it is: a `$` or `${` inside a
//! variable's value is not expanded again. Since `$$` is one `$`, text
//! that should hold `$$` (a password, say) is written `$$$$`.

use std::borrow::Cow;
use std::fmt;

/// Why the text of a scalar cannot be expanded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExpandError {
    /// Variables referenced without a default and not set, in the order
    /// they are written (each named once).
    Unset(Vec<String>),
    /// A `${` that is not a reference this module reads: `reference` is the
    /// text from `${` to the closing `}` (or to the end).
    Malformed {
        /// The text as written.
        reference: String,
        /// What is wrong with it.
        reason: &'static str,
    },
}

impl fmt::Display for ExpandError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unset(names) => {
                let list: Vec<String> = names.iter().map(|n| format!("${{{n}}}")).collect();
                let (subject, verb, object) = if names.len() == 1 {
                    ("environment variable", "is", "it")
                } else {
                    ("environment variables", "are", "them")
                };
                write!(
                    f,
                    "{subject} {} {verb} not set; set {object}, or write ${{NAME:-default}}",
                    list.join(", ")
                )
            }
            Self::Malformed { reference, reason } => write!(
                f,
                "{reference:?} {reason}; write ${{NAME}} or ${{NAME:-default}}, and $$ for a literal $"
            ),
        }
    }
}

impl std::error::Error for ExpandError {}

/// Whether `text` holds anything [`expand`] would change: a `$` followed
/// by `$` or `{`.
pub fn has_references(text: &str) -> bool {
    text.as_bytes()
        .windows(2)
        .any(|w| w[0] == b'$' && matches!(w[1], b'$' | b'{'))
}

/// The text of one scalar with its references replaced, looking each
/// variable up with `env` (`None` for a variable that is not set).
///
/// Text without references is returned borrowed.
///
/// # Errors
/// A malformed reference (the first one), or else every variable that is
/// referenced without a default and is not set.
pub fn expand<'t>(
    text: &'t str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Cow<'t, str>, ExpandError> {
    if !has_references(text) {
        return Ok(Cow::Borrowed(text));
    }
    let mut out = String::with_capacity(text.len());
    let mut unset: Vec<String> = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(inner) = after.strip_prefix('{') {
            let Some(close) = inner.find('}') else {
                return Err(ExpandError::Malformed {
                    reference: rest[at..].to_owned(),
                    reason: "has no closing }",
                });
            };
            let reference =
                Reference::read(&inner[..close]).map_err(|reason| ExpandError::Malformed {
                    reference: rest[at..at + 2 + close + 1].to_owned(),
                    reason,
                })?;
            match (env(reference.name), reference.default) {
                (Some(value), Some(default)) if value.is_empty() => unescape(default, &mut out),
                (Some(value), _) => out.push_str(&value),
                (None, Some(default)) => unescape(default, &mut out),
                (None, None) => {
                    if !unset.iter().any(|n| n == reference.name) {
                        unset.push(reference.name.to_owned());
                    }
                }
            }
            rest = &inner[close + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    if unset.is_empty() {
        Ok(Cow::Owned(out))
    } else {
        Err(ExpandError::Unset(unset))
    }
}

/// `text` with every `$` doubled: what [`expand`] turns back into `text`.
pub fn escape(text: &str) -> String {
    text.replace('$', "$$")
}

/// What is between `${` and `}`.
struct Reference<'a> {
    name: &'a str,
    default: Option<&'a str>,
}

impl<'a> Reference<'a> {
    fn read(inner: &'a str) -> Result<Self, &'static str> {
        let (name, default) = match inner.split_once(":-") {
            Some((name, default)) => (name, Some(default)),
            None => (inner, None),
        };
        if name.is_empty() {
            return Err("names no variable");
        }
        let mut chars = name.chars();
        let first_ok = chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
        if !first_ok || !chars.all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err("is not a variable name with an optional :-default");
        }
        if default.is_some_and(|d| d.contains("${")) {
            return Err("has a reference inside its default");
        }
        Ok(Self { name, default })
    }
}

/// Appends a default's text with `$$` read as `$`.
fn unescape(default: &str, out: &mut String) {
    let mut rest = default;
    while let Some(at) = rest.find("$$") {
        out.push_str(&rest[..=at]);
        rest = &rest[at + 2..];
    }
    out.push_str(rest);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        match name {
            "HOST" => Some("redis.internal".into()),
            "PORT" => Some("6380".into()),
            "EMPTY" => Some(String::new()),
            "YAML" => Some("{a: 1} # not a comment\n- x".into()),
            "DOLLARS" => Some("p$$w${HOST}".into()),
            _ => None,
        }
    }

    fn x(text: &str) -> Result<String, ExpandError> {
        expand(text, &env).map(Cow::into_owned)
    }

    #[test]
    fn set_variables_are_replaced() {
        assert_eq!(
            x("redis://${HOST}:${PORT}/0").as_deref(),
            Ok("redis://redis.internal:6380/0")
        );
        assert_eq!(x("${PORT}").as_deref(), Ok("6380"));
        assert_eq!(x("${EMPTY}").as_deref(), Ok(""));
    }

    #[test]
    fn defaults_apply_when_unset_or_empty() {
        assert_eq!(x("${NOPE:-6379}").as_deref(), Ok("6379"));
        assert_eq!(x("${EMPTY:-x}").as_deref(), Ok("x"));
        assert_eq!(x("${PORT:-1}").as_deref(), Ok("6380"));
        assert_eq!(x("${NOPE:-}").as_deref(), Ok(""));
        assert_eq!(x("${NOPE:-a:-b $$ c$d}").as_deref(), Ok("a:-b $ c$d"));
    }

    #[test]
    fn unset_variables_are_named_once_each() {
        assert_eq!(
            x("${A}${B:-b}${C}${A}"),
            Err(ExpandError::Unset(vec!["A".into(), "C".into()]))
        );
        assert_eq!(
            x("${A}").unwrap_err().to_string(),
            "environment variable ${A} is not set; set it, or write ${NAME:-default}"
        );
    }

    #[test]
    fn dollars_escape_and_stand_alone() {
        assert_eq!(x("$$").as_deref(), Ok("$"));
        assert_eq!(x("$$$$").as_deref(), Ok("$$"));
        assert_eq!(x("$${HOST}").as_deref(), Ok("${HOST}"));
        assert_eq!(x("$$$${HOST}").as_deref(), Ok("$${HOST}"));
        assert_eq!(x("$$${HOST}").as_deref(), Ok("$redis.internal"));
        assert_eq!(x("^/api$").as_deref(), Ok("^/api$"));
        assert_eq!(x("a$b $").as_deref(), Ok("a$b $"));
        assert!(matches!(
            expand("no references $ here", &env),
            Ok(Cow::Borrowed(_))
        ));
    }

    #[test]
    fn values_are_used_as_they_are() {
        assert_eq!(x("${YAML}").as_deref(), Ok("{a: 1} # not a comment\n- x"));
        assert_eq!(x("${DOLLARS}").as_deref(), Ok("p$$w${HOST}"));
    }

    #[test]
    fn malformed_references_are_refused() {
        for (text, reference) in [
            ("${HOST", "${HOST"),
            ("a ${} b", "${}"),
            ("${1X}", "${1X}"),
            ("${A B}", "${A B}"),
            ("${A:?err}", "${A:?err}"),
            ("${A-b}", "${A-b}"),
            ("${A:-${B}}", "${A:-${B}"),
        ] {
            match x(text) {
                Err(ExpandError::Malformed { reference: r, .. }) => assert_eq!(r, reference),
                other => panic!("{text}: {other:?}"),
            }
        }
    }

    #[test]
    fn escaping_round_trips() {
        for text in ["", "$", "$$", "${A}", "a$${B:-c}$", "€$x"] {
            assert_eq!(x(&escape(text)).as_deref(), Ok(text), "{text}");
        }
    }
}
