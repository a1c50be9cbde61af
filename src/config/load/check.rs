//! The checker every section of the loader walks its file structs with.
//!
//! A [`Check`] knows where every node of the file is ([`Positions`]) and
//! collects [`ConfigError`]s. A rule that fails records its error and
//! returns [`Reported`]; the caller carries on with the next field, and only
//! combines the results (`?`) once every field of its mapping has been
//! checked, so one bad field never hides another. The helpers here read one
//! field each: [`Check::optional`] and [`Check::required`] a scalar or
//! mapping, [`Check::each`] a scalar-or-list, [`Check::list`] a list of
//! mappings, and [`text`], [`int`], [`positive`] and [`choice`] adapt plain
//! parsers (`&str -> Result<T, String>`) into checks that report at the
//! value. Durations, which every section has, are parsed here too.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use http::HeaderName;

use super::errors::ConfigError;
use crate::config::file::{self, Field, Int, OneOrMany, Text};
use crate::config::position::{Pos, Positions, child_index, child_key};

/// Marks a check that failed; its error is already recorded.
#[derive(Debug, Clone, Copy)]
pub(super) struct Reported;

/// The result of one check: the value, or [`Reported`].
pub(super) type Checked<T> = Result<T, Reported>;

/// Walks the file structs, recording every problem.
pub(super) struct Check<'p> {
    pub(super) positions: &'p Positions,
    pub(super) errors: Vec<ConfigError>,
    /// Directory that relative file paths are resolved against.
    pub(super) base: Option<&'p Path>,
    /// What limits need to know of the store, once `store` is checked:
    /// whether Redis is configured, and `store.redis.sync`.
    pub(super) store: StoreFacts,
    /// Whom the file is for: the gateway (`listen` and `routes` required,
    /// no top-level `limits`) or an application's layer (top-level
    /// `limits` required, `listen` and `routes` not).
    pub(super) reader: Reader,
}

/// Whom a file is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reader {
    /// The gateway: `tollgate run`, `check`, `simulate`.
    Gateway,
    /// An application's `RateLimitLayer`.
    Layer,
}

/// The store settings a limit's `sync` is checked against.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct StoreFacts {
    /// `store.redis` is set.
    pub(super) redis: bool,
    /// `store.redis.sync`, the default of counter limits.
    pub(super) sync: Option<Duration>,
}

pub(super) fn error(path: &str, message: impl Into<String>, pos: Option<Pos>) -> ConfigError {
    ConfigError {
        path: path.to_owned(),
        message: message.into(),
        line: pos.map(|p| p.line),
        column: pos.map(|p| p.col),
    }
}

/// Adapts a parser of one leaf into a check that reports at the value.
pub(super) fn leaf<T, U>(
    parse: impl Fn(&T) -> Result<U, String>,
) -> impl Fn(&mut Check<'_>, &T, &str) -> Checked<U> {
    move |check, value, path| parse(value).map_err(|m| check.value_error(path, m))
}

/// A leaf parser over the text of a [`Text`].
pub(super) fn text<U>(
    parse: impl Fn(&str) -> Result<U, String>,
) -> impl Fn(&mut Check<'_>, &Text, &str) -> Checked<U> {
    leaf(move |t: &Text| parse(&t.0))
}

/// A whole number in `min..=max`.
pub(super) fn int(min: i64, max: i64) -> impl Fn(&mut Check<'_>, &Int, &str) -> Checked<i64> {
    leaf(move |&Int(n): &Int| {
        if n < min && max == i64::MAX {
            Err(format!("must be at least {min}, found {n}"))
        } else if !(min..=max).contains(&n) {
            Err(format!("must be between {min} and {max}, found {n}"))
        } else {
            Ok(n)
        }
    })
}

/// A count of at least 1.
pub(super) fn positive(check: &mut Check<'_>, value: &Int, path: &str) -> Checked<u64> {
    let n = int(1, i64::MAX)(check, value, path)?;
    u64::try_from(n).map_err(|_| check.value_error(path, "must be at least 1"))
}

/// A choice from a spellings table (such as
/// [`HeaderMode::SPELLINGS`](crate::config::HeaderMode::SPELLINGS)),
/// reported at the value with the table's names when it is none of them.
pub(super) fn choice<T: Copy>(
    table: &'static [(&'static str, T)],
) -> impl Fn(&mut Check<'_>, &Text, &str) -> Checked<T> {
    text(move |s| one_of(s, table))
}

/// The value `s` spells in `table`, or an error listing the spellings.
fn one_of<T: Copy>(s: &str, table: &[(&str, T)]) -> Result<T, String> {
    spelled(s, table)
        .ok_or_else(|| format!("unknown value {s:?}; expected one of {}", names(table)))
}

/// The value `s` spells in `table`, if any. Spellings are exact: `IETF`
/// is not `ietf`, as the schema's `enum` says too.
pub(super) fn spelled<T: Copy>(s: &str, table: &[(&str, T)]) -> Option<T> {
    table
        .iter()
        .find(|(name, _)| *name == s)
        .map(|&(_, value)| value)
}

/// The spellings of `table`, for an error message: `allow, deny, local`.
pub(super) fn names<T>(table: &[(&str, T)]) -> String {
    let names: Vec<&str> = table.iter().map(|(name, _)| *name).collect();
    names.join(", ")
}

impl Check<'_> {
    pub(super) fn push(
        &mut self,
        path: &str,
        message: impl Into<String>,
        pos: Option<Pos>,
    ) -> Reported {
        self.errors.push(error(path, message, pos));
        Reported
    }

    /// An error about the value at `path`.
    pub(super) fn value_error(&mut self, path: &str, message: impl Into<String>) -> Reported {
        let pos = self.positions.value(path);
        self.push(path, message, pos)
    }

    pub(super) fn unknown(&mut self, field: &file::UnknownField) {
        let pos = self.positions.key(&child_key(&field.parent, &field.key));
        let mut message = format!("unknown field {:?}", field.key);
        if !field.expected.is_empty() {
            message.push_str("; expected one of ");
            message.push_str(&field.expected.join(", "));
        }
        self.push(&field.parent, message, pos);
    }

    /// An optional field, read by `read` when present.
    pub(super) fn optional<T, U>(
        &mut self,
        field: &Field<T>,
        path: &str,
        read: impl FnOnce(&mut Self, &T, &str) -> Checked<U>,
    ) -> Checked<Option<U>> {
        match field {
            Field::Absent => Ok(None),
            Field::Invalid(message) => Err(self.value_error(path, message.clone())),
            Field::Valid(value) => read(self, value, path).map(Some),
        }
    }

    /// A required field `name` of the mapping at `parent`.
    pub(super) fn required<T, U>(
        &mut self,
        field: &Field<T>,
        parent: &str,
        name: &str,
        read: impl FnOnce(&mut Self, &T, &str) -> Checked<U>,
    ) -> Checked<U> {
        let path = child_key(parent, name);
        if let Some(value) = self.optional(field, &path, read)? {
            return Ok(value);
        }
        let pos = self.positions.value(parent);
        Err(self.push(parent, format!("missing required field {name:?}"), pos))
    }

    /// A scalar or a list of them; list items get their own `[i]` paths.
    pub(super) fn each<T, U>(
        &mut self,
        items: &OneOrMany<T>,
        path: &str,
        mut read: impl FnMut(&mut Self, &T, &str) -> Checked<U>,
    ) -> Checked<Vec<U>> {
        let mut read_one = |check: &mut Self, item: &Field<T>, path: &str| match item {
            Field::Absent => Err(check.value_error(path, "empty entry")),
            Field::Invalid(message) => Err(check.value_error(path, message.clone())),
            Field::Valid(value) => read(check, value, path),
        };
        match items {
            OneOrMany::One(item) => read_one(self, item, path).map(|v| vec![v]),
            OneOrMany::Many(items) => {
                let read: Vec<Checked<U>> = items
                    .iter()
                    .enumerate()
                    .map(|(i, item)| read_one(self, item, &child_index(path, i)))
                    .collect();
                read.into_iter().collect()
            }
        }
    }

    /// A list of mappings; each item is read by `read` with its own path.
    pub(super) fn list<T, U>(
        &mut self,
        items: &[Field<T>],
        path: &str,
        mut read: impl FnMut(&mut Self, &T, &str) -> Checked<U>,
    ) -> Checked<Vec<U>> {
        let read: Vec<Checked<U>> = items
            .iter()
            .enumerate()
            .map(|(i, item)| {
                let path = child_index(path, i);
                match item {
                    Field::Absent => Err(self.value_error(&path, "empty entry")),
                    Field::Invalid(message) => Err(self.value_error(&path, message.clone())),
                    Field::Valid(value) => read(self, value, &path),
                }
            })
            .collect();
        read.into_iter().collect()
    }

    /// Reports every name that repeats an earlier one in the list at `path`.
    ///
    /// Works on the names as written, so duplicates are found even when
    /// other fields of the items are wrong.
    pub(super) fn unique<T>(
        &mut self,
        items: &[Field<T>],
        name: impl Fn(&T) -> &Field<Text>,
        path: &str,
        what: &str,
    ) -> Checked<()> {
        let names = items.iter().map(|item| match item {
            Field::Valid(item) => match name(item) {
                Field::Valid(Text(name)) => Some(name.as_str()),
                _ => None,
            },
            _ => None,
        });
        let mut first: HashMap<&str, usize> = HashMap::new();
        let mut result = Ok(());
        for (i, name) in names.enumerate() {
            let Some(name) = name else { continue };
            if let Some(&j) = first.get(name) {
                let here = child_key(&child_index(path, i), "name");
                let message = format!(
                    "duplicate {what} {name:?}; it is already used by {}",
                    child_index(path, j)
                );
                result = Err(self.value_error(&here, message));
            } else {
                first.insert(name, i);
            }
        }
        result
    }

    /// A secret written in the file (`NAME`) or read from a file
    /// (`NAME_file`), at most one of the two, in the mapping at `parent`.
    ///
    /// The file is read whole, without the line ends it closes with (what
    /// `echo` and editors add). An error names the field and the file,
    /// never what the file holds.
    pub(super) fn secret(
        &mut self,
        inline: &Field<Text>,
        from_file: &Field<Text>,
        parent: &str,
        name: &str,
    ) -> Checked<Option<String>> {
        let file_name = format!("{name}_file");
        let inline_path = child_key(parent, name);
        let file_path = child_key(parent, &file_name);
        let written = self.optional(inline, &inline_path, text(|s| Ok(s.to_owned())));
        let read = self.optional(from_file, &file_path, |check, t: &Text, path| {
            let file = check.file(&t.0);
            let contents = std::fs::read_to_string(&file).map_err(|e| {
                check.value_error(path, format!("cannot read {}: {e}", file.display()))
            })?;
            let secret = contents.trim_end_matches(['\n', '\r']);
            if secret.is_empty() {
                return Err(check.value_error(path, format!("{} is empty", file.display())));
            }
            Ok(secret.to_owned())
        });
        match (written?, read?) {
            (Some(_), Some(_)) => Err(self.value_error(
                parent,
                format!("set either {name} or {file_name}, not both"),
            )),
            (written, read) => Ok(written.or(read)),
        }
    }

    /// `path` as written, resolved against the configuration file's directory.
    pub(super) fn file(&self, path: &str) -> PathBuf {
        match self.base {
            Some(base) if Path::new(path).is_relative() => base.join(path),
            _ => PathBuf::from(path),
        }
    }
}

/// A duration: a whole number and one of `ms`, `s`, `m`, `h`, `d`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let digits = s.bytes().take_while(u8::is_ascii_digit).count();
    let (number, unit) = s.split_at(digits);
    let millis_per_unit: u64 = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => {
            return Err(format!(
                "{s:?} is not a duration; write {}",
                duration_hint(s)
            ));
        }
    };
    number
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(millis_per_unit))
        .map(Duration::from_millis)
        .ok_or_else(|| format!("{s:?} is not a duration; write {}", duration_hint(s)))
}

/// How to write what the user meant: `5 minutes` → `5m or 300s`.
fn duration_hint(s: &str) -> String {
    const GENERIC: &str = "a whole number and a unit (ms, s, m, h or d), e.g. 5m or 300s";
    let s = s.trim();
    let digits = s.bytes().take_while(u8::is_ascii_digit).count();
    let (number, word) = s.split_at(digits);
    let Ok(n) = number.parse::<u64>() else {
        return GENERIC.to_owned();
    };
    let smaller = |factor: u64, unit: &str| {
        n.checked_mul(factor)
            .map_or(String::new(), |m| format!(" or {m}{unit}"))
    };
    match word.trim().to_ascii_lowercase().as_str() {
        "" => format!("{n}s or {n}ms (a unit is required)"),
        "ms" | "msec" | "msecs" | "millis" | "millisecond" | "milliseconds" => format!("{n}ms"),
        "s" | "sec" | "secs" | "second" | "seconds" => format!("{n}s{}", smaller(1000, "ms")),
        "m" | "min" | "mins" | "minute" | "minutes" => format!("{n}m{}", smaller(60, "s")),
        "h" | "hr" | "hrs" | "hour" | "hours" => format!("{n}h{}", smaller(60, "m")),
        "d" | "day" | "days" => format!("{n}d{}", smaller(24, "h")),
        _ => GENERIC.to_owned(),
    }
}

/// A timeout: a duration above zero.
pub(super) fn parse_timeout(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d.is_zero() {
        return Err(format!("{s:?} is too short; a timeout must be more than 0"));
    }
    Ok(d)
}

/// A concurrency slot's lease (`store.redis.lease`): from 1 s (renewed
/// every third of it) to 10 minutes (the slots of a gateway that died
/// stay taken that long).
pub(super) fn parse_lease(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d < Duration::from_secs(1) || d > Duration::from_secs(600) {
        return Err(format!(
            "{s:?} is out of range; lease takes 1s to 10m, e.g. 10s"
        ));
    }
    Ok(d)
}

/// A `sync` interval: from 10 ms (a call per instance a hundred times a
/// second) to one minute (the over-admission bound grows with it).
pub(super) fn parse_sync(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d < Duration::from_millis(10) || d > Duration::from_secs(60) {
        return Err(format!(
            "{s:?} is out of range; sync takes 10ms to 1m, e.g. 100ms"
        ));
    }
    Ok(d)
}

/// A header name, lower-cased; pseudo-headers and bad characters refused.
pub(super) fn parse_header_name(s: &str) -> Result<HeaderName, String> {
    HeaderName::from_bytes(s.as_bytes()).map_err(|_| {
        format!("{s:?} is not a header name (letters, digits and !#$%&'*+-.^_`|~ only)")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("1d"), Ok(Duration::from_secs(86_400)));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        assert_eq!(
            parse_duration("5 minutes"),
            Err("\"5 minutes\" is not a duration; write 5m or 300s".into())
        );
        assert_eq!(
            parse_duration("60"),
            Err("\"60\" is not a duration; write 60s or 60ms (a unit is required)".into())
        );
        assert_eq!(
            parse_duration("2 hours"),
            Err("\"2 hours\" is not a duration; write 2h or 120m".into())
        );
        for bad in [
            "",
            "s",
            "1.5s",
            "-1s",
            "1S",
            "1m30s",
            "99999999999999999999s",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
        assert!(parse_duration("18446744073709551615d").is_err());
        assert!(parse_timeout("0ms").is_err());
        assert_eq!(parse_timeout("1ms"), Ok(Duration::from_millis(1)));
    }
}
