//! `sync` mode's exchange task ([`SyncTask`]): every interval it sends
//! what the synced keys owe to Redis and keeps the fleet's totals Redis
//! answers; [`SyncLink`] is how decisions learn whether those
//! totals are fresh and ask for an exchange at once; [`SyncMode`] is what
//! the limiter holds of it all. The design and its
//! bound are in [`super`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{info, warn};

use super::{Due, Intent, SyncTable};
use crate::clock::{Clock, SystemClock};
use crate::decision::reach::{Reachability, begin_push};
use crate::limit::LimitRequest;
use crate::metrics::StoreMetrics;
use crate::store::heartbeat::Instances;
use crate::store::{Breaker, RedisStore};

/// Between synced decisions and the exchange task: whether the counts held
/// are fresh, and the way to ask for an exchange at once.
#[derive(Debug, Default)]
pub(in crate::decision) struct SyncLink {
    /// Set when an exchange failed (or the link or the breaker stopped
    /// one) or the fallback decided a synced limit; cleared by an exchange
    /// that succeeded with nothing waiting to be pushed. Meanwhile
    /// `on_error` decides synced limits, as it decides exact ones.
    pub(in crate::decision) failed: AtomicBool,
    /// Asks the exchange task to run now.
    pub(in crate::decision) kick: Notify,
    /// Woken when an exchange ends.
    pub(in crate::decision) ended: Notify,
}

impl SyncLink {
    /// Asks for an exchange now and waits, until `deadline`, for one that
    /// leaves the counts fresh; whether they are.
    pub(in crate::decision) async fn refreshed(&self, deadline: Instant) -> bool {
        self.kick.notify_one();
        loop {
            // Created before the check, so an exchange ending in between
            // still wakes it.
            let ended = self.ended.notified();
            if !self.failed.load(Ordering::SeqCst) {
                return true;
            }
            if tokio::time::timeout_at(deadline, ended).await.is_err() {
                return !self.failed.load(Ordering::SeqCst);
            }
        }
    }
}

/// `sync` mode's exchange task and what it works with.
pub(in crate::decision) struct SyncTask {
    pub(in crate::decision) table: Arc<SyncTable>,
    pub(in crate::decision) redis: Arc<RedisStore>,
    pub(in crate::decision) breaker: Arc<Breaker>,
    pub(in crate::decision) link: Arc<SyncLink>,
    pub(in crate::decision) reach: Arc<Reachability>,
    pub(in crate::decision) instances: Instances,
    pub(in crate::decision) metrics: StoreMetrics,
    pub(in crate::decision) clock: Arc<dyn Clock>,
}

impl SyncTask {
    /// Marks the counts stale (`on_error` decides synced limits until an
    /// exchange succeeds), logging the change once.
    pub(in crate::decision) fn fail(&self, why: &str) {
        if !self.link.failed.swap(true, Ordering::SeqCst) {
            warn!(
                error = why,
                "sync mode cannot exchange counts with redis; on_error decides synced limits until it can"
            );
        }
    }

    /// One exchange at `now_ms`: the keys due (all queued keys while the
    /// counts are stale), after what the fallback admitted is pushed.
    pub(in crate::decision) async fn once(&self, now_ms: u64) {
        if !self.redis.is_connected() {
            return self.fail("not connected to Redis");
        }
        if !self.breaker.allows() {
            return self.fail("breaker open");
        }
        let stale = self.link.failed.load(Ordering::SeqCst);
        if !self.reach.ahead() {
            // The totals read below must hold what the fallback admitted.
            let deadline = Instant::now() + self.reach.wait;
            begin_push(
                &self.reach,
                &self.redis,
                &self.breaker,
                &self.metrics,
                now_ms,
            );
            self.reach.push_ended(deadline).await;
        }
        let pushed = self.reach.ahead();
        self.table.set_instances(self.instances.get());
        let due = if stale { Due::All } else { Due::Ready };
        let deltas = self.table.take(now_ms, due);
        if deltas.is_empty() {
            return;
        }
        let keys = deltas.len() as u64;
        let answers = self.redis.sync(now_ms, &deltas).await;
        let failure = answers.iter().find_map(|a| a.as_ref().err()).cloned();
        self.table.apply(deltas, answers);
        match &failure {
            None => {
                self.breaker.record(Ok(()));
                if pushed && self.link.failed.swap(false, Ordering::SeqCst) {
                    info!("sync mode exchanges counts with redis again");
                }
            }
            Some(e) => {
                self.metrics.errors.inc();
                self.breaker.record(Err(e));
                self.fail(&e.to_string());
            }
        }
        // After the answers are taken in: a count that has moved means
        // decisions see the totals.
        self.metrics.sync_keys.inc_by(keys);
        self.metrics.sync_exchanges.inc();
        self.link.ended.notify_waiters();
    }
}

/// `sync` mode's exchange task: every tick (the shortest interval of any
/// synced key), or at once when a decision finds the counts stale, sends
/// what the keys due owe and keeps the totals Redis answers. A tick that
/// finds Redis unusable marks the counts stale, so decisions go to
/// `on_error` until an exchange succeeds.
pub(in crate::decision) async fn run(x: SyncTask) {
    let mut next = Instant::now();
    loop {
        let Some(tick) = x.table.tick() else {
            x.table.tick_changed().await;
            continue;
        };
        next += tick;
        let now = Instant::now();
        if next < now {
            // Late (a slow exchange): keep the interval from now on.
            next = now + tick;
        }
        tokio::select! {
            () = tokio::time::sleep_until(next) => {}
            () = x.link.kick.notified() => {}
            () = x.table.tick_changed() => {
                // A shorter interval: start again from it.
                next = Instant::now();
                continue;
            }
        }
        x.once(x.clock.now_ms()).await;
    }
}

/// `sync` mode's state: what this gateway knows of the fleet's counts and
/// owes Redis, whether those counts are fresh, and the exchange task.
pub(in crate::decision) struct SyncMode {
    pub(in crate::decision) table: Arc<SyncTable>,
    /// Whether the counts are fresh, and the way to ask for an exchange at
    /// once.
    pub(in crate::decision) link: Arc<SyncLink>,
    /// The task exchanging the counts, started by the first synced
    /// decision; aborted on drop.
    pub(in crate::decision) exchange: OnceLock<JoinHandle<()>>,
    /// The clock the exchange reads (the gateway's).
    pub(in crate::decision) clock: Arc<dyn Clock>,
}

impl Default for SyncMode {
    fn default() -> Self {
        Self {
            table: Arc::new(SyncTable::new()),
            link: Arc::new(SyncLink::default()),
            exchange: OnceLock::new(),
            clock: Arc::new(SystemClock),
        }
    }
}

impl Drop for SyncMode {
    fn drop(&mut self) {
        if let Some(t) = self.exchange.get() {
            t.abort();
        }
    }
}

impl SyncMode {
    /// Queues the synced keys of `requests` for the next exchange, which
    /// reads their totals, without deciding.
    pub(in crate::decision) fn touch(&self, now_ms: u64, requests: &[LimitRequest], synced: usize) {
        if synced == requests.len() {
            let _ = self.table.decide(now_ms, requests, Intent::Check);
            return;
        }
        let synced: Vec<LimitRequest> = requests
            .iter()
            .filter(|r| r.sync_ms() > 0)
            .cloned()
            .collect();
        let _ = self.table.decide(now_ms, &synced, Intent::Check);
    }
}
