//! proxy (to be written).
