//! FAST&FAIR: the persistent B+-tree of Hwang et al., FAST'18 — the baseline the NUMA-aware
//! engines of numakv build on and compare against.
//!
//! - 512-byte nodes by default (configurable), entries sorted in place;
//! - **FAST**: inserts and deletes shift entries failure-atomically in store order, flushing at
//!   cache-line boundaries (ADR; in eADR the pool makes flushes no-ops) — [`insert`](crate::insert),
//!   [`delete`](crate::delete);
//! - **FAIR**: splits and merges without logging, through B-link sibling pointers and node key
//!   ranges — [`smo`](crate::smo);
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
    /// Where NSM places new nodes (default: on the calling thread's node). Per session.
    pub nsm_mode: NsmMode,
    /// How `open()` recovers (default: lazy). Per session.
    pub recovery: RecoveryMode,
}

impl Default for FastFairOptions {
    fn default() -> Self {
        FastFairOptions {
            node_size: DEFAULT_NODE_SIZE,
            nsm_mode: NsmMode::Local,
            recovery: RecoveryMode::Lazy,
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
    counters: Arc<Counters>,
    /// True until every node's range has been repaired (lazy recovery): readers then take
    /// `min(high, sibling.low)` as a node's high key (docs/design.md, "Recovery"). Shared with
    /// the background thread.
    repairing: Arc<AtomicBool>,
    /// The background recovery of a lazy open.
    background: Mutex<recovery::Background>,
}

/// What a leaf write does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WriteKind {
    Insert,
    Upsert,
    Update,
}

impl FastFair {
    fn new_handle(pool: Arc<Pool>, nsm: Arc<Nsm>, node_size: usize) -> FastFair {
        let slots = layout::slots(node_size);
        FastFair {
            generation: pool.generation(),
            pool,
            nsm,
            node_size,
            slots,
            cap: slots - 1,
            counters: Arc::default(),
            repairing: Arc::default(),
            background: Mutex::default(),
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
            counters: Arc::clone(&self.counters),
            repairing: Arc::clone(&self.repairing),
            background: Mutex::default(),
        }
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

    /// The current root.
    pub(crate) fn root(&self) -> Result<PPtr> {
        // ORDERING: Acquire; pairs with the Release store of a new root in smo.rs.
        Ok(PPtr::from_raw(self.pool.root(layout::SLOT_ROOT)?.load(Ordering::Acquire)))
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
        EngineStats {
            pm_bytes_per_node,
            dram_bytes: std::mem::size_of::<FastFair>() as u64,
            counters: vec![
                ("splits", get(&c.splits)),
                ("root_splits", get(&c.root_splits)),
                ("merges", get(&c.merges)),
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
        if pool.header().engine.name != Self::NAME {
            return Err(Error::InvalidOptions(format!(
                "pool belongs to engine {:?}, not {}",
                pool.header().engine.name,
                Self::NAME
            )));
        }
        if pool.root(layout::SLOT_META)?.load(Ordering::Acquire) != 0 {
            return Err(Error::InvalidOptions("pool already holds a fastfair tree".into()));
        }
        let nsm = Nsm::new(Arc::clone(&pool), opts.nsm_mode)?;
        let tree = FastFair::new_handle(pool, nsm, opts.node_size);
        let root = tree.alloc_node()?;
        tree.init_node(root, 0, PPtr::NULL, 0, END, PPtr::NULL, &[])?;
        let meta = tree.pool.root(layout::SLOT_META)?;
        meta.store(layout::meta_word(opts.node_size), Ordering::Release);
        let slot = tree.pool.root(layout::SLOT_ROOT)?;
        slot.store(root.raw(), Ordering::Release);
        // PERSIST: the root node was persisted by init_node; the format word and the root pointer
        // (same header line) become durable together, after it.
        tree.pool.flush_obj(meta);
        tree.pool.persist_obj(slot);
        Ok(tree)
    }

    fn open(pool: Arc<Pool>, opts: &FastFairOptions) -> Result<(FastFair, RecoveryReport)> {
        recovery::open(pool, opts)
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
