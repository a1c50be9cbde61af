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
//! Where the schema says more than "a scalar" (an enum field's spellings,
//! what a duration, a window or a size looks like), it says it from what
//! the loader uses; those shapes sit beside the structs that name them, in
//! `file/shape.rs`.

use std::borrow::Cow;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};

use super::file::{
    Admin, AdminMap, Cost, CostMap, Field, Flag, FromBody, FromBodyMap, Int, Listen, ListenMap,
    OneOrMany, Reserve, ReserveMap, Root, Target, TargetMap, Text,
};

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

impl JsonSchema for Admin {
    fn schema_name() -> Cow<'static, str> {
        "Admin".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        // `127.0.0.1:9090` or `{ addr, token_file }`.
        let addr = generator.subschema_for::<Text>();
        let map = generator.subschema_for::<AdminMap>();
        json_schema!({ "anyOf": [addr, map] })
    }
}

impl JsonSchema for Target {
    fn schema_name() -> Cow<'static, str> {
        "Target".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        // `http://10.0.0.1:9000` or `{ url, weight }`.
        let url = generator.subschema_for::<Text>();
        let map = generator.subschema_for::<TargetMap>();
        json_schema!({ "anyOf": [url, map] })
    }
}

impl JsonSchema for Cost {
    fn schema_name() -> Cow<'static, str> {
        "Cost".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        // `2` or `{ reserve, from_header | from_trailer }`.
        let fixed = generator.subschema_for::<Int>();
        let settled = generator.subschema_for::<CostMap>();
        json_schema!({ "anyOf": [fixed, settled] })
    }
}

impl JsonSchema for Reserve {
    fn schema_name() -> Cow<'static, str> {
        "Reserve".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        // `500` or `{ json: max_tokens, default: 1000 }`.
        let fixed = generator.subschema_for::<Int>();
        let json = generator.subschema_for::<ReserveMap>();
        json_schema!({ "anyOf": [fixed, json] })
    }
}

impl JsonSchema for FromBody {
    fn schema_name() -> Cow<'static, str> {
        "FromBody".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        // `openai`, `anthropic` or `{ json, stream }`.
        let fields = generator.subschema_for::<FromBodyMap>();
        let presets = crate::limit::settle::BodyUsage::PRESETS;
        json_schema!({ "anyOf": [{ "type": "string", "enum": presets }, fields] })
    }
}

/// The schema of the whole file, as a JSON value.
pub fn schema() -> Schema {
    let mut schema = schemars::schema_for!(Root);
    schema.insert("title".into(), "tollgate configuration".into());
    if let Some(map) = schema.as_object_mut() {
        for value in map.values_mut() {
            allow_references(value);
        }
    }
    schema
}

/// What a scalar holding an environment reference looks like: the loader
/// expands it before reading the field, so the schema cannot know its type.
const REFERENCE: &str = "\\$\\{";

/// Lets every field (a `Field`'s `anyOf: [T, null]`, whatever shape its
/// attributes gave it) also be a string holding `${…}`: the field as
/// shaped, or a reference.
fn allow_references(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::Object(map) => {
            for child in map.values_mut() {
                allow_references(child);
            }
            let is_field = map
                .get("anyOf")
                .and_then(serde_json::Value::as_array)
                .is_some_and(|choices| {
                    choices
                        .iter()
                        .any(|c| *c == serde_json::json!({ "type": "null" }))
                });
            if is_field {
                let description = map.remove("description");
                let shaped = std::mem::take(map);
                map.insert(
                    "anyOf".into(),
                    serde_json::json!([shaped, { "type": "string", "pattern": REFERENCE }]),
                );
                if let Some(d) = description {
                    map.insert("description".into(), d);
                }
            }
        }
        serde_json::Value::Array(items) => {
            for item in items {
                allow_references(item);
            }
        }
        _ => {}
    }
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
