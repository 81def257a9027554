//! Errors of the substrate. Every failure a user, a file or the machine can cause is one of these
//! variants; the substrate never panics on bad input.

use std::io;
use std::path::PathBuf;

/// Everything that can go wrong creating, opening or using a pool or one of its allocators.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PoolError {
    /// An operating-system call on a pool file failed.
    #[error("I/O error on {path}: {source}")]
    Io {
        /// The file or directory involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// A node file does not start with the numakv pool magic: not a pool, or overwritten.
    #[error("{path}: not a numakv pool file (bad magic)")]
    BadMagic {
        /// The offending file.
        path: PathBuf,
    },
    /// The pool was written by another on-media format version.
    #[error("{path}: pool format version {found}, this build reads version {expected}")]
    FormatVersion {
        /// The offending file.
        path: PathBuf,
        /// Version stored in the file.
        found: u32,
        /// Version this build understands.
        expected: u32,
    },
    /// The header's checksum does not match its contents.
    #[error("{path}: header checksum mismatch (stored {stored:#010x}, computed {computed:#010x})")]
    ChecksumMismatch {
        /// The offending file.
        path: PathBuf,
        /// Checksum stored in the header.
        stored: u32,
        /// Checksum of the header bytes as read.
        computed: u32,
    },
    /// The store was created by another engine, or another format version of the same engine.
    #[error("store holds engine {found_name} v{found_version}, expected {expected_name} v{expected_version}")]
    EngineMismatch {
        /// Engine the caller asked for.
        expected_name: String,
        /// Engine format version the caller asked for.
        expected_version: u32,
        /// Engine recorded in the store.
        found_name: String,
        /// Engine format version recorded in the store.
        found_version: u32,
    },
    /// Node files of two different stores were mixed in one directory.
    #[error("{path}: belongs to store {found}, but node 0 belongs to store {expected}")]
    StoreMismatch {
        /// The offending file.
        path: PathBuf,
        /// UUID recorded in node 0.
        expected: String,
        /// UUID recorded in this file.
        found: String,
    },
    /// A node file the store needs is missing.
    #[error("{path}: node file missing (store has {nodes} nodes)")]
    MissingNodeFile {
        /// The path that should exist.
        path: PathBuf,
        /// Node count recorded in node 0.
        nodes: usize,
    },
    /// A node file that the store does not account for is present.
    #[error("{path}: unexpected node file (store has {nodes} nodes)")]
    UnexpectedNodeFile {
        /// The extra file.
        path: PathBuf,
        /// Node count recorded in node 0.
        nodes: usize,
    },
    /// A node file is shorter than its header says.
    #[error("{path}: truncated: {found} bytes, header says {expected}")]
    Truncated {
        /// The offending file.
        path: PathBuf,
        /// Size the header records.
        expected: u64,
        /// Size found on disk.
        found: u64,
    },
    /// A structure read from the pool violates an invariant.
    #[error("corrupted pool: {what}")]
    Corrupted {
        /// Which invariant is violated, and where.
        what: String,
    },
    /// The pool (or the given node of it) has no room for the request. The pool stays usable.
    #[error("out of persistent memory on node {node}: {requested} bytes requested")]
    OutOfSpace {
        /// Node that ran out.
        node: usize,
        /// Bytes asked for.
        requested: u64,
    },
    /// The store directory already holds a pool.
    #[error("{path}: a pool already exists here")]
    AlreadyExists {
        /// The directory.
        path: PathBuf,
    },
    /// Another handle (this process or another) has the store open.
    #[error("{path}: store is locked by another open handle")]
    Locked {
        /// The lock file.
        path: PathBuf,
    },
    /// A configuration value or argument is out of range.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A persistent pointer does not point into the pool, or not at an object of the asked type.
    #[error("invalid persistent pointer {ptr}: {why}")]
    BadPointer {
        /// The pointer, formatted.
        ptr: String,
        /// Why it is rejected.
        why: &'static str,
    },
    /// More threads than an allocator's persistent per-thread structures were sized for.
    #[error("thread id {tid} exceeds the {max} per-thread slots this allocator was created with")]
    TooManyThreads {
        /// The calling thread's dense id.
        tid: usize,
        /// Slots available.
        max: usize,
    },
    /// A NUMA call failed.
    #[error(transparent)]
    Numa(#[from] numakv_numa::NumaError),
}

impl PoolError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: io::Error) -> Self {
        PoolError::Io { path: path.into(), source }
    }

    pub(crate) fn corrupted(what: impl Into<String>) -> Self {
        PoolError::Corrupted { what: what.into() }
    }
}

/// Result alias of the substrate.
pub type Result<T, E = PoolError> = std::result::Result<T, E>;
