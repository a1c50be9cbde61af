//! `sync` mode's exchange with Redis: what gateways admitted in process
//! goes to [`sync.lua`](SYNC), which adds it to the counters and answers
//! the fleet's totals (the decision side is `crate::decision::sync`).
//!
//! One `EVAL` per Cluster slot (on one server, per [`MAX_SYNC_KEYS`] keys:
//! usually one call per interval), a few calls at a time, each bounded by
//! the store's timeout. `EVAL` rather than `EVALSHA`, as for the other
//! small scripts (`commands`): a few calls a second, no `NOSCRIPT` round
//! trip to handle, and Redis keeps compiled `EVAL` bodies in its cache.
//!
//! The keys and their layout are the decision script's, so a delta sent
//! here and a decision made there count in the same numbers.

use fred::types::Value;
use futures_util::StreamExt;

use super::clients::Clients;
use super::clients::slot_groups;
use crate::store::contract::StoreError;

/// Adds deltas and answers totals; its header comment names `KEYS` and
/// `ARGV`.
pub const SYNC: &str = concat!(include_str!("arith.lua"), include_str!("sync.lua"));

/// Keys in one call at most: a call then holds the server for about a
/// millisecond, like one push call.
const MAX_SYNC_KEYS: usize = 512;
/// Calls outstanding at once.
const SYNC_CONCURRENCY: usize = 8;

/// How a key counts, for [`Delta`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counter {
    /// A sliding window of `window_ms`.
    Sliding {
        /// The window, in ms.
        window_ms: u64,
    },
    /// A fixed window (or a calendar month): the one that now falls in.
    Fixed {
        /// The window's nominal length, in ms (the shortest expiry).
        window_ms: u64,
        /// Its index.
        index: u64,
        /// When it ends, in ms since the epoch.
        end_ms: u64,
    },
}

/// What one key admitted in process since the last call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delta {
    /// The counter key, as the decision script names it.
    pub key: String,
    /// How it counts.
    pub counter: Counter,
    /// Units admitted in the previous window (sliding windows only).
    pub prev: u64,
    /// Units admitted in now's window.
    pub cur: u64,
}

/// A key's counts after a call: its window index and the counts of that
/// window and the one before (`prev` is 0 for a fixed window).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    /// The window the counts belong to.
    pub window: u64,
    /// Count of the window before it.
    pub prev: u64,
    /// Count of that window.
    pub cur: u64,
}

/// The answer for one [`Delta`]: the fleet's totals, `Ok(None)` when the
/// key holds something else (left as it is; decisions on it fail), or the
/// error of its call (nothing is known to have been added).
pub type SyncAnswer = Result<Option<Totals>, StoreError>;

/// An argument of the script: below 2^53, which it computes in exactly.
fn number(v: u64) -> Result<Value, StoreError> {
    const MAX: u64 = 1 << 53;
    i64::try_from(v)
        .ok()
        .filter(|_| v < MAX)
        .map(Value::Integer)
        .ok_or_else(|| StoreError::Protocol(format!("sync argument {v} is not below 2^53")))
}

/// The five arguments of `d` after `now` (see sync.lua's header).
fn arguments(d: &Delta) -> Result<[Value; 5], StoreError> {
    let (kind, w, end, a, b) = match d.counter {
        Counter::Sliding { window_ms } => (0, window_ms, 0, d.prev, d.cur),
        Counter::Fixed {
            window_ms,
            index,
            end_ms,
        } => (1, window_ms, end_ms, index, d.cur),
    };
    Ok([
        number(kind)?,
        number(w.max(1))?,
        number(end)?,
        number(a)?,
        number(b)?,
    ])
}

/// Adds `deltas` at `now_ms` and answers each one's totals, in order.
pub(super) async fn send(clients: &Clients, now_ms: u64, deltas: &[Delta]) -> Vec<SyncAnswer> {
    let mut answers: Vec<Option<SyncAnswer>> = vec![None; deltas.len()];
    let now = match number(now_ms) {
        Ok(v) => v,
        Err(e) => return deltas.iter().map(|_| Err(e.clone())).collect(),
    };
    let mut calls: Vec<Vec<(usize, [Value; 5])>> = Vec::new();
    for group in slot_groups(clients.clustered, deltas.iter().map(|d| d.key.as_str())) {
        let mut call = Vec::new();
        for i in group {
            match arguments(&deltas[i]) {
                Ok(args) => call.push((i, args)),
                Err(e) => answers[i] = Some(Err(e)),
            }
            if call.len() >= MAX_SYNC_KEYS {
                calls.push(std::mem::take(&mut call));
            }
        }
        if !call.is_empty() {
            calls.push(call);
        }
    }
    let mut replies = futures_util::stream::iter(calls)
        .map(|call| {
            let now = now.clone();
            async move {
                let keys: Vec<&str> = call.iter().map(|(i, _)| deltas[*i].key.as_str()).collect();
                let mut args = Vec::with_capacity(1 + 5 * call.len());
                args.push(now);
                for (_, a) in &call {
                    args.extend(a.iter().cloned());
                }
                let reply = clients.eval(SYNC, &keys, args).await;
                (call, reply)
            }
        })
        .buffer_unordered(SYNC_CONCURRENCY);
    while let Some((call, reply)) = replies.next().await {
        match reply.and_then(|v| totals(v, call.len())) {
            Ok(all) => {
                for ((i, _), t) in call.iter().zip(all) {
                    answers[*i] = Some(Ok(t));
                }
            }
            Err(e) => {
                for (i, _) in &call {
                    answers[*i] = Some(Err(e.clone()));
                }
            }
        }
    }
    answers
        .into_iter()
        .map(|a| a.unwrap_or_else(|| Err(StoreError::Protocol("no sync answer".into()))))
        .collect()
}

/// Reads sync.lua's reply for `n` keys.
fn totals(reply: Value, n: usize) -> Result<Vec<Option<Totals>>, StoreError> {
    let bad = |v: &dyn std::fmt::Debug| StoreError::Protocol(format!("sync replied {v:?}"));
    let Value::Array(items) = reply else {
        return Err(bad(&reply));
    };
    if items.len() != 3 * n {
        return Err(bad(&items));
    }
    items
        .chunks_exact(3)
        .map(|c| match c {
            [Value::Integer(w), Value::Integer(p), Value::Integer(c)] => {
                if *w < 0 {
                    return Ok(None);
                }
                match (u64::try_from(*w), u64::try_from(*p), u64::try_from(*c)) {
                    (Ok(window), Ok(prev), Ok(cur)) => Ok(Some(Totals { window, prev, cur })),
                    _ => Err(bad(&c)),
                }
            }
            other => Err(bad(&other)),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_are_read_three_numbers_a_key() {
        let reply = Value::Array(
            [5, 2, 3, -1, 0, 0]
                .into_iter()
                .map(Value::Integer)
                .collect(),
        );
        assert_eq!(
            totals(reply, 2).unwrap(),
            [
                Some(Totals {
                    window: 5,
                    prev: 2,
                    cur: 3
                }),
                None
            ]
        );
        let short = Value::Array(vec![Value::Integer(1)]);
        assert!(totals(short, 1).is_err());
        assert!(totals(Value::Integer(3), 1).is_err());
    }

    #[test]
    fn arguments_follow_the_script_header() {
        let d = Delta {
            key: "k".into(),
            counter: Counter::Fixed {
                window_ms: 1000,
                index: 7,
                end_ms: 8000,
            },
            prev: 0,
            cur: 4,
        };
        assert_eq!(
            arguments(&d).unwrap(),
            [1, 1000, 8000, 7, 4].map(Value::Integer)
        );
        let too_big = Delta { cur: 1 << 53, ..d };
        assert!(arguments(&too_big).is_err());
    }
}
