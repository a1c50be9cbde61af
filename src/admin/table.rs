//! The command line's side of the support API (`tollgate callers`,
//! `tollgate overrides`): `NAME=VALUE` arguments made into a query or a
//! JSON body, and the API's JSON answers printed as tables. What the
//! arguments mean is checked by the gateway, whose 400 names the field.

use serde_json::{Map, Value};

/// `NAME=VALUE` arguments as a query string (values percent-encoded).
///
/// # Errors
/// An argument without `=`.
pub fn query(args: &[String]) -> Result<String, String> {
    let mut out = form_urlencoded::Serializer::new(String::new());
    for a in args {
        let (k, v) = split(a)?;
        out.append_pair(k, v);
    }
    Ok(out.finish())
}

/// `NAME=VALUE` arguments as a JSON object: `true`/`false` as booleans,
/// whole numbers as numbers, anything else as a string.
///
/// # Errors
/// An argument without `=`.
pub fn body(args: &[String]) -> Result<String, String> {
    let mut map = Map::new();
    for a in args {
        let (k, v) = split(a)?;
        let value = match v {
            "true" => Value::Bool(true),
            "false" => Value::Bool(false),
            _ => match v.parse::<u64>() {
                Ok(n) => Value::from(n),
                Err(_) => Value::from(v),
            },
        };
        map.insert(k.to_owned(), value);
    }
    Ok(Value::Object(map).to_string())
}

fn split(arg: &str) -> Result<(&str, &str), String> {
    arg.split_once('=')
        .ok_or_else(|| format!("{arg:?}: write NAME=VALUE, e.g. api_key=k1"))
}

/// Columns padded to their widest cell, two spaces apart.
fn render(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let mut out = String::new();
        for (i, (c, w)) in cells.iter().zip(&widths).enumerate() {
            if i + 1 == cells.len() {
                out.push_str(c);
            } else {
                out.push_str(&format!("{c:<w$}  "));
            }
        }
        out.trim_end().to_owned()
    };
    let mut out = vec![line(header.iter().map(|h| (*h).to_owned()).collect())];
    out.extend(rows.iter().map(|r| line(r.clone())));
    out.join("\n")
}

fn cell(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => s.clone(),
        // Whole seconds without a fraction: `60`, not `60.0`.
        Value::Number(n) if n.as_f64().is_some_and(|f| f.fract() == 0.0) && n.is_f64() => {
            n.to_string().trim_end_matches(".0").to_owned()
        }
        other => other.to_string(),
    }
}

/// An override's change in a few words: `quota=6 window=60s`, `plan=pro`,
/// `exempt`.
fn change(o: &Value) -> String {
    let mut parts = Vec::new();
    if o["exempt"] == true {
        parts.push("exempt".to_owned());
    }
    for (name, unit) in [("quota", ""), ("window_s", "s"), ("plan", "")] {
        if !o[name].is_null() {
            let label = name.trim_end_matches("_s");
            parts.push(format!("{label}={}{unit}", cell(&o[name])));
        }
    }
    parts.join(" ")
}

/// The elements of `v`; none when it is not an array.
fn items(v: &Value) -> &[Value] {
    v.as_array().map_or(&[], Vec::as_slice)
}

/// `GET /admin/callers` as a table.
pub fn callers(v: &Value) -> String {
    let rows: Vec<Vec<String>> = items(&v["limits"])
        .iter()
        .map(|e| {
            vec![
                cell(&e["route"]),
                cell(&e["limit"]),
                cell(&e["algorithm"]),
                cell(&e["quota"]),
                format!("{}s", cell(&e["window_s"])),
                cell(&e["used"]),
                cell(&e["remaining"]),
                format!("{}s", cell(&e["reset_s"])),
                if e["override"].is_null() {
                    "-".into()
                } else {
                    change(&e["override"])
                },
                match &e["shared"] {
                    Value::String(s) => format!("{} ({s})", cell(&e["identity"])),
                    _ => cell(&e["identity"]),
                },
            ]
        })
        .collect();
    let mut out = render(
        &[
            "ROUTE",
            "LIMIT",
            "ALGORITHM",
            "QUOTA",
            "WINDOW",
            "USED",
            "REMAINING",
            "RESET",
            "OVERRIDE",
            "IDENTITY",
        ],
        &rows,
    );
    for (key, says) in [
        ("exempt_routes", "exempt on"),
        ("no_plan_routes", "no plan on"),
    ] {
        let routes: Vec<String> = items(&v[key]).iter().map(cell).collect();
        if !routes.is_empty() {
            out.push_str(&format!("\n{says}: {}", routes.join(", ")));
        }
    }
    out
}

/// `DELETE /admin/callers` as a table.
pub fn reset(v: &Value) -> String {
    let rows: Vec<Vec<String>> = items(&v["reset"])
        .iter()
        .map(|e| vec![cell(&e["route"]), cell(&e["limit"]), cell(&e["key"])])
        .collect();
    format!(
        "{}\ncounters deleted: {}",
        render(&["ROUTE", "LIMIT", "KEY"], &rows),
        cell(&v["counters_held"])
    )
}

/// A list of overrides (`GET`, or what `PUT`/`DELETE` answered) as a table.
pub fn overrides(v: &Value) -> String {
    let list: Vec<&Value> = match (&v["overrides"], &v["override"], &v["removed"]) {
        (Value::Array(a), _, _) | (_, _, Value::Array(a)) => a.iter().collect(),
        (_, o @ Value::Object(_), _) => vec![o],
        _ => Vec::new(),
    };
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|o| {
            // The caller field, and the `json.FIELD` values beside it.
            let caller =
                o["caller"]
                    .as_object()
                    .filter(|m| !m.is_empty())
                    .map_or("-".into(), |m| {
                        let parts: Vec<String> =
                            m.iter().map(|(k, v)| format!("{k}={}", cell(v))).collect();
                        parts.join("&")
                    });
            let mut state = Vec::new();
            if o["orphaned"] == true {
                state.push("orphaned");
            }
            if o["expired"] == true {
                state.push("expired");
            }
            vec![
                caller,
                cell(&o["route"]),
                cell(&o["limit"]),
                change(o),
                o["expires_in_s"]
                    .as_u64()
                    .map_or("never".into(), |s| format!("in {s}s")),
                if state.is_empty() {
                    "-".into()
                } else {
                    state.join(",")
                },
            ]
        })
        .collect();
    render(
        &["CALLER", "ROUTE", "LIMIT", "CHANGE", "EXPIRES", "STATE"],
        &rows,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments() {
        let args = |a: &[&str]| a.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert_eq!(
            query(&args(&["api_key=k 1", "limit=api/per_key"])).unwrap(),
            "api_key=k+1&limit=api%2Fper_key"
        );
        assert_eq!(
            body(&args(&[
                "api_key=k1",
                "quota=6",
                "exempt=true",
                "window=1m"
            ]))
            .unwrap(),
            r#"{"api_key":"k1","exempt":true,"quota":6,"window":"1m"}"#
        );
        assert!(query(&args(&["k1"])).unwrap_err().contains("NAME=VALUE"));
    }

    #[test]
    fn tables() {
        let v: Value = serde_json::from_str(
            r#"{"limits":[{"route":"api","limit":"per_key","algorithm":"sliding_window","quota":3,"window_s":3600.0,"used":2,"remaining":1,"reset_s":3600,"override":{"quota":6,"exempt":false,"window_s":null,"plan":null},"identity":"-","shared":"the bucket every caller without api_key shares"}],"exempt_routes":["x"],"no_plan_routes":[]}"#,
        )
        .unwrap();
        let t = callers(&v);
        assert!(t.starts_with("ROUTE  LIMIT    ALGORITHM"), "{t}");
        assert!(
            t.contains(
                "api    per_key  sliding_window  3      3600s   2     1          3600s  quota=6   - (the bucket every caller without api_key shares)"
            ),
            "{t}"
        );
        assert!(t.ends_with("exempt on: x"), "{t}");
        let v: Value = serde_json::from_str(
            r#"{"overrides":[{"caller":{"api_key":"sha256:6ab9f1eb8f7d3388","json.model":"m1"},"route":"chat","limit":"tpm","share":false,"quota":5,"window_s":null,"plan":null,"exempt":false,"expires_in_s":null}]}"#,
        )
        .unwrap();
        let t = overrides(&v);
        assert!(
            t.contains("api_key=sha256:6ab9f1eb8f7d3388&json.model=m1  chat"),
            "{t}"
        );
    }
}
