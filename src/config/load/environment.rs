//! `${VAR}` references expanded in the parsed document, before the file
//! structs read it.
//!
//! Every string scalar that is a mapping value or a list item goes through
//! [`expand`](crate::config::expand::expand); mapping keys are names and
//! are left as written. Working on the parsed tree is what keeps a value
//! from adding structure: whatever a variable holds becomes the text of one
//! scalar.
//!
//! A scalar that holds a reference is then read as the field's type: when
//! its expanded text is a whole number written the way Rust writes it
//! (`10`, `-3`, not `010` or `+3`) or `true` / `false`, it becomes that
//! number or boolean, so `limit: ${LIMIT}` is a number. Text fields read
//! numbers and booleans back in exactly that spelling, so nothing a text
//! field receives is changed by this.
//!
//! A reference that cannot be expanded is an error at the scalar's path,
//! and the scalar is read as empty text so the rest of the file is checked;
//! the loader keeps only the expansion error for that path. In a secret
//! field ([`SECRET_FIELDS`]) a `${` may be part of the secret rather than
//! a reference, so the error there quotes none of the text: it names the
//! field (and, for a value that is one whole reference, its variable).

use yaml_serde::Value;

use crate::config::expand::{ExpandError, expand, has_references};
use crate::config::position::{child_index, child_key};

/// An environment: a variable's value, `None` when it is not set.
pub type Env<'e> = &'e dyn Fn(&str) -> Option<String>;

/// The process environment. A variable whose value is not UTF-8 reads as
/// not set.
pub fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// The fields whose values are secrets: passwords, a URL that may hold a
/// user and a password, tokens. No message quotes their text.
pub(super) const SECRET_FIELDS: [&str; 5] = [
    "admin.token",
    "store.redis.url",
    "store.redis.username",
    "store.redis.password",
    "users.jwt.secret",
];

/// Expands every scalar of `value` in place and returns the errors' messages,
/// each with the path of its scalar.
pub(super) fn expand_tree(value: &mut Value, env: Env<'_>) -> Vec<(String, String)> {
    let mut errors = Vec::new();
    walk(value, String::new(), env, &mut errors);
    errors
}

/// What an expansion error at `path` says; in a secret field, nothing of
/// `text`.
fn message(path: &str, text: &str, e: &ExpandError) -> String {
    if !SECRET_FIELDS.contains(&path) {
        return e.to_string();
    }
    let whole_reference = text.starts_with("${") && text.find('}') == Some(text.len() - 1);
    match e {
        ExpandError::Unset(_) if whole_reference => e.to_string(),
        ExpandError::Unset(_) => "references an environment variable that is not set (the \
            value is secret and not shown); set it, or write $$ for each $ the value holds"
            .to_owned(),
        ExpandError::Malformed { reason, .. } => format!(
            "holds a ${{ that {reason} (the value is secret and not shown); write $$ for each \
             $ the value holds, or give the whole value as ${{NAME}} or in a file"
        ),
    }
}

fn walk(value: &mut Value, path: String, env: Env<'_>, errors: &mut Vec<(String, String)>) {
    match value {
        Value::String(text) if has_references(text) => {
            let referenced = text.contains("${");
            match expand(text, env) {
                Ok(expanded) => {
                    let expanded = expanded.into_owned();
                    *value = if referenced {
                        typed(expanded)
                    } else {
                        Value::String(expanded)
                    };
                }
                Err(e) => {
                    errors.push((path.clone(), message(&path, text, &e)));
                    *value = Value::String(String::new());
                }
            }
        }
        Value::Sequence(items) => {
            for (i, item) in items.iter_mut().enumerate() {
                walk(item, child_index(&path, i), env, errors);
            }
        }
        Value::Mapping(map) => {
            for (key, item) in map.iter_mut() {
                let child = match key {
                    Value::String(k) => child_key(&path, k),
                    _ => path.clone(),
                };
                walk(item, child, env, errors);
            }
        }
        Value::Tagged(tagged) => walk(&mut tagged.value, path, env, errors),
        _ => {}
    }
}

/// Expanded text as the scalar a field reads: a canonical whole number or
/// boolean becomes one, anything else stays text.
fn typed(text: String) -> Value {
    match text.as_str() {
        "true" => return Value::Bool(true),
        "false" => return Value::Bool(false),
        _ => {}
    }
    if let Ok(n) = text.parse::<i64>() {
        if n.to_string() == text {
            return Value::Number(n.into());
        }
    }
    if let Ok(n) = text.parse::<u64>() {
        if n.to_string() == text {
            return Value::Number(n.into());
        }
    }
    Value::String(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        match name {
            "N" => Some("10".into()),
            "Z" => Some("010".into()),
            "T" => Some("true".into()),
            "Y" => Some("[1, 2]".into()),
            _ => None,
        }
    }

    fn run(src: &str) -> (Value, Vec<(String, String)>) {
        let mut value: Value = yaml_serde::from_str(src).expect("test YAML");
        let errors = expand_tree(&mut value, &env);
        (value, errors)
    }

    #[test]
    fn scalars_are_expanded_and_typed() {
        let (value, errors) =
            run("a: ${N}\nb: \"${Z}\"\nc: ${T}\nd: ${Y}\ne:\n  - x${N}\n  - $$N\n${N}: k\n");
        assert!(errors.is_empty(), "{errors:?}");
        let want: Value = yaml_serde::from_str(
            "a: 10\nb: \"010\"\nc: true\nd: \"[1, 2]\"\ne: [x10, $N]\n\"${N}\": k\n",
        )
        .expect("YAML");
        assert_eq!(value, want);
    }

    #[test]
    fn errors_carry_the_path_and_leave_empty_text() {
        let (value, errors) = run("a:\n  b: [ok, \"${NOPE}\"]\n");
        assert_eq!(errors.len(), 1);
        assert_eq!(errors[0].0, "a.b[1]");
        assert_eq!(
            errors[0].1,
            ExpandError::Unset(vec!["NOPE".into()]).to_string()
        );
        let want: Value = yaml_serde::from_str("a:\n  b: [ok, \"\"]\n").expect("YAML");
        assert_eq!(value, want);
    }

    #[test]
    fn an_error_in_a_secret_field_quotes_none_of_it() {
        let src = "store:\n  redis:\n    password: Tr0ub4dor${9x!Lq-SECRETTAIL\n    username: u${NOPE}SECRETTAIL\nadmin: { token: \"${NOPE}\" }\n";
        let (_, errors) = run(src);
        assert_eq!(errors.len(), 3, "{errors:?}");
        for (path, message) in &errors {
            assert!(
                !message.contains("SECRETTAIL") && !message.contains("9x"),
                "{path}: {message}"
            );
        }
        // A value that is one whole reference names its variable.
        assert!(
            errors
                .iter()
                .any(|(p, m)| p == "admin.token" && m.contains("${NOPE}")),
            "{errors:?}"
        );
        assert!(
            errors
                .iter()
                .any(|(p, m)| p == "store.redis.username" && !m.contains("NOPE")),
            "{errors:?}"
        );
    }
}
