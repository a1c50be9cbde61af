//! Failovers followed, by reason: what `follow` moved the pool for, and
//! the sign (a closed connection, no reply) that sent it to look. Shared by
//! the pool's link watchers (`clients`) and `follow`, so neither imports
//! the other for it; exported as `tollgate_store_failovers_total`.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicI64, AtomicU8, Ordering};

use prometheus_client::metrics::counter::Counter;

/// Why the gateway left a server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailoverReason {
    /// The sentinels named another master.
    Switch,
    /// The server gave no reply within the bound.
    NoReply,
    /// The connection closed.
    Closed,
}

impl FailoverReason {
    /// Every reason, in the order of [`Self::index`].
    pub const ALL: [FailoverReason; 3] = [
        FailoverReason::Switch,
        FailoverReason::NoReply,
        FailoverReason::Closed,
    ];

    /// The `reason` label of `tollgate_store_failovers_total`.
    pub fn label(self) -> &'static str {
        match self {
            FailoverReason::Switch => "switch",
            FailoverReason::NoReply => "no_reply",
            FailoverReason::Closed => "closed",
        }
    }

    /// Position in [`Self::ALL`].
    pub fn index(self) -> usize {
        match self {
            FailoverReason::Switch => 0,
            FailoverReason::NoReply => 1,
            FailoverReason::Closed => 2,
        }
    }

    fn from_u8(v: u8) -> Option<Self> {
        Self::ALL.get(usize::from(v).checked_sub(1)?).copied()
    }
}

/// Failovers followed, by reason, and the reason the next move will be
/// counted under.
#[derive(Debug, Default)]
pub struct Failovers {
    counts: [AtomicI64; 3],
    /// 0, or 1 + the index of the sign that sent the gateway to the
    /// sentinels (a closed connection, no reply), until a move uses it.
    hint: AtomicU8,
    /// `tollgate_store_failovers_total`, once known.
    counters: OnceLock<[Counter; 3]>,
}

impl Failovers {
    /// Mirrors the counts in `counters` from now on.
    pub fn export(&self, counters: [Counter; 3]) {
        for reason in FailoverReason::ALL {
            let n = self.counts[reason.index()].load(Ordering::Relaxed);
            counters[reason.index()].inc_by(u64::try_from(n).unwrap_or(0));
        }
        let _ = self.counters.set(counters);
    }

    /// Failovers followed for `reason` so far.
    pub fn count(&self, reason: FailoverReason) -> i64 {
        self.counts[reason.index()].load(Ordering::Relaxed)
    }

    pub(super) fn add(&self, reason: FailoverReason) {
        self.counts[reason.index()].fetch_add(1, Ordering::Relaxed);
        if let Some(c) = self.counters.get() {
            c[reason.index()].inc();
        }
    }

    /// A sign that the master may be lost; the move it leads to is counted
    /// under it. The first sign stands until a move, or until a call is
    /// answered ([`Self::answered`]).
    pub(super) fn hint(&self, reason: FailoverReason) {
        let v = u8::try_from(reason.index() + 1).unwrap_or(0);
        let _ = self
            .hint
            .compare_exchange(0, v, Ordering::Relaxed, Ordering::Relaxed);
    }

    /// A call was answered: the sign, if any, led nowhere.
    pub(super) fn answered(&self) {
        if self.hint.load(Ordering::Relaxed) != 0 {
            self.hint.store(0, Ordering::Relaxed);
        }
    }

    pub(super) fn take_hint(&self) -> Option<FailoverReason> {
        FailoverReason::from_u8(self.hint.swap(0, Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_sign_names_the_move() {
        let f = Failovers::default();
        f.hint(FailoverReason::Closed);
        f.hint(FailoverReason::NoReply);
        assert_eq!(f.take_hint(), Some(FailoverReason::Closed));
        assert_eq!(f.take_hint(), None);
    }
}
