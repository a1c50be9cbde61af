//! What a simulation is asked to do, and how it can fail.

use std::path::PathBuf;

use http::HeaderName;

/// The shape of the input lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputFormat {
    /// nginx/Apache combined log format, with optional extra quoted fields.
    Combined,
    /// tollgate's own JSON access log, written with `access_log.replay: true`.
    Tollgate,
    /// One JSON object per line: `ts, method, host, path, peer, headers`.
    Jsonl,
}

impl InputFormat {
    /// The name of the format, as `--input` spells it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Combined => "combined",
            Self::Tollgate => "tollgate",
            Self::Jsonl => "jsonl",
        }
    }
}

/// The report's form.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OutputFormat {
    /// Text for a terminal.
    #[default]
    Table,
    /// JSON with stable field names.
    Json,
    /// One self-contained HTML page with a chart per route.
    Html,
}

/// A simulation to run.
#[derive(Debug, Clone)]
pub struct Options {
    /// The configuration whose limits are simulated.
    pub config: PathBuf,
    /// Logs to replay, in order (`.gz` files are read through gzip).
    pub logs: Vec<PathBuf>,
    /// A second configuration, replayed beside the first to compare.
    pub against: Option<PathBuf>,
    /// The input format; detected from the first non-empty line if `None`.
    pub input: Option<InputFormat>,
    /// Combined format: the extra quoted fields after the user agent, in
    /// order, and the header each one becomes (`-` for none).
    pub fields: Vec<HeaderName>,
    /// The `Host` of requests whose line does not name one.
    pub host: Option<String>,
    /// Offenders listed per route and per limit.
    pub top: usize,
    /// Bad lines shown (all are counted).
    pub show_bad: usize,
    /// Show a progress bar (stderr is a terminal).
    pub progress: bool,
    /// Write every request's decision here, one JSON object a line.
    pub decisions: Option<PathBuf>,
}

impl Options {
    /// Options for `config` and `logs`, the rest at their defaults.
    pub fn new(config: impl Into<PathBuf>, logs: Vec<PathBuf>) -> Self {
        Self {
            config: config.into(),
            logs,
            against: None,
            input: None,
            fields: Vec::new(),
            host: None,
            top: 10,
            show_bad: 5,
            progress: false,
            decisions: None,
        }
    }
}

/// Why a simulation could not run.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// A configuration does not load.
    #[error("{path}: {errors}")]
    Config {
        /// The file.
        path: String,
        /// Every problem in it, one per line.
        errors: crate::config::load::ConfigErrors,
    },
    /// A log cannot be opened or read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// What failed.
        source: std::io::Error,
    },
    /// The gateway cannot be built for replay.
    #[error("cannot build the gateway: {0}")]
    Start(#[from] crate::pipeline::StartError),
}

impl SimError {
    /// `path` (a file, or an option that stands for one) cannot be read
    /// or written.
    pub(crate) fn io(path: impl std::fmt::Display, source: std::io::Error) -> Self {
        Self::Io {
            path: path.to_string(),
            source,
        }
    }
}
