//! The leaves of the file structs: [`Field`] (absent, invalid or read),
//! [`Text`], [`Int`], [`Flag`] and [`OneOrMany`], each of which reads a
//! whole [`yaml_serde::Value`] and says what it found when it is not what
//! was expected, in the words the loader's messages use.

use std::fmt;
use std::marker::PhantomData;

use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};
use yaml_serde::Value;

/// One field as written: absent (or `null`), of the wrong type, or read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Field<T> {
    /// Not in the file, or written as `null` / left empty.
    #[default]
    Absent,
    /// Present but not of the expected type; the message says why.
    Invalid(String),
    /// Present and well typed.
    Valid(T),
}

impl<T> Field<T> {
    /// Whether the field was left out.
    pub fn is_absent(&self) -> bool {
        matches!(self, Self::Absent)
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Field<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_option(FieldVisitor(PhantomData))
    }
}

struct FieldVisitor<T>(PhantomData<T>);

impl<'de, T: Deserialize<'de>> Visitor<'de> for FieldVisitor<T> {
    type Value = Field<T>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any value")
    }

    fn visit_none<E: de::Error>(self) -> Result<Field<T>, E> {
        Ok(Field::Absent)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Field<T>, E> {
        Ok(Field::Absent)
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Field<T>, D::Error> {
        Ok(match T::deserialize(deserializer) {
            Ok(value) => Field::Valid(value),
            Err(e) => Field::Invalid(tidy(&e.to_string())),
        })
    }
}

/// Rewrites serde's `invalid type: map, expected a string` (what a struct or
/// a list reports for a node of the wrong kind) as
/// `expected a string, found a mapping`, in the words the leaves use.
pub(super) fn tidy(message: &str) -> String {
    let Some((found, expected)) = message
        .strip_prefix("invalid type: ")
        .and_then(|rest| rest.split_once(", expected "))
    else {
        return message.to_owned();
    };
    let expected = match expected {
        "a sequence" => "a list",
        // A mapping key that is not a string (`1: x`, `true: x`).
        "field identifier" => "a field name",
        other => other,
    };
    let found = match found {
        "map" => "a mapping".to_owned(),
        "sequence" => "a list".to_owned(),
        "unit value" => "null".to_owned(),
        other => match other.split_once(' ') {
            Some(("string", s)) => format!("the string {s}"),
            Some(("integer" | "floating", n)) => {
                format!(
                    "the number {}",
                    n.trim_start_matches("point ").trim_matches('`')
                )
            }
            Some(("boolean", b)) => b.trim_matches('`').to_owned(),
            _ => other.to_owned(),
        },
    };
    format!("expected {expected}, found {found}")
}

/// Says what kind of node `value` is, for "expected …, found …" messages.
pub(super) fn describe(value: &Value) -> String {
    match value {
        Value::Null => "null".to_owned(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => format!("the number {n}"),
        Value::String(s) => format!("the string {s:?}"),
        Value::Sequence(_) => "a list".to_owned(),
        Value::Mapping(_) => "a mapping".to_owned(),
        Value::Tagged(t) => format!("a value tagged {}", t.tag),
    }
}

/// A scalar read as text. Strings are taken as written; numbers and
/// booleans in their YAML spelling, so `window: 60` reaches the duration
/// parser (which then asks for a unit) instead of failing as "not a string".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Text(pub String);

impl<'de> Deserialize<'de> for Text {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match Value::deserialize(deserializer)? {
            Value::String(s) => Ok(Self(s)),
            Value::Number(n) => Ok(Self(n.to_string())),
            Value::Bool(b) => Ok(Self(b.to_string())),
            other => Err(de::Error::custom(format_args!(
                "expected a string, found {}",
                describe(&other)
            ))),
        }
    }
}

/// A whole number. Range checks are the loader's business.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Int(pub i64);

impl<'de> Deserialize<'de> for Int {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = Value::deserialize(deserializer)?;
        if let Value::Number(n) = &value {
            if let Some(i) = n.as_i64() {
                return Ok(Self(i));
            }
            if n.is_u64() {
                return Err(de::Error::custom(format_args!("{n} is too large")));
            }
        }
        Err(de::Error::custom(format_args!(
            "expected a whole number, found {}",
            describe(&value)
        )))
    }
}

/// A YAML boolean (`true` / `false`), nothing else: `yes` or `"true"` is
/// more likely a mistake than a choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flag(pub bool);

impl<'de> Deserialize<'de> for Flag {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match Value::deserialize(deserializer)? {
            Value::Bool(b) => Ok(Self(b)),
            other => Err(de::Error::custom(format_args!(
                "expected true or false, found {}",
                describe(&other)
            ))),
        }
    }
}

/// One scalar or a list of them (`key: ip` or `key: [ip, user]`).
///
/// Each item is its own [`Field`], so one bad item does not hide the others.
/// Only for leaf item types: the items are read from owned values, outside
/// the unknown-field tracking of [`from_value`](super::from_value).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OneOrMany<T> {
    /// A single value.
    One(Field<T>),
    /// A list, possibly empty.
    Many(Vec<Field<T>>),
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for OneOrMany<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        fn item<'de, T: Deserialize<'de>>(value: Value) -> Field<T> {
            Field::deserialize(value).unwrap_or_else(|e| Field::Invalid(e.to_string()))
        }
        Ok(match Value::deserialize(deserializer)? {
            Value::Sequence(items) => Self::Many(items.into_iter().map(item).collect()),
            other => Self::One(item(other)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tidy_messages() {
        assert_eq!(
            tidy("invalid type: string \"x\", expected a mapping"),
            "expected a mapping, found the string \"x\""
        );
        assert_eq!(
            tidy("invalid type: floating point `1.5`, expected a sequence"),
            "expected a list, found the number 1.5"
        );
        assert_eq!(
            tidy("invalid type: boolean `true`, expected a mapping"),
            "expected a mapping, found true"
        );
        assert_eq!(
            tidy("invalid type: integer `1`, expected field identifier"),
            "expected a field name, found the number 1"
        );
        assert_eq!(tidy("something else"), "something else");
    }
}
