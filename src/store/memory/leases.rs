//! Concurrency slots in process: a count of slots held per key.
//!
//! Used when no Redis is configured, and as `on_error: local`'s fallback
//! while Redis cannot take a slot. Keys are spread over sharded maps by the
//! process's keyed hash, like the counters; a key's entry is removed when
//! its last slot is given back, so memory holds only keys with requests in
//! flight. Each operation touches one key under one shard lock: a request
//! with several concurrency limits takes them one after the other and gives
//! back what it took when a later one is full.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::limit::concurrency;

const SHARDS: usize = 16;

/// Slots held per key, in process.
#[derive(Debug)]
pub struct MemoryLeases {
    hasher: RandomState,
    shards: Box<[Mutex<HashMap<String, u64>>]>,
}

impl Default for MemoryLeases {
    fn default() -> Self {
        Self::new()
    }
}

/// What taking a slot answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Taken {
    /// A slot is now held; this many are still free.
    Held {
        /// Slots left after this one.
        free: u64,
    },
    /// Every slot is held; none was taken.
    Full,
}

impl MemoryLeases {
    /// An empty table.
    pub fn new() -> Self {
        Self {
            hasher: RandomState::new(),
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
        }
    }

    fn shard(&self, key: &str) -> MutexGuard<'_, HashMap<String, u64>> {
        // SHARDS is a power of two; the truncation keeps the low bits.
        #[allow(clippy::cast_possible_truncation)]
        let i = (self.hasher.hash_one(key) as usize) & (SHARDS - 1);
        // A panic elsewhere cannot leave a count half-written: each
        // operation is one insert or one remove.
        self.shards[i]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes one of `cap` slots of `key` if one is free.
    pub fn acquire(&self, key: &str, cap: u64) -> Taken {
        let mut shard = self.shard(key);
        // One lookup; the key is copied only for a caller holding none.
        let held = match shard.get_mut(key) {
            Some(n) if concurrency::admits(*n, cap) => {
                *n += 1;
                *n
            }
            Some(_) => return Taken::Full,
            None if concurrency::admits(0, cap) => {
                shard.insert(key.to_owned(), 1);
                1
            }
            None => return Taken::Full,
        };
        Taken::Held { free: cap - held }
    }

    /// Gives back one slot of `key`; nothing when it holds none.
    pub fn release(&self, key: &str) {
        let mut shard = self.shard(key);
        match shard.get_mut(key) {
            Some(n) if *n > 1 => *n -= 1,
            Some(_) => {
                shard.remove(key);
            }
            None => {}
        }
    }

    /// Slots of `key` held now.
    pub fn held(&self, key: &str) -> u64 {
        self.shard(key).get(key).copied().unwrap_or(0)
    }

    /// Keys with a slot held, all limits together.
    pub fn keys(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(PoisonError::into_inner).len())
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_at_the_cap_and_empty_after_release() {
        let t = MemoryLeases::new();
        assert_eq!(t.acquire("k", 2), Taken::Held { free: 1 });
        assert_eq!(t.acquire("k", 2), Taken::Held { free: 0 });
        assert_eq!(t.acquire("k", 2), Taken::Full);
        t.release("k");
        assert_eq!(t.held("k"), 1);
        t.release("k");
        t.release("k");
        assert_eq!((t.held("k"), t.keys()), (0, 0));
    }
}
