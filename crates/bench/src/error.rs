//! The benchmark driver's error type.

use std::path::PathBuf;

/// Everything configuring, running or reporting a benchmark can fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BenchError {
    /// A flag or configuration value that cannot work (bad distribution, zero threads, ...).
    #[error("invalid configuration: {0}")]
    Config(String),
    /// `--engines` named something no target answers to.
    #[error("unknown engine {name:?} (available: {available})")]
    UnknownTarget {
        /// The name asked for.
        name: String,
        /// The names on offer, comma-separated.
        available: String,
    },
    /// `--workload` named no preset.
    #[error("unknown workload {name:?} (see the preset list: {available})")]
    UnknownWorkload {
        /// The name asked for.
        name: String,
        /// The preset names, comma-separated.
        available: String,
    },
    /// `repro` named no reproduction.
    #[error("unknown reproduction {name:?} (available: {available})")]
    UnknownRepro {
        /// The name asked for.
        name: String,
        /// The reproduction names, comma-separated.
        available: String,
    },
    /// An external program a reproduction drives is not installed (`repro redis`:
    /// `redis-server`, `redis-benchmark`).
    #[error("{tool} is not installed or not on PATH: {hint}")]
    MissingTool {
        /// The program's name.
        tool: String,
        /// How to get it.
        hint: String,
    },
    /// An index operation, open or check failed.
    #[error(transparent)]
    Index(#[from] numakv_index::Error),
    /// Topology or thread placement failed.
    #[error(transparent)]
    Numa(#[from] numakv_numa::NumaError),
    /// Reading or writing a file failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A target (engine or peer) failed in a way of its own.
    #[error("{target}: {message}")]
    Target {
        /// The target's name.
        target: String,
        /// What went wrong.
        message: String,
    },
    /// Encoding the JSON report failed.
    #[error("json: {0}")]
    Json(#[from] serde_json::Error),
    /// Drawing a plot failed.
    #[error("plot {}: {message}", path.display())]
    Plot {
        /// The SVG file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// A worker thread panicked.
    #[error("worker thread panicked: {0}")]
    Panic(String),
}

impl BenchError {
    /// Wraps an I/O error with the path it concerns.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> BenchError {
        BenchError::Io { path: path.into(), source }
    }
}

/// Result of the benchmark driver.
pub type Result<T, E = BenchError> = std::result::Result<T, E>;
