//! Named pools of targets (`upstreams` in the configuration): the
//! `balancer` (endpoints, picking, ejection) with its retry `budget`, one
//! request's `tries` over a pool's targets, target names kept `resolve`d,
//! and active `health` checks. No file circle: the children import each
//! other, never `upstreams.rs`.

pub(super) mod balancer;
mod budget;
pub(super) mod health;
pub mod resolve;
pub(super) mod tries;
