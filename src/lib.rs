//! tollgate: a rate-limiting reverse-proxy HTTP gateway.
//!
//! For each request the gateway makes the target canonical ([`target`]),
//! matches a route ([`routing`]), works out who is calling ([`identity`]),
//! asks a limiter shared by every gateway instance ([`limit`] over a
//! [`store`]) and then forwards the request upstream ([`proxy`]) or answers
//! `429 Too Many Requests` with the IETF rate-limit headers ([`headers`]).
//! [`pipeline`] runs those phases for one request; [`run`] builds the
//! gateway and serves it ([`server`]). The binary in `main.rs` only parses
//! the command line, sets up logging, loads the configuration and calls
//! [`run`]; the integration tests call [`server::start`], which `run` is
//! made of. See `docs/request-lifecycle.md` for the phase chart.
#![forbid(unsafe_code)]

#[cfg(feature = "gateway")]
pub mod admin;
pub mod clock;
pub mod config;
pub mod cors;
pub mod decision;
pub mod grpc;
pub mod guard;
pub mod headers;
pub mod http1;
pub mod identity;
pub mod jwt;
pub mod layer;
pub mod limit;
#[cfg(feature = "gateway")]
pub mod listener;
pub mod logs;
pub mod metrics;
pub mod pipeline;
pub mod plans;
pub mod problem;
pub mod proxy;
#[cfg(feature = "gateway")]
pub mod reload;
pub mod request_id;
pub mod routing;
#[cfg(feature = "gateway")]
pub mod server;
#[cfg(feature = "gateway")]
pub mod simulate;
pub mod store;
pub mod target;
pub mod telemetry;
pub mod tls;
pub mod top;
pub mod upgrade;

pub use config::Config;
pub use layer::RateLimitLayer;
pub use pipeline::Gateway;
#[cfg(feature = "gateway")]
pub use server::run;
