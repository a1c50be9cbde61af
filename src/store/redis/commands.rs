//! Calls beside the decision: `PING` for the breaker's probe and a plain
//! `EVAL` for the small, rare scripts (heartbeat, cross-slot refund).
//!
//! These scripts run at most once a second per instance or only when a
//! cross-slot request is denied, so they are sent whole with `EVAL` rather
//! than cached by SHA-1: no `NOSCRIPT` round trip to handle, and Redis keeps
//! its own cache of compiled `EVAL` bodies.

use std::time::Duration;

use fred::interfaces::ClientLike;
use fred::types::{ClusterHash, CustomCommand, Value};
use fred::util::redis_keyslot;
use tokio::time::Instant;

use super::fault::Op;
use super::{RedisStore, store_error};
use crate::store::StoreError;

impl RedisStore {
    /// One `PING`, bounded by `timeout`.
    ///
    /// # Errors
    /// Not connected, timed out, or anything but `PONG` came back.
    pub async fn ping(&self, timeout: Duration) -> Result<(), StoreError> {
        if !self.is_connected() {
            return Err(StoreError::Unavailable("not connected to Redis".into()));
        }
        let deadline = Instant::now() + timeout;
        let cmd = CustomCommand::new_static("PING", ClusterHash::Random, false);
        let call = async {
            self.client()
                .with_options(&Self::options(deadline)?)
                .custom::<Value, Value>(cmd, Vec::new())
                .await
                .map_err(store_error)
        };
        let result = match tokio::time::timeout_at(deadline, call).await {
            Ok(Ok(Value::String(s))) if &*s == "PONG" => Ok(()),
            Ok(Ok(other)) => Err(StoreError::Protocol(format!("PING replied {other:?}"))),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(StoreError::Timeout),
        };
        self.clients.health.observe(Op::Ping, &result);
        result
    }

    /// `EVAL script` over `keys` (all in one slot) and `args`, bounded by
    /// the store's timeout.
    ///
    /// # Errors
    /// As [`crate::store::Store::decide`]: unavailable, timed out, or an
    /// error reply from the script.
    pub async fn eval(
        &self,
        script: &'static str,
        keys: &[&str],
        args: Vec<Value>,
    ) -> Result<Value, StoreError> {
        self.eval_by(Instant::now() + self.timeout, script, keys, args)
            .await
    }

    /// [`Self::eval`] that must finish by `deadline`.
    pub(super) async fn eval_by(
        &self,
        deadline: Instant,
        script: &'static str,
        keys: &[&str],
        args: Vec<Value>,
    ) -> Result<Value, StoreError> {
        if !self.is_connected() {
            return Err(StoreError::Unavailable("not connected to Redis".into()));
        }
        // EVAL script numkeys key... arg...; routed to the first key's slot
        // (fred honours only `ClusterHash::Custom` on custom commands).
        let slot = keys.first().map_or(ClusterHash::Random, |k| {
            ClusterHash::Custom(redis_keyslot(k.as_bytes()))
        });
        let cmd = CustomCommand::new_static("EVAL", slot, false);
        let mut all = Vec::with_capacity(2 + keys.len() + args.len());
        all.push(Value::from(script));
        all.push(Value::Integer(keys.len() as i64));
        all.extend(keys.iter().map(|k| Value::from(*k)));
        all.extend(args);
        let call = async {
            self.client()
                .with_options(&Self::options(deadline)?)
                .custom::<Value, Value>(cmd, all)
                .await
                .map_err(store_error)
        };
        let result = tokio::time::timeout_at(deadline, call)
            .await
            .unwrap_or(Err(StoreError::Timeout));
        self.clients.health.observe(Op::Eval, &result);
        result
    }
}
