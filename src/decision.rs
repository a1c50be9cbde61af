//! Deciding a request against its limits: the limiter in front of the
//! store with its failure policy (`on_error`) and the deny cache
//! ([`limiter`]), and shadow limits decided beside the enforced ones
//! ([`shadow`]).

pub mod limiter;
pub mod shadow;
