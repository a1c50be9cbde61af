//! headers (to be written).
