//! NBTree: the lock-free B+-tree for persistent-cache (eADR) PM of papers/nbtree.txt.
//!
//! - **Decoupled leaves**: a DRAM metadata layer ([`leaf`]: fingerprints, `num`, commit bitmap,
//!   data pointer, `copy_ptr`, SMO flags, next) over a PM key-value layer ([`layout`]: unsorted
//!   16-byte entries plus next), both singly linked.
//! - **Log-structured insert**, **in-place update/delete**, fingerprint search ([`ops`]).
//! - **Three-phase SMO** with sync-on-write, sync-on-read and cooperative SMO ([`smo`]).
//! - **Inner nodes** in DRAM with FAST&FAIR's structure, high key and sibling, updated through
//!   an HTM-shaped atomic-update abstraction (version-word fallback) and searched with the
//!   shift-aware search ([`inner`], [`tree`]).
//! - **Calloc** for the key-value blocks; retired leaves freed through epochs; the recyclable
//!   log makes an SMO crash leak-free.
//! - **Ordered scans** over unsorted leaves ([`scan`]), **recovery** from the PM layer
//!   ([`recovery`]).
//! - Variants of the paper's factor analysis: [`Variant::W`] and [`Variant::WR`].
//!
//! Formats, the SMO protocol and its crash states: docs/design.md, section "NBTree".
//!
//! # Progress: what is lock-free and what waits
//!
//! The paper calls NBTree lock-free. In this implementation, exactly:
//!
//! - **Lock-free (no step waits for another thread):** searches through the inner nodes
//!   ([`inner::Inner::step`]: no version validation, no retry of a node — a writer parked in
//!   the middle of a shift delays no reader); leaf searches outside SMOs; the SMO's sync phase
//!   and the leaf-level part of its link phase, which any thread can run or finish
//!   (cooperative SMO, each hand-over one CAS; a link phase that meets a predecessor whose own
//!   link phase has begun finishes that SMO first). The parent update that ends a link phase
//!   is an inner-node write (below): a writer that reaches a new leaf before it is live waits
//!   for that, helping.
//! - **Waits, each bounded by a few instructions of the thread waited for** (short unless that
//!   thread is preempted; none of them waits for anything in turn):
//!   - a slot's BUSY bit ([`leaf::LeafMeta::tagged_store`], `unsealed`, `seal`): held for one
//!     value store or key CAS (two loads and a store for a sync); sync-on-read in the sync
//!     phase takes it on the copy's slot, so a read of a leaf in its sync phase can wait here;
//!   - the link phase's patch of the copy's `next` (`NEXT_PATCHING`): one PM store, its
//!     persist and one DRAM store;
//!   - the copy phase's wait for the pending bits ([`leaf::LeafMeta::wait_pending`]) and an
//!     insert's wait for a same-fingerprint slot that is pending: a committed insert between
//!     its commit CAS and the end of its key store and flush.
//! - **Locks:**
//!   - inner-node *writers* (an SMO's parent update, inner splits) serialise per node on the
//!     HTM fallback's version word ([`inner::htm`]; the paper uses HTM, itself not lock-free);
//!     spin, then yield;
//!   - the variants [`Variant::W`] and [`Variant::WR`] take per-leaf locks by design (Fig. 14).
//! - **Sleeps:** only when PM runs out — a copy phase that cannot begin its Calloc SMO retries
//!   unpinned for up to 5 s (`RESERVE_PATIENCE`) for a log slot to come back before it reports
//!   `OutOfSpace` (see `pinned`). An insert into a full leaf whose SMO cannot start fails and
//!   leaves the leaf as it was: its slot counter never passes the slot count.
//!
//! # Pause and failure points (tests only, docs/design.md §12)
//!
//! `nbtree.find_leaf.child` (a descent holds a leaf read from its parent), `nbtree.insert.claim`
//! (an insert before it claims a slot), `nbtree.update.store_buffered` (failure point: the
//! update's value store and tag release stay invisible — in the store buffer — until its
//! fence; with no fence they would drain after `nbtree.update.checked`), `nbtree.update.stored`
//! (an update after its store, before its fence and sync-on-write), `nbtree.update.checked` (an
//! update after its sync-on-write), `nbtree.delete.redirected` (a delete of a sealed slot, done
//! in the copy, not yet mirrored), `nbtree.smo.alloc` (failure point: the SMO's allocation
//! fails), `nbtree.smo.copied` (the copy is published, the sync phase not begun),
//! `nbtree.smo.seal_wait` (a sealer waits out a slot's BUSY holder; met on every spin),
//! `nbtree.smo.sealed` (sync phase: slots sealed, pass not run), `nbtree.smo.linked_pred` (link
//! phase: the predecessor points at the copy, the parent not yet), `nbtree.inner.shifted` (an
//! inner-node insert with its entries shifted, the new one not yet written).
//!
//! ```
//! use numakv_index::{Engine, Index};
//! use numakv_nbtree::{NbTree, NbTreeOptions};
//! use numakv_pmem::{Pool, PoolConfig};
//!
//! let pool = Pool::volatile(PoolConfig::new(NbTree::engine_id(), 64 << 20))?;
//! let tree = NbTree::create(pool, &NbTreeOptions::default())?;
//! assert!(tree.insert(7, u64::MAX)?); // every value is a value, high bits included
//! assert_eq!(tree.get(7)?, Some(u64::MAX));
//! let mut out = Vec::new();
//! tree.scan(1, 10, &mut out)?;
//! assert_eq!(out, vec![(7, u64::MAX)]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod alloc;
pub mod inner;
pub mod layout;
pub mod leaf;
mod ops;
mod recovery;
mod scan;
mod smo;
mod tree;

/// Hooks for the interleaving tests (`tests/interleavings.rs`): state a schedule needs that the
/// public API cannot reach. Compiled only with the `failpoints` feature (tests).
#[cfg(feature = "failpoints")]
pub mod testing {
    use std::sync::atomic::Ordering;

    use numakv_pmem::alloc::epoch;

    use crate::NbTree;

    /// The slot-claim counter (`num`) of the leaf that holds `key`'s range.
    pub fn leaf_claims(tree: &NbTree, key: u64) -> u32 {
        let g = epoch::pin();
        // ORDERING: Relaxed; a test reads it at quiescence.
        tree.find_leaf(key, &g).num.load(Ordering::Relaxed)
    }

    /// The key range `[low, high)` of the leaf that holds `key`'s range.
    pub fn leaf_bounds(tree: &NbTree, key: u64) -> (u64, u64) {
        let g = epoch::pin();
        let leaf = tree.find_leaf(key, &g);
        (leaf.low, leaf.high)
    }

    /// (leaves, inner nodes) counted by walking the structure (at quiescence).
    pub fn count_nodes(tree: &NbTree) -> (u64, u64) {
        tree.count_nodes()
    }

    /// Overwrites that counter: stands in for the claims of 2^32 failed inserts, which a test
    /// cannot make one by one.
    pub fn set_leaf_claims(tree: &NbTree, key: u64, num: u32) {
        let g = epoch::pin();
        // ORDERING: Relaxed; the test's later operations are ordered by its own joins.
        tree.find_leaf(key, &g).num.store(num, Ordering::Relaxed);
    }
}

use std::collections::HashSet;
use std::str::FromStr;
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};
use std::sync::Arc;

use numakv_index::{
    check_key, CheckReport, Engine, EngineStats, Error, Index, RecoveryReport, Result,
};
use numakv_pmem::alloc::calloc::{Calloc, CallocConfig};
use numakv_pmem::alloc::epoch;
use numakv_pmem::{Pool, PoolError};

pub use crate::alloc::LeafAllocator;
use crate::inner::{leaf_word, Inner};
use crate::layout::{Block, Shape, DEFAULT_SLOTS, SLOT_CALLOC, SLOT_HEAD, SLOT_META};
use crate::leaf::LeafMeta;

/// Which concurrency scheme runs on the leaves (papers/nbtree.txt §VI-E, Fig. 14).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Variant {
    /// NBTree: lock-free reads and writes.
    #[default]
    LockFree,
    /// NBTree-W: node-grained write locks on leaves (writers serialise per leaf); lock-free
    /// reads.
    W,
    /// NBTree-WR: node-grained locks for reads and writes.
    WR,
}

impl Variant {
    /// Whether leaf writers take the leaf lock.
    pub fn locks_writes(self) -> bool {
        self != Variant::LockFree
    }

    /// The option value (`lock-free`, `w`, `wr`).
    pub fn name(self) -> &'static str {
        match self {
            Variant::LockFree => "lock-free",
            Variant::W => "w",
            Variant::WR => "wr",
        }
    }
}

impl FromStr for Variant {
    type Err = Error;

    fn from_str(s: &str) -> Result<Variant> {
        match s.trim().to_ascii_lowercase().as_str() {
            "lock-free" | "lockfree" | "nbtree" => Ok(Variant::LockFree),
            "w" | "nbtree-w" => Ok(Variant::W),
            "wr" | "nbtree-wr" => Ok(Variant::WR),
            other => Err(Error::InvalidOptions(format!(
                "variant {other:?}: expected lock-free, w or wr"
            ))),
        }
    }
}

/// Options of an NBTree.
#[derive(Clone, Debug)]
pub struct NbTreeOptions {
    /// Entries per leaf, 2..=63 (default 63: 1 KB key-value blocks, the paper's node size;
    /// 31 gives the prototype's 512-byte leaves). Shapes the format:
    /// recorded at create, the stored value wins at open.
    pub leaf_slots: usize,
    /// Leaf concurrency scheme. Per session.
    pub variant: Variant,
    /// The coupled-leaf variant of Fig. 13: leaf metadata (bitmap, num, fingerprints) also
    /// kept in a PM line of each block, written on every insert and read on every search.
    /// Shapes the format: recorded at create, the stored value wins at open.
    pub coupled: bool,
    /// Allocator of the key-value blocks (§VI-F, Fig. 15): Calloc (default, the paper's),
    /// naive (bump, never freed) or the page heap. Recorded at create; naive and page-heap
    /// stores cannot be reopened (measurement stores, see [`LeafAllocator`]).
    pub allocator: LeafAllocator,
    /// Test hook: yield the CPU between the SMO's phases and steps, widening the windows in
    /// which concurrent operations meet an SMO in each phase (stress tests). Off by default;
    /// per session, not settable through the facade.
    pub smo_yield: bool,
}

impl Default for NbTreeOptions {
    fn default() -> Self {
        NbTreeOptions {
            leaf_slots: DEFAULT_SLOTS,
            variant: Variant::LockFree,
            coupled: false,
            allocator: LeafAllocator::Calloc,
            smo_yield: false,
        }
    }
}

/// Event counters (DRAM, per session).
#[derive(Debug, Default)]
struct Counters {
    smos: AtomicU64,
    smo_helps: AtomicU64,
    copies_lost: AtomicU64,
    sync_on_write: AtomicU64,
    sync_on_read: AtomicU64,
    inner_splits: AtomicU64,
    /// Leaf metadata records linked into the tree (published by an SMO's copy, unlinked at
    /// retire; retired ones awaiting their grace period are not counted).
    live_leaves: AtomicU64,
    /// Inner nodes (never freed while the tree lives: NBTree has no merges).
    inner_nodes: AtomicU64,
}

/// An NBTree in a pool; see the [crate docs](crate).
#[derive(Debug)]
pub struct NbTree {
    pool: Arc<Pool>,
    calloc: Arc<Calloc>,
    /// The blocks' allocator when it is not Calloc (`None`: Calloc).
    plain: Option<alloc::Plain>,
    slots: usize,
    shape: Shape,
    variant: Variant,
    smo_yield: bool,
    /// Root inner node (level ≥ 1).
    root: AtomicPtr<Inner>,
    /// First leaf (the DRAM anchor mirroring root slot `SLOT_HEAD`).
    head: AtomicPtr<LeafMeta>,
    counters: Counters,
}

// SAFETY: the raw pointers are to DRAM structures shared under the tree's protocols (atomics,
// epoch reclamation); nothing is tied to a thread.
unsafe impl Send for NbTree {}
// SAFETY: as for Send.
unsafe impl Sync for NbTree {}

/// How long [`NbTree::reserve_patiently`] waits for a Calloc log slot.
const RESERVE_PATIENCE: std::time::Duration = std::time::Duration::from_secs(5);

/// Bytes per node the naive allocator reserves: most of the node (it never frees).
fn naive_bytes(pool: &Pool) -> u64 {
    pool.capacity() / pool.nodes() as u64 / 100 * 80
}

/// Calloc geometry for a pool: blocks of one leaf, chunks of `chunk_blocks` blocks (512: one
/// bitmap line each; fewer for small pools), as many chunks as fit in `share` of a node.
fn calloc_config(pool: &Pool, shape: Shape, share: u64, chunk_blocks: u64) -> CallocConfig {
    let block = shape.block_size() as u64;
    let chunk = block * chunk_blocks;
    let cap = pool.capacity();
    CallocConfig {
        block_size: block,
        chunk_size: chunk,
        chunks_per_node: (cap / 100 * share / chunk).max(1),
        max_threads: 256,
        ring_capacity: 64,
        log_slots: 64,
    }
}

impl NbTree {
    fn new_handle(
        pool: Arc<Pool>,
        calloc: Arc<Calloc>,
        plain: Option<alloc::Plain>,
        shape: Shape,
        opts: &NbTreeOptions,
        root: *mut Inner,
        head: *mut LeafMeta,
    ) -> NbTree {
        let tree = NbTree {
            pool,
            calloc,
            plain,
            slots: shape.slots,
            shape,
            variant: opts.variant,
            smo_yield: opts.smo_yield,
            root: AtomicPtr::new(root),
            head: AtomicPtr::new(head),
            counters: Counters::default(),
        };
        // From here on the counts are maintained where nodes are linked and unlinked.
        let (leaves, inners) = tree.count_nodes();
        // ORDERING: Relaxed; counters, published with the handle.
        tree.counters.live_leaves.store(leaves, Ordering::Relaxed);
        tree.counters.inner_nodes.store(inners, Ordering::Relaxed);
        tree
    }

    /// Leaves along the leaf list and inner nodes level by level (leftmost child, then
    /// siblings): the structure walked, for the counters at open and for tests. Needs a tree
    /// no one else changes meanwhile.
    pub(crate) fn count_nodes(&self) -> (u64, u64) {
        let g = epoch::pin();
        let mut leaves = 0;
        // ORDERING: Acquire; pairs with the Release/SeqCst stores that link nodes.
        let mut p = self.head.load(Ordering::Acquire);
        while !p.is_null() {
            leaves += 1;
            p = self.meta(p, &g).next_ptr();
        }
        let mut inners = 0;
        let mut level: *const Inner = self.root.load(Ordering::Acquire);
        loop {
            // SAFETY: inner nodes live as long as the tree.
            let first = unsafe { &*level };
            let mut n: *const Inner = first;
            while !n.is_null() {
                inners += 1;
                // SAFETY: as above.
                n = unsafe { &*n }.sibling.load(Ordering::Acquire);
            }
            if first.level == 1 {
                break;
            }
            level = first.leftmost.load(Ordering::Acquire) as *const Inner;
        }
        (leaves, inners)
    }

    /// Runs `op` pinned.
    ///
    /// An SMO needs a Calloc log slot, and a thread's slots come back only after the grace
    /// period of its earlier SMOs — which cannot end while the thread is pinned, and Calloc's
    /// `smo_begin` waits for a slot without unpinning its caller. So when the copy phase cannot
    /// begin its Calloc SMO, it records what it wanted ([`smo::want_reservation`]) and fails
    /// with `OutOfSpace`; here the guard is dropped, the Calloc SMO begun *unpinned* (its wait
    /// can then complete grace periods), kept as this thread's reservation, and `op` retried,
    /// its copy phase taking the reservation. An unused reservation is aborted after `op`. Any
    /// other `OutOfSpace` is retried once after pushing the epoch on, then reported (a full
    /// pool stays full; nothing was changed by a failed attempt: an SMO that could not begin
    /// left its leaf as it was).
    fn pinned<T>(&self, mut op: impl FnMut(&epoch::Guard) -> Result<T>) -> Result<T> {
        let mut tries = 0;
        loop {
            let g = epoch::pin();
            let r = op(&g);
            drop(g);
            {
                let _acct = numakv_pmem::account::smo_scope();
                smo::drop_reservation();
            }
            match r {
                Err(e) if e.is_out_of_space() && tries < 16 => {
                    tries += 1;
                    if let Some((old, n)) = smo::take_want(&self.calloc) {
                        self.reserve_patiently(old, n)?;
                    } else {
                        for _ in 0..4 {
                            epoch::pin().flush();
                        }
                        if tries > 1 {
                            return Err(e);
                        }
                    }
                }
                r => return r,
            }
        }
    }

    /// Begins the Calloc SMO the copy phase wanted, unpinned. Calloc's own wait for a log slot
    /// is a bounded number of epoch pushes, which a preempted pinned thread elsewhere in the
    /// process can outlast on a busy machine; so it is retried, sleeping in between, for up to
    /// [`RESERVE_PATIENCE`] before the `OutOfSpace` is reported.
    fn reserve_patiently(&self, old: numakv_pmem::PPtr, n: usize) -> Result<()> {
        let start = std::time::Instant::now();
        loop {
            match smo::reserve(&self.calloc, old, n) {
                Err(e) if start.elapsed() < RESERVE_PATIENCE => {
                    let _ = e;
                    std::thread::sleep(std::time::Duration::from_micros(200));
                }
                r => return r,
            }
        }
    }

    /// DRAM the tree's index structure holds: the leaf metadata records linked into the tree
    /// (fingerprints, tags, bitmap, `num`, pointers: all inline in [`LeafMeta`]) and the inner
    /// nodes, at their `size_of`. Not counted: retired leaves waiting for their grace period,
    /// the heap allocator's own overhead, Calloc's volatile free lists, and per-thread state.
    pub fn dram_bytes(&self) -> u64 {
        // ORDERING: Relaxed; statistics.
        let leaves = self.counters.live_leaves.load(Ordering::Relaxed);
        let inners = self.counters.inner_nodes.load(Ordering::Relaxed);
        leaves * std::mem::size_of::<LeafMeta>() as u64
            + inners * std::mem::size_of::<Inner>() as u64
    }

    /// Entries per leaf.
    pub fn leaf_slots(&self) -> usize {
        self.slots
    }

    /// Whether the leaves use the coupled layout (metadata in PM).
    pub fn coupled(&self) -> bool {
        self.shape.coupled
    }

    /// The leaf concurrency variant of this session.
    pub fn variant(&self) -> Variant {
        self.variant
    }

    /// The allocator of the key-value blocks.
    pub fn allocator(&self) -> LeafAllocator {
        match &self.plain {
            None => LeafAllocator::Calloc,
            Some(alloc::Plain::Naive(_)) => LeafAllocator::Naive,
            Some(alloc::Plain::PageHeap { .. }) => LeafAllocator::PageHeap,
        }
    }

    /// The Calloc allocator (holding the key-value blocks when [`NbTree::allocator`] is Calloc).
    pub fn calloc(&self) -> &Arc<Calloc> {
        &self.calloc
    }
}

impl Index for NbTree {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn insert(&self, key: u64, value: u64) -> Result<bool> {
        check_key(key)?;
        self.pinned(|g| self.insert_or_upsert(key, value, false, g))
    }

    fn upsert(&self, key: u64, value: u64) -> Result<()> {
        check_key(key)?;
        self.pinned(|g| self.insert_or_upsert(key, value, true, g)).map(|_| ())
    }

    fn update(&self, key: u64, value: u64) -> Result<bool> {
        check_key(key)?;
        self.pinned(|g| self.update_key(key, value, g))
    }

    fn get(&self, key: u64) -> Result<Option<u64>> {
        check_key(key)?;
        self.pinned(|g| self.lookup(key, g))
    }

    /// One descent (see `NbTree::update_with_from_root`); no exclusion of other writers, as
    /// the default.
    fn update_with(
        &self,
        key: u64,
        f: &mut dyn FnMut(u64) -> Result<Option<u64>>,
    ) -> Result<Option<u64>> {
        check_key(key)?;
        let mut computed = None;
        self.pinned(|g| self.update_with_from_root(key, &mut *f, &mut computed, g))
    }

    fn remove(&self, key: u64) -> Result<bool> {
        check_key(key)?;
        self.pinned(|g| self.delete_key(key, g))
    }

    fn scan(&self, start: u64, max: usize, out: &mut Vec<(u64, u64)>) -> Result<usize> {
        if max == 0 || start == u64::MAX {
            return Ok(0);
        }
        self.pinned(|g| {
            let before = out.len();
            let r = self.range(start.max(1), max, out, g);
            if r.is_err() {
                out.truncate(before);
            }
            r
        })
    }

    fn stats(&self) -> EngineStats {
        let s = self.calloc.stats();
        let bs = self.calloc.block_size() as u64;
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let blocks: u64 = s.nodes.iter().map(|n| n.allocated_blocks).sum();
        let pm_bytes_per_node = match &self.plain {
            None => s.nodes.iter().map(|n| n.allocated_blocks * bs).collect(),
            Some(p) => (0..self.pool.nodes())
                .map(|node| {
                    p.naive_used(node).unwrap_or_else(|| self.pool.used_bytes(node).unwrap_or(0))
                })
                .collect(),
        };
        EngineStats {
            pm_bytes_per_node,
            dram_bytes: self.dram_bytes(),
            counters: vec![
                ("smos", get(&c.smos)),
                ("smo_helps", get(&c.smo_helps)),
                ("copies_lost", get(&c.copies_lost)),
                ("sync_on_write", get(&c.sync_on_write)),
                ("sync_on_read", get(&c.sync_on_read)),
                ("inner_splits", get(&c.inner_splits)),
                ("leaf_blocks", blocks),
            ],
        }
    }

    fn check(&self) -> Result<CheckReport> {
        self.check_tree()
    }
}

impl Engine for NbTree {
    type Options = NbTreeOptions;

    const NAME: &'static str = "nbtree";
    const FORMAT_VERSION: u32 = 1;

    fn create(pool: Arc<Pool>, opts: &NbTreeOptions) -> Result<NbTree> {
        layout::validate_slots(opts.leaf_slots)?;
        numakv_index::check_fresh_pool(&pool, Self::NAME, SLOT_META, "an nbtree")?;
        let slots = opts.leaf_slots;
        let shape = Shape { slots, coupled: opts.coupled };
        // Leaves get most of each node; a smaller pool is retried with fewer chunks, then with
        // smaller chunks (a tiny pool cannot hold even one chunk of 512 1 KB blocks).
        // With another block allocator Calloc only holds its directory and a token chunk area:
        // the space goes to that allocator (the naive one reserves its regions up front).
        let (mut share, mut chunk_blocks) =
            if opts.allocator == LeafAllocator::Calloc { (85, 512) } else { (1, 64) };
        let (calloc, dir) = loop {
            let cfg = calloc_config(&pool, shape, share, chunk_blocks);
            match Calloc::create(Arc::clone(&pool), cfg) {
                Ok(c) => break c,
                Err(PoolError::OutOfSpace { .. }) if share > 10 => share -= 10,
                Err(PoolError::OutOfSpace { .. })
                    if share > 1 && opts.allocator != LeafAllocator::Calloc =>
                {
                    share = 1
                }
                Err(PoolError::OutOfSpace { .. }) if chunk_blocks > 64 => {
                    chunk_blocks /= 2;
                    share = 85;
                }
                Err(e) => return Err(e.into()),
            }
        };
        let dir_slot = pool.root(SLOT_CALLOC)?;
        dir_slot.store(dir.raw(), Ordering::Release);
        // PERSIST: the allocator's directory is findable before any block is allocated from it.
        pool.persist_obj(dir_slot);
        let plain =
            alloc::Plain::new(&pool, opts.allocator, shape.block_size(), naive_bytes(&pool))?;
        // The first leaf, through a logged SMO with no old block: a crash before the head slot
        // is persisted frees it at the next open... which refuses the store anyway (meta 0).
        // (Other allocators: a plain block; their stores are not reopened.)
        let smo = match &plain {
            None => Some(calloc.smo_begin(&[], 1)?),
            Some(_) => None,
        };
        let first = match (&smo, &plain) {
            (Some(smo), _) => smo.new_blocks()[0],
            (None, Some(p)) => p.alloc(&pool, shape.block_size())?,
            (None, None) => unreachable!("Calloc stores begin a Calloc SMO above"),
        };
        // SAFETY: a fresh block of `shape.block_size()` bytes from the store's allocator.
        let blk = unsafe { Block::at(&pool, first, shape) };
        if shape.coupled {
            // ORDERING: Relaxed; single-threaded create, persisted below.
            blk.pm_bitmap().store(0, Ordering::Relaxed);
            blk.pm_num().store(0, Ordering::Relaxed);
        }
        for i in 0..slots {
            // ORDERING: Relaxed; single-threaded create, persisted below.
            blk.entry(i).key.store(0, Ordering::Relaxed);
            blk.entry(i).val.store(0, Ordering::Relaxed);
        }
        blk.head.next.store(0, Ordering::Relaxed);
        blk.head.low.store(0, Ordering::Relaxed);
        // PERSIST: the first block is durable before the head slot points to it.
        pool.persist(blk.addr(), shape.block_size());
        let head_slot = pool.root(SLOT_HEAD)?;
        head_slot.store(first.raw(), Ordering::Release);
        // PERSIST: the head is durable before the format word declares the store initialised.
        pool.persist_obj(head_slot);
        if let Some(smo) = smo {
            let g = epoch::pin();
            // SAFETY: the new block is linked (head slot) and there is no old block.
            unsafe { smo.commit(&g) };
        }
        let meta = pool.root(SLOT_META)?;
        meta.store(layout::meta_word_with(shape, opts.allocator), Ordering::Release);
        // PERSIST: the format word last: a store with it set is complete.
        pool.persist_obj(meta);
        let leaf = Box::into_raw(Box::new(LeafMeta::new(slots, first, 0, u64::MAX)));
        let root = Box::into_raw(Box::new(Inner::new(1, leaf_word(leaf), u64::MAX)));
        Ok(NbTree::new_handle(pool, calloc, plain, shape, opts, root, leaf))
    }

    fn open(pool: Arc<Pool>, opts: &NbTreeOptions) -> Result<(NbTree, RecoveryReport)> {
        recovery::open(pool, opts)
    }

    fn close(self) -> Result<()> {
        // Let deferred frees of retired leaves run while the pool is still open.
        for _ in 0..4 {
            epoch::pin().flush();
        }
        self.pool.close()?;
        Ok(())
    }

    fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }
}

impl Drop for NbTree {
    fn drop(&mut self) {
        // Free the DRAM structures: inner nodes level by level, leaves along the list and their
        // pending copies. Retired leaves are freed by their deferred destructors. A Calloc SMO
        // still held by a leaf is forgotten, not aborted: its log stays ACTIVE and the next open
        // repairs it from PM (dropping without close is a crash).
        let mut level_first = *self.root.get_mut();
        while !level_first.is_null() {
            // SAFETY: inner nodes are owned by the tree; nobody else runs (we have &mut self).
            let (next_level, level) =
                unsafe { ((*level_first).leftmost.load(Ordering::Relaxed), (*level_first).level) };
            let mut n = level_first;
            while !n.is_null() {
                // SAFETY: as above; every node is reached once along its level's sibling chain.
                let b = unsafe { Box::from_raw(n) };
                n = b.sibling.load(Ordering::Relaxed);
            }
            level_first = if level > 1 { next_level as *mut Inner } else { std::ptr::null_mut() };
        }
        let mut seen = HashSet::new();
        let mut stack = vec![*self.head.get_mut()];
        while let Some(p) = stack.pop() {
            if p.is_null() || !seen.insert(p as usize) {
                continue;
            }
            // SAFETY: reachable leaves are owned by the tree (retired ones are unreachable from
            // the list and from copies of live leaves).
            let m = unsafe { &*p };
            // (An UNPATCHED `next` — a copy not linked yet — may name a retired leaf: skipped.)
            stack.push(m.next_ptr());
            if !m.live() {
                // A new leaf reached before its SMO's link completed: the old leaf is not
                // retired (that follows LIVE) and may be listed nowhere else.
                stack.push(m.source);
            }
            // A listed leaf with a copy has an unfinished SMO: its new leaves are not retired.
            // (`pair` of other leaves may name a leaf retired since, so it is not followed.)
            let c = m.copy.load(Ordering::Relaxed);
            if !c.is_null() {
                stack.push(c);
                // SAFETY: the copy of a listed leaf is alive (see above).
                stack.push(unsafe { (*c).pair });
            }
        }
        for p in seen {
            // SAFETY: each pointer once (HashSet), from Box::into_raw.
            let mut b = unsafe { Box::from_raw(p as *mut LeafMeta) };
            if let Some(smo) = b.smo.get_mut().take() {
                std::mem::forget(smo);
            }
        }
    }
}
