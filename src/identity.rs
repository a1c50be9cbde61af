//! identity (to be written).
