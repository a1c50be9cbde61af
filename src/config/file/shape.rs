//! The shapes the JSON Schema gives fields that are more than "a scalar",
//! named by the file structs' `#[schemars(…)]` attributes.
//!
//! Each is taken from what the loader uses: an enum field's `enum` is
//! [`spellings`] of the same table its loader parses with
//! (`HeaderMode::SPELLINGS`, …), and durations, windows and sizes take the
//! shapes the loader's parsers accept ([`duration`], [`window`], [`size`]).
//! `tests/config.rs` holds the two to each other: every spelling, near miss
//! and documented example is accepted by both or by neither.

use schemars::Schema;
use serde_json::json;

/// What a duration looks like: a whole number and a unit.
pub const DURATION: &str = "^[0-9]+(ms|s|m|h|d)$";

/// What a limit's window looks like: a duration, or `month`.
pub const WINDOW: &str = "^([0-9]+(ms|s|m|h|d)|month)$";

/// What a limit's `sync` looks like: a duration, or `off`.
pub const SYNC: &str = "^([0-9]+(ms|s|m|h|d)|off)$";

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

/// `#[schemars(transform = sync)]`: a string shaped like [`SYNC`], or null.
pub fn sync(schema: &mut Schema) {
    one_of_or_null(schema, vec![json!({ "type": "string", "pattern": SYNC })]);
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

/// `#[schemars(transform = ratio)]`: a number from 0 to 1, or null.
pub fn ratio(schema: &mut Schema) {
    one_of_or_null(
        schema,
        vec![json!({ "type": "number", "minimum": 0, "maximum": 1 })],
    );
}

/// Replaces the choices of a `Field`'s schema (`anyOf: [T, null]`) with
/// `choices` and null, keeping its description.
fn one_of_or_null(schema: &mut Schema, mut choices: Vec<serde_json::Value>) {
    choices.push(json!({ "type": "null" }));
    schema.insert("anyOf".into(), choices.into());
}

/// The `enum` of a field read through a spellings table (such as
/// [`HeaderMode::SPELLINGS`](crate::config::HeaderMode::SPELLINGS)): every
/// spelling, then `null` for a field left empty. The loader parses the same
/// table, so the two cannot drift apart.
pub fn spellings<T>(table: &[(&'static str, T)]) -> Vec<Option<&'static str>> {
    table
        .iter()
        .map(|&(name, _)| Some(name))
        .chain([None])
        .collect()
}
