//! What loading reports: every [`ConfigError`] found in a file, with its
//! field path and position, gathered in [`ConfigErrors`].

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
