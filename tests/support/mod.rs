//! Shared test support: real Redis servers, upstreams and gateways on free
//! loopback ports, cleaned up on drop.
#![allow(dead_code)]

pub mod admin;
pub mod binary;
pub mod gateway;
pub mod pki;
pub mod redis;
pub mod redis_topologies;
pub mod skip;
pub mod targets;
pub mod wait;
