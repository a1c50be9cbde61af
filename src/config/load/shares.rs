//! `share: NAME` across routes: limits that name one share count on one
//! counter, so they must mean the same limit. The first limit of a share
//! (in file order) is its model; every later one that differs in key,
//! quota, window, algorithm or kind is reported at the field that
//! differs, naming the model. A route counts a request once per limit, so
//! two limits of one route in the same share would count it twice and are
//! refused too.

use std::collections::HashMap;

use super::check::{Check, Checked};
use crate::config::position::{child_index, child_key};
use crate::config::{Limit, Route};

/// Where a share's first limit is, and that limit.
struct Model<'a> {
    route: usize,
    index: usize,
    limit: &'a Limit,
}

impl Check<'_> {
    /// Reports every limit whose share disagrees with the share's first
    /// limit, or repeats a share on one route; `path` is the routes' list.
    pub(super) fn shares(&mut self, routes: &[Route], path: &str) -> Checked<()> {
        let mut models: HashMap<&str, Model<'_>> = HashMap::new();
        let mut result = Ok(());
        for (i, route) in routes.iter().enumerate() {
            let limits = child_key(&child_index(path, i), "limits");
            for (j, limit) in route.limits.iter().enumerate() {
                let Some(share) = limit.share.as_deref() else {
                    continue;
                };
                let here = child_index(&limits, j);
                let Some(model) = models.get(share) else {
                    models.insert(
                        share,
                        Model {
                            route: i,
                            index: j,
                            limit,
                        },
                    );
                    continue;
                };
                let there = child_index(
                    &child_key(&child_index(path, model.route), "limits"),
                    model.index,
                );
                if model.route == i {
                    result = Err(self.value_error(
                        &child_key(&here, "share"),
                        format!(
                            "{there} of this route already shares {share:?}; one request would be counted twice on one counter"
                        ),
                    ));
                    continue;
                }
                if let Some((field, ours, theirs)) = disagreement(limit, model.limit) {
                    let line = self
                        .positions
                        .value(&child_key(&there, "share"))
                        .map(|p| format!(" (line {})", p.line))
                        .unwrap_or_default();
                    result = Err(self.value_error(
                        &child_key(&here, field),
                        format!(
                            "{ours} differs from {there}{line}, which shares {share:?} with {theirs}; limits of one share count on one counter and must agree on key, limit, window and algorithm (and its precision)"
                        ),
                    ));
                }
            }
        }
        result
    }
}

/// The first field in which `limit` differs from `model`: the field, and
/// this limit's and the model's values as the file writes them.
fn disagreement(limit: &Limit, model: &Limit) -> Option<(&'static str, String, String)> {
    if limit.key != model.key {
        let key = |l: &Limit| format!("key {}", key_text(l));
        return Some(("key", key(limit), key(model)));
    }
    if limit.concurrency != model.concurrency {
        let kind = |l: &Limit| match l.concurrency {
            Some(n) => format!("concurrency {n}"),
            None => "a rate".to_owned(),
        };
        let field = if limit.concurrency.is_some() {
            "concurrency"
        } else {
            "limit"
        };
        return Some((field, kind(limit), kind(model)));
    }
    if limit.limit != model.limit {
        let quota = |l: &Limit| format!("limit {}", l.limit);
        return Some(("limit", quota(limit), quota(model)));
    }
    if limit.window_ms != model.window_ms {
        let ms = |l: &Limit| match l.window_ms.get() {
            ms if ms % 3_600_000 == 0 => format!("window {}h", ms / 3_600_000),
            ms if ms % 60_000 == 0 => format!("window {}m", ms / 60_000),
            ms if ms % 1000 == 0 => format!("window {}s", ms / 1000),
            ms => format!("window {ms}ms"),
        };
        return Some(("window", ms(limit), ms(model)));
    }
    if limit.algorithm != model.algorithm {
        let name = |l: &Limit| format!("algorithm {}", l.algorithm.described());
        // The same algorithm counted in other buckets: the precision differs.
        let field = if limit.algorithm.name() == model.algorithm.name() {
            "precision"
        } else {
            "algorithm"
        };
        return Some((field, name(limit), name(model)));
    }
    None
}

/// A key as the file writes it: `api_key | ip`, `[ip, header:x-user]`.
fn key_text(limit: &Limit) -> String {
    limit.key.to_string()
}
