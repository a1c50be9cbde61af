//! The JSON Schema of the configuration file, for editors (`tollgate schema`).
//!
//! The schema is derived (`schemars`) from the [`file`](super::file)
//! structs, so it cannot drift from what the loader reads. Those structs
//! wrap every field in [`Field`] and read leaves through [`Text`], [`Int`]
//! and [`OneOrMany`]; the impls below describe each wrapper as the YAML is
//! written — a `Field<T>` is a `T` or `null`, a `Text` any scalar, a
//! `OneOrMany<T>` one `T` or a list of them — rather than as Rust types.
//! Unknown fields are refused (`additionalProperties: false`), as the loader
//! does. The schema checks shape only: ranges, routes' exclusive fields and
//! the like stay with `tollgate check`, which also says how to fix them.
//!
//! Where the schema says more than "a scalar", it says it from what the
//! loader uses: an enum field's `enum` is [`spellings`] of the same table
//! its loader parses with (`HeaderMode::SPELLINGS`, …), and durations,
//! windows and sizes take the shapes the loader's parsers accept
//! ([`duration`], [`window`], [`size`]). `tests/config.rs` holds the two to
//! each other: every spelling, near miss and documented example is
//! accepted by both or by neither.

use std::borrow::Cow;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde_json::json;

use super::file::{Field, Flag, Int, Listen, ListenMap, OneOrMany, Root, Text};

/// What a duration looks like: a whole number and a unit.
pub const DURATION: &str = "^[0-9]+(ms|s|m|h|d)$";

/// What a limit's window looks like: a duration, or `month`.
pub const WINDOW: &str = "^([0-9]+(ms|s|m|h|d)|month)$";

/// What a size looks like: bytes, or a whole number and a binary unit
/// (the loader allows spaces around the unit: `8 KiB`).
pub const SIZE: &str = "^[0-9]+\\s*(B|KiB|MiB|GiB)?\\s*$";

/// `#[schemars(transform = duration)]` on a `Field<Text>`: a string
/// shaped like [`DURATION`], or null. Not a number: `timeout: 5` has no
/// unit, which the loader refuses.
pub fn duration(schema: &mut Schema) {
    one_of_or_null(
        schema,
        vec![json!({ "type": "string", "pattern": DURATION })],
    );
}

/// `#[schemars(transform = window)]`: a string shaped like [`WINDOW`], or null.
pub fn window(schema: &mut Schema) {
    one_of_or_null(schema, vec![json!({ "type": "string", "pattern": WINDOW })]);
}

/// `#[schemars(transform = size)]`: a string shaped like [`SIZE`], a
/// whole number of bytes, or null.
pub fn size(schema: &mut Schema) {
    one_of_or_null(
        schema,
        vec![
            json!({ "type": "string", "pattern": SIZE }),
            json!({ "type": "integer", "minimum": 0 }),
        ],
    );
}

/// Replaces the choices of a `Field`'s schema (`anyOf: [T, null]`) with
/// `choices` and null, keeping its description.
fn one_of_or_null(schema: &mut Schema, mut choices: Vec<serde_json::Value>) {
    choices.push(json!({ "type": "null" }));
    schema.insert("anyOf".into(), choices.into());
}

/// The `enum` of a field read through a spellings table (such as
/// [`HeaderMode::SPELLINGS`](super::HeaderMode::SPELLINGS)): every
/// spelling, then `null` for a field left empty. The loader parses the same
/// table, so the two cannot drift apart.
pub fn spellings<T>(table: &[(&'static str, T)]) -> Vec<Option<&'static str>> {
    table
        .iter()
        .map(|&(name, _)| Some(name))
        .chain([None])
        .collect()
}

impl<T: JsonSchema> JsonSchema for Field<T> {
    fn schema_name() -> Cow<'static, str> {
        format!("Nullable_{}", T::schema_name()).into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        let inner = generator.subschema_for::<T>();
        json_schema!({ "anyOf": [inner, { "type": "null" }] })
    }
}

impl JsonSchema for Text {
    fn schema_name() -> Cow<'static, str> {
        "Text".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        // The loader reads numbers and booleans in their YAML spelling.
        json_schema!({ "type": ["string", "number", "boolean"] })
    }
}

impl JsonSchema for Int {
    fn schema_name() -> Cow<'static, str> {
        "Int".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({ "type": "integer" })
    }
}

impl JsonSchema for Flag {
    fn schema_name() -> Cow<'static, str> {
        "Flag".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({ "type": "boolean" })
    }
}

impl<T: JsonSchema> JsonSchema for OneOrMany<T> {
    fn schema_name() -> Cow<'static, str> {
        format!("OneOrMany_{}", T::schema_name()).into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        let one = generator.subschema_for::<T>();
        json_schema!({ "anyOf": [one, { "type": "array", "items": one }] })
    }
}

impl JsonSchema for Listen {
    fn schema_name() -> Cow<'static, str> {
        "Listen".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        // `127.0.0.1:8080` or `{ addr, tls: { cert, key } }`.
        let addr = generator.subschema_for::<Text>();
        let map = generator.subschema_for::<ListenMap>();
        json_schema!({ "anyOf": [addr, map] })
    }
}

/// The schema of the whole file, as a JSON value.
pub fn schema() -> Schema {
    let mut schema = schemars::schema_for!(Root);
    schema.insert("title".into(), "tollgate configuration".into());
    schema
}

/// The schema, pretty-printed.
pub fn json() -> String {
    serde_json::to_string_pretty(&schema()).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_fields_are_refused_and_match_is_renamed() {
        let s = serde_json::to_value(schema()).expect("schema is JSON");
        assert_eq!(s["additionalProperties"], false);
        let route = &s["$defs"]["Route"];
        assert!(route["properties"]["match"].is_object(), "{route}");
        assert_eq!(route["additionalProperties"], false);
    }
}
