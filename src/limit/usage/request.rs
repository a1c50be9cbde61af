//! One field of a request's JSON body: the reservation
//! (`reserve: { json: max_tokens }`) and the key source `json:model`.
//!
//! The body is whole here (the gateway reads at most a bounded prefix of
//! it), so serde_json reads it, but walks only the path: every member off
//! the path is skipped without being built, and only the value at its end
//! is. Keys are compared decoded, as JSON defines them; when a key repeats,
//! its last value counts (as serde_json's maps keep it). A body that is not
//! one JSON value, or nests deeper than serde_json's limit of 128, has no
//! field.

use std::fmt;

use serde::de::{DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

use super::spec::JsonPath;

/// The non-negative integer (up to 2^63 − 1, no fraction) at `path` of
/// `body`; `None` when it is absent, of another type, or the body is not
/// JSON.
pub fn json_u64(body: &[u8], path: &JsonPath) -> Option<u64> {
    find(body, path)?.as_u64().filter(|v| *v <= i64::MAX as u64)
}

/// The string at `path` of `body`; `None` when it is absent, of another
/// type, or the body is not JSON.
pub fn json_str(body: &[u8], path: &JsonPath) -> Option<String> {
    match find(body, path)? {
        Value::String(s) => Some(s),
        _ => None,
    }
}

fn find(body: &[u8], path: &JsonPath) -> Option<Value> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let found = Walk(&path.segments).deserialize(&mut de).ok()?;
    de.end().ok()?;
    found
}

/// The value at the rest of a path, from the value being read.
struct Walk<'p>(&'p [Box<str>]);

impl<'de> DeserializeSeed<'de> for Walk<'_> {
    type Value = Option<Value>;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        if self.0.is_empty() {
            return serde::Deserialize::deserialize(d).map(Some);
        }
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Walk<'_> {
    type Value = Option<Value>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut found = None;
        while let Some(hit) = map.next_key_seed(Key(&self.0[0]))? {
            if hit {
                found = map.next_value_seed(Walk(&self.0[1..]))?;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(found)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(None)
    }

    fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
}

/// Whether a key is the wanted segment, without keeping it.
struct Key<'p>(&'p str);

impl<'de> DeserializeSeed<'de> for Key<'_> {
    type Value = bool;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for Key<'_> {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a key")
    }

    fn visit_str<E>(self, k: &str) -> Result<bool, E> {
        Ok(k == self.0)
    }
}
