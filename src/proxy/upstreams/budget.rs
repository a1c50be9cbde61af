//! A pool's retry budget: retries at most a share of the requests that
//! could have been retried, over a window, plus a floor a second — so a
//! sick pool is not hit by a storm of retries on top of its load.
//!
//! Every retryable request deposits, so a deposit is one atomic add and
//! nothing else: no lock, no clock. The rare retry does the bookkeeping. It
//! keeps marks — when, how many deposits and retries had been counted by
//! then, at most one a second — and compares the deposits and retries since
//! the newest mark that is at least a window old (or since the start). The
//! span compared is therefore at least the window and at most a second or
//! two longer while retries come; after a quiet spell it is as long as the
//! spell, which keeps the ratio honest and only makes the floor count for
//! more of the past. `tower`'s budget does the same arithmetic but takes a
//! lock and reads the clock on every deposit, a cost every request would pay.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Retries allowed: `floor` plus `ratio` of the deposits over `window`.
#[derive(Debug)]
pub struct RetryBudget {
    deposits: AtomicU64,
    ledger: Mutex<Ledger>,
    window: Duration,
    ratio: f64,
    /// Retries allowed over a window whatever the deposits.
    floor: f64,
}

#[derive(Debug)]
struct Ledger {
    /// `(when, deposits by then, retries by then)`, oldest first.
    marks: VecDeque<(Instant, u64, u64)>,
    retries: u64,
}

impl RetryBudget {
    /// A budget of `ratio` of the requests over `window`, and at least
    /// `min_per_sec` retries a second.
    pub fn new(window: Duration, min_per_sec: u32, ratio: f64) -> Self {
        Self::starting_at(Instant::now(), window, min_per_sec, ratio)
    }

    fn starting_at(start: Instant, window: Duration, min_per_sec: u32, ratio: f64) -> Self {
        Self {
            deposits: AtomicU64::new(0),
            ledger: Mutex::new(Ledger {
                marks: VecDeque::from([(start, 0, 0)]),
                retries: 0,
            }),
            window,
            ratio,
            floor: f64::from(min_per_sec) * window.as_secs_f64(),
        }
    }

    /// Counts one request that could be retried.
    pub fn deposit(&self) {
        self.deposits.fetch_add(1, Ordering::Relaxed);
    }

    /// Takes a retry; false when the budget is spent.
    pub fn withdraw(&self) -> bool {
        self.withdraw_at(Instant::now())
    }

    fn withdraw_at(&self, now: Instant) -> bool {
        let total = self.deposits.load(Ordering::Relaxed);
        let mut l = self.ledger.lock().unwrap_or_else(PoisonError::into_inner);
        // The baseline is the newest mark at least a window old.
        while l
            .marks
            .get(1)
            .is_some_and(|m| now.saturating_duration_since(m.0) >= self.window)
        {
            l.marks.pop_front();
        }
        let (deposits, retries) = l.marks.front().map_or((total, l.retries), |m| {
            (total.saturating_sub(m.1), l.retries.saturating_sub(m.2))
        });
        #[allow(clippy::cast_precision_loss)]
        let allowed = (retries as f64) < self.floor + self.ratio * deposits as f64;
        if allowed {
            l.retries += 1;
        }
        let retries_now = l.retries;
        if l.marks
            .back()
            .is_none_or(|m| now.saturating_duration_since(m.0) >= Duration::from_secs(1))
        {
            l.marks.push_back((now, total, retries_now));
        }
        allowed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_floor_allows_retries_without_deposits_then_the_ratio_rules() {
        let t0 = Instant::now();
        let b = RetryBudget::starting_at(t0, Duration::from_secs(10), 1, 0.2);
        // The floor: 1 a second over 10 s.
        let allowed = (0..20).filter(|_| b.withdraw_at(t0)).count();
        assert_eq!(allowed, 10);
        // 100 deposits buy 20 more.
        for _ in 0..100 {
            b.deposit();
        }
        let allowed = (0..50).filter(|_| b.withdraw_at(t0)).count();
        assert_eq!(allowed, 20);
    }

    #[test]
    fn what_was_spent_a_window_ago_is_forgotten() {
        let t0 = Instant::now();
        let b = RetryBudget::starting_at(t0, Duration::from_secs(10), 1, 0.0);
        let spent = (0..20).filter(|_| b.withdraw_at(t0)).count();
        assert_eq!(spent, 10);
        // A mark a second later, then a window after it the budget is whole
        // again.
        assert!(!b.withdraw_at(t0 + Duration::from_secs(1)));
        let later = t0 + Duration::from_secs(12);
        let allowed = (0..20).filter(|_| b.withdraw_at(later)).count();
        assert_eq!(allowed, 10);
    }
}
