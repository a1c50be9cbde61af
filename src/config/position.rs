//! Field path → line/column index (to be written).
