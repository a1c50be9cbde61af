//! Deciding a request against its limits: the limiter in front of the
//! store with its failure policy (`on_error`) and the deny cache
//! ([`limiter`]), shadow limits decided beside the enforced ones
//! ([`shadow`]), and `sync` mode's in-process counts of the fleet
//! ([`sync`]).

pub mod limiter;
pub mod shadow;
pub mod sync;
