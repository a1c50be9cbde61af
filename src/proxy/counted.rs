//! A byte count shared between a body and whoever settles what it cost
//! (byte quotas: docs/limits.md#byte-quotas). Put in a request's extensions, it is counted
//! by the [`UpstreamBody`](super::UpstreamBody) that forwards the request:
//! each data frame handed to the upstream adds its length.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes counted so far; clones share the count.
#[derive(Debug, Clone, Default)]
pub struct BodyBytes(Arc<AtomicU64>);

impl BodyBytes {
    /// Adds `n` bytes.
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }

    /// The bytes counted so far.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}
