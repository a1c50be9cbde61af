//! Serde mirror of the YAML file (to be written).
