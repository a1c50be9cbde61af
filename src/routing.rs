//! routing (to be written).
