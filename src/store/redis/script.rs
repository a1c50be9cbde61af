//! The decision script's side of a call, without the call: [`SCRIPT`]
//! itself, each request encoded as its keys and its shape ([`Encoded`]),
//! the `EVALSHA` arguments of a call with each distinct shape sent once,
//! and the script's reply read back into one [`Answer`] per request.
//! Nothing here talks to Redis; `commands` sends what this file encodes.

use fred::bytes_utils::Str;
use fred::types::Value;
use smallvec::SmallVec;

use crate::limit::{Answer, LimitRequest, Standing, Standings};
use crate::store::contract::StoreError;

/// The decision script; its header comment names `KEYS` and `ARGV`.
pub const SCRIPT: &str = concat!(include_str!("arith.lua"), include_str!("limits.lua"));

/// `now` argument that makes the scripts read Redis `TIME` (`clock: redis`).
pub(super) const SERVER_CLOCK: &str = "TIME";

/// Arguments at or above 2^53 are refused: the script computes in doubles.
const MAX_ARG: u64 = 1 << 53;

/// One request's part of a script call: its keys, its shape (what it asks
/// apart from its keys and its instant: n, then algorithm, limit, window,
/// cost and burst per limit) and its instant (see limits.lua's header).
/// Numbers stay numbers until the call is encoded; inline for up to two
/// limits, so a request allocates only its keys' bytes.
pub(super) struct Encoded {
    pub(super) keys: SmallVec<[Value; 2]>,
    shape: SmallVec<[i64; 11]>,
    now: Now,
}

/// A request's instant as the script is told it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Now {
    /// Milliseconds on the gateway's clock, below 2^53.
    At(i64),
    /// Redis `TIME` (`clock: redis`).
    Server,
}

impl Now {
    fn value(self) -> Value {
        match self {
            Now::At(ms) => Value::Integer(ms),
            Now::Server => Value::from(SERVER_CLOCK),
        }
    }
}

impl Encoded {
    /// One request's keys and arguments for the script; with
    /// `server_clock` the script is told to read `TIME` instead of `now`.
    pub(super) fn new(
        now_ms: u64,
        requests: &[LimitRequest],
        server_clock: bool,
    ) -> Result<Encoded, StoreError> {
        let shape = shape(now_ms, requests)?;
        let now = number(now_ms, "now")?;
        // `clock: redis`: the script reads TIME when `now` is "TIME".
        let now = if server_clock {
            Now::Server
        } else {
            Now::At(now)
        };
        let keys = requests
            .iter()
            .map(|r| Value::from(&*r.key.text()))
            .collect();
        Ok(Encoded { keys, shape, now })
    }
}

/// One request's shape for the script: its number of limits, then
/// algorithm, limit, window, cost and burst per limit (for a calendar
/// month: the month's end and its index, at `now_ms`).
fn shape(now_ms: u64, requests: &[LimitRequest]) -> Result<SmallVec<[i64; 11]>, StoreError> {
    let mut argv = SmallVec::with_capacity(1 + 5 * requests.len());
    argv.push(requests.len() as i64);
    for r in requests {
        let (window, burst) = r.algorithm.script_args(now_ms, r.limit, r.window_ms);
        argv.push(number(r.algorithm.code(), "algorithm")?);
        argv.push(number(r.limit, "limit")?);
        argv.push(number(window, "window")?);
        argv.push(number(r.units(), "cost")?);
        argv.push(number(burst, "burst")?);
    }
    Ok(argv)
}

/// `EVALSHA sha numkeys key... S shape... (shape now count)...`: every
/// request's keys, each distinct shape once, then the requests in order as
/// runs of one shape at one instant (limits.lua's header). Arguments are
/// much of what a call costs Redis, and a batch's requests mostly share a
/// shape and come from a few milliseconds.
pub(super) fn evalsha_args<'a>(
    sha: &Str,
    requests: impl Iterator<Item = &'a Encoded> + Clone,
) -> Vec<Value> {
    let mut shapes: SmallVec<[&[i64]; 4]> = SmallVec::new();
    // (shape index, instant, requests in a row)
    let mut runs: SmallVec<[(usize, Now, i64); 8]> = SmallVec::new();
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
        match runs.last_mut() {
            Some((shape, now, count)) if *shape == i && *now == e.now => *count += 1,
            _ => runs.push((i, e.now, 1)),
        }
    }
    let shape_args: usize = shapes.iter().map(|s| s.len()).sum();
    let mut args = Vec::with_capacity(3 + keys + shape_args + 3 * runs.len());
    args.push(Value::String(sha.clone()));
    args.push(Value::Integer(keys as i64));
    for e in requests {
        args.extend(e.keys.iter().cloned());
    }
    args.push(Value::Integer(shapes.len() as i64));
    for s in shapes {
        args.extend(s.iter().map(|&v| Value::Integer(v)));
    }
    for (shape, now, count) in runs {
        args.push(Value::Integer(shape as i64 + 1));
        args.push(now.value());
        args.push(Value::Integer(count));
    }
    args
}

pub(super) fn arg(v: u64, what: &str) -> Result<Value, StoreError> {
    number(v, what).map(Value::Integer)
}

/// `v` as the script takes it: below 2^53.
fn number(v: u64, what: &str) -> Result<i64, StoreError> {
    if v < MAX_ARG {
        // Below 2^53, so it fits an i64.
        Ok(v as i64)
    } else {
        Err(StoreError::Protocol(format!(
            "{what} {v} is not below 2^53, beyond what the script computes exactly"
        )))
    }
}

/// Splits the script's reply, one flat array for the whole call, into one
/// result per request; `sizes` are the requests' numbers of limits, in the
/// order they were sent. A decided request is `1 + 4 n` integers, read
/// straight into its [`Answer`] (no allocation for up to two limits); a
/// request the script could not decide (garbage in one of its keys) is one
/// string, its error message, and fails alone, as [`StoreError::Protocol`]
/// like the error reply of a call of its own.
///
/// # Errors
/// The reply as a whole is not an array of as many answers as requests.
pub(super) fn parse_replies(
    reply: Value,
    sizes: impl ExactSizeIterator<Item = usize>,
) -> Result<Vec<Result<Answer, StoreError>>, StoreError> {
    let Value::Array(items) = reply else {
        return Err(StoreError::Protocol("script reply is not an array".into()));
    };
    let requests = sizes.len();
    let mut items = items.into_iter();
    let mut replies = Vec::with_capacity(requests);
    for n in sizes {
        let reply = match items.next() {
            Some(Value::Integer(allowed)) => parse_decision(allowed, n, &mut items)?,
            Some(Value::String(msg)) => Err(StoreError::Protocol(msg.to_string())),
            Some(Value::Bytes(msg)) => Err(StoreError::Protocol(
                String::from_utf8_lossy(&msg).into_owned(),
            )),
            Some(other) => {
                return Err(StoreError::Protocol(format!(
                    "script reply holds {other:?}, not a decision"
                )));
            }
            None => {
                return Err(StoreError::Protocol(format!(
                    "script reply ends after {} of {requests} requests",
                    replies.len()
                )));
            }
        };
        replies.push(reply);
    }
    if items.next().is_some() {
        return Err(StoreError::Protocol(format!(
            "script reply has more than {requests} answers"
        )));
    }
    Ok(replies)
}

/// Reads one decided request after its `allowed` flag: per limit admits,
/// remaining, reset_ms and retry_after_ms (−1 for never). Numbers out of
/// their range fail this request only.
///
/// # Errors
/// The reply ends early or holds something else than integers: the whole
/// reply is unusable then, as the requests after this one cannot be found.
fn parse_decision(
    allowed: i64,
    n: usize,
    items: &mut impl Iterator<Item = Value>,
) -> Result<Result<Answer, StoreError>, StoreError> {
    let mut int = || match items.next() {
        Some(Value::Integer(i)) => Ok(i),
        Some(_) => Err(bad("holds a non-integer")),
        None => Err(bad("ends inside a decision")),
    };
    let mut outcomes = Standings::new();
    let mut wrong = None;
    for _ in 0..n {
        let o = [int()?, int()?, int()?, int()?];
        match outcome(o) {
            Ok(o) => outcomes.push(o),
            Err(e) => wrong = wrong.or(Some(e)),
        }
    }
    if let Some(e) = wrong {
        return Ok(Err(e));
    }
    Ok(match flag(allowed) {
        Ok(allowed) if allowed == outcomes.iter().all(|o| o.admits) => {
            Ok(Answer { allowed, outcomes })
        }
        Ok(_) => Err(bad(
            "contradicts itself: allowed is not every limit admitting",
        )),
        Err(e) => Err(e),
    })
}

/// One limit's answer from its four integers.
fn outcome([admits, remaining, reset_ms, retry]: [i64; 4]) -> Result<Standing, StoreError> {
    let count = |i: i64| u64::try_from(i).map_err(|_| bad("holds a negative count"));
    Ok(Standing {
        admits: flag(admits)?,
        remaining: count(remaining)?,
        reset_ms: count(reset_ms)?,
        retry_after_ms: match retry {
            -1 => None,
            v => Some(count(v)?),
        },
    })
}

fn flag(i: i64) -> Result<bool, StoreError> {
    match i {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err(bad("holds a flag that is not 0 or 1")),
    }
}

fn bad(why: &str) -> StoreError {
    StoreError::Protocol(format!("script reply {why}"))
}

#[cfg(test)]
mod tests;
