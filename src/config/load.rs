//! File structs → validated [`Config`] (to be written).
use std::path::Path;

use super::Config;

/// One problem in a configuration file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// Field path, e.g. `routes[1].limits[0].window`; empty for the whole file.
    pub path: String,
    /// What is wrong and, where it helps, how to fix it.
    pub message: String,
    /// 1-based line and column of the offending node, when known.
    pub line: Option<usize>,
    /// 1-based column.
    pub column: Option<usize>,
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if !self.path.is_empty() {
            write!(f, "{}: ", self.path)?;
        }
        f.write_str(&self.message)?;
        if let (Some(l), Some(c)) = (self.line, self.column) {
            write!(f, " (line {l}, col {c})")?;
        }
        Ok(())
    }
}

/// Every problem found in a configuration file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl std::fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

/// Parses and validates YAML text.
///
/// # Errors
/// Every problem found, each with its field path and position.
pub fn parse_str(_src: &str) -> Result<Config, ConfigErrors> {
    todo!()
}

/// Reads and validates a configuration file.
///
/// # Errors
/// The file cannot be read, or [`parse_str`] finds problems.
pub fn load_file(path: &Path) -> Result<Config, ConfigErrors> {
    let src = std::fs::read_to_string(path).map_err(|e| {
        ConfigErrors(vec![ConfigError {
            path: String::new(),
            message: format!("cannot read {}: {e}", path.display()),
            line: None,
            column: None,
        }])
    })?;
    parse_str(&src)
}
