//! FAST&FAIR: the persistent B+-tree of Hwang et al., FAST'18 — the baseline the NUMA-aware
//! engines of numakv build on and compare against.
//!
//! - 512-byte nodes by default (configurable), entries sorted in place;
//! - **FAST**: inserts and deletes shift entries failure-atomically in store order, flushing at
//!   cache-line boundaries (ADR; in eADR the pool makes flushes no-ops) — [`insert`](crate::insert),
//!   [`delete`](crate::delete);
//! - **FAIR**: splits and merges (leaves and internal nodes, with root shrink) without logging,
//!   through B-link sibling pointers and node key ranges — [`smo`](crate::smo);
//! - lock-free searches and scans that tolerate the transient duplicates of a shift, guided by the
//!   switch counter — [`search`](crate::search), [`scan`](crate::scan);
//! - per-node writer locks tagged with the pool generation — [`lock`](crate::lock);
//! - instant recovery: `open()` validates the format word and the root and returns; a background
//!   pass collects NSM's unreachable blocks, repairs every node and links orphans while the tree
//!   serves operations ([`RecoveryMode::Lazy`], the default; [`RecoveryMode::Eager`] does it all
//!   before `open()` returns) — [`recovery`](crate::recovery); `check()` — [`check`](crate::check).
//!
//! Formats and the store-order arguments: docs/design.md, section "FAST&FAIR".
//!
//! **Embedding.** A tree occupies two pool root slots from
//! [`FastFairOptions::root_slot_base`] on, so an engine that keeps its own roots in the same
//! pool can host one or more trees. Its nodes come from an NSM allocator; an embedding engine
//! that allocates from the same NSM (or hosts several trees) creates the trees with
//! [`FastFair::create_with`], collects [`FastFair::reachable`] of each before running
//! [`Nsm::recover`] on the union with its own blocks, and reopens them with
//! [`FastFair::open_with`] — [`Engine::open`] would reclaim every block it cannot reach itself.
//! `open_with` always recovers eagerly (the embedder already collected NSM; see docs/design.md,
//! "Sharing a pool"). An embedder that opens NSM with [`Nsm::recover_deferred`] instead reopens
//! the tree with [`FastFair::open_deferred_with`]: lazily, the background pass collecting NSM
//! over its walk plus the embedder's blocks.
//!
//! Pause points (docs/design.md §12; forced in `tests/interleavings.rs`):
//! - `fastfair.leaf.key_read`: a lock-free leaf lookup has read the slot holding its key, not
//!   yet the value (a shift may move the slot's entry on);
//! - `fastfair.lookup.leaf`: a lookup has chosen its leaf, not yet read it (it may split or
//!   be merged away);
//! - `fastfair.write.leaf_found`: a writer (insert, upsert, update, remove, `update_with`) has
//!   found its leaf lock-free, not yet locked it;
//! - `fastfair.split.linked`: FAIR's window — a split's new node is durable and linked through
//!   the split node's sibling pointer, no parent names it yet (the split node still locked);
//! - `fastfair.scan.next_leaf`: a scan has emitted a leaf and read its sibling pointer, not
//!   yet visited the sibling;
//! - `fastfair.recovery.background`: the background pass of a lazy open before it walks the
//!   tree;
//! - `fastfair.recovery.lost_root`: orphan linking (lazy pass or eager open) has seen a root
//!   with a sibling (a lost root split), not yet locked the root to install a new one.
//!
//! ```
//! use numakv_fastfair::{FastFair, FastFairOptions};
//! use numakv_index::{Engine, Index};
//! use numakv_pmem::{Pool, PoolConfig};
//!
//! let pool = Pool::volatile(PoolConfig::new(FastFair::engine_id(), 8 << 20))?;
//! let tree = FastFair::create(pool, &FastFairOptions::default())?;
//! assert!(tree.insert(7, 0)?);
//! assert_eq!(tree.get(7)?, Some(0)); // value 0 is a value like any other
//! let mut out = Vec::new();
//! tree.scan(1, 10, &mut out)?;
//! assert_eq!(out, vec![(7, 0)]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod check;
mod delete;
mod insert;
pub use insert::LeafCursor;
pub mod layout;
mod lock;
mod recovery;
mod scan;
mod search;
mod smo;

use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use numakv_index::{
    check_key, CheckReport, Engine, EngineStats, Error, Index, RecoveryReport, Result,
};
use numakv_pmem::alloc::epoch;
use numakv_pmem::alloc::nsm::{Nsm, NsmMode};
use numakv_pmem::{PPtr, Pool};

use crate::layout::{Node, DEFAULT_NODE_SIZE, END, ENGINE};

/// Options of a FAST&FAIR tree.
#[derive(Clone, Debug)]
pub struct FastFairOptions {
    /// Node size in bytes: a multiple of 64 in 256..=4096 (default 512, the paper's). Shapes the
    /// format: recorded at create, the stored value wins at open.
    pub node_size: usize,
    /// Where NSM places new nodes (default: on the calling thread's node). Per session; ignored
    /// by [`FastFair::create_with`] / [`FastFair::open_with`], whose NSM is the caller's.
    pub nsm_mode: NsmMode,
    /// How [`Engine::open`] recovers (default: lazy). Per session. Ignored by
    /// [`FastFair::open_with`], which always repairs before returning (its NSM was recovered
    /// by the embedder).
    pub recovery: RecoveryMode,
    /// First of the two pool root slots the tree uses (root pointer, format word), default 0;
    /// at most `ROOT_SLOTS - 2`. Not recorded in the store (it says where the record is): pass
    /// the same value at open.
    pub root_slot_base: usize,
}

impl Default for FastFairOptions {
    fn default() -> Self {
        FastFairOptions {
            node_size: DEFAULT_NODE_SIZE,
            nsm_mode: NsmMode::Local,
            recovery: RecoveryMode::Lazy,
            root_slot_base: 0,
        }
    }
}

/// How [`Engine::open`] recovers a tree; see docs/design.md, "FAST&FAIR", "Recovery".
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum RecoveryMode {
    /// Instant recovery: `open()` does O(1) work (format word, root, NSM's extent table) and a
    /// background thread collects unreachable blocks, repairs nodes and links orphans while the
    /// tree serves operations. [`Index::check`] and `close()` wait for it; dropping the tree
    /// cancels it.
    #[default]
    Lazy,
    /// `open()` walks the whole tree, collects, repairs and links orphans before returning.
    Eager,
}

impl fmt::Display for RecoveryMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RecoveryMode::Lazy => "lazy",
            RecoveryMode::Eager => "eager",
        })
    }
}

impl FromStr for RecoveryMode {
    type Err = Error;

    /// Parses `lazy` or `eager`.
    fn from_str(s: &str) -> Result<RecoveryMode> {
        match s {
            "lazy" => Ok(RecoveryMode::Lazy),
            "eager" => Ok(RecoveryMode::Eager),
            _ => Err(Error::InvalidOptions(format!("recovery {s:?}: expected lazy or eager"))),
        }
    }
}

/// Event counters (DRAM, per session; shared with the background recovery thread).
#[derive(Debug, Default)]
struct Counters {
    splits: AtomicU64,
    root_splits: AtomicU64,
    merges: AtomicU64,
    internal_merges: AtomicU64,
    root_shrinks: AtomicU64,
    retries: AtomicU64,
    repairs: AtomicU64,
    ranges_fixed: AtomicU64,
    orphans_linked: AtomicU64,
}

/// A FAST&FAIR tree in a pool; see the [crate docs](crate).
#[derive(Debug)]
pub struct FastFair {
    pool: Arc<Pool>,
    nsm: Arc<Nsm>,
    node_size: usize,
    /// Entry slots per node.
    slots: usize,
    /// Most entries a node holds (one slot stays for the terminator).
    cap: usize,
    generation: u64,
    /// [`FastFairOptions::root_slot_base`].
    slot_base: usize,
    counters: Arc<Counters>,
    /// True until every node's range has been repaired (lazy recovery): readers then take
    /// `min(high, sibling.low)` as a node's high key (docs/design.md, "Recovery"). Shared with
    /// the background thread.
    repairing: Arc<AtomicBool>,
    /// The background recovery of a lazy open.
    background: Mutex<recovery::Background>,
    /// Whether NSM holds this tree's nodes only ([`Engine::create`] / [`Engine::open`]), so
    /// that `check()` can wait for retired nodes' deferred frees until the allocated count
    /// meets the reachable one; an embedder's shared NSM holds other blocks too.
    owns_nsm: bool,
}

/// What a leaf write does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WriteKind {
    Insert,
    Upsert,
    Update,
}

impl FastFair {
    fn new_handle(pool: Arc<Pool>, nsm: Arc<Nsm>, node_size: usize, slot_base: usize) -> FastFair {
        let slots = layout::slots(node_size);
        FastFair {
            generation: pool.generation(),
            pool,
            nsm,
            node_size,
            slots,
            cap: slots - 1,
            slot_base,
            counters: Arc::default(),
            repairing: Arc::default(),
            background: Mutex::default(),
            owns_nsm: false,
        }
    }

    /// A second handle on the same tree, sharing counters and the repair flag (for the
    /// background recovery thread); it has no background work of its own.
    fn sibling_handle(&self) -> FastFair {
        FastFair {
            pool: Arc::clone(&self.pool),
            nsm: Arc::clone(&self.nsm),
            node_size: self.node_size,
            slots: self.slots,
            cap: self.cap,
            generation: self.generation,
            slot_base: self.slot_base,
            counters: Arc::clone(&self.counters),
            repairing: Arc::clone(&self.repairing),
            background: Mutex::default(),
            owns_nsm: self.owns_nsm,
        }
    }

    /// Creates a tree in `pool` whose nodes come from `nsm`, an allocator the caller shares
    /// (with its own structures or with other trees at other root slot bases). Unlike
    /// [`Engine::create`], the pool may belong to another engine and may already hold NSM
    /// blocks; `opts.nsm_mode` is ignored.
    ///
    /// # Errors
    /// `InvalidOptions` for a bad node size or root slot base, an `nsm` over another pool, or
    /// root slots that already hold a tree; pool errors (out of space).
    pub fn create_with(pool: Arc<Pool>, nsm: Arc<Nsm>, opts: &FastFairOptions) -> Result<FastFair> {
        layout::validate_node_size(opts.node_size)?;
        layout::validate_root_slot_base(opts.root_slot_base)?;
        if !Arc::ptr_eq(&pool, numakv_pmem::alloc::PmAllocator::pool(&*nsm)) {
            return Err(Error::InvalidOptions("the NSM allocator belongs to another pool".into()));
        }
        let base = opts.root_slot_base;
        if pool.root(base + layout::SLOT_META)?.load(Ordering::Acquire) != 0 {
            return Err(Error::InvalidOptions(format!(
                "root slots {base}.. already hold a fastfair tree"
            )));
        }
        let tree = FastFair::new_handle(pool, nsm, opts.node_size, base);
        let root = tree.alloc_node()?;
        tree.init_node(root, 0, PPtr::NULL, 0, END, PPtr::NULL, &[])?;
        let slot = tree.root_slot(layout::SLOT_ROOT)?;
        slot.store(root.raw(), Ordering::Release);
        // PERSIST: the root pointer is durable (after the root node, persisted by init_node)
        // before the format word that declares the tree: with an arbitrary base the two slots
        // may lie in different header lines, and the format word is the commit point.
        tree.pool.persist_obj(slot);
        let meta = tree.root_slot(layout::SLOT_META)?;
        meta.store(layout::meta_word(opts.node_size), Ordering::Release);
        // PERSIST: the tree exists durably before create returns.
        tree.pool.persist_obj(meta);
        Ok(tree)
    }

    /// The nodes of the tree at `opts.root_slot_base` in `pool`, as they are durable now (every
    /// level's sibling chain, validated): the blocks an embedding engine reports to
    /// [`Nsm::recover`] before [`FastFair::open_with`]. Read only.
    ///
    /// # Errors
    /// `InvalidOptions` for a bad root slot base; `Corrupted` when the slots hold no fastfair
    /// tree or a node is invalid.
    pub fn reachable(pool: &Pool, opts: &FastFairOptions) -> Result<Vec<PPtr>> {
        recovery::reachable(pool, opts)
    }

    /// Opens, with recovery, the tree at `opts.root_slot_base` whose nodes come from `nsm`, an
    /// allocator the caller has already recovered with (at least) this tree's
    /// [`FastFair::reachable`] blocks. `opts.nsm_mode` is ignored.
    ///
    /// # Errors
    /// As [`Engine::open`]; `Corrupted` when a node of the tree is not allocated in `nsm`.
    pub fn open_with(
        pool: Arc<Pool>,
        nsm: Arc<Nsm>,
        opts: &FastFairOptions,
    ) -> Result<(FastFair, RecoveryReport)> {
        if !Arc::ptr_eq(&pool, numakv_pmem::alloc::PmAllocator::pool(&*nsm)) {
            return Err(Error::InvalidOptions("the NSM allocator belongs to another pool".into()));
        }
        recovery::open_with(pool, nsm, opts)
    }

    /// Opens the tree at `opts.root_slot_base` lazily over `nsm`, an allocator the caller opened
    /// with [`Nsm::recover_deferred`] and shares with other structures of the pool: returns once
    /// the format word and root are checked (O(1)), like [`RecoveryMode::Lazy`]; a background
    /// pass walks the tree while it serves operations, hands that walk plus `extra` — the
    /// caller's own reachable blocks, which must follow the deferred protocol documented at
    /// [`Nsm::recover_deferred`] — to [`Nsm::collect`], then repairs the nodes and links
    /// orphans. [`FastFair::wait_recovery`] waits for it; `opts.nsm_mode` and `opts.recovery`
    /// are ignored.
    ///
    /// # Errors
    /// `InvalidOptions` when `nsm` belongs to another pool or has no collection pending;
    /// otherwise as [`Engine::open`].
    pub fn open_deferred_with(
        pool: Arc<Pool>,
        nsm: Arc<Nsm>,
        opts: &FastFairOptions,
        extra: Vec<PPtr>,
    ) -> Result<(FastFair, RecoveryReport)> {
        if !Arc::ptr_eq(&pool, numakv_pmem::alloc::PmAllocator::pool(&*nsm)) {
            return Err(Error::InvalidOptions("the NSM allocator belongs to another pool".into()));
        }
        recovery::open_deferred_with(pool, nsm, opts, extra)
    }

    /// Node size of this tree (as recorded in the store).
    pub fn node_size(&self) -> usize {
        self.node_size
    }

    /// The NSM allocator holding the nodes.
    pub fn nsm(&self) -> &Arc<Nsm> {
        &self.nsm
    }

    /// Resolves a node pointer.
    #[inline]
    pub(crate) fn node(&self, p: PPtr) -> Result<Node<'_>> {
        Node::resolve(&self.pool, p, self.node_size)
    }

    /// The tree's root slot `which` ([`layout::SLOT_ROOT`], [`layout::SLOT_META`]).
    #[inline]
    pub(crate) fn root_slot(&self, which: usize) -> Result<&numakv_pmem::PmU64> {
        Ok(self.pool.root(self.slot_base + which)?)
    }

    /// The current root.
    pub(crate) fn root(&self) -> Result<PPtr> {
        // ORDERING: Acquire; pairs with the Release stores of a new root (split, shrink) in
        // smo.rs: the new root's contents are visible.
        Ok(PPtr::from_raw(self.root_slot(layout::SLOT_ROOT)?.load(Ordering::Acquire)))
    }

    pub(crate) fn retry(&self) {
        self.counters.retries.fetch_add(1, Ordering::Relaxed);
    }

    /// True while node ranges may still hold a crash's `high > sibling.low`.
    #[inline]
    pub(crate) fn repairing(&self) -> bool {
        // ORDERING: Acquire; pairs with the Release in recovery.rs that clears it after the
        // last range repair, whose stores are then visible.
        self.repairing.load(Ordering::Acquire)
    }

    /// Waits for the background recovery of a lazy open and returns its report; `None` when
    /// there was none (eager open, create). Repeated calls return the same outcome.
    ///
    /// # Errors
    /// What the background pass failed with (e.g. `Corrupted` when the walk found a broken
    /// node), described again on every call; `Unsupported` when called from a thread pinned in
    /// the epoch while the pass runs (the pass waits for such pins: it would never finish).
    pub fn wait_recovery(&self) -> Result<Option<RecoveryReport>> {
        recovery::wait(self)
    }

    /// True while the background recovery of a lazy open is still running.
    pub fn recovery_pending(&self) -> bool {
        recovery::pending(self)
    }
}

impl Drop for FastFair {
    fn drop(&mut self) {
        // An unclean shutdown: the background work is cancelled; the next open starts it over.
        recovery::stop(self, false);
    }
}

impl Index for FastFair {
    fn name(&self) -> &'static str {
        ENGINE
    }

    /// One descent: the leaf covering `key` is locked while `f` runs, so no writer changes the
    /// key meanwhile; the new value is one 8-byte store, persisted.
    fn update_with(
        &self,
        key: u64,
        f: &mut dyn FnMut(u64) -> Result<Option<u64>>,
    ) -> Result<Option<u64>> {
        check_key(key)?;
        self.update_locked_with(key, f)
    }

    /// Writes lock a leaf, write and persist, and allocate from NSM (which never waits for a
    /// grace period): a caller may stay pinned across them.
    fn writes_wait_for_grace(&self) -> bool {
        false
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
        let height = self.root().and_then(|r| self.node(r)).map_or(0, |r| u64::from(r.level()) + 1);
        EngineStats {
            pm_bytes_per_node,
            dram_bytes: std::mem::size_of::<FastFair>() as u64,
            counters: vec![
                ("splits", get(&c.splits)),
                ("root_splits", get(&c.root_splits)),
                ("merges", get(&c.merges)),
                ("internal_merges", get(&c.internal_merges)),
                ("root_shrinks", get(&c.root_shrinks)),
                ("height", height),
                ("retries", get(&c.retries)),
                ("repairs", get(&c.repairs)),
                ("ranges_fixed", get(&c.ranges_fixed)),
                ("orphans_linked", get(&c.orphans_linked)),
                ("recovery_pending", u64::from(self.recovery_pending())),
                ("node_bytes_allocated", s.allocated_bytes),
            ],
        }
    }

    /// Waits for a pending background recovery first (so the tree is fully repaired and the
    /// allocator exact), then checks the tree and NSM's free lists ("nsm free lists": no block
    /// freed twice); a failed background recovery is reported as its error.
    fn check(&self) -> Result<CheckReport> {
        self.wait_recovery()?;
        self.nsm
            .check_free_lists()
            .map_err(|e| Error::corrupted(layout::ENGINE, format!("nsm free lists: {e}")))?;
        self.check_tree()
    }
}

impl Engine for FastFair {
    type Options = FastFairOptions;

    const NAME: &'static str = "fastfair";
    const FORMAT_VERSION: u32 = 1;

    fn create(pool: Arc<Pool>, opts: &FastFairOptions) -> Result<FastFair> {
        layout::validate_node_size(opts.node_size)?;
        layout::validate_root_slot_base(opts.root_slot_base)?;
        numakv_index::check_fresh_pool(
            &pool,
            Self::NAME,
            opts.root_slot_base + layout::SLOT_META,
            "a fastfair tree",
        )?;
        // A pool with NSM pages (another tree) is refused here: its blocks would be reclaimed
        // by this tree's recovery. Shared pools go through create_with.
        let nsm = Nsm::new(Arc::clone(&pool), opts.nsm_mode)?;
        let mut tree = FastFair::create_with(pool, nsm, opts)?;
        tree.owns_nsm = true;
        Ok(tree)
    }

    fn open(pool: Arc<Pool>, opts: &FastFairOptions) -> Result<(FastFair, RecoveryReport)> {
        let (mut tree, report) = recovery::open(pool, opts)?;
        tree.owns_nsm = true;
        Ok((tree, report))
    }

    /// Lets a pending background recovery finish (so that a cleanly closed store is collected
    /// and repaired; from a thread pinned in the epoch it is cancelled instead, and the next open
    /// starts it over), then closes.
    fn close(self) -> Result<()> {
        recovery::stop(&self, true);
        self.pool.close()?;
        Ok(())
    }

    fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }
}
