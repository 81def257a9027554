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
use std::sync::atomic::{AtomicUsize, Ordering};
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
    /// Node whose free list the round-robin slab tries first.
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
    /// Bytes of small blocks found reachable at recovery (allocated before this session).
    recovered_small_bytes: u64,
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
        for node in 0..pool.nodes() {
            if pool.extents(node)?.iter().any(|e| e.owner == OWNER_NSM) {
                return Err(PoolError::InvalidArgument(format!(
                    "node {node} already holds NSM pages; open it with Nsm::recover"
                )));
            }
        }
        Ok(Arc::new(Self::build(pool, mode)?))
    }

    fn build(pool: Arc<Pool>, mode: NsmMode) -> Result<Nsm> {
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
            nodes,
            page_size,
            classes,
            caches,
            depots,
            large: Mutex::new(HashMap::new()),
            rr_next: CachePadded::new(AtomicUsize::new(0)),
            recovered_small_bytes: 0,
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
        // slab of its node), so reuse them first, starting where the last hit was.
        for i in 0..self.nodes {
            let n = (cache.rr_cursor + i) % self.nodes;
            if let Some(p) = cache.slabs[n].free[class].pop() {
                cache.rr_cursor = n;
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
        self.pool.alloc_pages(node, 1, OWNER_NSM, class as u16)
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
            self.pool.alloc_pages(node, pages, OWNER_NSM, LARGE)
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
        if info.owner != OWNER_NSM {
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
        match self.classify(p)? {
            Block::Small { class, .. } => {
                let node = p.node();
                let mut cache = self.cache()?;
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

    // -----------------------------------------------------------------------------------------
    // Leak checks and statistics
    // -----------------------------------------------------------------------------------------

    /// Every block NSM considers allocated: the blocks of NSM pages that are on no free list,
    /// in no depot and not yet cut from a fresh page, plus every large extent; sorted.
    ///
    /// Exact when no other thread allocates or frees meanwhile (the testkit's leak check runs
    /// quiescent); it locks every thread cache, so it is not for hot paths.
    pub fn allocated_blocks(&self) -> Vec<PPtr> {
        // Lock order everywhere: thread cache(s) in tid order, then depots.
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
        let mut out = Vec::new();
        for node in 0..self.nodes {
            for e in self.pool.extents(node).unwrap_or_default() {
                if e.owner != OWNER_NSM {
                    continue;
                }
                if e.aux == LARGE {
                    out.push(e.ptr);
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

    /// Pages per node and bytes handed out (see [`NsmStats`]).
    pub fn stats(&self) -> NsmStats {
        let mut stats = NsmStats {
            small_pages: vec![0; self.nodes],
            large_pages: vec![0; self.nodes],
            allocated_bytes: 0,
        };
        for node in 0..self.nodes {
            for e in self.pool.extents(node).unwrap_or_default() {
                if e.owner == OWNER_NSM {
                    if e.aux == LARGE {
                        stats.large_pages[node] += e.pages;
                    } else {
                        stats.small_pages[node] += e.pages;
                    }
                }
            }
        }
        let small: i64 = self.caches.iter().map(|c| c.lock().small_bytes).sum();
        let small = (self.recovered_small_bytes as i64).saturating_add(small).max(0) as u64;
        let large: u64 = self.large.lock().values().map(|&pages| pages * self.page_size).sum();
        stats.allocated_bytes = small + large;
        stats
    }

    // -----------------------------------------------------------------------------------------
    // Recovery
    // -----------------------------------------------------------------------------------------

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
        let t0 = Instant::now();
        if pool.has_crashed() {
            return Err(PoolError::InvalidArgument("pool crashed; reopen it to recover".into()));
        }
        let mut nsm = Self::build(pool, mode)?;
        let pool = Arc::clone(&nsm.pool);

        // 1. Index every NSM extent: small pages get a mark bitmap, large extents a flag.
        struct Page {
            class: usize,
            marks: Vec<u64>,
            marked: u64,
        }
        let mut pages: BTreeMap<PPtr, Page> = BTreeMap::new();
        let mut large: BTreeMap<PPtr, (u64, bool)> = BTreeMap::new();
        for node in 0..nsm.nodes {
            for e in pool.extents(node)? {
                if e.owner != OWNER_NSM {
                    continue;
                }
                if e.aux == LARGE {
                    large.insert(e.ptr, (e.pages, false));
                    continue;
                }
                let class = usize::from(e.aux);
                if class >= nsm.classes.len() || e.pages != 1 {
                    return Err(PoolError::corrupted(format!(
                        "NSM extent {} has class {class} and {} pages",
                        e.ptr, e.pages
                    )));
                }
                let words = nsm.blocks_per_page(class).div_ceil(64) as usize;
                pages.insert(e.ptr, Page { class, marks: vec![0; words], marked: 0 });
            }
        }

        // 2. Mark. Only volatile state changes until every pointer has been checked.
        let mut report = NsmRecovery::default();
        for p in reachable {
            let block = nsm.classify(p).map_err(|e| match e {
                PoolError::BadPointer { why, .. } => PoolError::corrupted(format!(
                    "reachable pointer {p} is not an NSM block: {why}"
                )),
                other => other,
            })?;
            let not_indexed =
                || PoolError::corrupted(format!("{p}: NSM extent missing from the heap index"));
            match block {
                Block::Small { class, page } => {
                    let pg = pages.get_mut(&page).ok_or_else(not_indexed)?;
                    let i = (p.offset() - page.offset()) / nsm.classes[class];
                    let (w, bit) = ((i / 64) as usize, 1u64 << (i % 64));
                    if pg.marks[w] & bit == 0 {
                        pg.marks[w] |= bit;
                        pg.marked += 1;
                        report.blocks_reachable += 1;
                    }
                }
                Block::Large => {
                    let l = large.get_mut(&p).ok_or_else(not_indexed)?;
                    if !l.1 {
                        l.1 = true;
                        report.blocks_reachable += 1;
                    }
                }
            }
        }

        // 3. Sweep.
        let mut small_bytes = 0;
        for (page, pg) in pages {
            if pg.marked == 0 {
                // PERSIST: free_pages persists the cleared descriptor; a crash before it merely
                // leaves the page for the next recovery to collect again.
                pool.free_pages(page)?;
                report.pages_freed += 1;
                continue;
            }
            report.pages_kept += 1;
            let size = nsm.classes[pg.class];
            small_bytes += pg.marked * size;
            let count = nsm.blocks_per_page(pg.class);
            let depot = nsm.depots[page.node()][pg.class].get_mut();
            for i in 0..count {
                if pg.marks[(i / 64) as usize] & (1 << (i % 64)) == 0 {
                    if let Some(b) = page.add(i * size) {
                        depot.push(b);
                        report.blocks_free += 1;
                    }
                }
            }
        }
        let live = nsm.large.get_mut();
        for (p, (n, reached)) in large {
            if reached {
                live.insert(p, n);
                report.large_kept += 1;
            } else {
                // PERSIST: as above; an unreachable large extent is durably free.
                pool.free_pages(p)?;
                report.large_freed += 1;
            }
        }
        // Hand out the lowest addresses first: depots pop from the end.
        for d in nsm.depots.iter_mut().flat_map(|d| d.iter_mut()) {
            d.get_mut().reverse();
        }
        nsm.recovered_small_bytes = small_bytes;
        report.elapsed = t0.elapsed();
        Ok((Arc::new(nsm), report))
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
