//! Limiter stores: where counters live.
//!
//! [`Store`] is the one trait every store implements (`contract`, with
//! [`StoreError`]); [`memory`] keeps state in process and [`redis`] shares it
//! between gateway instances. Both pass the same conformance table
//! (`tests/limiter.rs`), driven with an injected time: `now_ms` is an
//! argument, never read inside a store. [`keys`] names every key tollgate
//! writes to a store.
//!
//! Around Redis: [`Breaker`] stops calling it after repeated failures and
//! probes it in the background; [`heartbeat`] counts the live gateway
//! instances, which `on_error: local` divides each limit by. Both live in
//! [`redis`] and are named here too.
//!
//! This file only declares the family and names its public items; every
//! item lives in a file of its own, so imports run one way, from here down.

mod contract;
pub mod keys;
pub mod memory;
pub mod redis;

pub use contract::{Store, StoreError};
pub use memory::MemoryStore;
pub use redis::RedisStore;
pub use redis::breaker::{Breaker, BreakerState};
pub use redis::heartbeat;
