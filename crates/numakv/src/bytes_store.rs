//! [`BytesStore`]: a store of byte-string keys and values (numakv_bytes over any engine), used
//! through [`dyn ByteMap`](ByteMap).

use std::fmt;
use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use numakv_bytes::{ByteMap, Bytes};
use numakv_index::{CheckReport, Engine, RecoveryReport};
use numakv_pmem::{Header, OpenConfig, Pool, PoolConfig};

use crate::error::Result;
use crate::options::Options;
use crate::registry::{EngineConfig, EngineKind, WithEngine};
use crate::store::{
    engine_of, engine_options, prepare, remove_fresh_pool, store_info, StoreInfo, StoreKind,
};

/// A store of byte-string keys (1 B ..= 1 KiB, ordered by memcmp) and values (0 B ..= 1 MiB)
/// over any engine: the byte-string layer ([`numakv_bytes`]) on the engine's index, in one
/// directory of node files like a [`Store`](crate::Store). The header records it as a bytes
/// store; opening it as an integer `Store`, or an integer store as a `BytesStore`, is
/// [`Error::StoreKind`](crate::Error::StoreKind).
///
/// ```
/// use numakv::{BytesStore, EngineKind, Options, Store};
///
/// let dir = tempfile::tempdir()?;
/// let store = BytesStore::create(dir.path(), EngineKind::NbTree, Options::default().capacity_per_node(32 << 20))?;
/// store.put(b"user:1", b"hello")?;
/// store.put(b"user:2", b"")?;
/// assert_eq!(store.get(b"user:1")?.as_deref(), Some(&b"hello"[..]));
/// let n = store.scan_prefix(b"user:", 10).count();
/// assert_eq!(n, 2);
/// store.close()?;
///
/// assert!(matches!(Store::open(dir.path()), Err(numakv::Error::StoreKind { .. })));
/// let store = BytesStore::open(dir.path())?;
/// assert!(store.delete(b"user:2")?);
/// store.close()?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct BytesStore {
    map: Box<dyn ByteMap>,
    kind: EngineKind,
    dir: PathBuf,
    recovery: Option<RecoveryReport>,
}

impl fmt::Debug for BytesStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BytesStore")
            .field("dir", &self.dir)
            .field("kind", &self.kind)
            .field("recovery", &self.recovery)
            .finish_non_exhaustive()
    }
}

impl Deref for BytesStore {
    type Target = dyn ByteMap;
    fn deref(&self) -> &(dyn ByteMap + 'static) {
        &*self.map
    }
}

struct Create<'a> {
    dir: &'a Path,
    opts: &'a Options,
}

impl WithEngine for Create<'_> {
    type Output = Result<Box<dyn ByteMap>>;
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
            engine: numakv_bytes::engine_id::<E>(),
            sim: self.opts.sim,
            topology: self.opts.topology.clone(),
        };
        let new_dir = !self.dir.exists();
        let pool = Pool::create(self.dir, cfg)?;
        let nodes = pool.nodes();
        match Bytes::<E>::create(pool, &eopts) {
            Ok(b) => Ok(Box::new(b)),
            Err(e) => {
                remove_fresh_pool(self.dir, nodes, new_dir);
                Err(e.into())
            }
        }
    }
}

struct Open<'a> {
    dir: &'a Path,
    opts: &'a Options,
}

impl WithEngine for Open<'_> {
    type Output = Result<(Box<dyn ByteMap>, RecoveryReport)>;
    fn run<E: Engine>(self) -> Self::Output
    where
        E::Options: EngineConfig,
    {
        let eopts = engine_options::<E>(self.opts)?;
        let cfg = OpenConfig {
            engine: numakv_bytes::engine_id::<E>(),
            sim: self.opts.sim,
            topology: self.opts.topology.clone(),
        };
        let pool = Pool::open(self.dir, cfg)?;
        let (b, report) = Bytes::<E>::open(pool, &eopts)?;
        Ok((Box::new(b), report))
    }
}

impl BytesStore {
    /// Creates a bytes store over engine `kind` in `dir` (created if missing; it must not
    /// already hold a store).
    pub fn create(dir: impl AsRef<Path>, kind: EngineKind, opts: Options) -> Result<BytesStore> {
        let dir = dir.as_ref();
        prepare(kind, &opts)?;
        let map = kind.with(Create { dir, opts: &opts })?;
        Ok(BytesStore { map, kind, dir: dir.to_path_buf(), recovery: None })
    }

    /// Opens the bytes store in `dir` with default session options, recovering it if needed.
    pub fn open(dir: impl AsRef<Path>) -> Result<BytesStore> {
        Self::open_with(dir, &Options::default())
    }

    /// Opens the bytes store in `dir` with the session options of `opts`.
    pub fn open_with(dir: impl AsRef<Path>, opts: &Options) -> Result<BytesStore> {
        let dir = dir.as_ref();
        let kind = engine_of(dir, StoreKind::Bytes)?;
        prepare(kind, opts)?;
        let (map, report) = kind.with(Open { dir, opts })?;
        Ok(BytesStore { map, kind, dir: dir.to_path_buf(), recovery: Some(report) })
    }

    /// The engine under the byte-string layer.
    pub fn kind(&self) -> EngineKind {
        self.kind
    }

    /// The byte map, as a trait object (the same as dereferencing the store).
    pub fn map(&self) -> &dyn ByteMap {
        &*self.map
    }

    /// The pool the store lives in.
    pub fn pool(&self) -> &Arc<Pool> {
        self.map.pool()
    }

    /// The store directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Node 0's header.
    pub fn header(&self) -> &Header {
        self.pool().header()
    }

    /// What the open did; `None` for a store this handle created.
    pub fn recovery(&self) -> Option<&RecoveryReport> {
        self.recovery.as_ref()
    }

    /// A description of the store: header fields, clean flag, space per node, statistics of
    /// the engine and the layer.
    pub fn inspect(&self) -> Result<StoreInfo> {
        store_info(self.pool(), self.kind, &self.dir, self.map.stats(), StoreKind::Bytes)
    }

    /// Structural check: every node's page heap, then the engine and every bucket. Run it while
    /// no other thread mutates the store.
    pub fn fsck(&self) -> Result<CheckReport> {
        for node in 0..self.pool().nodes() {
            self.pool().check_heap(node)?;
        }
        Ok(self.map.check()?)
    }

    /// Clean shutdown.
    pub fn close(self) -> Result<()> {
        Ok(self.map.close_boxed()?)
    }
}
