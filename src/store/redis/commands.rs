//! Every command a store sends, on its pool of clients: the decision
//! script by `EVALSHA` (loaded with `SCRIPT LOAD` when its SHA-1 is not
//! known, and again on `NOSCRIPT`), `PING` for the breaker's probe, a
//! plain `EVAL` for the small, rare scripts (heartbeat, cross-slot refund,
//! outage push) and `HGET` for the API-key hash. Each is sent at most once,
//! fails fast while the link is down, is bounded by a deadline, and tells
//! its outcome to the health record ([`Op`]); fred's errors become
//! [`StoreError`]s here ([`store_error`]).
//!
//! The small scripts run at most once a second per instance, or only when
//! a cross-slot request is denied or an outage ends, so they are sent whole
//! with `EVAL` rather than cached by SHA-1: no `NOSCRIPT` round trip to
//! handle, and Redis keeps its own cache of compiled `EVAL` bodies.

use std::collections::BTreeMap;
use std::time::Duration;

use fred::bytes_utils::Str;
use fred::error::{Error as FredError, ErrorKind};
use fred::interfaces::{ClientLike, ClusterInterface};
use fred::types::config::Options;
use fred::types::{ClusterHash, CustomCommand, Value};
use fred::util::redis_keyslot;
use futures_util::future::join_all;
use tokio::time::Instant;

use super::clients::Clients;
use super::fault::Op;
use super::script::{Encoded, SCRIPT, evalsha_args};
use crate::store::contract::StoreError;

impl Clients {
    /// `SCRIPT LOAD`s the script and remembers the SHA-1 the server returns.
    pub(super) async fn load_script(&self, deadline: Instant) -> Result<Str, StoreError> {
        // In a Cluster the script is loaded on every primary.
        if self.clustered {
            return self.load_script_everywhere(deadline).await;
        }
        let cmd = CustomCommand::new_static("SCRIPT", ClusterHash::Random, false);
        let args = vec![Value::from("LOAD"), Value::from(SCRIPT)];
        let conn = self.conn()?;
        let sent = Instant::now();
        let reply: Result<Value, StoreError> = conn
            .client
            .with_options(&options(deadline)?)
            .custom(cmd, args)
            .await
            .map_err(store_error);
        self.observe(&conn, sent, None, &reply);
        let sha = match reply? {
            Value::String(s) if s.len() == 40 => s,
            other => {
                return Err(StoreError::Protocol(format!(
                    "SCRIPT LOAD replied {other:?}, not a SHA-1"
                )));
            }
        };
        // Every load of the same script yields the same SHA-1, so a
        // concurrent first load storing it first is just as good.
        let _ = self.sha.set(sha.clone());
        Ok(sha)
    }

    /// One call of the script deciding `requests` (one or a batch), by
    /// `EVALSHA`; the script is loaded first when its SHA-1 is not known
    /// yet, and loaded again and the call retried once on `NOSCRIPT`.
    /// Fails fast while the link is down.
    pub(super) async fn call<'a, I>(
        &self,
        deadline: Instant,
        slot: ClusterHash,
        requests: I,
    ) -> Result<Value, StoreError>
    where
        I: Iterator<Item = &'a Encoded> + Clone,
    {
        let result = self.call_once(deadline, slot, requests).await;
        self.health.observe(Op::Script, &result);
        result
    }

    /// [`Self::call`] before its outcome is told to the health record.
    async fn call_once<'a, I>(
        &self,
        deadline: Instant,
        slot: ClusterHash,
        requests: I,
    ) -> Result<Value, StoreError>
    where
        I: Iterator<Item = &'a Encoded> + Clone,
    {
        if !self.is_connected() {
            return Err(StoreError::Unavailable("not connected to Redis".into()));
        }
        let sha = match self.sha.get() {
            Some(sha) => sha.clone(),
            None => self.load_script(deadline).await?,
        };
        match self
            .evalsha(&sha, slot.clone(), requests.clone(), deadline)
            .await?
        {
            Some(reply) => Ok(reply),
            // Flushed or a new server: load and retry, once.
            None => {
                let sha = self.load_script(deadline).await?;
                self.evalsha(&sha, slot, requests, deadline)
                    .await?
                    .ok_or_else(|| StoreError::Protocol("NOSCRIPT right after SCRIPT LOAD".into()))
            }
        }
    }

    /// One `EVALSHA` of the script; `None` when the server does not know
    /// it (`NOSCRIPT`).
    async fn evalsha<'a, I>(
        &self,
        sha: &Str,
        slot: ClusterHash,
        requests: I,
        deadline: Instant,
    ) -> Result<Option<Value>, StoreError>
    where
        I: Iterator<Item = &'a Encoded> + Clone,
    {
        // fred applies only `ClusterHash::Custom` to custom commands
        // (an `Offset` is ignored and the SHA-1 would be hashed), so the
        // caller computes the slot.
        let node_slot = if let ClusterHash::Custom(s) = &slot {
            Some(*s)
        } else {
            None
        };
        self.check_node(node_slot)?;
        let cmd = CustomCommand::new_static("EVALSHA", slot, false);
        let args = evalsha_args(sha, requests);
        let options = options(deadline)?;
        let conn = self.conn()?;
        let sent = Instant::now();
        let reply = match conn.client.with_options(&options).custom(cmd, args).await {
            Ok(reply) => Ok(Some(reply)),
            Err(e) if e.details().starts_with("NOSCRIPT") => Ok(None),
            Err(e) => Err(store_error(e)),
        };
        self.observe(&conn, sent, node_slot, &reply);
        reply
    }

    /// `SCRIPT LOAD` on every primary of the cluster: `EVALSHA` goes to the
    /// keys' node, and a script is cached per node.
    async fn load_script_everywhere(&self, deadline: Instant) -> Result<Str, StoreError> {
        let conn = self.conn()?;
        let client = &conn.client;
        let mut slots: BTreeMap<String, u16> = BTreeMap::new();
        if let Some(state) = client.cached_cluster_state() {
            for range in state.slots() {
                slots
                    .entry(range.primary.to_string())
                    .or_insert(range.start);
            }
        }
        if slots.is_empty() {
            return Err(StoreError::Unavailable(
                "cluster slot map not known yet".into(),
            ));
        }
        let options = options(deadline)?;
        let loads = slots.values().map(|&slot| {
            let cmd = CustomCommand::new_static("SCRIPT", ClusterHash::Custom(slot), false);
            let args = vec![Value::from("LOAD"), Value::from(SCRIPT)];
            let options = options.clone();
            async move {
                client
                    .with_options(&options)
                    .custom::<Value, Value>(cmd, args)
                    .await
                    .map_err(store_error)
            }
        });
        let mut sha = None;
        for reply in join_all(loads).await {
            match reply? {
                Value::String(s) if s.len() == 40 => sha = Some(s),
                other => {
                    return Err(StoreError::Protocol(format!(
                        "SCRIPT LOAD replied {other:?}, not a SHA-1"
                    )));
                }
            }
        }
        let sha = sha.ok_or_else(|| StoreError::Unavailable("no cluster primary".into()))?;
        let _ = self.sha.set(sha.clone());
        Ok(sha)
    }

    /// One `PING`, bounded by `timeout`.
    ///
    /// # Errors
    /// Not connected, timed out, or anything but `PONG` came back.
    pub(super) async fn ping(&self, timeout: Duration) -> Result<(), StoreError> {
        if !self.is_connected() {
            return Err(StoreError::Unavailable("not connected to Redis".into()));
        }
        let deadline = Instant::now() + timeout;
        let cmd = CustomCommand::new_static("PING", ClusterHash::Random, false);
        let conn = self.conn()?;
        let sent = Instant::now();
        let call = async {
            conn.client
                .with_options(&options(deadline)?)
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
        self.told(&conn, sent, Op::Ping, None, &result);
        result
    }

    /// `EVAL script` over `keys` (all in one slot) and `args`, bounded by
    /// the store's timeout.
    ///
    /// # Errors
    /// As [`crate::store::Store::decide`]: unavailable, timed out, or an
    /// error reply from the script.
    pub(super) async fn eval(
        &self,
        script: &'static str,
        keys: &[&str],
        args: Vec<Value>,
    ) -> Result<Value, StoreError> {
        self.eval_by(Instant::now() + self.timeout, script, keys, args)
            .await
    }

    /// [`Self::eval`] whose refusal is not recorded as the gateway's
    /// fault ([`Self::eval_unjudged`]).
    ///
    /// # Errors
    /// As [`Self::eval`].
    pub(super) async fn eval_aside(
        &self,
        script: &'static str,
        keys: &[&str],
        args: Vec<Value>,
    ) -> Result<Value, StoreError> {
        self.eval_unjudged(Instant::now() + self.timeout, script, keys, args)
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
        let result = self.eval_unjudged(deadline, script, keys, args).await;
        self.health.observe(Op::Eval, &result);
        result
    }

    /// [`Self::eval_by`] whose refusal says nothing of the gateway's
    /// health: for calls no decision depends on (the console's summaries),
    /// whose missing permission must not make `/readyz` fail.
    pub(super) async fn eval_unjudged(
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
        let node_slot = keys.first().map(|k| redis_keyslot(k.as_bytes()));
        self.check_node(node_slot)?;
        let slot = node_slot.map_or(ClusterHash::Random, ClusterHash::Custom);
        let cmd = CustomCommand::new_static("EVAL", slot, false);
        let mut all = Vec::with_capacity(2 + keys.len() + args.len());
        all.push(Value::from(script));
        all.push(Value::Integer(keys.len() as i64));
        all.extend(keys.iter().map(|k| Value::from(*k)));
        all.extend(args);
        let conn = self.conn()?;
        let sent = Instant::now();
        let call = async {
            conn.client
                .with_options(&options(deadline)?)
                .custom::<Value, Value>(cmd, all)
                .await
                .map_err(store_error)
        };
        let result = tokio::time::timeout_at(deadline, call)
            .await
            .unwrap_or(Err(StoreError::Timeout));
        self.observe(&conn, sent, node_slot, &result);
        result
    }

    /// `HGET key field`, bounded by the store's timeout like a decision.
    /// Used for the dynamic API-key → plan hash.
    ///
    /// # Errors
    /// [`StoreError`] when Redis cannot answer, or answers something other
    /// than a string or nil.
    pub(super) async fn hget(&self, key: &str, field: &str) -> Result<Option<String>, StoreError> {
        if !self.is_connected() {
            return Err(StoreError::Unavailable("not connected to Redis".into()));
        }
        let deadline = Instant::now() + self.timeout;
        // fred routes custom commands only by `ClusterHash::Custom`.
        let node_slot = redis_keyslot(key.as_bytes());
        self.check_node(Some(node_slot))?;
        let slot = ClusterHash::Custom(node_slot);
        let cmd = CustomCommand::new_static("HGET", slot, false);
        let conn = self.conn()?;
        let sent = Instant::now();
        let call = async {
            conn.client
                .with_options(&options(deadline)?)
                .custom::<Value, Value>(cmd, vec![Value::from(key), Value::from(field)])
                .await
                .map_err(store_error)
        };
        let reply = tokio::time::timeout_at(deadline, call)
            .await
            .unwrap_or(Err(StoreError::Timeout));
        self.told(&conn, sent, Op::Hget, Some(node_slot), &reply);
        match reply? {
            Value::Null => Ok(None),
            Value::String(s) => Ok(Some(s.to_string())),
            Value::Bytes(b) => String::from_utf8(b.to_vec())
                .map(Some)
                .map_err(|_| StoreError::Protocol("HGET replied bytes that are not UTF-8".into())),
            other => Err(StoreError::Protocol(format!(
                "HGET replied {other:?}, not a string"
            ))),
        }
    }
}

/// Options for one command that must finish by `deadline`.
fn options(deadline: Instant) -> Result<Options, StoreError> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(StoreError::Timeout);
    }
    Ok(Options {
        fail_fast: true,
        max_attempts: Some(1),
        timeout: Some(left),
        ..Options::default()
    })
}

/// Classifies a fred error. No catch-all arm: a new error kind must be placed.
fn store_error(e: FredError) -> StoreError {
    let detail = e.details().to_owned();
    match e.kind() {
        ErrorKind::Timeout => StoreError::Timeout,
        // Canceled is what `fail_fast` answers while disconnected.
        ErrorKind::Canceled
        | ErrorKind::IO
        | ErrorKind::Backpressure
        | ErrorKind::Routing
        | ErrorKind::Config
        | ErrorKind::Url
        | ErrorKind::Cluster
        | ErrorKind::Tls
        | ErrorKind::Sentinel => StoreError::Unavailable(format!("{:?}: {detail}", e.kind())),
        // WRONGPASS, NOAUTH: the connection is not authenticated.
        ErrorKind::Auth => StoreError::Refused(detail),
        // The ACL user lacks the command or the key pattern.
        ErrorKind::Unknown if detail.starts_with("NOPERM") => StoreError::Refused(detail),
        // Server error replies arrive as Unknown; the ones that mean "not
        // now" are outages, the rest (script errors) are garbage answers.
        ErrorKind::Unknown if is_transient_reply(&detail) => StoreError::Unavailable(detail),
        // A Cluster redirect (MOVED/ASK, a stale slot map during a
        // failover or resharding) uses up the single attempt: an outage of
        // that slot, not garbage.
        ErrorKind::Unknown if detail.starts_with("Too many failed write attempts") => {
            StoreError::Unavailable(detail)
        }
        // fred found no connection to write to (it closed), or the
        // client was replaced and its router stopped with the command
        // unanswered (`follow`).
        ErrorKind::Unknown
            if detail.starts_with("Failed to route command") || detail == "channel closed" =>
        {
            StoreError::Unavailable(format!("connection closed: {detail}"))
        }
        ErrorKind::Unknown
        | ErrorKind::InvalidCommand
        | ErrorKind::InvalidArgument
        | ErrorKind::Protocol
        | ErrorKind::Parse
        | ErrorKind::NotFound => StoreError::Protocol(detail),
    }
}

/// Redis error codes that say the server cannot serve right now.
fn is_transient_reply(detail: &str) -> bool {
    const CODES: [&str; 6] = [
        "LOADING",
        "BUSY",
        "MASTERDOWN",
        "READONLY",
        "OOM",
        "TRYAGAIN",
    ];
    let code = detail.split_whitespace().next().unwrap_or("");
    CODES.contains(&code)
}
