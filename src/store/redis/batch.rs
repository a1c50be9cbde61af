//! Several concurrent decisions share one script call.
//!
//! Most of what one `EVALSHA` costs Redis is not the limits' arithmetic but
//! the call around it: reading and parsing the command, finding the script,
//! entering Lua, writing the reply, a system call each way. A request that
//! waits for its decision has no reason to be a call of its own, so
//! decisions of a standalone or Sentinel store go through a queue to one
//! task (the batcher) that sends everything waiting as one call of
//! [`limits.lua`](super::script::SCRIPT), which decides each request in
//! turn, each exactly as a call of its own would (see the script's header).
//!
//! Batches form by themselves, never by waiting: the batcher takes the
//! first request waiting and everything queued behind it, up to
//! [`MAX_BATCH`] requests or [`MAX_KEYS`] keys, and sends that at once. At
//! most [`MAX_IN_FLIGHT`] calls are outstanding; while they are, requests
//! collect in the queue and leave together in the next call. An idle
//! gateway therefore sends a batch of one; a busy one sends one
//! call for many requests, and a request waits at most for the call ahead
//! of it.
//!
//! What does not change with batching:
//! - **Fail-fast**: the store checks the link before queueing, and the
//!   call fails fast if it went down since.
//! - **Each decision's own timeout**: a request waits for its answer at most
//!   until its deadline, whatever the batch does; the call is bounded by the
//!   latest deadline in it. A request whose deadline passed, or whose
//!   caller went away (its future dropped), before its batch left is not
//!   sent, so it consumes nothing.
//! - **At most once**: the call is sent once (`max_attempts = 1`); a
//!   `NOSCRIPT` reply loads the script and sends it once more, as for a
//!   single decision.
//! - **Failures**: a call that fails (link down, timeout) fails each of its
//!   requests with the same error, and each goes through the breaker and
//!   the failure policy as its own call would have: requests pipelined on
//!   a connection that drops failed together before batching too, so the
//!   breaker sees what it saw then. Garbage in one key fails only the request
//!   that owns it.
//!
//! A Redis Cluster is not batched: one script call touches one slot, and
//! distinct identities hash to distinct slots, so batches of one slot would
//! rarely hold more than one request. Its requests keep one call each
//! (`cluster::decide`), through the same script as a batch of one.

use std::sync::Arc;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use fred::types::ClusterHash;

use super::clients::Clients;
use super::script::{Encoded, parse_replies};
use crate::limit::Answer;
use crate::store::contract::StoreError;

/// Requests in one call at most. Past a few dozen the saving per request is
/// small and a larger call only delays the requests behind it.
pub(super) const MAX_BATCH: usize = 64;
/// Keys in one call at most (a request with more still goes, alone).
pub(super) const MAX_KEYS: usize = 256;
/// Calls outstanding at once (pipelined by fred on the connection).
///
/// Measured with `benches/load.py`'s Redis contender (50 connections, one
/// gateway thread, Redis on loopback), 1, 2 and 4 cost the same CPU within
/// noise, gateway and Redis alike (batches of about 16 to 20 requests;
/// the gateway thread, not Redis, is what saturates). 2 lets the next batch
/// leave while a reply is on its way, so a request waits for less than a
/// whole call ahead of it when Redis is further away than loopback; more
/// only makes batches smaller.
pub(super) const MAX_IN_FLIGHT: usize = 2;

type Reply = Result<Answer, StoreError>;

/// A request waiting for its batch.
struct Pending {
    encoded: Encoded,
    /// When its caller stops waiting.
    deadline: Instant,
    reply: oneshot::Sender<Reply>,
}

/// The queue into the batching task; dropping it stops the task.
pub(super) struct Batcher {
    queue: mpsc::UnboundedSender<Pending>,
    task: JoinHandle<()>,
}

impl Drop for Batcher {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Batcher {
    /// Starts the batching task over `clients`. Must be called inside a
    /// Tokio runtime.
    pub(super) fn start(clients: Arc<Clients>) -> Self {
        // Unbounded: every entry is a request in flight, waiting at most
        // until its deadline, so the queue is bounded by the requests the
        // gateway holds; a bound here would only add a second timeout.
        let (queue, rx) = mpsc::unbounded_channel();
        let task = tokio::spawn(run(clients, rx));
        Self { queue, task }
    }

    /// Decides `encoded` in the next batch, waiting at most until
    /// `deadline`.
    pub(super) async fn decide(&self, deadline: Instant, encoded: Encoded) -> Reply {
        let (reply, answer) = oneshot::channel();
        self.queue
            .send(Pending {
                encoded,
                deadline,
                reply,
            })
            .map_err(|_| StoreError::Unavailable("the batching task stopped".into()))?;
        match tokio::time::timeout_at(deadline, answer).await {
            Ok(Ok(reply)) => reply,
            // The batch was dropped unanswered: the task stopped.
            Ok(Err(_)) => Err(StoreError::Unavailable("the batching task stopped".into())),
            Err(_) => Err(StoreError::Timeout),
        }
    }
}

/// The batching task: sends what waits, whenever fewer than
/// [`MAX_IN_FLIGHT`] calls are outstanding; ends when the queue closes.
async fn run(clients: Arc<Clients>, mut queue: mpsc::UnboundedReceiver<Pending>) {
    let mut in_flight = FuturesUnordered::new();
    loop {
        tokio::select! {
            // Answer finished calls first: that frees a slot for the next.
            biased;
            Some(()) = in_flight.next(), if !in_flight.is_empty() => {}
            first = queue.recv(), if in_flight.len() < MAX_IN_FLIGHT => {
                let Some(first) = first else { return };
                let batch = collect(first, &mut queue);
                if !batch.is_empty() {
                    in_flight.push(send(Arc::clone(&clients), batch));
                }
            }
        }
    }
}

/// `first` and whatever waits behind it, up to the caps; requests nobody
/// waits for any more are left out.
fn collect(first: Pending, queue: &mut mpsc::UnboundedReceiver<Pending>) -> Vec<Pending> {
    let now = Instant::now();
    let mut batch = Vec::new();
    let mut keys = 0;
    let mut next = Some(first);
    while let Some(p) = next {
        if p.reply.is_closed() {
            // The caller went away (timed out, or its request was dropped).
        } else if p.deadline <= now {
            let _ = p.reply.send(Err(StoreError::Timeout));
        } else {
            keys += p.encoded.keys.len();
            batch.push(p);
            if batch.len() >= MAX_BATCH || keys >= MAX_KEYS {
                break;
            }
        }
        next = queue.try_recv().ok();
    }
    batch
}

/// One call for `batch`; answers every request in it.
async fn send(clients: Arc<Clients>, batch: Vec<Pending>) {
    let Some(deadline) = batch.iter().map(|p| p.deadline).max() else {
        return;
    };
    let requests = batch.iter().map(|p| &p.encoded);
    // Not a Cluster: any slot goes to the one server.
    let call = clients.call(deadline, ClusterHash::Random, requests);
    let result = tokio::time::timeout_at(deadline, call)
        .await
        .unwrap_or(Err(StoreError::Timeout))
        .and_then(|reply| parse_replies(reply, batch.iter().map(|p| p.encoded.keys.len())));
    match result {
        Ok(replies) => {
            for (p, r) in batch.into_iter().zip(replies) {
                // A caller that went away meanwhile is no one's concern.
                let _ = p.reply.send(r);
            }
        }
        Err(e) => {
            for p in batch {
                let _ = p.reply.send(Err(e.clone()));
            }
        }
    }
}
