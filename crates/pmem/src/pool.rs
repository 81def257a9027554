//! Pools: the persistent memory of a store, one file (or anonymous region) per NUMA node.

use std::fs::{self, File, OpenOptions as FsOpen};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use numakv_numa::Topology;
use rand::RngCore;

use crate::access::{PmBytes, PmType, PmU64};
use crate::account::{self, RegionGuard};
use crate::error::{PoolError, Result};
use crate::heap::NodeHeap;
use crate::layout::{self, EngineId, Header, CLEAN_MAGIC, HEADER_LEN, ROOT_SLOTS};
use crate::map::{MapKind, Mapping};
use crate::persist::{self, PersistMode};
use crate::pptr::{PPtr, MAX_NODES};
use crate::shadow::{CrashOptions, CrashReport, Shadow};

/// Default page size of the page heap: NSM's 256 KiB pages (papers/nobtree.txt §III-E).
pub const DEFAULT_PAGE_SIZE: u64 = 256 << 10;
/// Name of the lock file that keeps two handles from opening one store.
pub const LOCK_FILE: &str = "numakv.lock";

/// How the pool maps its files, i.e. what a crash means.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum SimMode {
    /// Files are mapped shared (with `MAP_SYNC` on DAX). A killed process loses nothing that
    /// was stored — exactly an eADR crash; this is also the production mode.
    #[default]
    Direct,
    /// ADR power-failure simulation (see [`crate::shadow`]): only flushed-and-fenced lines are
    /// durable; [`Pool::crash`] freezes the durable image.
    Shadow,
}

/// Parameters of a new pool.
#[derive(Clone, Debug)]
pub struct PoolConfig {
    /// Number of NUMA nodes, i.e. node files (1..=256).
    pub nodes: usize,
    /// Size of each node file in bytes (sparse: only touched pages use space).
    pub capacity_per_node: u64,
    /// Page-heap page size, a power of two ≥ 4 KiB.
    pub page_size: u64,
    /// Persistence mode, fixed for the store's life.
    pub mode: PersistMode,
    /// The engine that will own the store.
    pub engine: EngineId,
    /// Mapping / crash-simulation mode.
    pub sim: SimMode,
    /// Topology used to bind each node's mapping to its node (`mbind`) on real NUMA machines.
    pub topology: Option<Arc<Topology>>,
}

impl PoolConfig {
    /// A configuration with the defaults: 1 node, ADR, direct mapping, 256 KiB pages.
    pub fn new(engine: EngineId, capacity_per_node: u64) -> PoolConfig {
        PoolConfig {
            nodes: 1,
            capacity_per_node,
            page_size: DEFAULT_PAGE_SIZE,
            mode: PersistMode::Adr,
            engine,
            sim: SimMode::Direct,
            topology: None,
        }
    }

    fn validate(&self) -> Result<()> {
        self.engine.validate()?;
        if self.nodes == 0 || self.nodes > MAX_NODES {
            return Err(PoolError::InvalidArgument(format!(
                "node count {} must be 1..={MAX_NODES}",
                self.nodes
            )));
        }
        if !self.page_size.is_power_of_two() || self.page_size < 4096 {
            return Err(PoolError::InvalidArgument(format!(
                "page size {} must be a power of two ≥ 4096",
                self.page_size
            )));
        }
        if self.capacity_per_node > (1 << crate::pptr::OFFSET_BITS)
            || self.capacity_per_node > isize::MAX as u64
        {
            return Err(PoolError::InvalidArgument("capacity too large".into()));
        }
        if layout::geometry(self.capacity_per_node, self.page_size).is_none() {
            return Err(PoolError::InvalidArgument(format!(
                "capacity {} bytes holds no {}-byte page after the header",
                self.capacity_per_node, self.page_size
            )));
        }
        Ok(())
    }
}

/// Parameters for opening an existing pool.
#[derive(Clone, Debug)]
pub struct OpenConfig {
    /// The engine the caller is; a store of another engine or engine version is refused.
    pub engine: EngineId,
    /// Mapping / crash-simulation mode for this session.
    pub sim: SimMode,
    /// Topology for `mbind` on real NUMA machines.
    pub topology: Option<Arc<Topology>>,
}

impl OpenConfig {
    /// Direct mapping, no binding.
    pub fn new(engine: EngineId) -> OpenConfig {
        OpenConfig { engine, sim: SimMode::Direct, topology: None }
    }
}

/// One node's memory.
#[derive(Debug)]
struct NodeRegion {
    /// The working memory engines access.
    work: Mapping,
    path: Option<PathBuf>,
    heap: NodeHeap,
    _accounting: RegionGuard,
}

/// The persistent memory of one store.
///
/// Engines resolve [`PPtr`]s to accessor structs with [`Pool::get`], allocate pages from the
/// per-node page heap ([`Pool::alloc_pages`]) or through an allocator built on it, and make
/// stores durable with [`Pool::flush`], [`Pool::fence`] and [`Pool::persist`].
///
/// ```
/// use numakv_pmem::{EngineId, Pool, PoolConfig, PmU64};
/// use std::sync::atomic::Ordering;
///
/// let dir = tempfile::tempdir()?;
/// let pool = Pool::create(dir.path(), PoolConfig::new(EngineId::new("demo", 1), 4 << 20))?;
/// let page = pool.alloc_pages(0, 1, numakv_numa_free_owner(), 0)?;
/// let word: &PmU64 = pool.get(page)?;
/// word.store(42, Ordering::Release);
/// pool.persist_obj(word); // PERSIST: 42 is durable before the root points at it.
/// pool.root(0)?.store(page.raw(), Ordering::Release);
/// pool.persist_obj(pool.root(0)?);
/// pool.close()?;
/// drop(pool);
///
/// let pool = numakv_pmem::Pool::open(dir.path(), numakv_pmem::OpenConfig::new(EngineId::new("demo", 1)))?;
/// assert!(pool.was_clean());
/// let page = numakv_pmem::PPtr::from_raw(pool.root(0)?.load(Ordering::Acquire));
/// assert_eq!(pool.get::<PmU64>(page)?.load(Ordering::Acquire), 42);
/// # fn numakv_numa_free_owner() -> u8 { numakv_pmem::heap::OWNER_ENGINE }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct Pool {
    regions: Vec<NodeRegion>,
    /// Working-memory base per node, for PPtr resolution (the "per-node base table").
    bases: Vec<*mut u8>,
    header: Header,
    dir: Option<PathBuf>,
    shadow: Option<Shadow>,
    was_clean: bool,
    generation: u64,
    closed: AtomicBool,
    _lock: Option<File>,
}

// SAFETY: the raw base pointers refer to mappings owned by `regions`, which live as long as the
// pool; all shared access to mapped memory goes through atomic accessors or guarded byte views.
unsafe impl Send for Pool {}
// SAFETY: as above.
unsafe impl Sync for Pool {}

/// Path of node `n`'s file in `dir`.
pub fn node_path(dir: &Path, node: usize) -> PathBuf {
    dir.join(format!("node{node}.pm"))
}

/// The first `node<N>.pm` in `dir` with `N ≥ nodes` (or an unparsable N), if any.
fn stray_node_file(dir: &Path, nodes: usize) -> Result<Option<PathBuf>> {
    let entries = fs::read_dir(dir).map_err(|e| PoolError::io(dir, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| PoolError::io(dir, e))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if let Some(num) = name.strip_prefix("node").and_then(|r| r.strip_suffix(".pm")) {
            if num.parse::<usize>().map_or(true, |n| n >= nodes) {
                return Ok(Some(entry.path()));
            }
        }
    }
    Ok(None)
}

fn lock_dir(dir: &Path) -> Result<File> {
    let path = dir.join(LOCK_FILE);
    let f = FsOpen::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&path)
        .map_err(|e| PoolError::io(&path, e))?;
    // A lock can be held for a moment by someone who is not a user of the store: a child that
    // another thread of this process (or of the previous holder) forked inherits the locked
    // descriptor until its exec closes it (close-on-exec). Retry briefly before reporting
    // `Locked`, so that closing a store and reopening it from a child process is reliable.
    const LOCK_GRACE: std::time::Duration = std::time::Duration::from_millis(500);
    let start = std::time::Instant::now();
    loop {
        // SAFETY: flock on a descriptor we own; released when the file is closed (also on
        // process death, which the eADR kill tests rely on).
        let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc == 0 {
            break;
        }
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EWOULDBLOCK) {
            return Err(PoolError::io(&path, err));
        }
        if start.elapsed() >= LOCK_GRACE {
            return Err(PoolError::Locked { path });
        }
        // The previous session of this store in this process may still be referenced by
        // destructors deferred through the epoch (a retired block's handle holds its allocator,
        // which holds the pool): after a crash-drop nothing else may advance the epoch, so
        // advance it from here and let them run.
        crossbeam_epoch::pin().flush();
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    Ok(f)
}

impl Pool {
    /// Creates a store in `dir` (created if missing; must not already hold node files).
    pub fn create(dir: &Path, cfg: PoolConfig) -> Result<Arc<Pool>> {
        #[cfg(feature = "failpoints")]
        crate::chaos::init_from_env();
        cfg.validate()?;
        fs::create_dir_all(dir).map_err(|e| PoolError::io(dir, e))?;
        let lock = lock_dir(dir)?;
        if node_path(dir, 0).exists() {
            return Err(PoolError::AlreadyExists { path: dir.to_path_buf() });
        }
        let mut uuid = [0u8; 16];
        rand::rngs::OsRng.fill_bytes(&mut uuid);
        for node in 0..cfg.nodes {
            let header = Header {
                uuid,
                node_id: node as u32,
                node_count: cfg.nodes as u32,
                capacity: cfg.capacity_per_node,
                page_size: cfg.page_size,
                engine: cfg.engine.clone(),
                mode: cfg.mode,
            };
            // Write to a temporary name and rename, so a crash during create never leaves a
            // half-written node file under its real name.
            let path = node_path(dir, node);
            let tmp = path.with_extension("pm.tmp");
            let write = || -> std::io::Result<()> {
                let f = FsOpen::new().create(true).truncate(true).write(true).open(&tmp)?;
                f.set_len(cfg.capacity_per_node)?;
                std::os::unix::fs::FileExt::write_all_at(&f, &header.encode(), 0)?;
                f.sync_all()?;
                fs::rename(&tmp, &path)
            };
            write().map_err(|e| PoolError::io(&path, e))?;
        }
        File::open(dir).and_then(|d| d.sync_all()).map_err(|e| PoolError::io(dir, e))?;
        let open = OpenConfig { engine: cfg.engine, sim: cfg.sim, topology: cfg.topology };
        Self::open_locked(dir, open, lock)
    }

    /// Opens the store in `dir`, validating every node file. A store not closed cleanly opens
    /// with [`Pool::was_clean`] false; engines then run their recovery.
    pub fn open(dir: &Path, cfg: OpenConfig) -> Result<Arc<Pool>> {
        #[cfg(feature = "failpoints")]
        crate::chaos::init_from_env();
        if !node_path(dir, 0).exists() {
            if !dir.is_dir() {
                return Err(PoolError::io(
                    dir,
                    std::io::Error::new(std::io::ErrorKind::NotFound, "store directory not found"),
                ));
            }
            return Err(PoolError::MissingNodeFile { path: node_path(dir, 0), nodes: 0 });
        }
        let lock = lock_dir(dir)?;
        Self::open_locked(dir, cfg, lock)
    }

    /// Reads the header of one node file without opening the store (for tools and errors).
    pub fn read_header(path: &Path) -> Result<Header> {
        let f = File::open(path).map_err(|e| PoolError::io(path, e))?;
        let len = f.metadata().map_err(|e| PoolError::io(path, e))?.len();
        let mut buf = vec![0u8; HEADER_LEN.min(len as usize)];
        std::os::unix::fs::FileExt::read_exact_at(&f, &mut buf, 0)
            .map_err(|e| PoolError::io(path, e))?;
        Header::decode(&buf, path)
    }

    fn open_locked(dir: &Path, cfg: OpenConfig, lock: File) -> Result<Arc<Pool>> {
        let first = Self::read_header(&node_path(dir, 0))?;
        if first.engine != cfg.engine {
            return Err(PoolError::EngineMismatch {
                expected_name: cfg.engine.name,
                expected_version: cfg.engine.version,
                found_name: first.engine.name,
                found_version: first.engine.version,
            });
        }
        let nodes = first.node_count as usize;
        if let Some(extra) = stray_node_file(dir, nodes)? {
            return Err(PoolError::UnexpectedNodeFile { path: extra, nodes });
        }
        let mut files = Vec::with_capacity(nodes);
        for node in 0..nodes {
            let path = node_path(dir, node);
            if !path.exists() {
                return Err(PoolError::MissingNodeFile { path, nodes });
            }
            let h = Self::read_header(&path)?;
            if h.uuid != first.uuid {
                return Err(PoolError::StoreMismatch {
                    path,
                    expected: first.uuid_string(),
                    found: h.uuid_string(),
                });
            }
            let same_shape = h.node_count == first.node_count
                && h.capacity == first.capacity
                && h.page_size == first.page_size
                && h.mode == first.mode
                && h.engine == first.engine;
            if h.node_id as usize != node || !same_shape {
                return Err(PoolError::corrupted(format!(
                    "{}: header disagrees with node 0 (node id {}, shape differs: {})",
                    path.display(),
                    h.node_id,
                    !same_shape
                )));
            }
            let f = FsOpen::new()
                .read(true)
                .write(true)
                .open(&path)
                .map_err(|e| PoolError::io(&path, e))?;
            let len = f.metadata().map_err(|e| PoolError::io(&path, e))?.len();
            if len < h.capacity {
                return Err(PoolError::Truncated { path, expected: h.capacity, found: len });
            }
            files.push((path, f, h.capacity as usize));
        }
        let mut works = Vec::with_capacity(nodes);
        let mut images = Vec::new();
        for (path, f, cap) in &files {
            let work = match cfg.sim {
                SimMode::Direct => Mapping::shared(f, *cap, true),
                SimMode::Shadow => Mapping::private(f, *cap),
            }
            .map_err(|e| PoolError::io(path, e))?;
            if cfg.sim == SimMode::Shadow {
                images.push(Mapping::shared(f, *cap, false).map_err(|e| PoolError::io(path, e))?);
            }
            works.push((work, Some(path.clone())));
        }
        let shadow = (cfg.sim == SimMode::Shadow)
            .then(|| Shadow::new(images, first.mode == PersistMode::Eadr));
        let pool = Self::assemble(
            works,
            first,
            Some(dir.to_path_buf()),
            shadow,
            Some(lock),
            cfg.topology.as_deref(),
        )?;
        Ok(Arc::new(pool))
    }

    /// An in-memory pool on anonymous memory: the same API and accounting, no durability.
    pub fn volatile(cfg: PoolConfig) -> Result<Arc<Pool>> {
        #[cfg(feature = "failpoints")]
        crate::chaos::init_from_env();
        cfg.validate()?;
        let mut uuid = [0u8; 16];
        rand::rngs::OsRng.fill_bytes(&mut uuid);
        let mut works = Vec::new();
        let mut first = None;
        for node in 0..cfg.nodes {
            let header = Header {
                uuid,
                node_id: node as u32,
                node_count: cfg.nodes as u32,
                capacity: cfg.capacity_per_node,
                page_size: cfg.page_size,
                engine: cfg.engine.clone(),
                mode: cfg.mode,
            };
            let m = Mapping::anonymous(cfg.capacity_per_node as usize)
                .map_err(|e| PoolError::io("<anonymous>", e))?;
            let bytes = header.encode();
            // SAFETY: the fresh mapping is at least one header long (validated geometry) and
            // not yet shared with anyone.
            unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), m.ptr(), bytes.len()) };
            first.get_or_insert(header);
            works.push((m, None));
        }
        let first = first.ok_or_else(|| PoolError::InvalidArgument("no nodes".into()))?;
        Ok(Arc::new(Self::assemble(works, first, None, None, None, cfg.topology.as_deref())?))
    }

    fn assemble(
        works: Vec<(Mapping, Option<PathBuf>)>,
        header: Header,
        dir: Option<PathBuf>,
        shadow: Option<Shadow>,
        lock: Option<File>,
        topology: Option<&Topology>,
    ) -> Result<Pool> {
        let mut regions = Vec::with_capacity(works.len());
        let mut bases = Vec::with_capacity(works.len());
        for (node, (work, path)) in works.into_iter().enumerate() {
            if let Some(t) = topology {
                if node < t.node_count() && work.kind() != MapKind::Anonymous {
                    t.bind_memory(work.ptr(), work.len(), node)?;
                }
            }
            // Before the first touch, so that the pages faulted in can be huge ones; advice only
            // (refused or ignored where the kernel's THP settings say so: `huge_page_bytes`).
            let _ = work.advise_huge_pages();
            let accounting = account::register_region(work.ptr() as usize, work.len(), node);
            bases.push(work.ptr());
            let heap = NodeHeap::placeholder();
            regions.push(NodeRegion { work, path, heap, _accounting: accounting });
        }
        let mut pool = Pool {
            regions,
            bases,
            header,
            dir,
            shadow,
            was_clean: false,
            generation: 0,
            closed: AtomicBool::new(false),
            _lock: lock,
        };
        // The heaps validate and index their descriptor tables; this is the pool's fsck.
        for node in 0..pool.regions.len() {
            let heap = NodeHeap::load(&pool, node)?;
            pool.regions[node].heap = heap;
        }
        let state = pool.header_word(crate::layout::CLEAN_OFF).load(Ordering::Acquire);
        if state != 0 && state != CLEAN_MAGIC {
            return Err(PoolError::corrupted(format!("clean-shutdown word {state:#x}")));
        }
        pool.was_clean = state == CLEAN_MAGIC;
        pool.generation =
            pool.header_word(crate::layout::GENERATION_OFF).load(Ordering::Acquire) + 1;
        let clean = pool.header_word(crate::layout::CLEAN_OFF);
        let gen = pool.header_word(crate::layout::GENERATION_OFF);
        // PERSIST: the store is marked open (dirty) before any engine write, so a crash from
        // here on is recognised at the next open.
        clean.store(0, Ordering::Release);
        gen.store(pool.generation, Ordering::Release);
        pool.persist_obj(clean);
        pool.persist_obj(gen);
        Ok(pool)
    }

    #[inline]
    fn header_word(&self, offset: usize) -> &PmU64 {
        // SAFETY: `offset` is one of the 8-aligned header word offsets of layout.rs, inside
        // node 0's first page, which is mapped for the pool's lifetime.
        unsafe { &*(self.bases[0].add(offset) as *const PmU64) }
    }

    // -----------------------------------------------------------------------------------------
    // Identity and geometry
    // -----------------------------------------------------------------------------------------

    /// Number of nodes (node files).
    pub fn nodes(&self) -> usize {
        self.regions.len()
    }
    /// Persistence mode of the store.
    pub fn mode(&self) -> PersistMode {
        self.header.mode
    }
    /// Store identity and geometry, as read from node 0.
    pub fn header(&self) -> &Header {
        &self.header
    }
    /// The store directory, `None` for a volatile pool.
    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }
    /// Whether the previous session closed the store cleanly. Always false for new pools.
    pub fn was_clean(&self) -> bool {
        self.was_clean
    }
    /// How many times the store has been opened (1 for a new store).
    pub fn generation(&self) -> u64 {
        self.generation
    }
    /// Page-heap page size.
    pub fn page_size(&self) -> u64 {
        self.header.page_size
    }
    /// Bytes of each node file.
    pub fn capacity(&self) -> u64 {
        self.header.capacity
    }
    /// True when node files are mapped with `MAP_SYNC` (a DAX file system).
    pub fn is_map_sync(&self) -> bool {
        self.regions.iter().all(|r| r.work.kind() == MapKind::SharedSync)
    }
    /// True in ADR shadow (crash-simulation) mode.
    pub fn is_shadow(&self) -> bool {
        self.shadow.is_some()
    }
    /// The file of node `node`, `None` for volatile pools.
    pub fn node_file(&self, node: usize) -> Option<&Path> {
        self.regions.get(node).and_then(|r| r.path.as_deref())
    }

    pub(crate) fn heap(&self, node: usize) -> Result<&NodeHeap> {
        self.regions.get(node).map(|r| &r.heap).ok_or_else(|| {
            PoolError::InvalidArgument(format!(
                "node {node} out of range (pool has {})",
                self.nodes()
            ))
        })
    }

    // -----------------------------------------------------------------------------------------
    // Pointers
    // -----------------------------------------------------------------------------------------

    /// Bytes of this pool's working memory that the kernel backs with transparent huge pages
    /// now, and its resident bytes (`/proc/self/smaps`); `None` where that cannot be read.
    pub fn huge_page_bytes(&self) -> Option<(u64, u64)> {
        self.regions.iter().try_fold((0, 0), |(h, r), region| {
            let (rh, rr) =
                crate::map::huge_page_bytes(region.work.ptr() as usize, region.work.len())?;
            Some((h + rh, r + rr))
        })
    }

    /// Address of `p` in this process, without any check (null and foreign pointers give
    /// meaningless addresses; dereferencing them is the caller's problem).
    #[inline]
    pub fn resolve(&self, p: PPtr) -> *mut u8 {
        match self.bases.get(p.node()) {
            Some(base) => base.wrapping_add(p.offset() as usize),
            None => std::ptr::null_mut(),
        }
    }

    /// The persistent pointer of an address inside this pool, `None` for other memory.
    pub fn pptr_of(&self, addr: *const u8) -> Option<PPtr> {
        let a = addr as usize;
        self.regions.iter().enumerate().find_map(|(node, r)| {
            let base = r.work.ptr() as usize;
            (a >= base && a < base + r.work.len())
                .then(|| PPtr::new(node, (a - base) as u64))
                .flatten()
        })
    }

    /// Inlined: hot paths resolve a node per level through [`Pool::bytes`] / [`Pool::get`]
    /// (a FAST&FAIR search four times), and the out-of-line call plus a division by `align`
    /// cost ~70 instructions each (issue 40); the error construction stays out of line.
    #[inline(always)]
    fn check_range(&self, p: PPtr, size: usize, align: usize) -> Result<*mut u8> {
        #[cold]
        #[inline(never)]
        fn bad_pointer(p: PPtr, why: &'static str) -> PoolError {
            PoolError::BadPointer { ptr: p.to_string(), why }
        }
        let bad = |why| bad_pointer(p, why);
        if p.is_null() {
            return Err(bad("null"));
        }
        let region = self.regions.get(p.node()).ok_or_else(|| bad("node out of range"))?;
        let off = p.offset();
        if off < region.heap.data_offset() {
            return Err(bad("points into the header or descriptor table"));
        }
        let end = off.checked_add(size as u64).ok_or_else(|| bad("range overflows"))?;
        if end > region.work.len() as u64 {
            return Err(bad("past the end of the node file"));
        }
        // Alignments of Rust types are powers of two: a mask, not a division.
        debug_assert!(align.is_power_of_two());
        if off as usize & (align - 1) != 0 {
            return Err(bad("misaligned for the requested type"));
        }
        Ok(self.resolve(p))
    }

    /// The PM object of type `T` at `p`, checked: non-null, inside the node's heap area, aligned.
    /// Use this on pointers read from PM during recovery, where a corrupted word must become an
    /// error rather than a wild access.
    #[inline]
    pub fn get<T: PmType>(&self, p: PPtr) -> Result<&T> {
        let ptr = self.check_range(p, std::mem::size_of::<T>(), std::mem::align_of::<T>())?;
        // SAFETY: in bounds of a mapping that lives as long as `self`, aligned, and `T: PmType`
        // is valid for any bytes and mutated only through interior mutability.
        Ok(unsafe { &*(ptr as *const T) })
    }

    /// The PM object of type `T` at `p`, unchecked, for hot paths.
    ///
    /// # Safety
    /// `p` must point into this pool's heap area, with `size_of::<T>()` bytes in bounds and
    /// aligned for `T` (e.g. a pointer this engine allocated for a `T`).
    #[inline]
    pub unsafe fn get_unchecked<T: PmType>(&self, p: PPtr) -> &T {
        // SAFETY: the caller guarantees bounds and alignment; see `get`.
        unsafe { &*(self.resolve(p) as *const T) }
    }

    /// `len` bytes at `p` as a byte view, checked like [`Pool::get`].
    #[inline]
    pub fn bytes(&self, p: PPtr, len: usize) -> Result<&PmBytes> {
        let ptr = self.check_range(p, len, 1)?;
        // SAFETY: in bounds of a mapping living as long as `self`; PmBytes' own methods carry
        // the concurrency contract.
        Ok(unsafe { PmBytes::from_raw(ptr, len) })
    }

    /// Engine root slot `slot` (0..[`ROOT_SLOTS`]) in node 0's header: the entry points an
    /// engine finds its structures from after a restart. 8-byte atomic, persist after writing.
    #[inline]
    pub fn root(&self, slot: usize) -> Result<&PmU64> {
        #[cold]
        #[inline(never)]
        fn bad_slot(slot: usize) -> PoolError {
            PoolError::InvalidArgument(format!("root slot {slot} ≥ {ROOT_SLOTS}"))
        }
        if slot >= ROOT_SLOTS {
            return Err(bad_slot(slot));
        }
        Ok(self.header_word(layout::ROOTS_OFF + 8 * slot))
    }

    // -----------------------------------------------------------------------------------------
    // Persistence
    // -----------------------------------------------------------------------------------------

    /// Writes the cache lines of `[addr, addr + len)` back (clwb/clflushopt/clflush). Durable
    /// only after the next [`Pool::fence`] of this thread. A no-op in eADR mode.
    #[inline]
    pub fn flush(&self, addr: *const u8, len: usize) {
        account::persist_step();
        if self.header.mode == PersistMode::Eadr || len == 0 {
            return;
        }
        // Only ranges inside this pool are flushed: that keeps this safe function sound for
        // any pointer (a flush of an unmapped address would fault) and shadow capture exact.
        // Anything else is DRAM or another pool and has nothing to persist here.
        let Some(p) = self.pptr_of(addr) else { return };
        let region = &self.regions[p.node()];
        let off = p.offset() as usize;
        let len = len.min(region.work.len() - off);
        account::record_flushes(addr as usize, len, p.node());
        match &self.shadow {
            // SAFETY: `[addr, addr + len)` was just clamped to lie inside node `p.node()`'s
            // mapping, which lives as long as `self`.
            None => unsafe { persist::flush_instr(region.work.ptr().add(off), len) },
            Some(s) => s.capture(p.node(), region.work.ptr(), off, len),
        }
    }

    /// Orders earlier flushes of this thread before later stores: after it, they are durable.
    /// A no-op in eADR mode (the persistence domain includes the caches).
    #[inline]
    pub fn fence(&self) {
        account::persist_step();
        if let Some(s) = &self.shadow {
            if self.header.mode == PersistMode::Adr {
                account::record_fence();
            }
            // Scheduled crashes count fences in eADR too, as crash points between operations.
            s.fence(&self.work_bases());
            return;
        }
        if self.header.mode == PersistMode::Eadr {
            return;
        }
        account::record_fence();
        persist::fence_instr();
    }

    /// [`Pool::flush`] then [`Pool::fence`].
    #[inline]
    pub fn persist(&self, addr: *const u8, len: usize) {
        self.flush(addr, len);
        self.fence();
    }

    /// Persists one PM object.
    #[inline]
    pub fn persist_obj<T>(&self, obj: &T) {
        self.persist(obj as *const T as *const u8, std::mem::size_of::<T>());
    }

    /// Flushes one PM object (no fence).
    #[inline]
    pub fn flush_obj<T>(&self, obj: &T) {
        self.flush(obj as *const T as *const u8, std::mem::size_of::<T>());
    }

    fn work_bases(&self) -> Vec<*const u8> {
        self.bases.iter().map(|b| *b as *const u8).collect()
    }

    // -----------------------------------------------------------------------------------------
    // Crash simulation and shutdown
    // -----------------------------------------------------------------------------------------

    /// Simulates a power failure now (shadow mode only): the durable image is frozen as
    /// `opts` describes and every later store, flush and fence of this pool is lost. Drop the
    /// pool (and everything holding it) and [`Pool::open`] the directory to recover.
    pub fn crash(&self, opts: CrashOptions) -> Result<CrashReport> {
        let s = self.shadow.as_ref().ok_or_else(|| {
            PoolError::InvalidArgument("crash simulation needs SimMode::Shadow".into())
        })?;
        Ok(s.crash(&self.work_bases(), opts))
    }

    /// Schedules a crash during the `fences`-th fence from now (1 = the next fence), in any
    /// thread: that fence's flushed lines are still pending and survive with
    /// `opts.pending_survival`; 0 crashes now.
    pub fn crash_after_fences(&self, fences: u64, opts: CrashOptions) -> Result<()> {
        let s = self.shadow.as_ref().ok_or_else(|| {
            PoolError::InvalidArgument("crash simulation needs SimMode::Shadow".into())
        })?;
        if fences == 0 {
            s.crash(&self.work_bases(), opts);
        } else {
            s.schedule(fences, opts);
        }
        Ok(())
    }

    /// Fences issued on this pool so far, by every thread (shadow mode only, ADR and eADR; 0 in
    /// direct mode): the crash points [`Pool::crash_after_fences`] counts, so a test can measure
    /// a scenario's fences once and then crash at each of them.
    pub fn fence_count(&self) -> u64 {
        self.shadow.as_ref().map_or(0, |s| s.fences())
    }

    /// Cancels a scheduled crash that has not fired. Returns false when the pool crashed or a
    /// scheduled crash is firing in another thread right now (its fence took the last step of
    /// the countdown: the image is being frozen) — either way this session is over: drop the
    /// pool and reopen. Checking [`Pool::has_crashed`] after cancelling is not enough for that
    /// second case.
    pub fn cancel_crash(&self) -> bool {
        match &self.shadow {
            Some(s) => s.cancel_scheduled(),
            None => true,
        }
    }

    /// True once a simulated crash has frozen the image.
    pub fn has_crashed(&self) -> bool {
        self.shadow.as_ref().is_some_and(|s| s.is_frozen())
    }

    /// Simulated crashes so far (0 or 1).
    pub fn crash_count(&self) -> u64 {
        self.shadow.as_ref().map_or(0, |s| s.crashes())
    }

    /// Clean shutdown: everything written so far becomes durable (shadow mode: the whole working
    /// memory reaches the image, as on a machine that keeps running; direct mode: `msync`), then
    /// the clean-shutdown flag is set and persisted. Idempotent. After a simulated crash it only
    /// returns an error: the session is over.
    pub fn close(&self) -> Result<()> {
        if self.has_crashed() {
            return Err(PoolError::InvalidArgument("pool crashed; reopen it to recover".into()));
        }
        if self.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let clean = self.header_word(layout::CLEAN_OFF);
        self.sync_all()?;
        // PERSIST: the flag is written only after everything else is durable (sync_all above),
        // so "clean" never describes a store with lost writes.
        clean.store(CLEAN_MAGIC, Ordering::Release);
        self.persist_obj(clean);
        self.sync_all()
    }

    fn sync_all(&self) -> Result<()> {
        if let Some(s) = &self.shadow {
            return s
                .write_back_all(&self.work_bases())
                .map_err(|e| PoolError::io(self.dir.clone().unwrap_or_default(), e));
        }
        for r in &self.regions {
            r.work.sync().map_err(|e| PoolError::io(r.path.clone().unwrap_or_default(), e))?;
        }
        Ok(())
    }
}
