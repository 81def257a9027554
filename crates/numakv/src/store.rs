//! [`Store`]: a store directory opened with whichever engine its header names, used through
//! `&dyn Index`.

use std::fmt;
use std::fs;
use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use numakv_index::{CheckReport, Engine, EngineStats, Index, RecoveryReport};
use numakv_pmem::{node_path, Header, OpenConfig, PersistMode, Pool, PoolConfig};

use crate::error::{Error, Result};
use crate::options::Options;
use crate::registry::{EngineConfig, EngineKind, WithEngine};

/// An engine behind a box: [`Engine::close`] takes `self`, which a `dyn` cannot, so the facade
/// closes through this object-safe shim.
trait DynEngine: Index {
    fn as_index(&self) -> &(dyn Index + 'static);
    fn pool(&self) -> &Arc<Pool>;
    fn close_boxed(self: Box<Self>) -> numakv_index::Result<()>;
}

impl<E: Engine> DynEngine for E {
    fn as_index(&self) -> &(dyn Index + 'static) {
        self
    }
    fn pool(&self) -> &Arc<Pool> {
        Engine::pool(self)
    }
    fn close_boxed(self: Box<Self>) -> numakv_index::Result<()> {
        (*self).close()
    }
}

/// A numakv store: a directory of node files (`node0.pm`, `node1.pm`, …) holding one engine's
/// index, opened in this process.
///
/// A `Store` dereferences to [`dyn Index`](Index), so the operations are called directly on it
/// and it can be shared between threads (`&Store` or `Arc<Store>`). [`Store::close`] shuts it down
/// cleanly; dropping a store without closing it is a crash as far as the store is concerned —
/// the next open runs the engine's recovery.
///
/// ```
/// use numakv::{EngineKind, Options, Store};
///
/// let dir = tempfile::tempdir()?;
/// let store = Store::create(dir.path(), EngineKind::FastFair, Options::default().capacity_per_node(16 << 20))?;
/// assert!(store.insert(7, 700)?);
/// store.upsert(8, 0)?; // any value, 0 included
/// assert_eq!(store.get(7)?, Some(700));
/// assert!(store.get(0).is_err()); // 0 and u64::MAX are reserved keys
/// store.close()?;
///
/// // The engine is read from the store's header.
/// let store = Store::open(dir.path())?;
/// assert_eq!(store.kind(), EngineKind::FastFair);
/// assert!(store.recovery().is_some_and(|r| r.was_clean));
/// let mut out = Vec::new();
/// store.scan(1, 10, &mut out)?;
/// assert_eq!(out, [(7, 700), (8, 0)]);
/// store.close()?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Store {
    engine: Box<dyn DynEngine>,
    kind: EngineKind,
    dir: PathBuf,
    recovery: Option<RecoveryReport>,
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store")
            .field("dir", &self.dir)
            .field("kind", &self.kind)
            .field("recovery", &self.recovery)
            .finish_non_exhaustive()
    }
}

impl Deref for Store {
    type Target = dyn Index;
    fn deref(&self) -> &(dyn Index + 'static) {
        self.engine.as_index()
    }
}

/// Creates `E` on a fresh store in `dir`.
struct Create<'a> {
    dir: &'a Path,
    opts: &'a Options,
}

impl WithEngine for Create<'_> {
    type Output = Result<Box<dyn DynEngine>>;
    fn run<E: Engine>(self) -> Self::Output
    where
        E::Options: EngineConfig,
    {
        let eopts = engine_options::<E>(self.opts)?;
        let cfg = PoolConfig {
            nodes: self.opts.nodes,
            capacity_per_node: self.opts.capacity_per_node,
            page_size: self.opts.page_size,
            mode: self.opts.mode,
            engine: E::engine_id(),
            sim: self.opts.sim,
            topology: self.opts.topology.clone(),
        };
        let new_dir = !self.dir.exists();
        let pool = Pool::create(self.dir, cfg)?;
        let nodes = pool.nodes();
        match E::create(pool, &eopts) {
            Ok(engine) => Ok(Box::new(engine)),
            Err(e) => {
                remove_fresh_pool(self.dir, nodes, new_dir);
                Err(e.into())
            }
        }
    }
}

/// Removes the node files of a pool created a moment ago by a create whose engine then failed
/// (Pool::create refuses a directory that already holds one), and the directory too if the create
/// made it: rather than leave a store without an index. Best effort: the error to report is the
/// engine's. The pool handle must be gone.
pub(crate) fn remove_fresh_pool(dir: &Path, nodes: usize, new_dir: bool) {
    for node in 0..nodes {
        let _ = fs::remove_file(node_path(dir, node));
    }
    if new_dir {
        let _ = fs::remove_file(dir.join(numakv_pmem::LOCK_FILE));
        let _ = fs::remove_dir(dir);
    }
}

/// What a store holds, as its header records it: `u64 → u64` ([`Store`]) or byte strings
/// ([`crate::BytesStore`], engine name `bytes-<engine>` in the header).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StoreKind {
    /// An integer store: u64 keys and values.
    Integer,
    /// A bytes store: byte-string keys and values.
    Bytes,
}

impl fmt::Display for StoreKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            StoreKind::Integer => "integer (u64 keys and values)",
            StoreKind::Bytes => "bytes (byte-string keys and values)",
        })
    }
}

/// Opens `E` on the store in `dir`.
struct Open<'a> {
    dir: &'a Path,
    opts: &'a Options,
}

impl WithEngine for Open<'_> {
    type Output = Result<(Box<dyn DynEngine>, RecoveryReport)>;
    fn run<E: Engine>(self) -> Self::Output
    where
        E::Options: EngineConfig,
    {
        let eopts = engine_options::<E>(self.opts)?;
        let cfg = OpenConfig {
            engine: E::engine_id(),
            sim: self.opts.sim,
            topology: self.opts.topology.clone(),
        };
        let pool = Pool::open(self.dir, cfg)?;
        let (engine, report) = E::open(pool, &eopts)?;
        Ok((Box::new(engine), report))
    }
}

/// `E`'s options out of `opts.engine`, or its defaults.
pub(crate) fn engine_options<E: Engine>(opts: &Options) -> Result<E::Options>
where
    E::Options: EngineConfig,
{
    match &opts.engine {
        None => Ok(E::Options::default()),
        Some(given) => E::Options::unwrap(given).cloned().ok_or_else(|| Error::OptionsMismatch {
            store: EngineKind::from_name(E::NAME).unwrap_or(given.kind()),
            given: given.kind(),
        }),
    }
}

/// Before a create or an open of a `kind` store: refuses options of another engine, then
/// installs the process-wide knobs of `opts` (accounting, latency).
pub(crate) fn prepare(kind: EngineKind, opts: &Options) -> Result<()> {
    if let Some(given) = &opts.engine {
        if given.kind() != kind {
            return Err(Error::OptionsMismatch { store: kind, given: given.kind() });
        }
    }
    opts.apply_process_knobs();
    Ok(())
}

/// The engine of the store in `dir`, which must hold `wanted` data (integer or bytes).
pub(crate) fn engine_of(dir: &Path, wanted: StoreKind) -> Result<EngineKind> {
    let (kind, found) = Store::kind_of(dir)?;
    if found != wanted {
        return Err(Error::StoreKind { dir: dir.to_path_buf(), found, wanted });
    }
    Ok(kind)
}

impl Store {
    /// Creates a store of engine `kind` in `dir` (created if missing; it must not already hold a
    /// store). See [`Options`] for the geometry, persistence mode and engine options.
    pub fn create(dir: impl AsRef<Path>, kind: EngineKind, opts: Options) -> Result<Store> {
        let dir = dir.as_ref();
        prepare(kind, &opts)?;
        let engine = kind.with(Create { dir, opts: &opts })?;
        Ok(Store { engine, kind, dir: dir.to_path_buf(), recovery: None })
    }

    /// Opens the store in `dir` with default session options, recovering it if it was not
    /// closed cleanly. The engine is the one named in the store's header.
    pub fn open(dir: impl AsRef<Path>) -> Result<Store> {
        Self::open_with(dir, &Options::default())
    }

    /// Opens the store in `dir` with the session options of `opts` (crash simulation, binding,
    /// accounting, latency, per-session engine options); the shape fields of `opts` are ignored.
    pub fn open_with(dir: impl AsRef<Path>, opts: &Options) -> Result<Store> {
        let dir = dir.as_ref();
        let kind = engine_of(dir, StoreKind::Integer)?;
        prepare(kind, opts)?;
        let (engine, report) = kind.with(Open { dir, opts })?;
        Ok(Store { engine, kind, dir: dir.to_path_buf(), recovery: Some(report) })
    }

    /// Reads node 0's header of the store in `dir` without opening the store.
    pub fn read_header(dir: impl AsRef<Path>) -> Result<Header> {
        let dir = dir.as_ref();
        if !dir.is_dir() {
            return Err(Error::NoStore { dir: dir.to_path_buf(), why: "directory not found" });
        }
        let path = node_path(dir, 0);
        if !path.exists() {
            return Err(Error::NoStore { dir: dir.to_path_buf(), why: "node0.pm not found" });
        }
        Ok(Pool::read_header(&path)?)
    }

    /// The engine of the store in `dir`, from its header, without opening the store (for a
    /// bytes store, the engine under the byte-string layer).
    pub fn engine_of(dir: impl AsRef<Path>) -> Result<EngineKind> {
        Self::kind_of(dir).map(|(k, _)| k)
    }

    /// The engine and the kind of store (integer or bytes) in `dir`, from its header, without
    /// opening the store.
    pub fn kind_of(dir: impl AsRef<Path>) -> Result<(EngineKind, StoreKind)> {
        let dir = dir.as_ref();
        let header = Self::read_header(dir)?;
        let name = header.engine.name.as_str();
        let (name, store_kind) = match name.strip_prefix(numakv_bytes::NAME_PREFIX) {
            Some(inner) => (inner, StoreKind::Bytes),
            None => (name, StoreKind::Integer),
        };
        let kind = EngineKind::from_name(name).ok_or_else(|| Error::UnknownStoredEngine {
            path: node_path(dir, 0),
            name: header.engine.name.clone(),
            known: EngineKind::known_names(),
        })?;
        Ok((kind, store_kind))
    }

    /// The store's engine.
    pub fn kind(&self) -> EngineKind {
        self.kind
    }

    /// The index, as a trait object (the same as dereferencing the store).
    pub fn index(&self) -> &dyn Index {
        self.engine.as_index()
    }

    /// The pool the index lives in (for tools: heap usage, crash simulation, ...).
    pub fn pool(&self) -> &Arc<Pool> {
        self.engine.pool()
    }

    /// The store directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Node 0's header: store identity, geometry, engine, persistence mode.
    pub fn header(&self) -> &Header {
        self.pool().header()
    }

    /// What the open did (clean or recovered, how long, engine counters); `None` for a store
    /// this handle created.
    pub fn recovery(&self) -> Option<&RecoveryReport> {
        self.recovery.as_ref()
    }

    /// A description of the store: header fields, clean flag, space per node, engine stats.
    pub fn inspect(&self) -> Result<StoreInfo> {
        store_info(self.pool(), self.kind, &self.dir, self.stats(), StoreKind::Integer)
    }

    /// Structural check of the whole store: every node's page heap against its descriptor table
    /// ([`Pool::check_heap`]), then the engine's [`Index::check`]. Run it while no other thread
    /// mutates the store.
    pub fn fsck(&self) -> Result<CheckReport> {
        for node in 0..self.pool().nodes() {
            self.pool().check_heap(node)?;
        }
        Ok(self.index().check()?)
    }

    /// Clean shutdown: everything becomes durable and the store is marked clean, so the next open
    /// needs no recovery.
    pub fn close(self) -> Result<()> {
        Ok(self.engine.close_boxed()?)
    }
}

/// A store is itself an [`Index`], forwarding to its engine, so an `Arc<Store>` goes wherever an
/// `Arc<dyn Index>` is expected (the benchmark runner, a layer such as Nap over any index).
impl Index for Store {
    fn name(&self) -> &'static str {
        self.index().name()
    }
    fn insert(&self, key: u64, value: u64) -> numakv_index::Result<bool> {
        self.index().insert(key, value)
    }
    fn upsert(&self, key: u64, value: u64) -> numakv_index::Result<()> {
        self.index().upsert(key, value)
    }
    fn update(&self, key: u64, value: u64) -> numakv_index::Result<bool> {
        self.index().update(key, value)
    }
    fn get(&self, key: u64) -> numakv_index::Result<Option<u64>> {
        self.index().get(key)
    }
    fn remove(&self, key: u64) -> numakv_index::Result<bool> {
        self.index().remove(key)
    }
    fn scan(
        &self,
        start: u64,
        max: usize,
        out: &mut Vec<(u64, u64)>,
    ) -> numakv_index::Result<usize> {
        self.index().scan(start, max, out)
    }
    fn stats(&self) -> EngineStats {
        self.index().stats()
    }
    fn check(&self) -> numakv_index::Result<CheckReport> {
        self.index().check()
    }
    fn quiesce(
        &self,
        limit: std::time::Duration,
    ) -> numakv_index::Result<Vec<numakv_index::Backlog>> {
        self.index().quiesce(limit)
    }
}

/// [`Store::inspect`] of any store.
pub(crate) fn store_info(
    pool: &Pool,
    kind: EngineKind,
    dir: &Path,
    stats: EngineStats,
    store_kind: StoreKind,
) -> Result<StoreInfo> {
    let h = pool.header();
    let mut space = Vec::with_capacity(pool.nodes());
    for node in 0..pool.nodes() {
        let (used_pages, total_pages) = pool.heap_usage(node)?;
        space.push(NodeSpace {
            node,
            file: pool.node_file(node).map(Path::to_path_buf),
            capacity_bytes: pool.capacity(),
            heap_pages: total_pages,
            used_pages,
            used_bytes: pool.used_bytes(node)?,
            engine_bytes: stats.pm_bytes_per_node.get(node).copied().unwrap_or(0),
        });
    }
    Ok(StoreInfo {
        dir: dir.to_path_buf(),
        store_kind,
        uuid: h.uuid_string(),
        pool_format_version: numakv_pmem::layout::FORMAT_VERSION,
        engine: kind,
        engine_format_version: h.engine.version,
        mode: h.mode,
        nodes: pool.nodes(),
        capacity_per_node: pool.capacity(),
        page_size: pool.page_size(),
        was_clean: pool.was_clean(),
        generation: pool.generation(),
        space,
        stats,
    })
}

/// What [`Store::inspect`] reports.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct StoreInfo {
    /// The store directory.
    pub dir: PathBuf,
    /// Integer or bytes store.
    pub store_kind: StoreKind,
    /// Store UUID as hex.
    pub uuid: String,
    /// Version of the pool file format.
    pub pool_format_version: u32,
    /// The engine.
    pub engine: EngineKind,
    /// Version of the engine's persistent format recorded in the store.
    pub engine_format_version: u32,
    /// Persistence mode.
    pub mode: PersistMode,
    /// Node files.
    pub nodes: usize,
    /// Bytes of each node file.
    pub capacity_per_node: u64,
    /// Page-heap page size.
    pub page_size: u64,
    /// Whether the previous session closed the store cleanly (if not, this open recovered it).
    pub was_clean: bool,
    /// How many times the store has been opened, this open included.
    pub generation: u64,
    /// Space per node.
    pub space: Vec<NodeSpace>,
    /// The engine's statistics.
    pub stats: EngineStats,
}

/// Space of one node file.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct NodeSpace {
    /// Node index.
    pub node: usize,
    /// The node file.
    pub file: Option<PathBuf>,
    /// Bytes of the file.
    pub capacity_bytes: u64,
    /// Pages of the page heap (the file minus header and descriptor table).
    pub heap_pages: u64,
    /// Heap pages allocated.
    pub used_pages: u64,
    /// Bytes in allocated heap pages.
    pub used_bytes: u64,
    /// PM bytes the engine reports holding on this node (≤ `used_bytes`).
    pub engine_bytes: u64,
}
