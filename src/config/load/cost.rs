//! A limit's settled cost (docs/limits.md#costs-settled-by-the-response): `cost: { reserve, from_header |
//! from_trailer | from_body }` (docs/limits.md#ai-apis) and `bytes: request
//! | response | both`, and the combinations the stores cannot settle.

use std::time::Duration;

use http::HeaderName;

use super::check::{Check, Checked, choice, leaf, positive, text};
use crate::config::BodyField;
use crate::config::file::{self, Field};
use crate::config::position::child_key;
use crate::limit::Algorithm;
use crate::limit::settle::{BodyUsage, Bytes, Source};
use crate::limit::usage::{JsonPath, Stream, UsageSpec};

/// A settled limit's source and the field that asked for it (for errors).
pub(super) type Settled = Option<(Source, &'static str)>;

/// What a limit's `cost` says: the cost (the reservation of a settled
/// one, its `default` when read from the body), the body field the
/// reservation is read from, and where a settled cost comes from.
pub(super) struct CheckedCost {
    pub(super) cost: Checked<Option<u64>>,
    pub(super) reserve_from: Checked<Option<BodyField>>,
    pub(super) settle: Checked<Settled>,
}

impl Check<'_> {
    /// `cost` and `bytes` of a limit.
    pub(super) fn cost(&mut self, limit: &file::Limit, path: &str) -> CheckedCost {
        let cost_path = child_key(path, "cost");
        let bytes_path = child_key(path, "bytes");
        let bytes = self.optional(&limit.bytes, &bytes_path, choice(&Bytes::SPELLINGS));
        let (cost, reserve_from, settle) = match &limit.cost {
            Field::Valid(file::Cost::Settled(map)) => {
                let (reserve, reserve_from, source) = self.settled_cost(map, &cost_path);
                (reserve, reserve_from, source.map(|s| Some((s, "cost"))))
            }
            Field::Valid(file::Cost::Fixed(n)) => {
                (positive(self, n, &cost_path).map(Some), Ok(None), Ok(None))
            }
            Field::Invalid(message) => (
                Err(self.value_error(&cost_path, message.clone())),
                Ok(None),
                Ok(None),
            ),
            Field::Absent => (Ok(None), Ok(None), Ok(None)),
        };
        let settle = match (bytes, settle) {
            (Ok(Some(_)), _) if !limit.cost.is_absent() => Err(self.value_error(
                &bytes_path,
                "a byte quota reserves the request's Content-Length (or 1) and settles the bytes counted; remove cost",
            )),
            (Ok(Some(b)), settle) => settle.map(|_| Some((Source::Bytes(b), "bytes"))),
            (Ok(None), settle) => settle,
            (Err(r), _) => Err(r),
        };
        CheckedCost {
            cost,
            reserve_from,
            settle,
        }
    }

    /// `cost: { reserve, from_header | from_trailer | from_body }`.
    fn settled_cost(
        &mut self,
        map: &file::CostMap,
        path: &str,
    ) -> (
        Checked<Option<u64>>,
        Checked<Option<BodyField>>,
        Checked<Source>,
    ) {
        let (reserve, reserve_from) = self.reserve(&map.reserve, &child_key(path, "reserve"));
        let header = |f: &Field<file::Text>, field: &str, c: &mut Self| {
            c.optional(f, &child_key(path, field), text(parse_header_name))
        };
        let from_header = header(&map.from_header, "from_header", self);
        let from_trailer = header(&map.from_trailer, "from_trailer", self);
        let from_body = self.optional(&map.from_body, &child_key(path, "from_body"), from_body);
        let sources = [
            from_header.map(|h| h.map(|h| (Source::Header(h), "from_header"))),
            from_trailer.map(|t| t.map(|t| (Source::Trailer(t), "from_trailer"))),
            from_body.map(|b| b.map(|b| (Source::Body(b), "from_body"))),
        ];
        let mut found = Vec::new();
        let mut failed = None;
        for s in sources {
            match s {
                Ok(Some(s)) => found.push(s),
                Ok(None) => {}
                Err(r) => failed = Some(r),
            }
        }
        let source = match (failed, found.len()) {
            (Some(r), _) => Err(r),
            (None, 0) => Err(self.value_error(
                path,
                "a settled cost names where the final cost comes from: from_header: NAME, from_trailer: NAME or from_body: openai | anthropic | { json, stream }",
            )),
            (None, 1) => Ok(found.remove(0).0),
            (None, _) => Err(self.value_error(
                &child_key(path, found[1].1),
                format!(
                    "a cost is settled from one place; keep one of {}",
                    found.iter().map(|f| f.1).collect::<Vec<_>>().join(", ")
                ),
            )),
        };
        (reserve, reserve_from, source)
    }

    /// `reserve: N` or `reserve: { json: FIELD, default: N }`: the cost
    /// reserved (the default, for a body field) and the body field.
    fn reserve(
        &mut self,
        reserve: &Field<file::Reserve>,
        path: &str,
    ) -> (Checked<Option<u64>>, Checked<Option<BodyField>>) {
        match reserve {
            Field::Absent => (Ok(None), Ok(None)),
            Field::Invalid(message) => (Err(self.value_error(path, message.clone())), Ok(None)),
            Field::Valid(file::Reserve::Fixed(n)) => (positive(self, n, path).map(Some), Ok(None)),
            Field::Valid(file::Reserve::Json(map)) => {
                let field = self.required(&map.json, path, "json", text(parse_body_field));
                let default = self.required(&map.default, path, "default", positive);
                (default.map(Some), field.map(Some))
            }
        }
    }

    /// A settled limit's algorithm and `sync`: a sliding log and `sync`
    /// mode cannot be settled.
    pub(super) fn settled_limit(
        &mut self,
        settle: Checked<Settled>,
        algorithm: &Checked<Algorithm>,
        sync: &Checked<Option<Duration>>,
        path: &str,
    ) -> Checked<Option<Source>> {
        let Some((source, field)) = settle? else {
            return Ok(None);
        };
        let at = child_key(path, field);
        if let Some(why) = algorithm.ok().and_then(|a| a.unsettled_because()) {
            return Err(self.value_error(&at, why));
        }
        if let Ok(Some(_)) = sync {
            return Err(self.value_error(
                &at,
                "a limit settled by the response is decided in Redis on every request, not in sync mode; give this limit sync: off",
            ));
        }
        Ok(Some(source))
    }
}

/// A response header or trailer name.
fn parse_header_name(s: &str) -> Result<HeaderName, String> {
    HeaderName::from_bytes(s.trim().as_bytes()).map_err(|_| {
        format!("{s:?} is not a valid header name; use letters, digits and '-', e.g. x-tokens-used")
    })
}

/// A field of the request's JSON body (`model`, `metadata.user_id`), as a
/// key's `json:FIELD` and `reserve: { json: FIELD }` name it.
pub(super) fn parse_body_field(s: &str) -> Result<BodyField, String> {
    let name = s.trim();
    let path = JsonPath::parse(name).map_err(|e| format!("{s:?} is not a JSON field: {e}"))?;
    Ok(BodyField {
        name: name.into(),
        path,
    })
}

/// `from_body: openai | anthropic | { json: "a.b + c.d", stream: last | sum }`.
fn from_body(c: &mut Check<'_>, body: &file::FromBody, path: &str) -> Checked<BodyUsage> {
    match body {
        file::FromBody::Preset(name) => leaf(|t: &file::Text| {
            let spec = match t.0.as_str() {
                "openai" => UsageSpec::openai(),
                "anthropic" => UsageSpec::anthropic(),
                other => {
                    return Err(format!(
                        "unknown preset {other:?}; expected openai, anthropic, or a mapping {{ json: \"usage.total_tokens\", stream: last | sum }}"
                    ));
                }
            };
            Ok(BodyUsage {
                written: t.0.as_str().into(),
                spec: spec.into(),
            })
        })(c, name, path),
        file::FromBody::Fields(map) => {
            let json = c.required(&map.json, path, "json", text(|s| Ok(s.trim().to_owned())));
            let stream = c.optional(
                &map.stream,
                &child_key(path, "stream"),
                text(|s| match s.trim() {
                    "last" => Ok(Stream::Last),
                    "sum" => Ok(Stream::Sum),
                    other => Err(format!("{other:?} is not a stream rule; write last or sum")),
                }),
            );
            let (json, stream) = (json?, stream?.unwrap_or_default());
            let spec = UsageSpec::parse(&json, stream).map_err(|e| {
                c.value_error(
                    &child_key(path, "json"),
                    format!("{json:?} is not a sum of JSON paths: {e}"),
                )
            })?;
            let rule = match stream {
                Stream::Last => "last",
                Stream::Sum => "sum",
            };
            Ok(BodyUsage {
                written: format!("{json} (stream: {rule})").into(),
                spec: spec.into(),
            })
        }
    }
}
