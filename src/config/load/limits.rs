//! Limits: a route's `limits` (name, identity key, numbers, algorithm,
//! cost, shadow, `plan: true`) and the rules plans share with them —
//! windows (`month` included), algorithms with their bursts, and the
//! bounds the stores' arithmetic needs.

use std::num::NonZeroU64;
use std::sync::Arc;
use std::time::Duration;

use http::HeaderName;

use super::check::{
    Check, Checked, Reported, choice, leaf, parse_duration, parse_sync, positive, text,
};
use crate::config::file::{self, Field, Flag, Int, OneOrMany, Text};
use crate::config::position::child_key;
use crate::config::{KeySource, KeySpec, Limit, OnLimit};
use crate::limit::Algorithm;

/// How long an `on_limit: delay` limit lets a request wait when
/// `max_delay` is not written.
pub const DEFAULT_MAX_DELAY: Duration = Duration::from_secs(1);

/// `max_delay`: 1ms to 1m. Longer waits hold a client's connection longer
/// than most clients and proxies wait for an answer.
fn parse_max_delay(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d.is_zero() || d > Duration::from_secs(60) {
        return Err(format!(
            "{s:?} is out of range; max_delay takes 1ms to 1m, e.g. 2s"
        ));
    }
    Ok(d)
}

impl Check<'_> {
    pub(super) fn limits(
        &mut self,
        limits: &[Field<file::Limit>],
        path: &str,
    ) -> Checked<Vec<Limit>> {
        let checked = self.list(limits, path, Self::limit);
        let unique = self.unique(limits, |limit| &limit.name, path, "limit name");
        unique?;
        checked
    }

    fn limit(&mut self, limit: &file::Limit, path: &str) -> Checked<Limit> {
        let name = self.required(&limit.name, path, "name", text(parse_limit_name));
        let key = self.required(&limit.key, path, "key", Self::key);
        let super::cost::CheckedCost {
            cost,
            reserve_from,
            settle,
        } = self.cost(limit, path);
        let shadow = self.optional(
            &limit.shadow,
            &child_key(path, "shadow"),
            leaf(|&Flag(b): &Flag| Ok::<_, String>(b)),
        );
        let plan = self
            .optional(&limit.plan, &child_key(path, "plan"), |_, b: &bool, _| {
                Ok(*b)
            })
            .map(|p| p.unwrap_or(false));
        let share = self.share(limit, path, matches!(plan, Ok(true)));
        let concurrency = self.optional(
            &limit.concurrency,
            &child_key(path, "concurrency"),
            positive,
        )?;
        if let Some(n) = concurrency.and_then(NonZeroU64::new) {
            self.no_rate(limit, path)?;
            return Ok(Limit {
                name: name?,
                key: key?,
                limit: n,
                window_ms: NonZeroU64::MIN,
                cost: None,
                algorithm: Algorithm::default(),
                plan: false,
                shadow: shadow?.unwrap_or(false),
                sync: None,
                delay: None,
                concurrency: Some(n),
                settle: None,
                reserve_from: None,
                share: share?,
            });
        }
        if let Ok(true) = plan {
            self.no_numbers(limit, path)?;
            self.route_key_without_plan(&key, path)?;
            share?;
            return Ok(Limit {
                name: name?,
                key: key?,
                limit: NonZeroU64::MIN,
                window_ms: NonZeroU64::MIN,
                cost: cost?,
                algorithm: Algorithm::default(),
                plan: true,
                shadow: shadow?.unwrap_or(false),
                sync: None,
                delay: None,
                concurrency: None,
                settle: None,
                reserve_from: None,
                share: None,
            });
        }
        let max = self.required(&limit.limit, path, "limit", positive);
        let month = is_month(&limit.window);
        let window = self.required(&limit.window, path, "window", text(parse_window));
        let algorithm = self.algorithm(&limit.algorithm, &limit.burst, &max, &window, month, path);
        let algorithm = self.precision(&limit.precision, algorithm, &window, path);
        let sync = self.sync(&limit.sync, &algorithm, &window, path);
        let delay = self.delay(&limit.on_limit, &limit.max_delay, path);
        let settle = self.settled_limit(settle, &algorithm, &sync, path);
        plan?;
        Ok(Limit {
            name: name?,
            key: key?,
            limit: NonZeroU64::new(max?).ok_or(Reported)?,
            window_ms: window?,
            cost: cost?,
            algorithm: algorithm?,
            plan: false,
            shadow: shadow?.unwrap_or(false),
            sync: sync?,
            delay: delay?,
            concurrency: None,
            settle: settle?,
            reserve_from: reserve_from?,
            share: share?,
        })
    }

    /// `on_limit` and `max_delay`: how long a denied request may wait
    /// (`Some`) under `on_limit: delay`, default 1s; `max_delay` beside
    /// `on_limit: reject` (or none) would do nothing and is refused.
    pub(super) fn delay(
        &mut self,
        on_limit: &Field<Text>,
        max_delay: &Field<Text>,
        path: &str,
    ) -> Checked<Option<Duration>> {
        let on_limit = self.optional(
            on_limit,
            &child_key(path, "on_limit"),
            choice(&OnLimit::SPELLINGS),
        );
        let max_path = child_key(path, "max_delay");
        let max = self.optional(max_delay, &max_path, text(parse_max_delay));
        match (on_limit?.unwrap_or_default(), max?) {
            (OnLimit::Delay, max) => Ok(Some(max.unwrap_or(DEFAULT_MAX_DELAY))),
            (OnLimit::Reject, None) => Ok(None),
            (OnLimit::Reject, Some(_)) => Err(self.value_error(
                &max_path,
                "max_delay applies to a limit with on_limit: delay; add on_limit: delay or remove max_delay",
            )),
        }
    }

    /// A concurrency limit counts requests in flight, not a rate: the
    /// fields of a rate (and `plan`) written beside it would be silently
    /// ignored, so they are refused.
    fn no_rate(&mut self, limit: &file::Limit, path: &str) -> Checked<()> {
        let written = [
            ("limit", limit.limit.is_absent()),
            ("window", limit.window.is_absent()),
            ("algorithm", limit.algorithm.is_absent()),
            ("burst", limit.burst.is_absent()),
            ("precision", limit.precision.is_absent()),
            ("sync", limit.sync.is_absent()),
            ("cost", limit.cost.is_absent()),
            ("plan", limit.plan.is_absent()),
            ("on_limit", limit.on_limit.is_absent()),
            ("max_delay", limit.max_delay.is_absent()),
            ("bytes", limit.bytes.is_absent()),
        ];
        self.refuse_written(&written, path, |field| {
            format!("a concurrency limit caps requests in flight and has no {field}; remove this, or write the rate as a limit of its own")
        })
    }

    /// A limit with `plan: true` takes its numbers from the caller's plan;
    /// any written beside it would be silently ignored, so they are refused.
    fn no_numbers(&mut self, limit: &file::Limit, path: &str) -> Checked<()> {
        let settled = matches!(limit.cost, Field::Valid(file::Cost::Settled(_)));
        let written = [
            ("limit", limit.limit.is_absent()),
            ("window", limit.window.is_absent()),
            ("algorithm", limit.algorithm.is_absent()),
            ("burst", limit.burst.is_absent()),
            ("precision", limit.precision.is_absent()),
            ("sync", limit.sync.is_absent()),
            ("on_limit", limit.on_limit.is_absent()),
            ("max_delay", limit.max_delay.is_absent()),
            ("cost", !settled),
            ("bytes", limit.bytes.is_absent()),
        ];
        self.refuse_written(&written, path, |field| {
            match field {
                "sync" => "a limit with plan: true takes its limits from the caller's plan; set sync on the plan's limits",
                "on_limit" | "max_delay" => "a limit with plan: true takes its limits from the caller's plan; set this on the plan's limits",
                "cost" | "bytes" => "a limit with plan: true cannot be settled by the response; give the route a limit of its own with this",
                _ => "a limit with plan: true takes its numbers from the caller's plan; remove this",
            }
            .to_owned()
        })
    }

    /// Reports each field of `fields` (name, absent) that is written, at
    /// the field, in `message`'s words.
    fn refuse_written(
        &mut self,
        fields: &[(&str, bool)],
        path: &str,
        message: impl Fn(&str) -> String,
    ) -> Checked<()> {
        let mut result = Ok(());
        for &(field, absent) in fields {
            if !absent {
                result = Err(self.value_error(&child_key(path, field), message(field)));
            }
        }
        result
    }

    /// `algorithm` and `burst` of a limit with limit `max` and `window`,
    /// and the bounds that depend on them.
    pub(super) fn algorithm(
        &mut self,
        algorithm: &Field<Text>,
        burst: &Field<Int>,
        max: &Checked<u64>,
        window: &Checked<NonZeroU64>,
        month: bool,
        path: &str,
    ) -> Checked<Algorithm> {
        let alg_path = child_key(path, "algorithm");
        let mut algorithm = self.optional(algorithm, &alg_path, choice(&Algorithm::SPELLINGS));
        if month {
            // A calendar month is counted as a fixed window.
            algorithm = match algorithm {
                Ok(None) => Ok(Some(Algorithm::MONTH)),
                Ok(Some(written)) => match written.for_month() {
                    Some(month) => Ok(Some(month)),
                    None => Err(self.value_error(
                        &alg_path,
                        format!(
                            "a window of one calendar month is counted as a fixed window; remove {}, or write a window like 30d",
                            written.name()
                        ),
                    )),
                },
                Err(r) => Err(r),
            };
        }
        let burst_path = child_key(path, "burst");
        let burst = self.optional(burst, &burst_path, positive);
        // gcra takes its burst (default: the limit); the others have none.
        let algorithm = match (algorithm, &burst, max) {
            (Ok(Some(a)), Ok(b), Ok(l)) if a.takes_burst() => Ok(a.with_burst(b.unwrap_or(*l))),
            (Ok(Some(a)), _, _) if a.takes_burst() => Err(Reported),
            (Ok(other), Ok(Some(_)), _) => Err(self.value_error(
                &burst_path,
                format!(
                    "only a gcra limit takes a burst; this one is {}",
                    other.unwrap_or_default().name()
                ),
            )),
            (Ok(other), _, _) => Ok(other.unwrap_or_default()),
            (Err(r), _, _) => Err(r),
        };
        if let (Ok(l), Ok(w), Ok(alg)) = (max, window, &algorithm) {
            self.bounds(*l, *w, *alg, path)?;
        }
        algorithm
    }

    /// A sliding window's `precision`: the window in buckets of it, a whole
    /// number of them and at most [`MAX_BUCKETS`]
    /// ([`crate::limit::buckets`]).
    pub(super) fn precision(
        &mut self,
        precision: &Field<Text>,
        algorithm: Checked<Algorithm>,
        window: &Checked<NonZeroU64>,
        path: &str,
    ) -> Checked<Algorithm> {
        let at = child_key(path, "precision");
        let Some(p) = self.optional(precision, &at, text(parse_precision))? else {
            return algorithm;
        };
        let (algorithm, w) = (algorithm?, window.as_ref().map_err(|_| Reported)?.get());
        let Some(buckets) = algorithm.with_precision(p) else {
            return Err(self.value_error(
                &at,
                format!(
                    "only a sliding_window limit counts in buckets of a precision; this one is {}: remove precision",
                    algorithm.name()
                ),
            ));
        };
        if w % p != 0 {
            return Err(self.value_error(
                &at,
                format!(
                    "{p}ms does not divide the window ({w}ms) into whole buckets; write a precision the window is a whole multiple of"
                ),
            ));
        }
        if w / p > MAX_BUCKETS {
            return Err(self.value_error(
                &at,
                format!(
                    "makes {} buckets of the window ({w}ms), and a limit keeps at most {MAX_BUCKETS}; write a precision of at least {}ms",
                    w / p,
                    w.div_ceil(MAX_BUCKETS)
                ),
            ));
        }
        Ok(buckets)
    }

    /// Whether and how often a limit is synced (`sync` mode,
    /// [`crate::decision::sync`]): its own `sync` (`off` or an interval),
    /// else `store.redis.sync` for the algorithms that count (sliding and
    /// fixed windows, calendar months). `sync` is refused on a gcra or
    /// sliding_log limit (their state is not a sum that gateways can add
    /// to apart), without Redis, and when it is not shorter than the window.
    pub(super) fn sync(
        &mut self,
        sync: &Field<Text>,
        algorithm: &Checked<Algorithm>,
        window: &Checked<NonZeroU64>,
        path: &str,
    ) -> Checked<Option<Duration>> {
        let sync_path = child_key(path, "sync");
        let own = self.optional(sync, &sync_path, text(parse_limit_sync))?;
        let (Ok(algorithm), Ok(window)) = (algorithm, window) else {
            return Ok(None);
        };
        let counts = algorithm.summed().is_some();
        let window = Duration::from_millis(window.get());
        match own {
            // `sync: off`
            Some(None) => Ok(None),
            Some(Some(every)) => {
                if !self.store.redis {
                    return Err(self.value_error(
                        &sync_path,
                        "sync shares counts through Redis, and this file has no store.redis; remove sync",
                    ));
                }
                if let Some(why) = algorithm.unsynced_because() {
                    return Err(self.value_error(&sync_path, why));
                }
                if every >= window {
                    return Err(self.value_error(
                        &sync_path,
                        format!(
                            "{every:?} is not shorter than the limit's window ({window:?}); sync much more often than the window, e.g. 100ms"
                        ),
                    ));
                }
                Ok(Some(every))
            }
            None => match self.store.sync {
                Some(every) if counts && every >= window => Err(self.value_error(
                    &child_key(path, "window"),
                    format!(
                        "is not longer than store.redis.sync ({every:?}); give this limit sync: off, or a shorter sync"
                    ),
                )),
                Some(every) if counts => Ok(Some(every)),
                _ => Ok(None),
            },
        }
    }

    /// The bounds of limit `l` over window `w` that the stores' arithmetic
    /// needs.
    fn bounds(&mut self, l: u64, w: NonZeroU64, alg: Algorithm, path: &str) -> Checked<()> {
        // The Redis script computes in doubles: keep 3·max(L, B)·w below
        // 2^53 where it multiplies units by the window, else 3·L.
        let units = l.max(alg.capacity(l));
        let field = if units == l { "limit" } else { "burst" };
        if alg.weighs_by_window() && u128::from(units) * u128::from(w.get()) * 3 >= 1u128 << 53 {
            return Err(self.value_error(
                &child_key(path, field),
                "is too large for this window (limit × window in ms must stay below 3·10^15); use a shorter window or a smaller limit, or algorithm: fixed_window, which has no such bound",
            ));
        }
        if u128::from(units) * 3 >= 1u128 << 53 {
            return Err(self.value_error(
                &child_key(path, field),
                "is too large (a limit must stay below 3·10^15)",
            ));
        }
        if alg.one_entry_per_unit() && l > MAX_LOG_LIMIT {
            return Err(self.value_error(
                &child_key(path, "limit"),
                format!(
                    "is too large for sliding_log, which keeps one entry per unit (at most {MAX_LOG_LIMIT}); use sliding_window or gcra"
                ),
            ));
        }
        Ok(())
    }

    pub(super) fn key(&mut self, key: &OneOrMany<Text>, path: &str) -> Checked<KeySpec> {
        let parts = self.each(key, path, text(parse_key_chain))?;
        if parts.is_empty() {
            return Err(self.value_error(path, "needs at least one source, e.g. ip"));
        }
        if parts.len() > 1 && parts.iter().flatten().any(|s| *s == KeySource::Route) {
            return Err(self.value_error(
                path,
                "route counts every caller together and cannot be part of a compound key (each caller would be counted apart again); write key: route alone, or leave route out",
            ));
        }
        Ok(KeySpec { parts })
    }

    /// `share: NAME` of a limit whose other fields read `plan` (true when
    /// it takes its numbers from plans): a plan's limits are the caller's
    /// own and cannot share a counter across routes.
    fn share(&mut self, limit: &file::Limit, path: &str, plan: bool) -> Checked<Option<Arc<str>>> {
        let share_path = child_key(path, "share");
        let share = self.optional(&limit.share, &share_path, text(parse_share_name))?;
        if share.is_some() && plan {
            return Err(self.value_error(
                &share_path,
                "a limit with plan: true takes its numbers from each caller's plan and cannot share a counter; share a limit with its own limit and window",
            ));
        }
        Ok(share)
    }

    /// A `key: route` limit counts every caller together, so a plan (the
    /// caller's own numbers) cannot pick its quota.
    fn route_key_without_plan(&mut self, key: &Checked<KeySpec>, path: &str) -> Checked<()> {
        if matches!(key, Ok(k) if is_route(k)) {
            return Err(self.value_error(
                &child_key(path, "key"),
                "route counts every caller together, and a plan is one caller's; give this limit its own limit and window, or a caller's key",
            ));
        }
        Ok(())
    }
}

/// Whether `key` is `key: route`.
pub(super) fn is_route(key: &KeySpec) -> bool {
    matches!(&key.parts[..], [chain] if chain[..] == [KeySource::Route])
}

/// A sliding log keeps one entry per admitted unit; past this, memory per
/// identity (tens of bytes per entry in Redis) is better spent elsewhere.
const MAX_LOG_LIMIT: u64 = 100_000;

/// The most buckets a window holds with a `precision`: each is a field of
/// the key's hash in Redis and a count per key in process.
const MAX_BUCKETS: u64 = 60;

/// A `precision`: a duration of at least 1ms, in milliseconds.
fn parse_precision(s: &str) -> Result<u64, String> {
    let d = parse_duration(s)?;
    u64::try_from(d.as_millis())
        .ok()
        .filter(|&ms| ms > 0)
        .ok_or_else(|| {
            format!("{s:?} is not a precision; write a duration of at least 1ms, e.g. 1s")
        })
}

/// Whether a window is written as `month` (a calendar month in UTC).
pub(super) fn is_month(window: &Field<Text>) -> bool {
    matches!(window, Field::Valid(Text(s)) if s == "month")
}

/// The nominal length of `window: month` (30 days), shown as the policy's
/// `w`; the count itself follows calendar months.
const MONTH_MS: u64 = 30 * 86_400_000;

/// A limit window: a duration of at least one second, in milliseconds, or
/// `month` (nominally 30 days; see [`is_month`]).
pub(super) fn parse_window(s: &str) -> Result<NonZeroU64, String> {
    if s == "month" {
        return NonZeroU64::new(MONTH_MS).ok_or_else(|| "month".to_owned());
    }
    let d = parse_duration(s)?;
    if d < Duration::from_secs(1) {
        return Err(format!("{s:?} is too short; a window must be at least 1s"));
    }
    u64::try_from(d.as_millis())
        .ok()
        .and_then(NonZeroU64::new)
        .ok_or_else(|| format!("{s:?} is too long"))
}

/// A limit's `sync`: `off` (`None`), or an interval ([`parse_sync`]).
fn parse_limit_sync(s: &str) -> Result<Option<Duration>, String> {
    if s == "off" {
        return Ok(None);
    }
    parse_sync(s).map(Some).map_err(|e| format!("{e}, or off"))
}

/// Limit names are rendered inside a quoted header string (`"per_ip";q=…`).
pub(super) fn parse_limit_name(s: &str) -> Result<Arc<str>, String> {
    let ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-');
    if s.is_empty() || !s.chars().all(ok) {
        return Err(format!(
            "{s:?} is not a valid limit name; use letters, digits, '_', '.' and '-'"
        ));
    }
    Ok(Arc::from(s))
}

/// A share's name: the characters of a limit's name.
fn parse_share_name(s: &str) -> Result<Arc<str>, String> {
    parse_limit_name(s).map_err(|_| {
        format!("{s:?} is not a valid share name; use letters, digits, '_', '.' and '-'")
    })
}

/// One part of a key: `api_key | user | ip` (first present wins).
fn parse_key_chain(s: &str) -> Result<Vec<KeySource>, String> {
    s.split('|')
        .map(|source| match source.trim() {
            "" => Err(format!(
                "{s:?} has an empty source; write e.g. ip or api_key | ip"
            )),
            "ip" => Ok(KeySource::Ip),
            "api_key" => Ok(KeySource::ApiKey),
            "user" => Ok(KeySource::User),
            "route" if s.contains('|') => Err(format!(
                "{s:?} puts route in a fallback chain; route counts every caller together, so the sources after it would never be read and those before it would count callers apart: write key: route alone"
            )),
            "route" => Ok(KeySource::Route),
            other => match (other.strip_prefix("header:"), other.strip_prefix("json:")) {
                (Some(name), _) => HeaderName::from_bytes(name.trim().as_bytes())
                    .map(KeySource::Header)
                    .map_err(|_| {
                        format!(
                            "{name:?} is not a valid header name; use letters, digits and '-', e.g. header:x-client-id"
                        )
                    }),
                (None, Some(field)) => super::cost::parse_body_field(field).map(KeySource::Json),
                (None, None) => Err(format!(
                    "unknown key source {other:?}; expected ip, api_key, user, header:NAME, json:FIELD or route"
                )),
            },
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows() {
        assert_eq!(parse_window("1s").ok(), NonZeroU64::new(1000));
        assert_eq!(
            parse_window("999ms"),
            Err("\"999ms\" is too short; a window must be at least 1s".into())
        );
        assert_eq!(parse_window("month").ok(), NonZeroU64::new(MONTH_MS));
    }

    #[test]
    fn key_chains() {
        assert_eq!(
            parse_key_chain("api_key | user|ip"),
            Ok(vec![KeySource::ApiKey, KeySource::User, KeySource::Ip])
        );
        assert_eq!(
            parse_key_chain("header:X-Client"),
            Ok(vec![KeySource::Header(HeaderName::from_static("x-client"))])
        );
        assert!(parse_key_chain("ip |").is_err());
        assert!(parse_key_chain("cookie:x").is_err());
    }

    #[test]
    fn every_spelling_is_the_name_of_its_algorithm() {
        for (spelling, algorithm) in Algorithm::SPELLINGS {
            assert_eq!(algorithm.name(), spelling);
        }
    }
}
