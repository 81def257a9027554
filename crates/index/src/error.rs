//! Index-level errors: the key/value contract's violations, engine invariants, and the substrate's
//! [`PoolError`] underneath.

use numakv_pmem::PoolError;

/// Everything an index operation, `create`, `open` or `check` can fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A key outside `1..=u64::MAX-1` (0 and `u64::MAX` are sentinels). Nothing was changed.
    #[error("invalid key {0}: keys must be in 1..=u64::MAX-1 (0 and u64::MAX are reserved)")]
    InvalidKey(u64),
    /// An empty byte-string key (byte-string stores take keys of 1 B ..= 1 KiB). Nothing was
    /// changed.
    #[error("empty key: byte-string keys must be 1 to {max} bytes long")]
    EmptyKey {
        /// The longest key accepted, in bytes.
        max: usize,
    },
    /// A byte-string key or value longer than the store accepts. Nothing was changed.
    #[error("{what} of {len} bytes is too large: the limit is {limit} bytes")]
    TooLarge {
        /// `"key"` or `"value"`.
        what: &'static str,
        /// Its length.
        len: usize,
        /// The largest length accepted.
        limit: usize,
    },
    /// The substrate failed: I/O, a bad pool file, out of space, ...
    #[error(transparent)]
    Pool(#[from] PoolError),
    /// The store's persistent structure violates an invariant (found by `check()` or recovery).
    #[error("{engine}: invariant violated: {invariant}")]
    Corrupted {
        /// The engine that found it.
        engine: &'static str,
        /// Which invariant, in words a developer can grep for in docs/design.md.
        invariant: String,
    },
    /// Engine options that cannot work (e.g. a node size that holds no entry).
    #[error("invalid options: {0}")]
    InvalidOptions(String),
    /// The engine does not offer this on this store (e.g. a persistence mode it does not claim).
    #[error("unsupported: {0}")]
    Unsupported(String),
}

impl Error {
    /// Shorthand for [`Error::Corrupted`].
    pub fn corrupted(engine: &'static str, invariant: impl Into<String>) -> Error {
        Error::Corrupted { engine, invariant: invariant.into() }
    }

    /// True when the pool ran out of space (the store stays usable and readable).
    pub fn is_out_of_space(&self) -> bool {
        matches!(self, Error::Pool(PoolError::OutOfSpace { .. }))
    }
}

/// Result of index operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;
