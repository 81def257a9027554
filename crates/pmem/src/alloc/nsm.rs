//! NOBtree's NUMA-aware NVM storage manager, NSM (papers/nobtree.txt §III-E, Algorithm 1).
//!
//! Two layers:
//!
//! - **Bottom: the NVM-free-page layer** — the pool's per-node page heap ([`crate::heap`]).
//!   NSM takes one page ([`Pool::page_size`], 256 KiB by default, the paper's NVM page) at a time
//!   and records the page's size class in the head descriptor's `aux`. Requests larger than the
//!   largest class get a multi-page extent of their own (`aux` = [`LARGE`]). Page allocation and
//!   free are the *only* persistent writes NSM makes; the heap persists the descriptor.
//! - **Top: the thread cache** — one cache per dense thread id ([`numakv_numa::tid`]), each with
//!   one slab manager per NUMA node plus one for round-robin mode (Algorithm 1's
//!   `thread_cache.slab[node]` / `slab[mode]`). A slab has segregated free lists, one per size
//!   class. Small allocations and frees touch only the calling thread's (uncontended) cache and
//!   persist nothing.
//!
//! A shared per-node **depot** of free blocks per class sits between the two: recovery fills it
//! with the unreachable blocks of the pages it keeps, and thread caches whose free list for a
//! class grows long hand a batch back to it (so a producer/consumer pattern cannot strand
//! memory in one thread's cache). Caches refill from the depot before taking a new page.
//!
//! # Placement (Algorithm 1)
//!
//! [`Nsm::alloc_on`] with `Some(node)` allocates from `slab[node]`, whose pages come from that
//! node. With `None` (and [`PmAllocator::alloc`]) the mode chosen at creation decides:
//! [`NsmMode::Local`] uses the slab of [`numakv_numa::current_node`], [`NsmMode::Node`] a fixed
//! node, and [`NsmMode::RoundRobin`] the round-robin slab, whose refills take pages from the
//! nodes in turn (a shared counter, `get_nvm_page(round-robin)`).
//!
//! Pages are carved lazily: a refill installs the page as the slab's *fresh cursor* for the class
//! and blocks are cut from it in address order as they are needed. This is Algorithm 1's "fill
//! the freelist with the requested NVM page" without writing a page's worth of list entries up
//! front.
//!
//! # Recovery (GC-based)
//!
//! Free lists and the depot are volatile by design, so after a crash *or* a clean shutdown the
//! engine calls [`Nsm::recover`] with every block it can reach. Pages with no reachable block go
//! back to the heap, unreachable blocks of the other pages go to the depot, unreachable large
//! extents are freed (papers/nobtree.txt §III-E: "rebuild heap metadata post-crash by
//! scanning").
//!
//! # Deferred recovery (instant restart)
//!
//! Finding every reachable block means walking the engine's whole structure, which makes open
//! O(structure size). [`Nsm::recover_deferred`] instead returns at once with every NSM extent
//! that exists at open *frozen*: none of its blocks is handed out, each counts as allocated, and
//! new allocations take new pages. The engine then walks its structure in the background, while
//! it keeps operating, and hands the blocks it reached to [`Nsm::collect`], which sweeps the
//! frozen extents. Blocks the engine unlinks meanwhile are announced by [`retire`](super::retire)
//! ([`PmAllocator::retiring`]) and their frees are held back until the sweep, so that the sweep
//! neither frees a block that is still (or again) reachable nor frees one a second time. The
//! protocol and why it is safe: docs/design.md §9, "Deferred recovery".
//!
//! # Persistent format
//!
//! NSM owns extents with owner tag [`OWNER_NSM`]. `aux` is either [`LARGE`] (an extent of one
//! or more pages holding a single block at its start) or the index of the page's size class in
//! [`size_classes`]`(page_size)` (a one-page extent cut into `page_size / class` blocks at
//! multiples of the class size from the page start). The class table is a pure function of the
//! page size; changing it changes the format.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;
use parking_lot::Mutex;

use crate::alloc::PmAllocator;
use crate::error::{PoolError, Result};
use crate::heap::OWNER_NSM;
use crate::pool::Pool;
use crate::pptr::PPtr;

// ---------------------------------------------------------------------------------------------
// Constants and size classes
// ---------------------------------------------------------------------------------------------

/// `aux` of an NSM extent that holds one large block (larger than the largest size class).
pub const LARGE: u16 = u16::MAX;

/// Most blocks moved between a thread cache and the depot at once.
const MAX_BATCH: usize = 256;

/// The size classes NSM uses for pages of `page_size` bytes, ascending.
///
/// `16, 32, 64`, then every power of two `p ≥ 128` and `1.5·p`, up to `page_size / 2`:
/// `16, 32, 64, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, …`. Every class from
/// 64 up is a multiple of 64, so blocks (cut at multiples of the class from a page-aligned page
/// start) are cache-line aligned — PM index nodes never straddle more lines than needed; the
/// 1.5× steps keep internal fragmentation under a third. Classes stop at half a page so a page
/// holds at least two blocks; anything bigger is a large extent.
pub fn size_classes(page_size: u64) -> Vec<u64> {
    let max = page_size / 2;
    let mut classes: Vec<u64> = [16, 32, 64].into_iter().filter(|&c| c <= max).collect();
    let mut p: u64 = 128;
    while p <= max {
        classes.push(p);
        let mid = p + p / 2;
        if mid <= max {
            classes.push(mid);
        }
        match p.checked_mul(2) {
            Some(next) => p = next,
            None => break,
        }
    }
    classes
}

// ---------------------------------------------------------------------------------------------
// Modes
// ---------------------------------------------------------------------------------------------

/// Where [`PmAllocator::alloc`] (and [`Nsm::alloc_on`] with `None`) places blocks; chosen when
/// the NSM is created (papers/nobtree.txt §III-E).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NsmMode {
    /// Pages from the calling thread's node ([`numakv_numa::current_node`]).
    Local,
    /// Pages from the nodes in turn, page by page.
    RoundRobin,
    /// Pages from one fixed node.
    Node(usize),
}

impl fmt::Display for NsmMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NsmMode::Local => f.write_str("local"),
            NsmMode::RoundRobin => f.write_str("round-robin"),
            NsmMode::Node(n) => write!(f, "node:{n}"),
        }
    }
}

impl FromStr for NsmMode {
    type Err = PoolError;

    /// Parses `local`, `round-robin` or `node:N`.
    fn from_str(s: &str) -> Result<NsmMode> {
        match s {
            "local" => Ok(NsmMode::Local),
            "round-robin" => Ok(NsmMode::RoundRobin),
            _ => {
                s.strip_prefix("node:").and_then(|n| n.parse().ok()).map(NsmMode::Node).ok_or_else(
                    || {
                        PoolError::InvalidArgument(format!(
                            "NSM mode {s:?}: expected local, round-robin or node:N"
                        ))
                    },
                )
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Volatile state
// ---------------------------------------------------------------------------------------------

/// The uncut rest of a page a slab is carving: blocks `next..count` of `base` are free.
#[derive(Clone, Copy, Debug)]
struct Fresh {
    base: PPtr,
    next: u64,
    count: u64,
}

/// One slab manager: segregated free lists and fresh cursors, indexed by class.
#[derive(Debug)]
struct Slab {
    free: Vec<Vec<PPtr>>,
    fresh: Vec<Option<Fresh>>,
}

impl Slab {
    fn new(classes: usize) -> Slab {
        Slab { free: vec![Vec::new(); classes], fresh: vec![None; classes] }
    }

    /// Cuts the next block of `class` (of `size` bytes) from the fresh cursor.
    fn cut(&mut self, class: usize, size: u64) -> Option<PPtr> {
        let slot = self.fresh.get_mut(class)?;
        let f = slot.as_mut()?;
        let p = f.base.add(f.next * size);
        f.next += 1;
        if f.next >= f.count {
            *slot = None;
        }
        p
    }
}

/// One thread's cache: `slabs[0..nodes]` per node, `slabs[nodes]` the round-robin slab. Empty
/// until the thread first allocates or frees. A thread that exits leaves its cache to the next
/// thread given the same dense id, so nothing is stranded.
#[derive(Debug, Default)]
struct ThreadCache {
    slabs: Vec<Slab>,
    /// Node whose free list the round-robin slab tries first (the one after its last hit).
    rr_cursor: usize,
    /// Bytes of small blocks allocated minus freed through this cache (may be negative when
    /// this thread frees others' blocks; the sum over caches is what counts).
    small_bytes: i64,
}

/// One node's depot: per size class, free blocks any thread may take (lock: after the thread
/// cache).
type NodeDepot = Box<[Mutex<Vec<PPtr>>]>;

/// What a pointer is, as far as NSM's page descriptors say.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Block {
    /// A block of size class `class` in a one-page extent starting at `page`.
    Small { class: usize, page: PPtr },
    /// The start of a large extent.
    Large,
}

// ---------------------------------------------------------------------------------------------
// Reports
// ---------------------------------------------------------------------------------------------

/// What [`Nsm::recover`] found and did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NsmRecovery {
    /// Small-block pages kept (they hold at least one reachable block).
    pub pages_kept: u64,
    /// Small-block pages returned to the heap (no reachable block).
    pub pages_freed: u64,
    /// Large extents kept (reachable).
    pub large_kept: u64,
    /// Large extents returned to the heap (unreachable).
    pub large_freed: u64,
    /// Distinct reachable blocks (small blocks and large extents).
    pub blocks_reachable: u64,
    /// Unreachable blocks of kept pages, now in the depot for reuse.
    pub blocks_free: u64,
    /// Wall time of the scan and rebuild.
    pub elapsed: Duration,
}

/// Space NSM holds, for tests, leak checks and reports.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NsmStats {
    /// Per node: pages cut into small blocks.
    pub small_pages: Vec<u64>,
    /// Per node: pages in large extents.
    pub large_pages: Vec<u64>,
    /// Bytes handed out and not freed: the class size of every live small block plus the whole
    /// extent of every live large block.
    pub allocated_bytes: u64,
}

// ---------------------------------------------------------------------------------------------
// The allocator
// ---------------------------------------------------------------------------------------------

/// NOBtree's NUMA-aware NVM storage manager; see the [module docs](self).
///
/// ```
/// use numakv_pmem::alloc::nsm::{Nsm, NsmMode};
/// use numakv_pmem::alloc::PmAllocator;
/// use numakv_pmem::{EngineId, Pool, PoolConfig};
///
/// let mut cfg = PoolConfig::new(EngineId::new("demo", 1), 4 << 20);
/// cfg.nodes = 2;
/// cfg.page_size = 64 << 10;
/// let pool = Pool::volatile(cfg)?;
/// let nsm = Nsm::new(pool, NsmMode::RoundRobin)?;
/// let node = nsm.alloc(256)?; // placed by the mode
/// let on1 = nsm.alloc_on(256, Some(1))?; // node-specific
/// assert_eq!(on1.node(), 1);
/// assert_eq!(node.offset() % 64, 0);
/// // SAFETY: both blocks came from `nsm`, are freed once and are not used afterwards.
/// unsafe {
///     nsm.free(node)?;
///     nsm.free(on1)?;
/// }
/// assert!(nsm.allocated_blocks().is_empty());
/// # Ok::<(), numakv_pmem::PoolError>(())
/// ```
pub struct Nsm {
    pool: Arc<Pool>,
    mode: NsmMode,
    /// Page-heap owner tag of this NSM's extents ([`OWNER_NSM`] unless created with another:
    /// two NSMs in one pool, e.g. an engine's and the byte-string layer's, must not collect each
    /// other's pages).
    owner: u8,
    nodes: usize,
    page_size: u64,
    classes: Vec<u64>,
    /// Per dense thread id.
    caches: Box<[CachePadded<Mutex<ThreadCache>>]>,
    /// `depots[node][class]`: shared free blocks of that node and class.
    depots: Box<[NodeDepot]>,
    /// Live large extents: start → pages. Lets `free` reject a second free of the same extent
    /// and size it without a heap lookup.
    large: Mutex<HashMap<PPtr, u64>>,
    /// Next node of the round-robin page counter.
    rr_next: CachePadded<AtomicUsize>,
    /// Bytes of small blocks allocated before this session: those found reachable at recovery,
    /// or, while a deferred collection is pending, every block of the frozen pages.
    recovered_small_bytes: AtomicU64,
    /// Bytes of small blocks freed by threads without a cache slot (straight to a depot): no
    /// cache's `small_bytes` went down for them.
    uncached_freed_bytes: AtomicU64,
    /// The pending deferred collection, `None` once swept (or when recovery was not deferred).
    /// Lock order: before the thread caches and the depots.
    deferred: Mutex<Option<Deferred>>,
    /// True while `deferred` is `Some`: lets frees skip the lock when nothing is pending.
    deferred_pending: AtomicBool,
}

/// A collection deferred by [`Nsm::recover_deferred`]: the extents that existed at open and what
/// happened to their blocks since.
#[derive(Debug, Default)]
struct Deferred {
    /// Frozen small-block pages (extent start → size class).
    pages: BTreeMap<PPtr, usize>,
    /// Frozen large extents (start → pages).
    large: BTreeMap<PPtr, u64>,
    /// Frozen blocks announced by `retiring` (unlinked by the engine during the collection).
    retired: HashSet<PPtr>,
    /// Frozen blocks whose free ran during the collection: held back, freed by the sweep.
    freed: HashSet<PPtr>,
}

impl Deferred {
    /// Whether `block` (at `p`) lies in a frozen extent.
    fn holds(&self, p: PPtr, block: Block) -> bool {
        match block {
            Block::Small { page, .. } => self.pages.contains_key(&page),
            Block::Large => self.large.contains_key(&p),
        }
    }
}

/// The NSM extents of a pool with a mark per block, for a garbage-collecting sweep.
struct Marks {
    pages: BTreeMap<PPtr, PageMarks>,
    /// Large extent start → (pages, marked).
    large: BTreeMap<PPtr, (u64, bool)>,
}

impl Marks {
    /// Whether `p` lies inside one of the extents held here.
    fn holds_address(&self, nsm: &Nsm, p: PPtr) -> bool {
        nsm.pool.page_info(p).is_some_and(|i| {
            self.pages.contains_key(&i.extent) || self.large.contains_key(&i.extent)
        })
    }
}

/// Marks of one small-block page.
struct PageMarks {
    class: usize,
    bits: Vec<u64>,
    marked: u64,
}

impl PageMarks {
    fn new(blocks: u64, class: usize) -> PageMarks {
        PageMarks { class, bits: vec![0; blocks.div_ceil(64) as usize], marked: 0 }
    }

    /// Sets (or clears) block `i`'s mark; true if it changed.
    fn set(&mut self, i: u64, on: bool) -> bool {
        let (w, bit) = ((i / 64) as usize, 1u64 << (i % 64));
        if (self.bits[w] & bit != 0) == on {
            return false;
        }
        self.bits[w] ^= bit;
        if on {
            self.marked += 1;
        } else {
            self.marked -= 1;
        }
        true
    }

    fn get(&self, i: u64) -> bool {
        self.bits[(i / 64) as usize] & (1 << (i % 64)) != 0
    }
}

impl fmt::Debug for Nsm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Nsm")
            .field("mode", &self.mode)
            .field("nodes", &self.nodes)
            .field("page_size", &self.page_size)
            .field("classes", &self.classes.len())
            .finish_non_exhaustive()
    }
}

impl Nsm {
    /// An NSM over a pool that holds no NSM pages yet. A pool with NSM pages (a reopened store)
    /// must go through [`Nsm::recover`], or its blocks would be leaked or handed out twice.
    ///
    /// # Errors
    /// `InvalidArgument` for `NsmMode::Node(n)` with `n ≥ pool.nodes()`, or when the pool
    /// already holds NSM extents.
    pub fn new(pool: Arc<Pool>, mode: NsmMode) -> Result<Arc<Nsm>> {
        Self::new_owned(pool, mode, OWNER_NSM)
    }

    /// [`Nsm::new`] for an NSM whose extents carry page-heap owner tag `owner` instead of
    /// [`OWNER_NSM`]: a second NSM in a pool whose engine has its own. Reopen it with
    /// [`Nsm::recover_owned`] and the same tag.
    ///
    /// # Errors
    /// As [`Nsm::new`] (the check is for extents tagged `owner`).
    pub fn new_owned(pool: Arc<Pool>, mode: NsmMode, owner: u8) -> Result<Arc<Nsm>> {
        for node in 0..pool.nodes() {
            if pool.extents(node)?.iter().any(|e| e.owner == owner) {
                return Err(PoolError::InvalidArgument(format!(
                    "node {node} already holds NSM pages; open it with Nsm::recover"
                )));
            }
        }
        Ok(Arc::new(Self::build(pool, mode, owner)?))
    }

    fn build(pool: Arc<Pool>, mode: NsmMode, owner: u8) -> Result<Nsm> {
        let nodes = pool.nodes();
        if let NsmMode::Node(n) = mode {
            if n >= nodes {
                return Err(PoolError::InvalidArgument(format!(
                    "NSM mode {mode}: node out of range (pool has {nodes})"
                )));
            }
        }
        let page_size = pool.page_size();
        let classes = size_classes(page_size);
        if classes.len() >= usize::from(LARGE) {
            return Err(PoolError::InvalidArgument(format!(
                "page size {page_size} gives too many size classes"
            )));
        }
        let caches = (0..numakv_numa::MAX_THREADS)
            .map(|_| CachePadded::new(Mutex::new(ThreadCache::default())))
            .collect();
        let depots = (0..nodes)
            .map(|_| (0..classes.len()).map(|_| Mutex::new(Vec::new())).collect())
            .collect();
        Ok(Nsm {
            pool,
            mode,
            owner,
            nodes,
            page_size,
            classes,
            caches,
            depots,
            large: Mutex::new(HashMap::new()),
            rr_next: CachePadded::new(AtomicUsize::new(0)),
            recovered_small_bytes: AtomicU64::new(0),
            uncached_freed_bytes: AtomicU64::new(0),
            deferred: Mutex::new(None),
            deferred_pending: AtomicBool::new(false),
        })
    }

    /// The placement mode chosen at creation.
    pub fn mode(&self) -> NsmMode {
        self.mode
    }

    /// The size classes in use (see [`size_classes`]).
    pub fn size_classes(&self) -> &[u64] {
        &self.classes
    }

    /// Bytes a request of `size` actually occupies: its class size, or whole pages for a large
    /// request.
    pub fn block_size(&self, size: usize) -> u64 {
        let size = (size as u64).max(1);
        match self.class_of(size) {
            Some(c) => self.classes[c],
            None => size.div_ceil(self.page_size).saturating_mul(self.page_size),
        }
    }

    /// Index of the smallest class holding `size` bytes; `None` for large requests.
    fn class_of(&self, size: u64) -> Option<usize> {
        let i = self.classes.partition_point(|&c| c < size);
        (i < self.classes.len()).then_some(i)
    }

    /// Blocks of `class` in one page.
    fn blocks_per_page(&self, class: usize) -> u64 {
        self.page_size / self.classes[class]
    }

    /// Blocks moved between a thread cache and the depot at once.
    fn batch(&self, class: usize) -> usize {
        (self.blocks_per_page(class) as usize).clamp(1, MAX_BATCH)
    }

    /// Algorithm 1's `nvm_numa_malloc(size, node)`: with `Some(node)` allocates from the calling
    /// thread's slab for `node` (pages on `node`), with `None` as the mode says.
    ///
    /// # Errors
    /// `InvalidArgument` for a node out of range; `OutOfSpace` when the node (round-robin: every
    /// node) has no free page — the allocator stays usable; `TooManyThreads`/`Numa` when the
    /// thread cannot get a dense id.
    pub fn alloc_on(&self, size: usize, node: Option<usize>) -> Result<PPtr> {
        let slab = match node {
            Some(n) if n < self.nodes => n,
            Some(n) => {
                return Err(PoolError::InvalidArgument(format!(
                    "node {n} out of range (pool has {})",
                    self.nodes
                )))
            }
            None => self.mode_slab(),
        };
        let size = (size as u64).max(1);
        match self.class_of(size) {
            Some(class) => {
                let mut cache = self.cache()?;
                let p = self.slab_alloc(&mut cache, slab, class)?;
                cache.small_bytes += self.classes[class] as i64;
                Ok(p)
            }
            None => self.alloc_large(slab, size),
        }
    }

    /// The slab Algorithm 1 uses for the mode (`slab[mode]`).
    fn mode_slab(&self) -> usize {
        match self.mode {
            NsmMode::Local => numakv_numa::current_node() % self.nodes,
            NsmMode::Node(n) => n,
            NsmMode::RoundRobin => self.nodes,
        }
    }

    /// The calling thread's cache, locked (uncontended except against `allocated_blocks`) and
    /// with its slabs created.
    fn cache(&self) -> Result<parking_lot::MutexGuard<'_, ThreadCache>> {
        let tid = numakv_numa::try_tid()?;
        let slot = self
            .caches
            .get(tid)
            .ok_or(PoolError::TooManyThreads { tid, max: self.caches.len() })?;
        let mut cache = slot.lock();
        if cache.slabs.is_empty() {
            cache.slabs = (0..=self.nodes).map(|_| Slab::new(self.classes.len())).collect();
        }
        Ok(cache)
    }

    /// Algorithm 1's `slab_alloc`: free list, then the fresh page, then the depot, then a new
    /// page (`get_nvm_page`).
    fn slab_alloc(&self, cache: &mut ThreadCache, slab: usize, class: usize) -> Result<PPtr> {
        let size = self.classes[class];
        if slab < self.nodes {
            let s = &mut cache.slabs[slab];
            if let Some(p) = s.free[class].pop() {
                return Ok(p);
            }
            if let Some(p) = s.cut(class, size) {
                return Ok(p);
            }
            if let Some(p) = self.refill_from_depot(cache, slab, class) {
                return Ok(p);
            }
            let page = self.new_page(slab, class)?;
            return self.install_fresh(cache, slab, class, page);
        }
        // Round-robin slab. Freed blocks live in the per-node slabs (a block goes back to the
        // slab of its node), so reuse them first, starting at the node after the last hit:
        // starting at the last hit itself drained one node's list before touching the next,
        // so after churn a burst of allocations all landed on one node (issue 36).
        for i in 0..self.nodes {
            let n = (cache.rr_cursor + i) % self.nodes;
            if let Some(p) = cache.slabs[n].free[class].pop() {
                cache.rr_cursor = (n + 1) % self.nodes;
                return Ok(p);
            }
        }
        if let Some(p) = cache.slabs[slab].cut(class, size) {
            return Ok(p);
        }
        // ORDERING: Relaxed; the counter only spreads pages, it publishes nothing.
        let start = self.rr_next.load(Ordering::Relaxed);
        for i in 0..self.nodes {
            if let Some(p) = self.refill_from_depot(cache, (start + i) % self.nodes, class) {
                return Ok(p);
            }
        }
        // get_nvm_page(round-robin): the next node in turn; a full node passes its turn on.
        let mut last = None;
        for _ in 0..self.nodes {
            // ORDERING: Relaxed, as above.
            let n = self.rr_next.fetch_add(1, Ordering::Relaxed) % self.nodes;
            match self.new_page(n, class) {
                Ok(page) => return self.install_fresh(cache, slab, class, page),
                Err(e @ PoolError::OutOfSpace { .. }) => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or(PoolError::OutOfSpace { node: 0, requested: self.page_size }))
    }

    /// Takes a batch of `class` blocks of `node` from the depot into the cache's slab for
    /// `node` and returns one of them.
    fn refill_from_depot(
        &self,
        cache: &mut ThreadCache,
        node: usize,
        class: usize,
    ) -> Option<PPtr> {
        let mut depot = self.depots.get(node)?.get(class)?.lock();
        if depot.is_empty() {
            return None;
        }
        let keep = depot.len().saturating_sub(self.batch(class));
        let list = &mut cache.slabs[node].free[class];
        list.extend(depot.drain(keep..));
        list.pop()
    }

    /// `get_nvm_page(node)`: one page of `class` on `node`.
    fn new_page(&self, node: usize, class: usize) -> Result<PPtr> {
        // PERSIST: alloc_pages persists the head descriptor (owner NSM, aux = class) before it
        // returns; that descriptor is all NSM ever makes durable for small blocks.
        self.pool.alloc_pages(node, 1, self.owner, class as u16)
    }

    /// Makes `page` the slab's fresh cursor for `class` and cuts its first block.
    fn install_fresh(
        &self,
        cache: &mut ThreadCache,
        slab: usize,
        class: usize,
        page: PPtr,
    ) -> Result<PPtr> {
        let s = &mut cache.slabs[slab];
        // A refill happens only when the cursor is exhausted, so nothing is overwritten.
        s.fresh[class] = Some(Fresh { base: page, next: 0, count: self.blocks_per_page(class) });
        s.cut(class, self.classes[class])
            .ok_or_else(|| PoolError::corrupted(format!("fresh NSM page {page} yields no block")))
    }

    /// A large block: its own extent on `slab`'s node (round-robin: the next node in turn).
    fn alloc_large(&self, slab: usize, size: u64) -> Result<PPtr> {
        let pages = size.div_ceil(self.page_size);
        let try_node = |node: usize| {
            // PERSIST: alloc_pages persists the head descriptor (aux = LARGE) before returning.
            self.pool.alloc_pages(node, pages, self.owner, LARGE)
        };
        let p = if slab < self.nodes {
            try_node(slab)?
        } else {
            let mut got = None;
            let mut last = None;
            for _ in 0..self.nodes {
                // ORDERING: Relaxed; the counter only spreads pages.
                let n = self.rr_next.fetch_add(1, Ordering::Relaxed) % self.nodes;
                match try_node(n) {
                    Ok(p) => {
                        got = Some(p);
                        break;
                    }
                    Err(e @ PoolError::OutOfSpace { .. }) => last = Some(e),
                    Err(e) => return Err(e),
                }
            }
            match got {
                Some(p) => p,
                None => {
                    return Err(last.unwrap_or(PoolError::OutOfSpace { node: 0, requested: size }))
                }
            }
        };
        self.large.lock().insert(p, pages);
        Ok(p)
    }

    /// What `p` is according to the page descriptors; `BadPointer` unless it is the start of a
    /// small block or of a large extent. Reads only the heap's DRAM mirror.
    fn classify(&self, p: PPtr) -> Result<Block> {
        let bad = |why| PoolError::BadPointer { ptr: p.to_string(), why };
        if p.is_null() {
            return Err(bad("null"));
        }
        let info = self.pool.page_info(p).ok_or_else(|| bad("not in an allocated page"))?;
        if info.owner != self.owner {
            return Err(bad("not in an NSM page"));
        }
        if info.aux == LARGE {
            return if p == info.extent {
                Ok(Block::Large)
            } else {
                Err(bad("inside a large NSM block, not at its start"))
            };
        }
        let class = usize::from(info.aux);
        let size = *self.classes.get(class).ok_or_else(|| {
            PoolError::corrupted(format!(
                "NSM page {} has size class {class}, only {} exist",
                info.extent,
                self.classes.len()
            ))
        })?;
        // page_info found `p` in this extent, so it is not below its start.
        let off = p.offset().saturating_sub(info.extent.offset());
        if off % size != 0 || off / size >= self.blocks_per_page(class) {
            return Err(bad("not at an NSM block boundary"));
        }
        Ok(Block::Small { class, page: info.extent })
    }

    fn free_block(&self, p: PPtr) -> Result<()> {
        let block = self.classify(p)?;
        if self.hold_back_free(p, block)? {
            return Ok(());
        }
        match block {
            Block::Small { class, .. } => {
                let node = p.node();
                let mut cache = match self.cache() {
                    Ok(cache) => cache,
                    Err(e) => {
                        // A thread without a cache slot: above all a deferred free that
                        // crossbeam runs on a thread whose thread-locals are being torn down
                        // (its exit pushes its epoch bag and may collect expired ones), or a
                        // thread past MAX_THREADS. Failing here leaked the block until the next
                        // recovery (seen as whole epoch bags, 64 blocks, left allocated). It
                        // goes to the shared depot of its node and class instead.
                        let Some(depot) = self.depots.get(node).and_then(|d| d.get(class)) else {
                            return Err(e);
                        };
                        depot.lock().push(p);
                        // ORDERING: Relaxed; a statistic.
                        self.uncached_freed_bytes.fetch_add(self.classes[class], Ordering::Relaxed);
                        return Ok(());
                    }
                };
                cache.small_bytes -= self.classes[class] as i64;
                let list = &mut cache.slabs[node].free[class];
                list.push(p);
                // A thread that frees what others allocate would hoard blocks: past two batches,
                // one batch goes to the depot where every thread can refill from.
                let batch = self.batch(class);
                if list.len() >= 2 * batch {
                    let keep = list.len() - batch;
                    if let Some(d) = self.depots.get(node).and_then(|d| d.get(class)) {
                        d.lock().extend(list.drain(keep..));
                    }
                }
                Ok(())
            }
            Block::Large => {
                let mut large = self.large.lock();
                if !large.contains_key(&p) {
                    return Err(PoolError::BadPointer {
                        ptr: p.to_string(),
                        why: "large NSM block is not live (freed twice?)",
                    });
                }
                // PERSIST: free_pages persists the cleared descriptor before the pages can be
                // reused. Under the map lock, so two frees of one extent cannot both get here.
                self.pool.free_pages(p)?;
                large.remove(&p);
                Ok(())
            }
        }
    }

    /// A free of a frozen block while a deferred collection is pending is only recorded: the
    /// sweep frees it (exactly once, whatever the walk saw). True if `p` was held back.
    fn hold_back_free(&self, p: PPtr, block: Block) -> Result<bool> {
        // ORDERING: Acquire; pairs with the Release in `collect`. A stale `true` is re-checked
        // under the lock; a `false` means the sweep is over and the normal path applies.
        if !self.deferred_pending.load(Ordering::Acquire) {
            return Ok(false);
        }
        let mut guard = self.deferred.lock();
        let Some(d) = guard.as_mut() else { return Ok(false) };
        if !d.holds(p, block) {
            return Ok(false);
        }
        if !d.freed.insert(p) {
            return Err(PoolError::BadPointer {
                ptr: p.to_string(),
                why: "NSM block freed twice during a deferred collection",
            });
        }
        Ok(true)
    }

    // -----------------------------------------------------------------------------------------
    // Leak checks and statistics
    // -----------------------------------------------------------------------------------------

    /// Every block NSM considers allocated: the blocks of NSM pages that are on no free list,
    /// in no depot and not yet cut from a fresh page, plus every large extent; sorted. While a
    /// deferred collection is pending, every block of a frozen extent counts, except those
    /// whose free was held back.
    ///
    /// Exact when no other thread allocates or frees meanwhile (the testkit's leak check runs
    /// quiescent); it locks every thread cache, so it is not for hot paths.
    pub fn allocated_blocks(&self) -> Vec<PPtr> {
        // Lock order everywhere: deferred state, thread cache(s) in tid order, then depots.
        let deferred = self.deferred.lock();
        let caches: Vec<_> = self.caches.iter().map(|c| c.lock()).collect();
        let depots: Vec<_> = self.depots.iter().flat_map(|d| d.iter().map(|m| m.lock())).collect();
        let mut free: HashSet<PPtr> = HashSet::new();
        let mut fresh: HashMap<PPtr, u64> = HashMap::new();
        for cache in &caches {
            for slab in &cache.slabs {
                free.extend(slab.free.iter().flatten().copied());
                fresh.extend(slab.fresh.iter().flatten().map(|f| (f.base, f.next)));
            }
        }
        for d in &depots {
            free.extend(d.iter().copied());
        }
        if let Some(d) = deferred.as_ref() {
            free.extend(d.freed.iter().copied());
        }
        let mut out = Vec::new();
        for node in 0..self.nodes {
            for e in self.pool.extents(node).unwrap_or_default() {
                if e.owner != self.owner {
                    continue;
                }
                if e.aux == LARGE {
                    if !free.contains(&e.ptr) {
                        out.push(e.ptr);
                    }
                    continue;
                }
                let class = usize::from(e.aux);
                let Some(&size) = self.classes.get(class) else { continue };
                let cut = fresh.get(&e.ptr).copied().unwrap_or(u64::MAX);
                for i in 0..self.blocks_per_page(class).min(cut) {
                    if let Some(b) = e.ptr.add(i * size) {
                        if !free.contains(&b) {
                            out.push(b);
                        }
                    }
                }
            }
        }
        out.sort_unstable();
        out
    }

    /// Checks the volatile free state: every block on a free list, in a depot or held back by
    /// a deferred collection is an NSM block start, appears once (a block there twice was
    /// freed twice and would be handed out twice), and lies in no fresh page's uncut rest.
    /// Quiescent, like [`Nsm::allocated_blocks`].
    ///
    /// # Errors
    /// `Corrupted` naming the first offending block.
    pub fn check_free_lists(&self) -> Result<()> {
        let deferred = self.deferred.lock();
        let caches: Vec<_> = self.caches.iter().map(|c| c.lock()).collect();
        let depots: Vec<_> = self.depots.iter().flat_map(|d| d.iter().map(|m| m.lock())).collect();
        let mut fresh: HashMap<PPtr, u64> = HashMap::new();
        // (block, held back by a deferred collection: may be a large block)
        let mut free: Vec<(PPtr, bool)> = Vec::new();
        for cache in &caches {
            for slab in &cache.slabs {
                free.extend(slab.free.iter().flatten().map(|&p| (p, false)));
                fresh.extend(slab.fresh.iter().flatten().map(|f| (f.base, f.next)));
            }
        }
        for d in &depots {
            free.extend(d.iter().map(|&p| (p, false)));
        }
        free.extend(deferred.iter().flat_map(|d| d.freed.iter().map(|&p| (p, true))));
        let mut seen = HashSet::with_capacity(free.len());
        for (p, held) in free {
            let bad = |why: &str| Err(PoolError::corrupted(format!("free NSM block {p}: {why}")));
            if !seen.insert(p) {
                return bad("free twice (double free)");
            }
            match self.classify(p) {
                Ok(Block::Small { class, page }) => {
                    let i = (p.offset() - page.offset()) / self.classes[class];
                    if fresh.get(&page).is_some_and(|&next| i >= next) {
                        return bad("not yet cut from its fresh page");
                    }
                }
                Ok(Block::Large) if held => {}
                Ok(Block::Large) => return bad("a large block on a small free list"),
                Err(e) => return bad(&e.to_string()),
            }
        }
        Ok(())
    }

    /// Pages per node and bytes handed out (see [`NsmStats`]). While a deferred collection is
    /// pending, every block of a frozen extent counts as handed out.
    pub fn stats(&self) -> NsmStats {
        let mut stats = NsmStats {
            small_pages: vec![0; self.nodes],
            large_pages: vec![0; self.nodes],
            allocated_bytes: 0,
        };
        for node in 0..self.nodes {
            for e in self.pool.extents(node).unwrap_or_default() {
                if e.owner == self.owner {
                    if e.aux == LARGE {
                        stats.large_pages[node] += e.pages;
                    } else {
                        stats.small_pages[node] += e.pages;
                    }
                }
            }
        }
        let frozen_large: u64 =
            self.deferred.lock().as_ref().map_or(0, |d| d.large.values().sum::<u64>());
        let small: i64 = self.caches.iter().map(|c| c.lock().small_bytes).sum();
        // ORDERING: Relaxed; a statistic, read without synchronising with the sweep.
        let recovered = self.recovered_small_bytes.load(Ordering::Relaxed);
        let uncached = self.uncached_freed_bytes.load(Ordering::Relaxed);
        let small =
            (recovered as i64).saturating_add(small).saturating_sub(uncached as i64).max(0) as u64;
        let large: u64 = self.large.lock().values().map(|&pages| pages * self.page_size).sum();
        stats.allocated_bytes = small + large + frozen_large * self.page_size;
        stats
    }

    // -----------------------------------------------------------------------------------------
    // Recovery
    // -----------------------------------------------------------------------------------------

    /// Every NSM extent of the pool, unmarked. `Corrupted` for an impossible class.
    fn unmarked(&self) -> Result<Marks> {
        let mut marks = Marks { pages: BTreeMap::new(), large: BTreeMap::new() };
        for node in 0..self.nodes {
            for e in self.pool.extents(node)? {
                if e.owner != self.owner {
                    continue;
                }
                if e.aux == LARGE {
                    marks.large.insert(e.ptr, (e.pages, false));
                    continue;
                }
                let class = usize::from(e.aux);
                if class >= self.classes.len() || e.pages != 1 {
                    return Err(PoolError::corrupted(format!(
                        "NSM extent {} has class {class} and {} pages",
                        e.ptr, e.pages
                    )));
                }
                marks.pages.insert(e.ptr, PageMarks::new(self.blocks_per_page(class), class));
            }
        }
        Ok(marks)
    }

    /// Marks every reachable block of `marks`' extents; returns how many distinct blocks were
    /// marked. A pointer that is not an NSM block start is `Corrupted`; one of an extent that
    /// `marks` does not hold is `Corrupted` when `strict`, else skipped (a deferred collection
    /// only sweeps the extents frozen at open; later ones are tracked exactly — a block the
    /// concurrent walk reached may even have been freed since, with its large extent, which is
    /// why only pointers into held extents must be blocks then). Changes nothing but `marks`.
    fn mark(
        &self,
        marks: &mut Marks,
        reachable: impl IntoIterator<Item = PPtr>,
        strict: bool,
    ) -> Result<u64> {
        let mut count = 0;
        for p in reachable {
            let block = match self.classify(p) {
                Ok(b) => b,
                Err(PoolError::BadPointer { .. }) if !strict && !marks.holds_address(self, p) => {
                    continue
                }
                Err(PoolError::BadPointer { why, .. }) => {
                    return Err(PoolError::corrupted(format!(
                        "reachable pointer {p} is not an NSM block: {why}"
                    )))
                }
                Err(e) => return Err(e),
            };
            let not_indexed =
                || PoolError::corrupted(format!("{p}: NSM extent missing from the heap index"));
            let fresh = match block {
                Block::Small { class, page } => match marks.pages.get_mut(&page) {
                    Some(pg) => pg.set((p.offset() - page.offset()) / self.classes[class], true),
                    None if strict => return Err(not_indexed()),
                    None => false,
                },
                Block::Large => match marks.large.get_mut(&p) {
                    Some(l) => !std::mem::replace(&mut l.1, true),
                    None if strict => return Err(not_indexed()),
                    None => false,
                },
            };
            count += u64::from(fresh);
        }
        Ok(count)
    }

    /// Sets (`on`) or clears the mark of one block of `marks`, if it holds the block.
    fn set_mark(&self, marks: &mut Marks, p: PPtr, on: bool) {
        match self.classify(p) {
            Ok(Block::Small { class, page }) => {
                if let Some(pg) = marks.pages.get_mut(&page) {
                    pg.set((p.offset() - page.offset()) / self.classes[class], on);
                }
            }
            Ok(Block::Large) => {
                if let Some(l) = marks.large.get_mut(&p) {
                    l.1 = on;
                }
            }
            Err(_) => {}
        }
    }

    /// The sweep: pages without a marked block and unmarked large extents return to the heap,
    /// unmarked blocks of the other pages go to the depots (lowest address handed out first),
    /// marked large extents become live. Returns the bytes of marked small blocks.
    fn sweep(&self, marks: Marks, report: &mut NsmRecovery) -> Result<u64> {
        let mut small_bytes = 0;
        // (node, class) → free blocks, ascending; moved to the depots at the end.
        let mut free: BTreeMap<(usize, usize), Vec<PPtr>> = BTreeMap::new();
        for (page, pg) in marks.pages {
            if pg.marked == 0 {
                // PERSIST: free_pages persists the cleared descriptor; a crash before it merely
                // leaves the page for the next recovery to collect again.
                self.pool.free_pages(page)?;
                report.pages_freed += 1;
                continue;
            }
            report.pages_kept += 1;
            let size = self.classes[pg.class];
            small_bytes += pg.marked * size;
            let list = free.entry((page.node(), pg.class)).or_default();
            let before = list.len();
            let count = self.blocks_per_page(pg.class);
            list.extend((0..count).filter(|&i| !pg.get(i)).filter_map(|i| page.add(i * size)));
            report.blocks_free += (list.len() - before) as u64;
        }
        for ((node, class), list) in free {
            // Depots pop from the end: pushing in descending order hands out the lowest
            // addresses first.
            self.depots[node][class].lock().extend(list.into_iter().rev());
        }
        for (p, (n, reached)) in marks.large {
            if reached {
                self.large.lock().insert(p, n);
                report.large_kept += 1;
            } else {
                // PERSIST: as above; an unreachable large extent is durably free.
                self.pool.free_pages(p)?;
                report.large_freed += 1;
            }
        }
        Ok(small_bytes)
    }

    /// Rebuilds NSM over a reopened pool (after a crash or a clean shutdown — free lists are
    /// volatile either way) by garbage collection: `reachable` are all blocks the engine can
    /// reach. Small-block pages with no reachable block return to the heap; the unreachable
    /// blocks of the other pages go to the depot; unreachable large extents are freed.
    /// Duplicates in `reachable` are allowed.
    ///
    /// # Errors
    /// `Corrupted` — with nothing modified — when a reachable pointer is not the start of an
    /// NSM block, or an NSM descriptor has an impossible class; `InvalidArgument` for a bad
    /// mode or a crashed pool; errors of [`Pool::free_pages`] while returning pages.
    pub fn recover(
        pool: Arc<Pool>,
        mode: NsmMode,
        reachable: impl IntoIterator<Item = PPtr>,
    ) -> Result<(Arc<Nsm>, NsmRecovery)> {
        Self::recover_owned(pool, mode, OWNER_NSM, reachable)
    }

    /// [`Nsm::recover`] for an NSM created with [`Nsm::new_owned`]`(…, owner)`: only extents
    /// tagged `owner` are collected.
    ///
    /// # Errors
    /// As [`Nsm::recover`].
    pub fn recover_owned(
        pool: Arc<Pool>,
        mode: NsmMode,
        owner: u8,
        reachable: impl IntoIterator<Item = PPtr>,
    ) -> Result<(Arc<Nsm>, NsmRecovery)> {
        let t0 = Instant::now();
        if pool.has_crashed() {
            return Err(PoolError::InvalidArgument("pool crashed; reopen it to recover".into()));
        }
        let nsm = Self::build(pool, mode, owner)?;
        let mut marks = nsm.unmarked()?;
        // Only volatile state changes until every pointer has been checked.
        let mut report = NsmRecovery {
            blocks_reachable: nsm.mark(&mut marks, reachable, true)?,
            ..NsmRecovery::default()
        };
        let small_bytes = nsm.sweep(marks, &mut report)?;
        // ORDERING: Relaxed; the Arc below publishes it.
        nsm.recovered_small_bytes.store(small_bytes, Ordering::Relaxed);
        report.elapsed = t0.elapsed();
        Ok((Arc::new(nsm), report))
    }

    /// Opens NSM over a reopened pool without knowing what is reachable — O(NSM extents), not
    /// O(blocks): every NSM extent existing now is frozen (its blocks count as allocated and
    /// none is handed out), new allocations take new pages. The collection of the frozen
    /// extents' unreachable blocks is [`Nsm::collect`]'s job, later.
    ///
    /// The engine's side of the protocol (docs/design.md §9, "Deferred recovery"):
    /// - it makes no block reachable that was unreachable when this returned;
    /// - it frees blocks it unlinks only through [`retire`](super::retire), called while still
    ///   pinned in the epoch guard under which it unlinked them;
    /// - the walk it hands to [`Nsm::collect`] starts after this returned and reaches every block
    ///   that stays reachable from its start until the walk passes it.
    ///
    /// # Errors
    /// As [`Nsm::recover`], without the reachability errors.
    pub fn recover_deferred(pool: Arc<Pool>, mode: NsmMode) -> Result<Arc<Nsm>> {
        if pool.has_crashed() {
            return Err(PoolError::InvalidArgument("pool crashed; reopen it to recover".into()));
        }
        let nsm = Self::build(pool, mode, OWNER_NSM)?;
        let marks = nsm.unmarked()?;
        let mut frozen_bytes = 0;
        let mut d = Deferred::default();
        for (page, pg) in marks.pages {
            frozen_bytes += nsm.blocks_per_page(pg.class) * nsm.classes[pg.class];
            d.pages.insert(page, pg.class);
        }
        d.large = marks.large.into_iter().map(|(p, (n, _))| (p, n)).collect();
        // ORDERING: Relaxed, both: the Arc below publishes them.
        nsm.recovered_small_bytes.store(frozen_bytes, Ordering::Relaxed);
        nsm.deferred_pending.store(true, Ordering::Relaxed);
        *nsm.deferred.lock() = Some(d);
        Ok(Arc::new(nsm))
    }

    /// True from [`Nsm::recover_deferred`] until [`Nsm::collect`] has swept.
    pub fn collection_pending(&self) -> bool {
        // ORDERING: Acquire; pairs with the Release in `collect`.
        self.deferred_pending.load(Ordering::Acquire)
    }

    /// Finishes a deferred recovery: waits for an epoch grace period (every thread pinned now
    /// has unpinned — so every block unlinked before the caller's walk passed it has been
    /// announced through [`retire`](super::retire)), then sweeps the frozen extents. A frozen
    /// block is freed iff its free was held back, or it is neither in `reachable` nor
    /// announced as retired (then its own deferred free will free it, after the sweep).
    ///
    /// `reachable`: the blocks reached by a walk that started after
    /// [`Nsm::recover_deferred`] returned (see there); blocks outside the frozen extents are
    /// checked and ignored. Returns `None`, with nothing changed and the collection still
    /// pending, when `cancel` became true while waiting. The caller must not be pinned.
    ///
    /// # Errors
    /// `InvalidArgument` when no collection is pending; `Corrupted` — with nothing changed and
    /// the collection still pending — when a reachable pointer is not an NSM block start;
    /// errors of [`Pool::free_pages`] (then the blocks not yet swept stay allocated: a leak
    /// until the next open, never a double allocation).
    pub fn collect(
        &self,
        reachable: impl IntoIterator<Item = PPtr>,
        cancel: &AtomicBool,
    ) -> Result<Option<NsmRecovery>> {
        let t0 = Instant::now();
        if !self.collection_pending() {
            return Err(PoolError::InvalidArgument("no deferred NSM collection pending".into()));
        }
        // Before taking the lock: a deferred free that runs while we wait takes it.
        if !super::wait_for_unpin(cancel) {
            return Ok(None);
        }
        let mut guard = self.deferred.lock();
        let Some(d) = guard.as_ref() else {
            return Err(PoolError::InvalidArgument("no deferred NSM collection pending".into()));
        };
        let mut marks = Marks {
            pages: d
                .pages
                .iter()
                .map(|(&p, &class)| (p, PageMarks::new(self.blocks_per_page(class), class)))
                .collect(),
            large: d.large.iter().map(|(&p, &n)| (p, (n, false))).collect(),
        };
        let mut report = NsmRecovery {
            blocks_reachable: self.mark(&mut marks, reachable, false)?,
            ..NsmRecovery::default()
        };
        // Kept iff (reached or retired) and not freed: a retired block's own free frees it
        // (held back if it already ran: then the sweep frees it now).
        for &p in &d.retired {
            self.set_mark(&mut marks, p, true);
        }
        for &p in &d.freed {
            self.set_mark(&mut marks, p, false);
        }
        let Some(d) = guard.take() else { unreachable!("checked above") };
        let result = self.sweep(marks, &mut report);
        // ORDERING: Release; pairs with the Acquire in `hold_back_free`: a free that sees
        // `false` goes the normal way, and the frozen blocks are ordinary blocks from now on.
        self.deferred_pending.store(false, Ordering::Release);
        drop(guard);
        drop(d);
        let small_bytes = result?;
        // ORDERING: Relaxed; a statistic.
        self.recovered_small_bytes.store(small_bytes, Ordering::Relaxed);
        report.elapsed = t0.elapsed();
        Ok(Some(report))
    }
}

impl PmAllocator for Nsm {
    /// Allocates as the mode says (Algorithm 1 with no node given).
    fn alloc(&self, size: usize) -> Result<PPtr> {
        self.alloc_on(size, None)
    }

    /// Returns a block to the calling thread's slab for the block's node (large blocks: to the
    /// heap). A pointer that is not the start of an NSM block — null, foreign, another owner's
    /// page, the middle of a block — is rejected with `BadPointer` and changes nothing; the
    /// `unsafe` contract remains for double frees of small blocks and use after free, which
    /// NSM cannot detect without per-block metadata.
    unsafe fn free(&self, p: PPtr) -> Result<()> {
        self.free_block(p)
    }

    /// While a deferred collection is pending, records a frozen block as retired: the sweep
    /// then leaves it to its own (deferred) free, whether or not the walk reached it.
    fn retiring(&self, p: PPtr) {
        if !self.collection_pending() {
            return;
        }
        let Ok(block) = self.classify(p) else { return }; // the free will report it
        let mut guard = self.deferred.lock();
        if let Some(d) = guard.as_mut().filter(|d| d.holds(p, block)) {
            d.retired.insert(p);
        }
    }

    fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{EngineId, PoolConfig};

    fn pool(page_size: u64) -> Arc<Pool> {
        let mut cfg = PoolConfig::new(EngineId::new("nsm-unit", 1), 4 << 20);
        cfg.nodes = 2;
        cfg.page_size = page_size;
        Pool::volatile(cfg).unwrap()
    }

    /// A deferred free can run on a thread whose thread-locals are being torn down (crossbeam
    /// collects expired bags while the exiting thread pushes its own): the thread has no id and
    /// so no cache any more. The block must still come back (before: `free` failed and the
    /// block stayed allocated until the next recovery).
    #[test]
    fn a_free_on_an_exiting_thread_returns_the_block() {
        type Outcome = Arc<parking_lot::Mutex<Option<(bool, Result<()>)>>>;
        struct FreeOnExit(std::cell::RefCell<Option<(Arc<Nsm>, PPtr, Outcome)>>);
        impl Drop for FreeOnExit {
            fn drop(&mut self) {
                if let Some((nsm, p, out)) = self.0.borrow_mut().take() {
                    let no_id = numakv_numa::try_tid().is_err();
                    // SAFETY: `p` came from `nsm` and is freed once, here.
                    *out.lock() = Some((no_id, unsafe { nsm.free(p) }));
                }
            }
        }
        thread_local!(static EXIT: FreeOnExit = const { FreeOnExit(std::cell::RefCell::new(None)) });

        let nsm = Nsm::new(pool(64 << 10), NsmMode::Local).unwrap();
        let before = nsm.allocated_blocks().len();
        let out: Outcome = Arc::default();
        let (n2, o2) = (Arc::clone(&nsm), Arc::clone(&out));
        std::thread::spawn(move || {
            // Registered before the thread's id slot, so destroyed after it.
            EXIT.with(|_| {});
            let p = n2.alloc(100).unwrap();
            EXIT.with(|e| *e.0.borrow_mut() = Some((n2, p, o2)));
        })
        .join()
        .unwrap();
        let (no_id, freed) = out.lock().take().expect("the destructor ran");
        assert!(no_id, "the scenario needs a thread without an id when the free runs");
        freed.expect("free on an exiting thread");
        assert_eq!(nsm.allocated_blocks().len(), before, "the block is still allocated");
        assert_eq!(nsm.stats().allocated_bytes, 0);
    }

    #[test]
    fn size_classes_are_the_documented_table() {
        assert_eq!(
            size_classes(64 << 10),
            [
                16, 32, 64, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192,
                12288, 16384, 24576, 32768
            ]
        );
        assert_eq!(
            size_classes(4096),
            [16, 32, 64, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048]
        );
        for ps in [4096u64, 64 << 10, 256 << 10, 1 << 30, 1 << 62] {
            let c = size_classes(ps);
            assert!(c.windows(2).all(|w| w[0] < w[1]), "{ps}: not ascending");
            assert!(c.iter().all(|&s| s < 64 || s % 64 == 0), "{ps}: unaligned class");
            assert!(*c.last().unwrap() <= ps / 2);
            assert!(c.len() < usize::from(LARGE));
        }
        assert_eq!(*size_classes(256 << 10).last().unwrap(), 128 << 10);
    }

    #[test]
    fn requests_map_to_the_smallest_fitting_class() {
        let nsm = Nsm::new(pool(64 << 10), NsmMode::Local).unwrap();
        let cases = [
            (0, 16),
            (1, 16),
            (16, 16),
            (17, 32),
            (33, 64),
            (65, 128),
            (129, 192),
            (256, 256),
            (257, 384),
            (32768, 32768),
            (32769, 64 << 10),
            (200 << 10, 256 << 10),
        ];
        for (req, want) in cases {
            assert_eq!(nsm.block_size(req), want, "request {req}");
        }
    }

    #[test]
    fn every_class_is_aligned_and_aux_records_it() {
        let pool = pool(64 << 10);
        let nsm = Nsm::new(Arc::clone(&pool), NsmMode::Node(1)).unwrap();
        for (class, &size) in nsm.size_classes().to_vec().iter().enumerate() {
            for _ in 0..3 {
                let p = nsm.alloc(size as usize).unwrap();
                assert_eq!(p.node(), 1);
                let align = if size >= 64 { 64 } else { 16 };
                assert_eq!(p.offset() % align, 0, "class {size}");
                let info = pool.page_info(p).unwrap();
                assert_eq!((info.owner, usize::from(info.aux)), (OWNER_NSM, class));
                assert_eq!((p.offset() - info.extent.offset()) % size, 0);
            }
        }
    }

    /// Issue 36: after churn the round-robin slab reused the free list of the node of its
    /// last hit until it ran dry, so the blocks a burst of allocations got all sat on one node
    /// (the node of the last freed block). Reuse now rotates over the nodes' free lists.
    #[test]
    fn round_robin_reuse_alternates_nodes() {
        // 4 KiB pages: 16 blocks of 256 bytes each, so 64 blocks take pages of both nodes.
        let nsm = Nsm::new(pool(4 << 10), NsmMode::RoundRobin).unwrap();
        let blocks: Vec<PPtr> = (0..64).map(|_| nsm.alloc(256).unwrap()).collect();
        for node in 0..2 {
            assert!(blocks.iter().filter(|p| p.node() == node).count() >= 16, "fresh pages");
        }
        for &p in &blocks {
            // SAFETY: allocated above, freed once, never used.
            unsafe { nsm.free(p).unwrap() };
        }
        let again: Vec<usize> = (0..16).map(|_| nsm.alloc(256).unwrap().node()).collect();
        let on0 = again.iter().filter(|&&n| n == 0).count();
        assert!((6..=10).contains(&on0), "reused blocks by node: {again:?}");
    }

    #[test]
    fn modes_parse_and_print() {
        for m in [NsmMode::Local, NsmMode::RoundRobin, NsmMode::Node(3)] {
            assert_eq!(m.to_string().parse::<NsmMode>().unwrap(), m);
        }
        assert_eq!("node:12".parse::<NsmMode>().unwrap(), NsmMode::Node(12));
        for bad in ["", "Local", "node:", "node:x", "node:-1", "rr"] {
            assert!(matches!(bad.parse::<NsmMode>(), Err(PoolError::InvalidArgument(_))), "{bad}");
        }
    }

    #[test]
    fn new_refuses_a_pool_with_nsm_pages_and_bad_nodes() {
        let pool = pool(64 << 10);
        assert!(matches!(
            Nsm::new(Arc::clone(&pool), NsmMode::Node(2)),
            Err(PoolError::InvalidArgument(_))
        ));
        let nsm = Nsm::new(Arc::clone(&pool), NsmMode::Local).unwrap();
        nsm.alloc(64).unwrap();
        assert!(matches!(Nsm::new(pool, NsmMode::Local), Err(PoolError::InvalidArgument(_))));
    }
}
