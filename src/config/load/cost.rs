//! A limit's settled cost (docs/limits.md#costs-settled-by-the-response): `cost: { reserve, from_header |
//! from_trailer }` and `bytes: request | response | both`, and the
//! combinations the stores cannot settle.

use std::time::Duration;

use http::HeaderName;

use super::check::{Check, Checked, choice, positive, text};
use crate::config::file::{self, Field};
use crate::config::position::child_key;
use crate::limit::Algorithm;
use crate::limit::settle::{Bytes, Source};

/// A settled limit's source and the field that asked for it (for errors).
pub(super) type Settled = Option<(Source, &'static str)>;

impl Check<'_> {
    /// `cost` and `bytes` of a limit: the cost (the reservation of a
    /// settled one) and where a settled cost comes from.
    pub(super) fn cost(
        &mut self,
        limit: &file::Limit,
        path: &str,
    ) -> (Checked<Option<u64>>, Checked<Settled>) {
        let cost_path = child_key(path, "cost");
        let bytes_path = child_key(path, "bytes");
        let bytes = self.optional(&limit.bytes, &bytes_path, choice(&Bytes::SPELLINGS));
        let (cost, settle) = match &limit.cost {
            Field::Valid(file::Cost::Settled(map)) => {
                let (reserve, source) = self.settled_cost(map, &cost_path);
                (reserve, source.map(|s| Some((s, "cost"))))
            }
            Field::Valid(file::Cost::Fixed(n)) => {
                (positive(self, n, &cost_path).map(Some), Ok(None))
            }
            Field::Invalid(message) => {
                (Err(self.value_error(&cost_path, message.clone())), Ok(None))
            }
            Field::Absent => (Ok(None), Ok(None)),
        };
        match (bytes, settle) {
            (Ok(Some(_)), _) if !limit.cost.is_absent() => {
                let e = self.value_error(
                    &bytes_path,
                    "a byte quota reserves the request's Content-Length (or 1) and settles the bytes counted; remove cost",
                );
                (cost, Err(e))
            }
            (Ok(Some(b)), settle) => (cost, settle.map(|_| Some((Source::Bytes(b), "bytes")))),
            (Ok(None), settle) => (cost, settle),
            (Err(r), _) => (cost, Err(r)),
        }
    }

    /// `cost: { reserve, from_header | from_trailer }`.
    fn settled_cost(
        &mut self,
        map: &file::CostMap,
        path: &str,
    ) -> (Checked<Option<u64>>, Checked<Source>) {
        let reserve = self.optional(&map.reserve, &child_key(path, "reserve"), positive);
        let header = |f: &Field<file::Text>, field: &str, c: &mut Self| {
            c.optional(f, &child_key(path, field), text(parse_header_name))
        };
        let from_header = header(&map.from_header, "from_header", self);
        let from_trailer = header(&map.from_trailer, "from_trailer", self);
        let source = match (from_header, from_trailer) {
            (Ok(Some(h)), Ok(None)) => Ok(Source::Header(h)),
            (Ok(None), Ok(Some(t))) => Ok(Source::Trailer(t)),
            (Ok(Some(_)), Ok(Some(_))) => Err(self.value_error(
                &child_key(path, "from_trailer"),
                "a cost is settled from one place; keep from_header or from_trailer",
            )),
            (Ok(None), Ok(None)) => Err(self.value_error(
                path,
                "a settled cost names where the final cost comes from: from_header: NAME or from_trailer: NAME",
            )),
            (Err(r), _) | (_, Err(r)) => Err(r),
        };
        (reserve, source)
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
