//! Byte-string keys and values, ordered by memcmp, over any numakv engine.
//!
//! [`Bytes<E>`] is a layer generic over [`Index`] (as Nap is): the engine maps an order-preserving
//! 8-byte prefix of each key ([`layout::index_key`]) to a persistent pointer to the root of a
//! small copy-on-write B+-tree of PM nodes (module `tree`) holding every full key and value that share
//! that prefix, sorted. A prefix with few keys is one leaf (a bucket record); a leaf that outgrows
//! [`TreeLimits`] splits. So every engine — FAST&FAIR, NBTree, NOBtree, F3-tree, NStore, Nap over
//! each — gets byte keys (1 B ..= 1 KiB) and values (0 B ..= 1 MiB) without engine-specific code,
//! and keys that share long prefixes (`key:000000012345`) do not pile into one record.
//!
//! - **Writers** ([`ops`]) build new nodes in fresh NSM blocks, persist them, and publish with
//!   one 8-byte store — a child slot, or the engine's write of the prefix — then retire what they
//!   replaced through an epoch grace period. A rewrite of one leaf inside a tree holds the
//!   prefix's striped lock shared plus the leaf's slot lock; everything else holds it
//!   exclusively.
//! - **Readers** take no lock: pinned in the epoch, they read the root from the engine and
//!   descend in place.
//! - **Scans** ([`Scan`]) walk the engine's scan in batches and each tree in order, lazily,
//!   resuming inside a large tree after its last key.
//! - **Recovery** ([`recovery`]): the engine recovers, then the layer walks it and every tree and
//!   returns every node nothing reaches to the allocator — a crash leaks nothing.
//! - **Write batches** ([`batch`], [`ByteMap::write_batch`]): puts and deletes of several keys,
//!   all or nothing across a crash (a redo/undo log in the pool, finished by the next open).
//! - **Pause points** (feature `failpoints` of numakv-pmem, for tests): `bytes.walk.leaf_done` —
//!   a scan has taken a leaf's pairs and is about to move to the next child;
//!   `bytes.write.leaf_built` — a leaf writer inside a tree has built its new leaf, not yet
//!   published; `bytes.cell.slot_written` — an in-place rewrite of a cell has filled the
//!   inactive slot, the version still names the old one; `bytes.cell.copied` — a reader has
//!   copied a cell's slot and not yet re-checked its version; `bytes.batch.committed` — a
//!   write batch's log is committed, no key written yet; `bytes.batch.applied` — a batch has
//!   written one more key. Fail point `bytes.batch.apply`: the batch's next write fails as if
//!   the pool were out of space (the batch then rolls back).
//!
//! PM format and the crash argument: docs/design.md, "Byte-string layer".
//!
//! ```
//! use numakv_bytes::{ByteMap, Bytes};
//! use numakv_fastfair::FastFair;
//! use numakv_pmem::{Pool, PoolConfig};
//!
//! let pool = Pool::volatile(PoolConfig::new(numakv_bytes::engine_id::<FastFair>(), 16 << 20))?;
//! let b = Bytes::<FastFair>::create(pool, &Default::default())?;
//! b.put(b"user:1", b"hello")?;
//! b.put(b"user:2", b"")?;
//! assert!(!b.insert(b"user:1", b"other")?);
//! assert_eq!(b.get(b"user:1")?.as_deref(), Some(&b"hello"[..]));
//! let keys: Vec<Vec<u8>> = b.scan_prefix(b"user:", 10).map(|r| r.map(|(k, _)| k)).collect::<Result<_, _>>()?;
//! assert_eq!(keys, [b"user:1".to_vec(), b"user:2".to_vec()]);
//! assert!(b.put(b"", b"x").is_err()); // the empty key is refused
//! b.close()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod batch;
mod cell;
pub mod layout;
pub mod ops;
pub mod recovery;
mod scan;
#[cfg(feature = "testkit")]
pub mod testkit;
mod tree;

use std::fmt;
use std::sync::Arc;

use numakv_index::{CheckReport, Engine, EngineStats, Index, RecoveryReport, Result};
use numakv_pmem::alloc::nsm::Nsm;
use numakv_pmem::{EngineId, Pool};

pub use crate::batch::{BatchOutcome, WriteBatch};
pub use crate::cell::CELL_MAX_VALUE;
pub use crate::layout::{MAX_KEY_LEN, MAX_VALUE_LEN};
pub use crate::scan::{prefix_end, Scan};
pub use crate::tree::TreeLimits;

/// Name prefix of a bytes store's engine in the pool header: `bytes-<engine>` (e.g.
/// `bytes-fastfair`, `bytes-nap-nbtree`). Its presence is what makes a store a bytes store.
pub const NAME_PREFIX: &str = "bytes-";

/// The header identity of a bytes store over `E`: name `bytes-<E::NAME>`, `E`'s format version
/// (the layer's own format is the word in [`layout::SLOT_META`]).
pub fn engine_id<E: Engine>() -> EngineId {
    EngineId::new(format!("{NAME_PREFIX}{}", E::NAME), E::FORMAT_VERSION)
}

/// The ordered byte-string map every bytes store offers, object-safe (the facade and the bench
/// hold a `dyn ByteMap`).
///
/// Keys are 1 B ..= [`MAX_KEY_LEN`], ordered by memcmp; values 0 B ..= [`MAX_VALUE_LEN`].
/// Operations are linearizable per key; a successful mutating call is durable when it returns.
pub trait ByteMap: Send + Sync {
    /// The engine underneath (e.g. `"fastfair"`).
    fn engine_name(&self) -> &'static str;
    /// Inserts or overwrites `key → value`.
    fn put(&self, key: &[u8], value: &[u8]) -> Result<()>;
    /// Inserts `key → value` if `key` is absent; `false` (no change) if present.
    fn insert(&self, key: &[u8], value: &[u8]) -> Result<bool>;
    /// Overwrites the value of `key` if present; `false` (no change) if absent.
    fn update(&self, key: &[u8], value: &[u8]) -> Result<bool>;
    /// Removes `key`; `false` if it was absent.
    fn delete(&self, key: &[u8]) -> Result<bool>;
    /// Applies `batch`'s puts and deletes all or nothing, across a crash too: every key and
    /// value is checked before anything is written; a failure part-way (the store is full) rolls
    /// back what was written; a crash after the batch's commit point is rolled forward (or, if it
    /// was rolling back, back) by the next open. Durable when it returns. See [`batch`].
    fn write_batch(&self, batch: &WriteBatch) -> Result<BatchOutcome>;
    /// Replaces `out` with the value of `key` and returns `true`, or returns `false` (`out`
    /// untouched) when absent. Reuses `out`'s buffer: no allocation per call once it is large
    /// enough.
    fn get_into(&self, key: &[u8], out: &mut Vec<u8>) -> Result<bool>;
    /// The value of `key`, if present.
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        let mut v = Vec::new();
        Ok(self.get_into(key, &mut v)?.then_some(v))
    }
    /// Pairs with `start ≤ key < end` (no upper bound when `end` is `None`), ascending, at most
    /// `limit`. The iterator reads the engine in batches; it does not materialise the range.
    fn scan<'a>(&'a self, start: &[u8], end: Option<&[u8]>, limit: usize) -> Scan<'a>;
    /// Pairs whose key starts with `prefix`, ascending, at most `limit`.
    fn scan_prefix<'a>(&'a self, prefix: &[u8], limit: usize) -> Scan<'a> {
        let end = prefix_end(prefix);
        self.scan(prefix, end.as_deref(), limit)
    }
    /// Space and counters: the engine's, plus the layer's buckets.
    fn stats(&self) -> EngineStats;
    /// Structural check of the engine and of every bucket (run while no thread mutates).
    fn check(&self) -> Result<CheckReport>;
    /// The pool the store lives in.
    fn pool(&self) -> &Arc<Pool>;
    /// Clean shutdown through a box (see [`Bytes::close`]).
    fn close_boxed(self: Box<Self>) -> Result<()>;
}

/// Byte-string keys and values over engine `E`; see the [crate docs](crate).
pub struct Bytes<E: Index> {
    index: E,
    pool: Arc<Pool>,
    nsm: Arc<Nsm>,
    stripes: ops::Stripes,
    limits: TreeLimits,
    /// One batch at a time (there is one log slot, [`batch::SLOT_BATCH`]).
    batch_lock: parking_lot::Mutex<()>,
    /// Set when a batch could neither finish nor roll back: writes are refused until the store
    /// is reopened (whose recovery rolls that batch back).
    poisoned: std::sync::OnceLock<String>,
}

impl<E: Index> fmt::Debug for Bytes<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Bytes").field("engine", &self.index.name()).finish_non_exhaustive()
    }
}

impl<E: Index> Bytes<E> {
    /// The engine underneath.
    pub fn index(&self) -> &E {
        &self.index
    }

    /// When a prefix's leaves and inner nodes split ([`TreeLimits`]; the default suits most
    /// stores). Not persisted: any tree shape is valid under any limits.
    pub fn tree_limits(&self) -> TreeLimits {
        self.limits
    }

    /// `Ok` unless a failed batch left the store refusing writes until it is reopened.
    pub(crate) fn writable(&self) -> Result<()> {
        match self.poisoned.get() {
            None => Ok(()),
            Some(why) => Err(numakv_index::Error::Unsupported(format!("writes refused: {why}"))),
        }
    }

    /// Marks the store as refusing writes (the first reason stays).
    pub(crate) fn poison(&self, why: String) {
        let _ = self.poisoned.set(why);
    }

    /// Sets the split limits (tests use tiny ones to grow deep trees from few keys).
    pub fn set_tree_limits(&mut self, limits: TreeLimits) -> Result<()> {
        limits.validate()?;
        self.limits = limits;
        Ok(())
    }
}

impl<E: Engine> Bytes<E> {
    /// Creates the engine and the layer on a fresh pool whose header names
    /// `bytes-<engine>` ([`engine_id`]).
    pub fn create(pool: Arc<Pool>, opts: &E::Options) -> Result<Self> {
        recovery::create(pool, opts)
    }

    /// Opens a bytes store: the engine recovers, then the layer reclaims every bucket the index
    /// does not reach.
    pub fn open(pool: Arc<Pool>, opts: &E::Options) -> Result<(Self, RecoveryReport)> {
        recovery::open(pool, opts)
    }

    /// Clean shutdown: the engine closes (buckets need nothing: each was durable before it was
    /// linked, and the allocator's free lists are rebuilt at open).
    pub fn close(self) -> Result<()> {
        self.index.close()
    }
}

impl<E: Engine> ByteMap for Bytes<E> {
    fn engine_name(&self) -> &'static str {
        E::NAME
    }
    fn put(&self, key: &[u8], value: &[u8]) -> Result<()> {
        self.write(key, ops::Write::Put(value)).map(|_| ())
    }
    fn insert(&self, key: &[u8], value: &[u8]) -> Result<bool> {
        self.write(key, ops::Write::Insert(value))
    }
    fn update(&self, key: &[u8], value: &[u8]) -> Result<bool> {
        self.write(key, ops::Write::Update(value))
    }
    fn delete(&self, key: &[u8]) -> Result<bool> {
        self.write(key, ops::Write::Delete)
    }
    fn write_batch(&self, batch: &WriteBatch) -> Result<BatchOutcome> {
        self.apply_batch(batch)
    }
    fn get_into(&self, key: &[u8], out: &mut Vec<u8>) -> Result<bool> {
        self.read(key, out)
    }
    fn scan<'a>(&'a self, start: &[u8], end: Option<&[u8]>, limit: usize) -> Scan<'a> {
        Scan::new(&self.index, &self.pool, start, end, limit)
    }
    fn stats(&self) -> EngineStats {
        recovery::stats(self)
    }
    fn check(&self) -> Result<CheckReport> {
        recovery::check(self)
    }
    fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }
    fn close_boxed(self: Box<Self>) -> Result<()> {
        (*self).close()
    }
}
