//! The decision script's side of a call, without the call: [`SCRIPT`]
//! itself, each request encoded as its keys and its shape ([`Encoded`]),
//! the `EVALSHA` arguments of a call with each distinct shape sent once,
//! and the script's reply read back into one [`Decision`] per request.
//! Nothing here talks to Redis; `commands` sends what this file encodes.

use fred::bytes_utils::Str;
use fred::types::Value;

use crate::limit::{Algorithm, Decision, LimitOutcome, LimitRequest, calendar};
use crate::store::contract::StoreError;

/// The decision script; its header comment names `KEYS` and `ARGV`.
pub const SCRIPT: &str = concat!(include_str!("arith.lua"), include_str!("limits.lua"));

/// `now` argument that makes the scripts read Redis `TIME` (`clock: redis`).
pub(super) const SERVER_CLOCK: &str = "TIME";

/// Arguments at or above 2^53 are refused: the script computes in doubles.
const MAX_ARG: u64 = 1 << 53;

/// One request's part of a script call: its keys and its shape, the
/// arguments it sends apart from its keys (see limits.lua's header).
pub(super) struct Encoded {
    pub(super) keys: Vec<Value>,
    pub(super) shape: Vec<Value>,
}

impl Encoded {
    /// One request's keys and arguments for the script; with
    /// `server_clock` the script is told to read `TIME` instead of `now`.
    pub(super) fn new(
        now_ms: u64,
        requests: &[LimitRequest],
        server_clock: bool,
    ) -> Result<Encoded, StoreError> {
        let mut shape = script_args(now_ms, requests)?;
        // issue 4 (clock: redis): the script reads TIME when `now` is "TIME".
        if server_clock {
            shape[1] = Value::from(SERVER_CLOCK);
        }
        let keys = requests
            .iter()
            .map(|r| Value::from(r.key.as_str()))
            .collect();
        Ok(Encoded { keys, shape })
    }
}

/// One request's shape for the script: its number of limits, now, then
/// algorithm, limit, window, cost and burst per limit (for a calendar
/// month: the month's end and its index).
fn script_args(now_ms: u64, requests: &[LimitRequest]) -> Result<Vec<Value>, StoreError> {
    let mut argv = Vec::with_capacity(2 + 5 * requests.len());
    argv.push(Value::Integer(requests.len() as i64));
    argv.push(arg(now_ms, "now")?);
    for r in requests {
        // A calendar month is computed here, once, for both stores' sake:
        // the script is told the month index and when it ends.
        let (window, burst) = match r.algorithm {
            Algorithm::Gcra { burst } => (r.window_ms, burst),
            Algorithm::CalendarMonth => {
                let (index, end) = calendar::month(now_ms);
                (end, index)
            }
            _ => (r.window_ms, r.limit),
        };
        argv.push(arg(r.algorithm.code(), "algorithm")?);
        argv.push(arg(r.limit, "limit")?);
        argv.push(arg(window, "window")?);
        argv.push(arg(r.cost, "cost")?);
        argv.push(arg(burst, "burst")?);
    }
    Ok(argv)
}

/// `EVALSHA sha numkeys key... S shape... index...`: every request's keys,
/// each distinct shape once, then each request's shape index, in the same
/// order (limits.lua's header). Arguments are most of what a call costs
/// Redis per request, and a batch's requests mostly share a few shapes.
pub(super) fn evalsha_args<'a>(
    sha: &Str,
    requests: impl Iterator<Item = &'a Encoded> + Clone,
) -> Vec<Value> {
    let mut shapes: Vec<&[Value]> = Vec::new();
    let mut indices = Vec::new();
    let mut keys = 0;
    for e in requests.clone() {
        keys += e.keys.len();
        let i = match shapes.iter().position(|s| *s == e.shape.as_slice()) {
            Some(i) => i,
            None => {
                shapes.push(&e.shape);
                shapes.len() - 1
            }
        };
        indices.push(Value::Integer(i as i64 + 1));
    }
    let shape_args: usize = shapes.iter().map(|s| s.len()).sum();
    let mut args = Vec::with_capacity(3 + keys + shape_args + indices.len());
    args.push(Value::String(sha.clone()));
    args.push(Value::Integer(keys as i64));
    for e in requests {
        args.extend(e.keys.iter().cloned());
    }
    args.push(Value::Integer(shapes.len() as i64));
    for s in shapes {
        args.extend(s.iter().cloned());
    }
    args.extend(indices);
    args
}

pub(super) fn arg(v: u64, what: &str) -> Result<Value, StoreError> {
    if v < MAX_ARG {
        // Below 2^53, so it fits an i64.
        Ok(Value::Integer(v as i64))
    } else {
        Err(StoreError::Protocol(format!(
            "{what} {v} is not below 2^53, beyond what the script computes exactly"
        )))
    }
}

/// Splits the script's reply into one result per request; `sizes` are the
/// requests' numbers of limits, in the order they were sent. A request the
/// script could not decide (garbage in one of its keys) is answered by its
/// error message and fails alone, as [`StoreError::Protocol`] like the error
/// reply of a call of its own.
///
/// # Errors
/// The reply as a whole is not one entry per request.
pub(super) fn parse_replies(
    reply: Value,
    sizes: impl ExactSizeIterator<Item = usize>,
) -> Result<Vec<Result<Decision, StoreError>>, StoreError> {
    let Value::Array(items) = reply else {
        return Err(StoreError::Protocol("script reply is not an array".into()));
    };
    if items.len() != sizes.len() {
        return Err(StoreError::Protocol(format!(
            "script reply has {} entries for {} requests",
            items.len(),
            sizes.len()
        )));
    }
    Ok(items
        .into_iter()
        .zip(sizes)
        .map(|(item, n)| match item {
            Value::Array(_) => parse_reply(item, n),
            Value::String(msg) => Err(StoreError::Protocol(msg.to_string())),
            Value::Bytes(msg) => Err(StoreError::Protocol(
                String::from_utf8_lossy(&msg).into_owned(),
            )),
            other => Err(StoreError::Protocol(format!(
                "script reply holds {other:?}, not a decision"
            ))),
        })
        .collect())
}

/// Reads one request's flat reply: allowed, then per limit admits,
/// remaining, reset_ms and retry_after_ms (−1 for never).
fn parse_reply(reply: Value, n: usize) -> Result<Decision, StoreError> {
    let bad = |why: &str| StoreError::Protocol(format!("script reply {why}"));
    let Value::Array(items) = reply else {
        return Err(bad("is not an array"));
    };
    if items.len() != 1 + 4 * n {
        return Err(bad(&format!(
            "has {} items, expected {}",
            items.len(),
            1 + 4 * n
        )));
    }
    let ints = items
        .into_iter()
        .map(|v| match v {
            Value::Integer(i) => Ok(i),
            _ => Err(bad("holds a non-integer")),
        })
        .collect::<Result<Vec<i64>, _>>()?;
    let flag = |i: i64| match i {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err(bad("holds a flag that is not 0 or 1")),
    };
    let count = |i: i64| u64::try_from(i).map_err(|_| bad("holds a negative count"));
    let Some((&allowed, per_limit)) = ints.split_first() else {
        return Err(bad("is empty"));
    };
    let allowed = flag(allowed)?;
    let outcomes = per_limit
        .chunks_exact(4)
        .map(|o| {
            Ok(LimitOutcome {
                admits: flag(o[0])?,
                remaining: count(o[1])?,
                reset_ms: count(o[2])?,
                retry_after_ms: match o[3] {
                    -1 => None,
                    v => Some(count(v)?),
                },
            })
        })
        .collect::<Result<Vec<_>, StoreError>>()?;
    if allowed != outcomes.iter().all(|o| o.admits) {
        return Err(bad(
            "contradicts itself: allowed is not every limit admitting",
        ));
    }
    Ok(Decision {
        allowed,
        outcomes: outcomes.into(),
    })
}

#[cfg(test)]
mod tests;
