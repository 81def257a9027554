//! numakv: NUMA-aware persistent-memory indexes behind one API.
//!
//! This is the crate users depend on. A [`Store`] is a directory of node files (one per NUMA
//! node) holding one engine's index; [`Store::create`] picks the engine ([`EngineKind`]) and the
//! store's shape ([`Options`]), [`Store::open`] reads the engine from the store's header and
//! recovers the store if it was not closed cleanly. Either way the store is used through
//! [`dyn Index`](Index): `insert`, `upsert`, `update`, `get`, `remove`, `scan`, `stats`, `check`.
//!
//! Keys are `u64` in `1..=u64::MAX-1` (0 and `u64::MAX` are reserved); values are any `u64`.
//!
//! ```
//! use numakv::{EngineKind, Options, PersistMode, Store};
//!
//! let dir = tempfile::tempdir()?;
//! let opts = Options::default().nodes(2).capacity_per_node(32 << 20).mode(PersistMode::Eadr);
//! let store = Store::create(dir.path(), EngineKind::FastFair, opts)?;
//! for k in 1..=100 {
//!     store.insert(k, k * 10)?;
//! }
//! assert!(store.update(5, 55)?);
//! assert!(store.remove(6)?);
//! assert_eq!(store.get(6)?, None);
//! store.close()?;
//!
//! let store = Store::open(dir.path())?;
//! let info = store.inspect()?;
//! assert_eq!((info.engine, info.nodes, info.was_clean), (EngineKind::FastFair, 2, true));
//! assert_eq!(store.fsck()?.entries, 99);
//! store.close()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Errors are layered: [`Error`] wraps [`numakv_index::Error`], which wraps the substrate's
//! [`PoolError`]; [`Error::is_corruption`] tells a damaged store from a failed request.

#![warn(missing_docs)]

mod bytes_store;
mod error;
mod options;
mod registry;
pub mod size;
mod store;

pub use bytes_store::BytesStore;
pub use error::{Error, Result};
pub use numakv_bytes::{
    BatchOutcome, ByteMap, Scan as BytesScan, WriteBatch, MAX_KEY_LEN, MAX_VALUE_LEN,
};
pub use options::{Options, DEFAULT_CAPACITY};
pub use registry::{EngineKind, EngineOptions, OptionKey};
pub use store::{NodeSpace, Store, StoreInfo, StoreKind};

pub use numakv_fastfair::FastFairOptions;
pub use numakv_index::Error as IndexError;
pub use numakv_index::{
    check_key, CheckReport, EngineStats, Index, RecoveryReport, MAX_KEY, MIN_KEY,
};
pub use numakv_nobtree::{MigrationOptions, NobtreeOptions};
pub use numakv_pmem::alloc::nsm::NsmMode;
pub use numakv_pmem::{Header, LatencyModel, PersistMode, PoolError, SimMode};
