//! NOBtree: the NUMA-optimized persistent tree index of papers/nobtree.txt (Chu et al., TCAD
//! 2024).
//!
//! - **Bottom layer** — write-optimized persistent B+-tree subindexes of 256-byte nodes with
//!   unsorted records ordered by an atomically updated slotArray, log-free splits and merges
//!   (leaves and inner nodes) through two shadow sibling pointers and a `sib_ver` flip,
//!   version-validated readers, and roots linked
//!   into one list; a subindex grows up to the height threshold, then its root splits into a new
//!   subindex — [`layout`], [`lock`](crate::lock), `bottom.rs`, `smo.rs`. Nodes are placed
//!   round-robin over the NUMA nodes by NSM.
//! - **Upper layer** — a static array-based k-ary tree over the subindex roots, replicated in
//!   every NUMA node's pool; each thread searches its own node's replica; split roots are
//!   inserted synchronously into every replica, failures go to a temporary list, and the layer is
//!   rebuilt by a dedicated background thread when the average walk along the root list
//!   exceeds a threshold — `upper.rs`, `smo.rs`, `rebuild.rs`.
//! - **Migration coordinator** — sampled access statistics per node id, a queue of hot,
//!   mostly-remote nodes (leaves, inner nodes, subindex roots), a background thread that copies
//!   them to the accessing node under a small PM log — `migration.rs`.
//! - **Recovery** — the bottom layer and the migration log from PM, NSM's garbage collection
//!   from the reachable set, replicas rebuilt — `recovery.rs`; `check()` — `check.rs`.
//!
//! Formats, protocols and the resolved ambiguities: docs/design.md, section "NOBtree".
//!
//! # Pause and failure points
//!
//! For the interleaving tests (docs/design.md §12; compiled only with the `failpoints` feature
//! of `numakv-pmem`, which this crate enables in its dev-dependencies alone):
//!
//! - `nobtree.grow_root` (failure): the growth of the first subindex fails as if the pool were
//!   out of space (the split's `link` swallows it: the new node stays an orphan).
//! - `nobtree.migrate.frozen` (pause): a migration has frozen the node, written its copy and
//!   frozen the previous sibling and the parent; nothing is switched yet.
//! - `nobtree.migrate.parent_switched` (pause): a migration has armed the log and pointed the
//!   parent (or the upper layer) at the copy; the previous sibling still names the original.
//! - `nobtree.migrate.copy_open` (pause): a migration has switched both references, marked the
//!   original obsolete and unfrozen the copy (writers enter it); its log is still armed and the
//!   previous sibling and parent are still frozen.
//! - `nobtree.rebuild.snapshot` (pause): a rebuild of the upper layer has started its log of
//!   concurrent writes and read its snapshot; nothing is built or swapped yet.
//!
//! ```
//! use numakv_index::{Engine, Index};
//! use numakv_nobtree::{Nobtree, NobtreeOptions};
//! use numakv_pmem::{Pool, PoolConfig};
//!
//! let mut cfg = PoolConfig::new(Nobtree::engine_id(), 8 << 20);
//! cfg.nodes = 2;
//! let pool = Pool::volatile(cfg)?;
//! let tree = Nobtree::create(pool, &NobtreeOptions::default())?;
//! for k in 1..=1000 {
//!     assert!(tree.insert(k, k * 10)?);
//! }
//! assert_eq!(tree.get(500)?, Some(5000));
//! let mut out = Vec::new();
//! tree.scan(998, 10, &mut out)?;
//! assert_eq!(out, vec![(998, 9980), (999, 9990), (1000, 10000)]);
//! tree.close()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod bottom;
mod check;
pub mod layout;
mod lock;
mod migration;
mod rebuild;
mod recovery;
mod scan;
mod smo;
mod upper;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crossbeam_utils::CachePadded;
use numakv_index::{
    check_key, Backlog, CheckReport, Engine, EngineStats, Error, Index, RecoveryReport, Result,
};
use numakv_pmem::alloc::epoch::{self, Atomic};
use numakv_pmem::alloc::nsm::{Nsm, NsmMode};
use numakv_pmem::alloc::PmAllocator;
use numakv_pmem::{PPtr, Pool};
use parking_lot::Mutex;

use crate::layout::{Node, END, ENGINE};
pub use crate::migration::MigrationOptions;
use crate::migration::Migrator;
use crate::rebuild::Rebuilder;
use crate::upper::{Upper, Writers};

/// Options of a NOBtree.
#[derive(Clone, Debug)]
pub struct NobtreeOptions {
    /// Subindex height threshold (Algorithm 3): levels per subindex, 1..=8 (default 2). A root
    /// split below it grows the subindex; at it, the split node becomes a new subindex. Shapes
    /// the format: recorded at create, the stored value wins at open.
    pub height: u32,
    /// Where NSM places bottom nodes (default round-robin over the NUMA nodes, the paper's).
    pub nsm_mode: NsmMode,
    /// Rebuild the upper layer when the average number of steps along the subindex root list
    /// per insert exceeds this (Algorithm 3 line 11).
    pub rebuild_threshold: f64,
    /// Inserts since the last rebuild before the average is trusted.
    pub rebuild_min_ops: u64,
    /// Rebuild the upper layer on a dedicated background thread (the paper's, §IV-B: "it is
    /// executed in the background"; default). `false`: the inserting thread that crosses the
    /// threshold rebuilds inline.
    pub background_rebuild: bool,
    /// The migration coordinator (§III-D); `enabled: false` turns it off.
    pub migration: MigrationOptions,
}

impl Default for NobtreeOptions {
    fn default() -> Self {
        NobtreeOptions {
            height: 2,
            nsm_mode: NsmMode::RoundRobin,
            rebuild_threshold: 0.5,
            rebuild_min_ops: 1000,
            background_rebuild: true,
            migration: MigrationOptions::default(),
        }
    }
}

/// Event counters (DRAM, per session).
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub splits: AtomicU64,
    pub merges: AtomicU64,
    pub inner_merges: AtomicU64,
    pub subindex_splits: AtomicU64,
    pub grows: AtomicU64,
    pub upper_insert_failed: AtomicU64,
    pub rebuilds: AtomicU64,
    pub retries: AtomicU64,
    pub orphans_deferred: AtomicU64,
    /// Completed migrations by kind (the coordinator's and explicit ones): leaves below the
    /// subindex roots, inner nodes below them, subindex roots (a leaf at height 1).
    pub migrated_leaves: AtomicU64,
    pub migrated_inner: AtomicU64,
    pub migrated_roots: AtomicU64,
}

/// Striped counters of Algorithm 3's `goes_step` / `query_time`.
#[derive(Debug)]
pub(crate) struct WalkStats {
    stripes: Box<[CachePadded<(AtomicU64, AtomicU64)>]>,
}

impl WalkStats {
    fn new() -> WalkStats {
        WalkStats {
            stripes: (0..16)
                .map(|_| CachePadded::new((AtomicU64::new(0), AtomicU64::new(0))))
                .collect(),
        }
    }
    fn add(&self, steps: u64) {
        let s = &self.stripes[numakv_pmem::numa::try_tid().unwrap_or(0) % self.stripes.len()];
        s.0.fetch_add(1, Ordering::Relaxed);
        if steps > 0 {
            s.1.fetch_add(steps, Ordering::Relaxed);
        }
    }
    /// (queries, steps).
    fn sum(&self) -> (u64, u64) {
        self.stripes.iter().fold((0, 0), |(q, st), s| {
            (q + s.0.load(Ordering::Relaxed), st + s.1.load(Ordering::Relaxed))
        })
    }
    fn reset(&self) {
        for s in self.stripes.iter() {
            s.0.store(0, Ordering::Relaxed);
            s.1.store(0, Ordering::Relaxed);
        }
    }
}

/// The tree itself, shared (behind an `Arc`) by the handle and the migration coordinator.
#[derive(Debug)]
pub(crate) struct Tree {
    pub(crate) pool: Arc<Pool>,
    pub(crate) nsm: Arc<Nsm>,
    /// Height threshold (levels per subindex).
    pub(crate) height: u32,
    pub(crate) opts: NobtreeOptions,
    /// The current upper layer (epoch-protected; replaced by a rebuild).
    pub(crate) upper: Atomic<Upper>,
    /// The upper-layer mutex: serialises replica writers; guards the temporary list of roots
    /// whose insert failed (Algorithm 3 `mutable`) and a rebuild's log of the writes made
    /// since its snapshot. A rebuild holds it only to start the log and to swap.
    pub(crate) upper_lock: Mutex<Writers>,
    /// One rebuild of the upper layer at a time (the rebuild thread, an inline rebuild,
    /// `Nobtree::rebuild_upper`): the log of writes since a snapshot belongs to one build.
    pub(crate) rebuild_lock: Mutex<()>,
    /// Serialises the growth of the first subindex (a new root above the head).
    pub(crate) grow_lock: Mutex<()>,
    /// Serialises migrations: the coordinator and the public `migrate_*_of` share the one
    /// migration log block, and an armed log must describe the migration in flight (two at
    /// once would overwrite or disarm each other's record, and a crash would redo a mixed one
    /// or none). Taken before any node lock.
    pub(crate) migrate_lock: Mutex<()>,
    pub(crate) next_id: AtomicU64,
    /// Blocks retired and not yet freed (awaiting their epoch grace period); `check()` does
    /// not count them as allocated.
    pub(crate) retiring: Arc<AtomicU64>,
    pub(crate) walk: WalkStats,
    pub(crate) counters: Counters,
    pub(crate) migrator: Option<Migrator>,
    /// The background rebuild thread (None with `background_rebuild: false`).
    pub(crate) rebuilder: Option<Rebuilder>,
    /// `lock::FROZEN_WAITS` and `FROZEN_WAIT_NS` when this handle was made (stats report
    /// the waits since).
    frozen_base: (u64, u64),
}

/// What a leaf write does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WriteKind {
    Insert,
    Upsert,
    Update,
}

impl Tree {
    fn new_handle(
        pool: Arc<Pool>,
        nsm: Arc<Nsm>,
        height: u32,
        opts: &NobtreeOptions,
        upper: Upper,
        next_id: u64,
    ) -> Tree {
        Tree {
            pool,
            nsm,
            height,
            opts: opts.clone(),
            upper: Atomic::new(upper),
            upper_lock: Mutex::new(Writers::default()),
            rebuild_lock: Mutex::new(()),
            grow_lock: Mutex::new(()),
            migrate_lock: Mutex::new(()),
            next_id: AtomicU64::new(next_id),
            retiring: Arc::new(AtomicU64::new(0)),
            walk: WalkStats::new(),
            counters: Counters::default(),
            migrator: None,
            rebuilder: None,
            frozen_base: {
                // The longest wait restarts with every tree (its counts are told apart by
                // the base instead).
                lock::FROZEN_WAIT_MAX_NS.store(0, Ordering::Relaxed);
                (
                    lock::FROZEN_WAITS.load(Ordering::Relaxed),
                    lock::FROZEN_WAIT_NS.load(Ordering::Relaxed),
                )
            },
        }
    }

    /// Level of subindex roots (the bottom layer's top level).
    #[inline]
    pub(crate) fn top(&self) -> u32 {
        self.height - 1
    }

    /// Resolves a node pointer.
    #[inline]
    pub(crate) fn node(&self, p: PPtr) -> Result<Node<'_>> {
        Node::resolve(&self.pool, p)
    }

    /// The head: first node of the top level (root of the first subindex).
    pub(crate) fn head(&self) -> Result<PPtr> {
        // ORDERING: Acquire; pairs with the Release store of a grown root in smo.rs.
        Ok(PPtr::from_raw(self.pool.root(layout::SLOT_HEAD)?.load(Ordering::Acquire)))
    }

    /// Frees `p` after the epoch grace period (see [`numakv_pmem::alloc::retire`]), counting it
    /// in `retiring` meanwhile.
    ///
    /// # Safety
    /// `p` is an NSM block of this tree, unreachable for new readers, retired once.
    pub(crate) unsafe fn retire_block(&self, guard: &epoch::Guard, p: PPtr) {
        self.retiring.fetch_add(1, Ordering::Relaxed);
        let nsm = Arc::downgrade(&self.nsm);
        let retiring = Arc::clone(&self.retiring);
        // SAFETY: the closure is 'static and Send (a Weak, an Arc, a Copy pointer); crossbeam
        // runs it after every thread pinned now has unpinned, when nobody can reach `p`.
        guard.defer(move || {
            if let Some(nsm) = nsm.upgrade() {
                // SAFETY: the caller's contract makes this the one free of `p`, after all
                // readers left. A failing free (the pool crashed meanwhile) is dropped: recovery
                // reclaims the block.
                let _ = unsafe { nsm.free(p) };
            }
            retiring.fetch_sub(1, Ordering::Relaxed);
        });
    }

    pub(crate) fn retry(&self) {
        self.counters.retries.fetch_add(1, Ordering::Relaxed);
    }

    fn validate_opts(opts: &NobtreeOptions) -> Result<()> {
        if !(1..=8).contains(&opts.height) {
            return Err(Error::InvalidOptions(format!("height {} must be in 1..=8", opts.height)));
        }
        if !(opts.rebuild_threshold.is_finite() && opts.rebuild_threshold > 0.0) {
            return Err(Error::InvalidOptions("rebuild_threshold must be positive".into()));
        }
        opts.migration.validate()?;
        Ok(())
    }

    /// Starts the coordinator and the rebuild thread if the options ask for them.
    fn start_threads(mut self) -> Result<Arc<Tree>> {
        let mig = self.opts.migration.clone();
        let first_id = self.next_id.load(Ordering::Relaxed);
        self.migrator = mig.enabled.then(|| Migrator::new(mig, self.pool.nodes(), first_id));
        self.rebuilder = self.opts.background_rebuild.then(Rebuilder::default);
        let tree = Arc::new(self);
        if let Some(m) = &tree.migrator {
            m.start(&tree)?;
        }
        if let Some(r) = &tree.rebuilder {
            r.start(&tree)?;
        }
        Ok(tree)
    }

    /// Stops the background threads (idempotent).
    fn stop_threads(&self) {
        if let Some(m) = &self.migrator {
            m.stop();
        }
        if let Some(r) = &self.rebuilder {
            r.stop();
        }
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        self.stop_threads();
        // SAFETY: `&mut self`: no reader holds the descriptor any more; it was allocated by
        // `Atomic::new`/`Owned` and is dropped exactly once here. Its PM blocks stay (freed by
        // the next open's garbage collection).
        unsafe {
            let g = epoch::unprotected();
            let p = self.upper.load(Ordering::Relaxed, g);
            if !p.is_null() {
                drop(p.into_owned());
            }
        }
    }
}

/// A NOBtree in a pool; see the [crate docs](crate).
#[derive(Debug)]
pub struct Nobtree(Arc<Tree>);

impl Nobtree {
    /// The NSM allocator holding the nodes.
    pub fn nsm(&self) -> &Arc<Nsm> {
        &self.0.nsm
    }

    /// Height threshold of this store (levels per subindex).
    pub fn height(&self) -> u32 {
        self.0.height
    }

    /// Rebuilds the upper layer now (Algorithm 3 `rebuild_upper`), for tests and tools.
    pub fn rebuild_upper(&self) -> Result<()> {
        self.0.rebuild_upper(true).map(|_| ())
    }

    /// Waits until no background rebuild of the upper layer is requested or running (tests,
    /// tools); returns at once without the rebuild thread.
    pub fn drain_rebuilds(&self) {
        if let Some(r) = &self.0.rebuilder {
            r.drain();
        }
    }

    /// Waits until the migration queue is empty and the coordinator idle (tests, benchmarks);
    /// returns at once without a coordinator.
    pub fn drain_migrations(&self) {
        if let Some(m) = &self.0.migrator {
            m.drain();
        }
    }

    /// Migrates the leaf holding `key` to NUMA node `target` now, the way the coordinator does
    /// (§III-D); `Ok(false)` when the leaf is not migratable or changed meanwhile. For tests and
    /// reproductions.
    pub fn migrate_leaf_of(&self, key: u64, target: usize) -> Result<bool> {
        check_key(key)?;
        self.0.migrate_key(key, target)
    }

    /// Migrates the node of `level` covering `key` (a leaf at 0, an inner node of a subindex,
    /// or at the height threshold − 1 a subindex root) to NUMA node `target` now, the way the
    /// coordinator does; `Ok(false)` when it is not migratable or changed meanwhile.
    pub fn migrate_node_of(&self, key: u64, level: u32, target: usize) -> Result<bool> {
        check_key(key)?;
        self.0.migrate_level_key(key, level, target)
    }

    /// The PM node holding the node of `level` covering `key` (tests, reproductions).
    pub fn node_of(&self, key: u64, level: u32) -> Result<usize> {
        check_key(key)?;
        let guard = epoch::pin();
        let mut path = [PPtr::NULL; crate::bottom::MAX_PATH];
        Ok(self.0.descend(key, level, &mut path, &guard)?.0.node())
    }

    /// The PM node holding the leaf of `key` (tests, reproductions).
    pub fn leaf_node_of(&self, key: u64) -> Result<usize> {
        check_key(key)?;
        let guard = epoch::pin();
        let mut path = [PPtr::NULL; crate::bottom::MAX_PATH];
        Ok(self.0.descend(key, 0, &mut path, &guard)?.0.node())
    }
}

impl Drop for Nobtree {
    fn drop(&mut self) {
        // The coordinator holds only a weak reference, but it must not outlive the handle
        // (a dropped handle is a crash: the next open recovers); nor must the rebuild thread.
        self.0.stop_threads();
    }
}

impl Index for Tree {
    fn name(&self) -> &'static str {
        ENGINE
    }

    fn insert(&self, key: u64, value: u64) -> Result<bool> {
        check_key(key)?;
        self.write(key, value, WriteKind::Insert)
    }

    fn upsert(&self, key: u64, value: u64) -> Result<()> {
        check_key(key)?;
        self.write(key, value, WriteKind::Upsert).map(|_| ())
    }

    fn update(&self, key: u64, value: u64) -> Result<bool> {
        check_key(key)?;
        self.write(key, value, WriteKind::Update)
    }

    fn get(&self, key: u64) -> Result<Option<u64>> {
        check_key(key)?;
        let guard = epoch::pin();
        self.lookup(key, &guard)
    }

    fn remove(&self, key: u64) -> Result<bool> {
        check_key(key)?;
        self.delete(key)
    }

    fn scan(&self, start: u64, max: usize, out: &mut Vec<(u64, u64)>) -> Result<usize> {
        if max == 0 || start == END {
            return Ok(0);
        }
        let guard = epoch::pin();
        self.range(start.max(1), max, out, &guard)
    }

    fn stats(&self) -> EngineStats {
        let s = self.nsm.stats();
        let page = self.pool.page_size();
        let pm_bytes_per_node =
            s.small_pages.iter().zip(&s.large_pages).map(|(a, b)| (a + b) * page).collect();
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let guard = epoch::pin();
        let up_nodes = {
            // SAFETY: loaded under `guard`; a replaced descriptor is destroyed only after every
            // guard pinned before the swap is gone.
            unsafe { self.upper.load(Ordering::Acquire, &guard).as_ref() }
                .map_or(0, |u| u.nodes() as u64)
        };
        let temp = self.upper_lock.lock().temp.len() as u64;
        let mut counters = vec![
            ("splits", get(&c.splits)),
            ("merges", get(&c.merges)),
            ("inner_merges", get(&c.inner_merges)),
            ("subindex_splits", get(&c.subindex_splits)),
            ("root_grows", get(&c.grows)),
            ("upper_insert_failed", get(&c.upper_insert_failed)),
            ("upper_rebuilds", get(&c.rebuilds)),
            (
                "upper_rebuild_requests",
                self.rebuilder.as_ref().map_or(0, |r| r.taken.load(Ordering::Relaxed)),
            ),
            ("upper_temp_list", temp),
            ("upper_bytes_per_replica", up_nodes * layout::UP_NODE_SIZE as u64),
            ("retries", get(&c.retries)),
            ("orphans_deferred", get(&c.orphans_deferred)),
            ("migrated_leaves", get(&c.migrated_leaves)),
            ("migrated_inner", get(&c.migrated_inner)),
            ("migrated_roots", get(&c.migrated_roots)),
            ("node_bytes_allocated", s.allocated_bytes),
            // Writers that waited for a node a migration had frozen (process-wide counts
            // since this handle was made: trees running at once in one process share them).
            ("writer_frozen_waits", get(&lock::FROZEN_WAITS) - self.frozen_base.0),
            ("writer_frozen_wait_ns", get(&lock::FROZEN_WAIT_NS) - self.frozen_base.1),
            ("writer_frozen_wait_max_ns", get(&lock::FROZEN_WAIT_MAX_NS)),
        ];
        if let Some(m) = &self.migrator {
            counters.extend(m.counters());
        }
        EngineStats {
            pm_bytes_per_node,
            dram_bytes: std::mem::size_of::<Tree>() as u64
                + self.migrator.as_ref().map_or(0, |m| m.dram_bytes()),
            counters,
        }
    }

    fn check(&self) -> Result<CheckReport> {
        self.check_tree()
    }

    /// Waits for the migration coordinator to empty its queue and the rebuild thread to finish
    /// a requested upper-layer rebuild.
    fn quiesce(&self, limit: Duration) -> Result<Vec<Backlog>> {
        let pending = || {
            let mut out = Vec::new();
            let queued = self.migrator.as_ref().map_or(0, |m| m.pending());
            if queued > 0 {
                out.push(Backlog { what: "migrations queued or running", count: queued });
            }
            if self.rebuilder.as_ref().is_some_and(|r| r.pending()) {
                out.push(Backlog { what: "upper-layer rebuild", count: 1 });
            }
            out
        };
        Ok(numakv_index::wait_for_background(limit, pending))
    }
}

macro_rules! forward_index {
    () => {
        fn name(&self) -> &'static str {
            self.0.name()
        }
        fn insert(&self, key: u64, value: u64) -> Result<bool> {
            self.0.insert(key, value)
        }
        fn upsert(&self, key: u64, value: u64) -> Result<()> {
            self.0.upsert(key, value)
        }
        fn update(&self, key: u64, value: u64) -> Result<bool> {
            self.0.update(key, value)
        }
        fn get(&self, key: u64) -> Result<Option<u64>> {
            self.0.get(key)
        }
        fn remove(&self, key: u64) -> Result<bool> {
            self.0.remove(key)
        }
        fn scan(&self, start: u64, max: usize, out: &mut Vec<(u64, u64)>) -> Result<usize> {
            self.0.scan(start, max, out)
        }
        fn stats(&self) -> EngineStats {
            self.0.stats()
        }
        fn check(&self) -> Result<CheckReport> {
            self.0.check()
        }
        fn quiesce(&self, limit: Duration) -> Result<Vec<Backlog>> {
            self.0.quiesce(limit)
        }
    };
}

impl Index for Nobtree {
    forward_index!();
}

impl Engine for Nobtree {
    type Options = NobtreeOptions;

    const NAME: &'static str = "nobtree";
    const FORMAT_VERSION: u32 = 1;

    fn create(pool: Arc<Pool>, opts: &NobtreeOptions) -> Result<Nobtree> {
        Tree::validate_opts(opts)?;
        numakv_index::check_fresh_pool(&pool, Self::NAME, layout::SLOT_META, "a nobtree")?;
        let nsm = Nsm::new(Arc::clone(&pool), opts.nsm_mode)?;
        let head = nsm.alloc_on(layout::NODE_SIZE, None)?;
        bottom::init_node(&pool, head, 0, PPtr::NULL, 0, PPtr::NULL, 1, &[])?;
        let upper = Upper::build(&nsm, &pool, &[(0, head)])?;
        let meta = pool.root(layout::SLOT_META)?;
        let slot = pool.root(layout::SLOT_HEAD)?;
        slot.store(head.raw(), Ordering::Release);
        meta.store(layout::format_word(opts.height), Ordering::Release);
        // PERSIST: the head node was persisted by init_node; the head pointer and the format
        // word (same header line) become durable after it, the format word marking the store
        // initialised.
        pool.flush_obj(slot);
        pool.persist_obj(meta);
        let tree = Tree::new_handle(pool, nsm, opts.height, opts, upper, 2);
        Ok(Nobtree(tree.start_threads()?))
    }

    fn open(pool: Arc<Pool>, opts: &NobtreeOptions) -> Result<(Nobtree, RecoveryReport)> {
        Tree::validate_opts(opts)?;
        let (tree, report) = recovery::open(pool, opts)?;
        Ok((Nobtree(tree.start_threads()?), report))
    }

    fn close(self) -> Result<()> {
        self.0.stop_threads();
        self.0.pool.close()?;
        Ok(())
    }

    fn pool(&self) -> &Arc<Pool> {
        &self.0.pool
    }
}
