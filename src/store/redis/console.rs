//! What each gateway publishes for the operators' console, and the fleet's
//! summaries read back: one script call per publication ([`exchange`]),
//! made at most once a second by the console's sampler, never by a request.
//! A refusal of it (an ACL without the console's key) is the console's
//! problem alone: it is not recorded as the gateway's fault, so `/readyz`
//! stays as the decisions make it.
//!
//! The summaries live in one hash beside the heartbeat's sorted set
//! (`<prefix>{instances}console`, field = instance id); the script keeps
//! only the fields of instances the heartbeat counts as live and lets the
//! hash expire [`heartbeat::TTL`](super::heartbeat::TTL) after the last
//! publication.

use fred::types::Value;

use super::RedisStore;
use super::heartbeat;
use crate::store::StoreError;
use crate::store::keys;

/// The script; its header comment names `KEYS` and `ARGV`.
pub const SCRIPT: &str = include_str!("console.lua");

/// Publishes `summary` as this gateway's and returns every live gateway's
/// summary, this one's included once its heartbeat has been counted.
///
/// # Errors
/// Redis cannot answer, refuses the script (a missing ACL permission), or
/// answers something other than a list of strings.
pub async fn exchange(
    store: &RedisStore,
    prefix: &str,
    summary: String,
) -> Result<Vec<String>, StoreError> {
    let (instances, hash) = (keys::instances(prefix), keys::console(prefix));
    let ttl = i64::try_from(heartbeat::TTL.as_millis()).unwrap_or(i64::MAX);
    let args = vec![
        Value::from(store.instance_id()),
        Value::from(summary),
        Value::Integer(ttl),
    ];
    let reply = store
        .eval_aside(SCRIPT, &[instances.as_str(), hash.as_str()], args)
        .await?;
    let Value::Array(items) = reply else {
        return Err(unexpected(&reply));
    };
    items
        .into_iter()
        .map(|v| match v {
            Value::String(s) => Ok(s.to_string()),
            Value::Bytes(b) => String::from_utf8(b.to_vec()).map_err(|_| unexpected(&Value::Null)),
            other => Err(unexpected(&other)),
        })
        .collect()
}

fn unexpected(reply: &Value) -> StoreError {
    StoreError::Protocol(format!("console summaries: unexpected reply {reply:?}"))
}
