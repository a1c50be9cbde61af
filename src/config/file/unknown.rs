//! Unknown fields: [`from_value`] reads the whole file under
//! `serde_ignored`, so every key the structs do not know is collected (with
//! the fields allowed at its place, asked from serde's derive) instead of
//! stopping the read at the first one.

use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};
use yaml_serde::Value;

use super::leaf::tidy;
use super::mappings::{
    ApiKeys, Breaker, ClientIp, Exempt, Jwt, Limit, Match, PlanLimit, Reconnect, Redis, RedisTls,
    Respond, Root, Route, Sentinel, Store, Timeouts, Tracing, Users,
};
use super::pools::{Eject, Health, UpstreamPool};
use super::server::{Server, ServerPath};
use crate::config::position::{child_index, child_key};

/// A key the structs do not know.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownField {
    /// Path of the mapping that holds it (`""` for the top level).
    pub parent: String,
    /// The key as written.
    pub key: String,
    /// The fields allowed in that mapping.
    pub expected: &'static [&'static str],
}

/// Reads a parsed YAML document into [`Root`].
///
/// Returns every unknown key alongside; field type errors are kept inside
/// the [`Field`](super::Field)s. A `null` document reads as an empty one.
///
/// # Errors
/// Only when the document itself is not a mapping.
pub fn from_value(value: Value) -> (Result<Root, String>, Vec<UnknownField>) {
    let mut unknown = Vec::new();
    if value.is_null() {
        return (Ok(Root::default()), unknown);
    }
    let root = serde_ignored::deserialize(value, |path| unknown.push(unknown_field(&path)))
        .map_err(|e| tidy(&e.to_string()));
    (root, unknown)
}

fn unknown_field(path: &serde_ignored::Path<'_>) -> UnknownField {
    /// Renders `path` in the error-path syntax, collecting its mapping keys.
    fn render(path: &serde_ignored::Path<'_>, keys: &mut Vec<String>) -> String {
        use serde_ignored::Path;
        match path {
            Path::Root => String::new(),
            Path::Seq { parent, index } => child_index(&render(parent, keys), *index),
            Path::Map { parent, key } => {
                let parent = render(parent, keys);
                keys.push(key.clone());
                child_key(&parent, key)
            }
            Path::Some { parent }
            | Path::NewtypeStruct { parent }
            | Path::NewtypeVariant { parent } => render(parent, keys),
        }
    }
    let mut keys = Vec::new();
    let (parent, key) = match path {
        serde_ignored::Path::Map { parent, key } => (render(parent, &mut keys), key.clone()),
        other => (render(other, &mut keys), String::new()),
    };
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    UnknownField {
        parent,
        key,
        expected: fields_at(&keys),
    }
}

/// The fields of the struct found under the mapping keys `keys` (sequence
/// indices left out: `routes[0].limits[1]` is `["routes", "limits"]`).
fn fields_at(keys: &[&str]) -> &'static [&'static str] {
    match keys {
        [] => fields_of::<Root>(),
        ["store"] => fields_of::<Store>(),
        ["store", "redis"] => fields_of::<Redis>(),
        ["store", "redis", "sentinel"] => fields_of::<Sentinel>(),
        ["store", "redis", "tls"] => fields_of::<RedisTls>(),
        ["store", "redis", "reconnect"] => fields_of::<Reconnect>(),
        ["store", "breaker"] => fields_of::<Breaker>(),
        ["client_ip"] => fields_of::<ClientIp>(),
        ["api_keys"] => fields_of::<ApiKeys>(),
        ["users"] => fields_of::<Users>(),
        ["users", "jwt"] => fields_of::<Jwt>(),
        ["plans", _] => fields_of::<PlanLimit>(),
        ["timeouts"] => fields_of::<Timeouts>(),
        ["tracing"] => fields_of::<Tracing>(),
        ["server"] => fields_of::<Server>(),
        ["server", "path"] => fields_of::<ServerPath>(),
        ["upstreams", _] => fields_of::<UpstreamPool>(),
        ["upstreams", _, "health"] => fields_of::<Health>(),
        ["upstreams", _, "eject"] => fields_of::<Eject>(),
        ["routes"] => fields_of::<Route>(),
        ["routes", "match"] => fields_of::<Match>(),
        ["routes", "respond"] => fields_of::<Respond>(),
        ["routes", "limits"] => fields_of::<Limit>(),
        ["exempt"] | ["routes", "exempt"] => fields_of::<Exempt>(),
        _ => &[],
    }
}

/// The field names serde's derive gives a struct, asked from the derive
/// itself (it passes them to `deserialize_struct`), so the "expected one
/// of" lists can never drift from the structs of `mappings.rs`.
pub(super) fn fields_of<'de, T: Deserialize<'de>>() -> &'static [&'static str] {
    struct Probe<'a>(&'a mut &'static [&'static str]);

    impl<'de> Deserializer<'de> for Probe<'_> {
        type Error = de::value::Error;

        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
            Err(de::Error::custom("not a struct"))
        }

        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _name: &'static str,
            fields: &'static [&'static str],
            _visitor: V,
        ) -> Result<V::Value, Self::Error> {
            *self.0 = fields;
            Err(de::Error::custom("probed"))
        }

        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
            bytes byte_buf option unit unit_struct newtype_struct seq tuple
            tuple_struct map enum identifier ignored_any
        }
    }

    let mut fields: &'static [&'static str] = &[];
    // The probe always fails; it is only asked for the field list.
    let _ = T::deserialize(Probe(&mut fields));
    fields
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(src: &str) -> (Result<Root, String>, Vec<UnknownField>) {
        let value: Value = yaml_serde::from_str(src).expect("test YAML parses");
        from_value(value)
    }

    #[test]
    fn field_lists_come_from_the_derive() {
        assert_eq!(
            fields_of::<Route>(),
            [
                "name",
                "match",
                "upstream",
                "respond",
                "timeout",
                "cost",
                "limits",
                "upstream_ca",
                "upgrade",
                "forward_proxy_authorization",
                "shadow",
                "on_error",
                "max_queue",
                "cors",
                "request_headers",
                "response_headers",
                "exempt"
            ]
        );
        assert_eq!(fields_at(&["routes", "limits"]), fields_of::<Limit>());
        assert!(fields_at(&["nope"]).is_empty());
    }

    #[test]
    fn not_a_mapping() {
        let (root, _) = read("[1, 2]\n");
        assert_eq!(root.err(), Some("expected a mapping, found a list".into()));
        let (root, _) = read("");
        assert!(root.is_ok());
    }
}
