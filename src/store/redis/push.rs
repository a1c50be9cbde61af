//! Adding an outage's backlog to the Redis counters (docs/design.md#breaker-and-recovery): the
//! records a [`Backlog`](super::backlog::Backlog) kept while Redis was away
//! go to [`push.lua`](PUSH), which adds each to its key in the shape its
//! algorithm counts in (see `backlog` for what "add" means per algorithm).
//!
//! One `EVAL` per Cluster slot (on one server, per batch of keys), at most
//! [`MAX_PUSH_KEYS`] keys each, a few calls at a time, each bounded by the
//! store's timeout. A call that fails returns its records in
//! [`Pushed::failed`], for the caller to put back.

use std::collections::BTreeMap;

use fred::types::Value;
use futures_util::StreamExt;

use super::backlog::Entry;
use super::clients::Clients;
use super::clients::call_slot;
use super::script::arg;
use crate::store::contract::StoreError;

/// Adds a backlog to the counters; its header comment names `KEYS` and
/// `ARGV`.
pub const PUSH: &str = concat!(include_str!("arith.lua"), include_str!("push.lua"));

/// Keys in one push call at most, and arguments (a sliding log sends two
/// per run); a key with more still goes, alone. One call then holds the
/// server for about a millisecond.
const MAX_PUSH_KEYS: usize = 256;
const MAX_PUSH_ARGS: usize = 8_192;
/// Push calls outstanding at once.
const PUSH_CONCURRENCY: usize = 8;

/// What one push did.
#[derive(Debug, Default)]
pub struct Pushed {
    /// Keys added to.
    pub added: usize,
    /// Keys left as they were: they hold something else (garbage, another
    /// type).
    pub skipped: usize,
    /// Records whose call failed, to put back
    /// ([`Backlog::restore`](super::backlog::Backlog::restore)).
    pub failed: Vec<(String, Entry)>,
    /// The first failure.
    pub error: Option<StoreError>,
}

/// One record on its way: its key, the record, and its arguments after
/// `now` (see push.lua's header).
type Item = (String, Entry, Vec<Value>);

/// Adds `entries` to the Redis counters at `now_ms` (see
/// `RedisStore::push`).
pub(super) async fn send(clients: &Clients, now_ms: u64, entries: Vec<(String, Entry)>) -> Pushed {
    let mut done = Pushed::default();
    let groups = by_slot(clients.clustered, now_ms, entries, &mut done);
    let calls = into_calls(groups);
    let now = match arg(now_ms, "now") {
        Ok(v) => v,
        Err(e) => {
            done.error = Some(e);
            return done;
        }
    };
    let mut results = futures_util::stream::iter(calls)
        .map(|call| {
            let now = now.clone();
            async move {
                let keys: Vec<&str> = call.iter().map(|(k, _, _)| k.as_str()).collect();
                let mut args = vec![now];
                for (_, _, a) in &call {
                    args.extend(a.iter().cloned());
                }
                let reply = clients.eval(PUSH, &keys, args).await;
                (call, reply)
            }
        })
        .buffer_unordered(PUSH_CONCURRENCY);
    while let Some((call, reply)) = results.next().await {
        let counts = reply.and_then(|v| match v {
            Value::Array(a) => match a.as_slice() {
                [Value::Integer(x), Value::Integer(y)] => Ok((*x, *y)),
                _ => Err(StoreError::Protocol(format!("push replied {a:?}"))),
            },
            other => Err(StoreError::Protocol(format!("push replied {other:?}"))),
        });
        match counts {
            Ok((added, skipped)) => {
                done.added += usize::try_from(added).unwrap_or(0);
                done.skipped += usize::try_from(skipped).unwrap_or(0);
            }
            Err(e) => {
                done.error.get_or_insert(e);
                done.failed.extend(call.into_iter().map(|(k, e, _)| (k, e)));
            }
        }
    }
    done
}

/// The records that still count at `now_ms` with their arguments, grouped
/// by Cluster slot (all in one group on one server, which takes any keys in
/// one call). A record whose numbers the script cannot take exactly is
/// counted as skipped in `done`.
fn by_slot(
    clustered: bool,
    now_ms: u64,
    entries: Vec<(String, Entry)>,
    done: &mut Pushed,
) -> BTreeMap<u16, Vec<Item>> {
    let mut groups: BTreeMap<u16, Vec<Item>> = BTreeMap::new();
    for (key, entry) in entries {
        let Some((w, numbers)) = entry.push_args(now_ms) else {
            continue;
        };
        let mut args = Vec::with_capacity(3 + numbers.len());
        let mut bad = false;
        for v in [entry.algorithm.code(), w, numbers.len() as u64]
            .into_iter()
            .chain(numbers)
        {
            match arg(v, "push argument") {
                Ok(v) => args.push(v),
                Err(_) => bad = true,
            }
        }
        if bad {
            done.skipped += 1;
            continue;
        }
        groups
            .entry(call_slot(clustered, &key))
            .or_default()
            .push((key, entry, args));
    }
    groups
}

/// Each group cut into calls of at most [`MAX_PUSH_KEYS`] keys and
/// [`MAX_PUSH_ARGS`] arguments.
fn into_calls(groups: BTreeMap<u16, Vec<Item>>) -> Vec<Vec<Item>> {
    let mut calls = Vec::new();
    for group in groups.into_values() {
        let mut call: Vec<Item> = Vec::new();
        let mut args = 0;
        for item in group {
            if !call.is_empty()
                && (call.len() >= MAX_PUSH_KEYS || args + item.2.len() > MAX_PUSH_ARGS)
            {
                calls.push(std::mem::take(&mut call));
                args = 0;
            }
            args += item.2.len();
            call.push(item);
        }
        if !call.is_empty() {
            calls.push(call);
        }
    }
    calls
}
