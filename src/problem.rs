//! problem (to be written).
