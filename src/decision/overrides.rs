//! Per-caller overrides set through the admin API: other numbers for one
//! limit, another plan, or an exemption, for one caller named by one of
//! its identity values (`api_key`, `user`, `ip` or `header.NAME`), and
//! optionally by string fields of its request bodies beside it
//! (`json.model`, as `json:FIELD` keys read them).
//!
//! The overrides live in the store. With Redis they sit in one hash
//! (`<prefix>{admin}overrides`) beside a generation counter every write
//! bumps; each gateway reads the counter every [`POLL`] and, when it has
//! moved, reads the hash again and forgets its deny cache. So a change on
//! one gateway is seen by every other within one poll, and a counter
//! reset (which bumps the generation too) empties every deny cache as
//! quickly. Polling one small key rather than subscribing keeps the watch
//! working through reconnects and failovers without a second connection
//! kind; it costs each gateway one `EVAL` per poll. While Redis cannot
//! answer, the last overrides read stay in force. Without Redis the table
//! is this gateway's own.
//!
//! A request reads whether any override is held with one atomic load; an
//! empty table (the usual case) costs nothing more. The table is scanned in full for a
//! caller, which suits what it is for — dozens of exceptions support
//! made, not a second plan system.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use arc_swap::ArcSwap;
use serde::{Deserialize, Serialize};
use tokio::task::JoinHandle;
use tracing::warn;

use super::limiter::Limiter;
use crate::identity::Caller;
use crate::store::StoreError;

/// How often a gateway reads the generation counter in Redis.
pub const POLL: Duration = Duration::from_millis(50);

/// Which caller an override is for: one identity value, and the request
/// body fields it must send as well.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Subject {
    /// `api_key`, `user`, `ip` or `header.NAME` (the name lowercased).
    pub field: String,
    /// The value the caller presents.
    pub value: String,
    /// `json.FIELD` values, sorted by field: string fields of the request
    /// body, as a route's `json:FIELD` keys read them (so they match on
    /// routes whose limits read those fields). Empty for most overrides.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub json: Vec<(String, String)>,
}

impl Subject {
    /// Whether `caller` presents this value (and sends these body
    /// fields).
    pub fn matches(&self, caller: &Caller<'_>) -> bool {
        self.matches_field(caller)
            && self
                .json
                .iter()
                .all(|(field, value)| sends(caller, field, value))
    }

    fn matches_field(&self, caller: &Caller<'_>) -> bool {
        let value = self.value.as_bytes();
        match self.field.as_str() {
            "api_key" => caller.api_key == Some(value),
            "user" => caller.user.as_deref() == Some(value),
            "ip" => self
                .value
                .parse::<IpAddr>()
                .is_ok_and(|ip| caller.ip.contains(&ip)),
            other => other.strip_prefix("header.").is_some_and(|name| {
                caller
                    .headers
                    .get(name)
                    .is_some_and(|v| v.as_bytes() == value)
            }),
        }
    }
}

/// Whether `caller`'s request body holds `value` at `field`.
fn sends(caller: &Caller<'_>, field: &str, value: &str) -> bool {
    caller.body.is_some_and(|b| {
        b.text
            .iter()
            .any(|(f, v)| **f == *field && **v == *value.as_bytes())
    })
}

/// One override, as the store keeps it (JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Override {
    /// The caller.
    pub subject: Subject,
    /// The route of the limit, when the limit's name alone is ambiguous.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route: Option<String>,
    /// The limit's name; `None` for a whole-caller override (`plan`, or
    /// `exempt` from every limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<String>,
    /// `limit` names a `share`: the override is about every limit counted
    /// on that shared counter, whatever its route.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub share: bool,
    /// The limit's quota for this caller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota: Option<u64>,
    /// The limit's window for this caller, in ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_ms: Option<u64>,
    /// The plan this caller is served by, whatever its API key's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<String>,
    /// Not counted at all by the limit (or by every limit).
    #[serde(default)]
    pub exempt: bool,
    /// When the override lapses (ms since the epoch); `None`: never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_ms: Option<u64>,
    /// When it was set (ms since the epoch).
    #[serde(default)]
    pub set_ms: u64,
}

impl Override {
    /// Its key in the store: the caller and the limit, so one caller has at
    /// most one override per limit (and one for the whole caller).
    pub fn id(&self) -> String {
        let share = self.limit.as_deref().map(|l| format!("@{l}"));
        let limit = if self.share {
            share.as_deref()
        } else {
            self.limit.as_deref()
        };
        id(&self.subject, self.route.as_deref(), limit)
    }

    /// Whether it is in force at `now_ms`.
    pub fn live(&self, now_ms: u64) -> bool {
        self.expires_ms.is_none_or(|t| now_ms < t)
    }

    /// Whether it is about limit `limit` of route `route` (counted on the
    /// shared counter `share`, if any).
    pub fn about(&self, route: &str, limit: &str, share: Option<&str>) -> bool {
        if self.share {
            return share.is_some() && self.limit.as_deref() == share;
        }
        self.limit.as_deref() == Some(limit) && self.route.as_deref().is_none_or(|r| r == route)
    }
}

/// The store key of the override of `subject` for `route/limit`
/// (`api_key=k1&json.model=m\nroute/limit`).
pub fn id(subject: &Subject, route: Option<&str>, limit: Option<&str>) -> String {
    let mut caller = format!("{}={}", subject.field, subject.value);
    for (field, value) in &subject.json {
        caller.push_str(&format!("&json.{field}={value}"));
    }
    format!("{caller}\n{}/{}", route.unwrap_or(""), limit.unwrap_or(""))
}

/// The overrides in force on this gateway.
#[derive(Debug)]
pub struct CallerOverrides {
    table: ArcSwap<Vec<Override>>,
    /// Whether `table` holds any override: the request path's one check,
    /// a plain load where `table`'s would take and give back a guard.
    held: AtomicBool,
    /// Without Redis: the table's source, by id.
    local: Mutex<BTreeMap<String, Override>>,
    /// The Redis generation the table was read at (`-1`: never read).
    generation: std::sync::atomic::AtomicI64,
    prefix: String,
}

impl CallerOverrides {
    /// An empty table for the store keys under `prefix`.
    pub fn new(prefix: &str) -> Self {
        Self {
            table: ArcSwap::from_pointee(Vec::new()),
            held: AtomicBool::new(false),
            local: Mutex::new(BTreeMap::new()),
            generation: std::sync::atomic::AtomicI64::new(-1),
            prefix: prefix.to_owned(),
        }
    }

    /// Every override held, expired ones too.
    pub fn all(&self) -> Arc<Vec<Override>> {
        self.table.load_full()
    }

    /// Whether no override is held: the request path's one check.
    pub fn is_empty(&self) -> bool {
        !self.held.load(Ordering::Acquire)
    }

    /// Puts `table` in force.
    fn set(&self, table: Vec<Override>) {
        let held = !table.is_empty();
        self.table.store(Arc::new(table));
        self.held.store(held, Ordering::Release);
    }

    /// The overrides in force at `now_ms` for `caller`, those naming more
    /// body fields first: of two for one limit (`api_key=k1` and
    /// `api_key=k1&json.model=m`), the narrower one is found first.
    pub fn of(&self, caller: &Caller<'_>, now_ms: u64) -> Vec<Override> {
        let mut found: Vec<Override> = self
            .table
            .load()
            .iter()
            .filter(|o| o.live(now_ms) && o.subject.matches(caller))
            .cloned()
            .collect();
        found.sort_by_key(|o| std::cmp::Reverse(o.subject.json.len()));
        found
    }

    /// Sets `o` (replacing the one with its id); the one it replaced.
    ///
    /// # Errors
    /// Redis cannot answer: nothing changed.
    pub async fn put(
        &self,
        limiter: &Limiter,
        o: Override,
    ) -> Result<Option<Override>, StoreError> {
        let id = o.id();
        let Some(redis) = limiter.admin().redis() else {
            let mut local = self.local.lock().unwrap_or_else(PoisonError::into_inner);
            let before = local.insert(id, o);
            self.set(local.values().cloned().collect());
            return Ok(before);
        };
        let json = serde_json::to_string(&o).unwrap_or_default();
        let before = redis.put_override(&self.prefix, &id, &json).await?;
        self.refresh(limiter).await;
        Ok(before.and_then(|b| serde_json::from_str(&b).ok()))
    }

    /// Removes the override `id`; the one removed.
    ///
    /// # Errors
    /// Redis cannot answer: nothing changed.
    pub async fn remove(
        &self,
        limiter: &Limiter,
        id: &str,
    ) -> Result<Option<Override>, StoreError> {
        let Some(redis) = limiter.admin().redis() else {
            let mut local = self.local.lock().unwrap_or_else(PoisonError::into_inner);
            let before = local.remove(id);
            self.set(local.values().cloned().collect());
            return Ok(before);
        };
        let before = redis.remove_override(&self.prefix, id).await?;
        self.refresh(limiter).await;
        Ok(before.and_then(|b| serde_json::from_str(&b).ok()))
    }

    /// Reads the generation and, when it moved, the overrides again and
    /// forgets the deny cache. Keeps what it holds when Redis cannot
    /// answer.
    pub async fn refresh(&self, limiter: &Limiter) {
        let Some(redis) = limiter.admin().redis() else {
            return;
        };
        let Ok(generation) = redis.admin_generation(&self.prefix).await else {
            return;
        };
        if generation == self.generation.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        let listed = match redis.overrides(&self.prefix).await {
            Ok(l) => l,
            Err(e) => {
                warn!(error = %e, "cannot read the overrides from redis; keeping the last ones read");
                return;
            }
        };
        let table: Vec<Override> = listed
            .entries
            .iter()
            .filter_map(|(id, json)| match serde_json::from_str(json) {
                Ok(o) => Some(o),
                Err(e) => {
                    warn!(%id, error = %e, "an override in redis is not one; ignored");
                    None
                }
            })
            .collect();
        self.set(table);
        self.generation
            .store(listed.generation, std::sync::atomic::Ordering::SeqCst);
        // The first read too: a denial cached before it may predate a reset.
        limiter.admin().forget_denials();
    }

    /// Whether the generation has been read from Redis yet.
    fn read_once(&self) -> bool {
        self.generation.load(std::sync::atomic::Ordering::SeqCst) >= 0
    }
}

/// The task watching Redis for overrides and resets; aborted on drop.
#[derive(Debug)]
pub struct Watcher(JoinHandle<()>);

impl Drop for Watcher {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Starts watching Redis for `overrides` (every [`POLL`]), when the
/// limiter has Redis.
pub fn watch(overrides: Arc<CallerOverrides>, limiter: Arc<Limiter>) -> Option<Watcher> {
    limiter.admin().redis()?;
    Some(Watcher(tokio::spawn(async move {
        loop {
            // The first read is made the moment Redis is connected, before
            // the deny cache has had time to fill.
            if !overrides.read_once()
                && let Some(redis) = limiter.admin().redis()
            {
                redis.wait_connected(Duration::from_secs(3600)).await;
            }
            overrides.refresh(&limiter).await;
            tokio::time::sleep(POLL).await;
        }
    })))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderMap;

    fn subject(field: &str, value: &str) -> Subject {
        Subject {
            field: field.into(),
            value: value.into(),
            json: Vec::new(),
        }
    }

    #[test]
    fn a_subject_matches_the_caller_presenting_its_value() {
        let mut headers = HeaderMap::new();
        headers.insert("x-tenant", "acme".parse().unwrap());
        let caller = Caller {
            ip: crate::identity::group("2001:db8::1".parse().unwrap(), 64),
            api_key: Some(b"k1"),
            user: None,
            plan: None,
            headers: &headers,
            body: None,
        };
        assert!(subject("api_key", "k1").matches(&caller));
        assert!(!subject("api_key", "k2").matches(&caller));
        assert!(!subject("user", "k1").matches(&caller));
        // An IPv6 address stands for its group.
        assert!(subject("ip", "2001:db8::ffff").matches(&caller));
        assert!(!subject("ip", "2001:db9::1").matches(&caller));
        assert!(subject("header.x-tenant", "acme").matches(&caller));
        assert!(!subject("header.x-tenant", "acm").matches(&caller));
        assert!(!subject("colour", "acme").matches(&caller));
        // Body fields narrow it: all of them must be sent.
        let mut with_model = subject("api_key", "k1");
        with_model.json = vec![("model".into(), "m1".into())];
        assert!(!with_model.matches(&caller));
        let body = crate::identity::BodyFields {
            text: vec![("model".into(), b"m1".to_vec().into_boxed_slice())],
            counts: Vec::new(),
        };
        let sending = Caller {
            body: Some(&body),
            ..caller
        };
        assert!(with_model.matches(&sending));
        assert!(subject("api_key", "k1").matches(&sending));
        with_model.json[0].1 = "m2".into();
        assert!(!with_model.matches(&sending));
        with_model.json[0].1 = "m1".into();
        with_model.json.push(("tier".into(), "x".into()));
        assert!(!with_model.matches(&sending));
    }

    #[test]
    fn ids_and_lapses() {
        let o = Override {
            subject: subject("api_key", "k1"),
            route: Some("api".into()),
            limit: Some("per_key".into()),
            share: false,
            quota: Some(6),
            window_ms: None,
            plan: None,
            exempt: false,
            expires_ms: Some(1_000),
            set_ms: 0,
        };
        assert_eq!(o.id(), "api_key=k1\napi/per_key");
        let mut narrowed = o.clone();
        narrowed.subject.json = vec![("model".into(), "m1".into())];
        assert_eq!(narrowed.id(), "api_key=k1&json.model=m1\napi/per_key");
        assert!(o.live(999) && !o.live(1_000));
        assert!(o.about("api", "per_key", None) && !o.about("other", "per_key", None));
        let shared = Override {
            route: None,
            limit: Some("ab".into()),
            share: true,
            ..o.clone()
        };
        assert_eq!(shared.id(), "api_key=k1\n/@ab");
        assert!(shared.about("a", "x", Some("ab")) && shared.about("b", "y", Some("ab")));
        assert!(!shared.about("a", "ab", None) && !shared.about("a", "ab", Some("cd")));
        let json = serde_json::to_string(&o).unwrap();
        assert_eq!(serde_json::from_str::<Override>(&json).unwrap(), o);
    }
}
