//! The facade's error: everything [`numakv_index::Error`] can say (and through it the substrate's
//! [`PoolError`]), plus what only the facade can get wrong — a store whose engine this build does
//! not know, options for the wrong engine, an engine option that does not parse.

use std::path::PathBuf;

use numakv_pmem::PoolError;

/// Everything a [`crate::Store`] operation can fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An index operation, `create`, `open`, `check` or the substrate failed.
    #[error(transparent)]
    Index(#[from] numakv_index::Error),
    /// The directory does not exist or holds no store (no `node0.pm`).
    #[error("{dir}: no numakv store here ({why})")]
    NoStore {
        /// The directory given.
        dir: PathBuf,
        /// What is missing.
        why: &'static str,
    },
    /// A name that is not one of [`crate::EngineKind::all`].
    #[error("unknown engine {name:?} (known engines: {known})")]
    UnknownEngine {
        /// The name given.
        name: String,
        /// The engines this build knows, comma-separated.
        known: String,
    },
    /// The store's header names an engine this build does not know.
    #[error("{path}: store was created by engine {name:?}, which this build does not know (known engines: {known})")]
    UnknownStoredEngine {
        /// The node file whose header was read.
        path: PathBuf,
        /// Engine name in the header.
        name: String,
        /// The engines this build knows, comma-separated.
        known: String,
    },
    /// [`crate::EngineOptions`] of one engine were given for a store of another.
    #[error("options for engine {given} given for a {store} store")]
    OptionsMismatch {
        /// Engine of the store.
        store: crate::EngineKind,
        /// Engine the options belong to.
        given: crate::EngineKind,
    },
    /// The store holds the other kind of data: a bytes store opened as an integer
    /// [`crate::Store`], or an integer store opened as a [`crate::BytesStore`].
    #[error("{dir}: this is a {found} store, not a {wanted} store")]
    StoreKind {
        /// The store directory.
        dir: PathBuf,
        /// What the header records.
        found: crate::StoreKind,
        /// What the caller opened it as.
        wanted: crate::StoreKind,
    },
    /// An engine option given as text (`key=value`) is unknown or does not parse.
    #[error("engine {engine}: {message}")]
    BadEngineOption {
        /// The engine whose options were being set.
        engine: crate::EngineKind,
        /// What is wrong, naming the option and the accepted values.
        message: String,
    },
}

impl From<PoolError> for Error {
    fn from(e: PoolError) -> Self {
        Error::Index(numakv_index::Error::Pool(e))
    }
}

impl Error {
    /// The substrate error underneath, if this is one.
    pub fn pool_error(&self) -> Option<&PoolError> {
        match self {
            Error::Index(numakv_index::Error::Pool(e)) => Some(e),
            _ => None,
        }
    }

    /// True when the store's files or structure are damaged: a bad header (magic, checksum,
    /// format version, fields), a truncated, missing or foreign node file, or a violated
    /// invariant found by recovery or `check()`. Tools use it to tell "your store is broken"
    /// from "your request failed".
    pub fn is_corruption(&self) -> bool {
        match self {
            Error::Index(numakv_index::Error::Corrupted { .. }) => true,
            Error::Index(numakv_index::Error::Pool(e)) => matches!(
                e,
                PoolError::BadMagic { .. }
                    | PoolError::FormatVersion { .. }
                    | PoolError::ChecksumMismatch { .. }
                    | PoolError::StoreMismatch { .. }
                    | PoolError::MissingNodeFile { .. }
                    | PoolError::UnexpectedNodeFile { .. }
                    | PoolError::Truncated { .. }
                    | PoolError::Corrupted { .. }
                    | PoolError::BadPointer { .. }
            ),
            _ => false,
        }
    }

    /// True when the pool ran out of space (the store stays usable and readable).
    pub fn is_out_of_space(&self) -> bool {
        matches!(self, Error::Index(e) if e.is_out_of_space())
    }
}

/// Result of facade operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;
