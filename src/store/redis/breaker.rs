//! A circuit breaker in front of Redis (docs/design.md#breaker-and-recovery).
//!
//! While Redis is merely unreachable the store already answers at once (the
//! link is known to be down). A Redis that is up but slow, or a network that
//! drops packets, is different: every decision would wait out the whole
//! command timeout. The breaker turns that into no wait at all: after
//! `failures` consecutive failures or timeouts it **opens**, decisions skip
//! Redis and go straight to the failure policy, and a background task
//! ([`Breaker::probe`]) sends `PING` every `probe_interval`. The first answer
//! closes the breaker, so decisions return to Redis within one probe
//! interval plus the client's reconnect delay of Redis coming back (both
//! well under the 2 s the design asks for with the defaults).
//!
//! There is no half-open state letting real decisions through as probes: a
//! `PING` is cheap, cannot consume quota, and keeps request latency flat.
//! The price: a server that answers `PING` but not decisions (a script
//! stuck `BUSY`) makes the breaker cycle, costing `failures` timed-out
//! decisions per probe interval.
//!
//! Only outages count (`Unavailable`, `Timeout`). A garbage reply
//! (`Protocol`) is about one key, not the server: it goes through the
//! failure policy for that request but does not open the breaker for all.
//! A refusal (`Refused`: `NOPERM`, `NOAUTH`) comes back at once and would
//! not heal while the breaker waits, and a `PING` may well be allowed when
//! the script is not: it is reported as a fault (`redis::fault`) instead.
//!
//! Each state change is logged once, and the state is readable through
//! [`Breaker::state`] for metrics.
//!
//! In a Cluster each node has a breaker of its own, in the store
//! (`nodes`), so one node's faults stop only its slots; the store-wide
//! breaker is then built with [`Breaker::per_node`] and never opens.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use prometheus_client::metrics::gauge::Gauge;
use tracing::{info, warn};

use super::RedisStore;
use crate::config::BreakerConfig;
use crate::store::contract::StoreError;

/// Whether decisions go to Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    /// Decisions go to Redis.
    Closed,
    /// Redis failed repeatedly; decisions use the failure policy while a
    /// background probe waits for it.
    Open,
}

/// Counts consecutive Redis failures and opens after too many.
#[derive(Debug)]
pub struct Breaker {
    config: BreakerConfig,
    consecutive: AtomicU32,
    open: AtomicBool,
    /// A Cluster's: the store breaks per node, this one never opens.
    per_node: bool,
    /// `tollgate_store_breaker_open`, once the gateway's metrics are known.
    gauge: OnceLock<Gauge<i64, AtomicI64>>,
}

impl Breaker {
    /// A closed breaker.
    pub fn new(config: BreakerConfig) -> Self {
        Self {
            config,
            consecutive: AtomicU32::new(0),
            open: AtomicBool::new(false),
            per_node: false,
            gauge: OnceLock::new(),
        }
    }

    /// The breaker of a Cluster store, whose nodes break one by one in the
    /// store (`RedisStore::break_per_node`): it records nothing and never
    /// opens.
    pub fn per_node(config: BreakerConfig) -> Self {
        Self {
            per_node: true,
            ..Self::new(config)
        }
    }

    /// Mirrors the state in `gauge` (1 open, 0 closed) from now on.
    pub fn export(&self, gauge: Gauge<i64, AtomicI64>) {
        gauge.set(i64::from(!self.allows()));
        let _ = self.gauge.set(gauge);
    }

    fn show(&self, open: bool) {
        if let Some(g) = self.gauge.get() {
            g.set(i64::from(open));
        }
    }

    /// The current state.
    pub fn state(&self) -> BreakerState {
        if self.open.load(Ordering::Acquire) {
            BreakerState::Open
        } else {
            BreakerState::Closed
        }
    }

    /// Whether a decision may call Redis now.
    pub fn allows(&self) -> bool {
        !self.open.load(Ordering::Acquire)
    }

    /// Records the outcome of one Redis call.
    pub fn record(&self, result: Result<(), &StoreError>) {
        if self.per_node {
            return;
        }
        match result {
            Ok(()) => self.consecutive.store(0, Ordering::Relaxed),
            // Answered at once, by a server that is there: waiting would
            // not help, and the probe's PING could not tell when it does.
            Err(StoreError::Protocol(_) | StoreError::Refused(_)) => {}
            Err(e @ (StoreError::Unavailable(_) | StoreError::Timeout)) => {
                let n = self.consecutive.fetch_add(1, Ordering::Relaxed) + 1;
                if n >= self.config.failures && !self.open.swap(true, Ordering::AcqRel) {
                    self.show(true);
                    warn!(
                        error = %e,
                        failures = n,
                        probe_every = ?self.config.probe_interval,
                        "redis breaker open: not calling redis until a probe answers"
                    );
                }
            }
        }
    }

    /// Closes the breaker after a probe was answered.
    fn close(&self) {
        self.consecutive.store(0, Ordering::Relaxed);
        if self.open.swap(false, Ordering::AcqRel) {
            self.show(false);
            info!("redis breaker closed: redis answers again");
        }
    }

    /// Runs forever: while the breaker is open, pings `store` every probe
    /// interval and closes it on the first answer. Spawn it; abort it (or
    /// drop the runtime) to stop.
    pub async fn probe(self: Arc<Self>, store: Arc<RedisStore>) {
        let mut tick = tokio::time::interval(self.config.probe_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // A probe waits for a slow server at most this long.
        let bound = self.config.probe_interval.max(Duration::from_millis(100));
        loop {
            tick.tick().await;
            if self.allows() {
                continue;
            }
            if store.ping(bound).await.is_ok() {
                self.close();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_after_consecutive_outages_only() {
        let b = Breaker::new(BreakerConfig {
            failures: 3,
            probe_interval: Duration::from_millis(10),
        });
        let down = StoreError::Timeout;
        b.record(Err(&down));
        b.record(Err(&down));
        b.record(Ok(()));
        b.record(Err(&down));
        b.record(Err(&down));
        assert_eq!(
            b.state(),
            BreakerState::Closed,
            "a success resets the count"
        );
        for _ in 0..10 {
            b.record(Err(&StoreError::Protocol("garbage".into())));
        }
        assert_eq!(b.state(), BreakerState::Closed, "garbage is not an outage");
        b.record(Err(&StoreError::Unavailable("down".into())));
        assert_eq!(b.state(), BreakerState::Open);
        assert!(!b.allows());
        b.close();
        assert_eq!(b.state(), BreakerState::Closed);
        b.record(Err(&down));
        assert!(b.allows(), "closing resets the count");
    }
}
