//! Deciding a request against its limits: the limiter in front of the
//! store with its failure policy (`on_error`) and the deny cache
//! ([`limiter`]), shadow limits decided beside the enforced ones
//! ([`shadow`]), and `sync` mode's in-process counts of the fleet
//! ([`sync`]); beside the limiter, the way back to Redis after an outage
//! (`resync`) and `sync` mode's exchange task (`exchange`).

pub mod concurrency;
mod exchange;
pub mod limiter;
mod resync;
pub mod settle;
pub mod shadow;
pub mod slots;
pub mod sync;
