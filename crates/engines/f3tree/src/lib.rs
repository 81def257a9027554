//! F3-tree (papers/f3tree.txt): writes go to per-thread persistent future objects (PTFOs) in the
//! writer's node's PM and to a DRAM hash table of pending keys; per-node evaluate threads
//! checkpoint them asynchronously into one global FAST&FAIR tree (used through its public API,
//! embedded in the same pool and NSM allocator).
//!
//! - [`layout`]: PM formats (directory, FOs, entries);
//! - [`ptfo`]: the lists and their durability protocol (Algorithm 1, Fig. 4);
//! - [`pending`]: the hash table, which is also the per-key serialisation point;
//! - [`evaluate`]: evaluate threads (key-based F3-K, node-based batched F3-N), thresholds, the
//!   FO limit;
//! - [`recovery`]: open — NSM GC over tree + FOs, replay of pre-crash entries by version;
//! - [`check`]: the fsck; [`scan`]: range queries merging pending keys with the tree;
//! - [`phase`]: PM lines per phase (producer lookup / append, evaluator PTFO / tree), for the
//!   NUMA analysis of Figs. 8-9.
//!
//! Design, crash states and resolved ambiguities: docs/design.md, section "F3-tree".
//!
//! Pause points (docs/design.md §12; `tests/interleavings.rs`):
//! - `f3tree.evaluate.drain`: an evaluate thread about to look at one of its lists;
//! - `f3tree.evaluate.applying`: an evaluate thread that flagged a key `applying` and is about
//!   to write its entry into the tree (outside the shard lock);
//! - `f3tree.evaluate.watermarked`: an evaluation that persisted its list's watermark;
//! - `f3tree.evaluate.unlinking`: an evaluation about to unlink the FOs it passed (its keys
//!   are out of the table);
//! - `f3tree.search_ptfos.listed`: a "No Hash" lookup that has listed the PTFO lists and not yet
//!   walked them.
//!
//! ```
//! use numakv_f3tree::{F3Tree, F3TreeOptions};
//! use numakv_index::{Engine, Index};
//! use numakv_pmem::{Pool, PoolConfig};
//!
//! let pool = Pool::volatile(PoolConfig::new(F3Tree::engine_id(), 8 << 20))?;
//! let t = F3Tree::create(pool, &F3TreeOptions::default())?;
//! assert!(t.insert(7, 0)?);
//! assert_eq!(t.get(7)?, Some(0));
//! assert!(t.remove(7)?);
//! assert_eq!(t.get(7)?, None);
//! t.close()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod check;
pub mod evaluate;
pub mod layout;
pub mod pending;
pub mod phase;
pub mod ptfo;
mod recovery;
mod scan;

use std::collections::hash_map::Entry;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::Duration;

use numakv_fastfair::{FastFair, FastFairOptions};
use numakv_index::{
    check_key, Backlog, CheckReport, Engine, EngineStats, Error, Index, RecoveryReport, Result,
};
use numakv_numa as numa;
use numakv_pmem::alloc::nsm::{Nsm, NsmMode};
use numakv_pmem::{PPtr, Pool};
use parking_lot::{Mutex, RwLock};

use crate::layout::{Desc, Directory, DIR_BYTES, DIR_SLOTS, ENGINE, MAX_FO_ENTRIES, TOMB};
use crate::pending::{Pending, PendingTable};
use crate::phase::{Phase, Phases};
use crate::ptfo::List;

/// Free pages per node below which producers get `OutOfSpace` (room kept for the tree).
pub const HEADROOM_PAGES: u64 = 4;

/// How evaluate threads apply a list's entries to the tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Evaluation {
    /// F3-K: entry by entry, in the order they were written.
    KeyBased,
    /// F3-N (node-based batching): up to `batch` entries at once, sorted by key, so that
    /// consecutive tree writes hit the same leaves.
    NodeBatched {
        /// Most entries per batch.
        batch: usize,
    },
}

/// Where the evaluate threads run and which PTFO lists each serves: the paper's configurations
/// (papers/f3tree.txt §3.2, §5.3.1, Figs. 2, 8, 9). Pinned evaluators are bound to a CPU of their
/// node and run as threads of that node (accounting, NSM placement of the tree nodes they
/// allocate).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Evaluators {
    /// F3-tree(N): `n` per node, pinned there, each serving only lists on its own node.
    PerNode(usize),
    /// F3-tree(N2): `n` in total, still node-bound: evaluator `g` is pinned to node
    /// `g % nodes`; a list is served by an evaluator of its own node, or — on a node that has
    /// none (fewer evaluators than nodes) — by evaluator `node % n`.
    Total(usize),
    /// F3-tree(NI) and (I) of §3.2: `n` in total, all pinned to the first node, serving every
    /// list wherever it lives.
    FirstNode(usize),
    /// `n` per node, unpinned, each serving any node's lists (our `f3tree-nonuma`).
    Unbound(usize),
}

impl Evaluators {
    /// The count in the variant.
    pub fn count(self) -> usize {
        match self {
            Evaluators::PerNode(n)
            | Evaluators::Total(n)
            | Evaluators::FirstNode(n)
            | Evaluators::Unbound(n) => n,
        }
    }

    /// Evaluate threads in all, on `nodes` nodes.
    pub fn threads(self, nodes: usize) -> usize {
        match self {
            Evaluators::PerNode(n) | Evaluators::Unbound(n) => n * nodes,
            Evaluators::Total(n) | Evaluators::FirstNode(n) => n,
        }
    }

    /// The node of evaluator `g` (of [`Evaluators::threads`]) and whether it is pinned there.
    pub fn node_of(self, g: usize, nodes: usize) -> (usize, bool) {
        match self {
            Evaluators::PerNode(n) => (g / n.max(1), true),
            Evaluators::Total(_) => (g % nodes.max(1), true),
            Evaluators::FirstNode(_) => (0, true),
            Evaluators::Unbound(n) => (g / n.max(1), false),
        }
    }

    /// Whether lists are ranked per node (node-bound evaluators) or over all nodes.
    fn ranks_per_node(self) -> bool {
        matches!(self, Evaluators::PerNode(_) | Evaluators::Total(_))
    }

    /// Whether evaluator `g` serves a list on `node` with `rank` (see the variants).
    pub fn serves(self, g: usize, nodes: usize, node: usize, rank: u64) -> bool {
        let nodes = nodes.max(1);
        match self {
            Evaluators::PerNode(n) => {
                let n = n.max(1);
                node == g / n && rank % n as u64 == (g % n) as u64
            }
            Evaluators::Total(n) => {
                let n = n.max(1);
                // Evaluators g ≡ node (mod nodes), g < n, live on the list's node.
                let here = if node < n { (n - node - 1) / nodes + 1 } else { 0 };
                if here > 0 {
                    g % nodes == node && rank % here as u64 == (g / nodes) as u64
                } else {
                    g == node % n
                }
            }
            Evaluators::FirstNode(n) => rank % n.max(1) as u64 == g as u64,
            Evaluators::Unbound(n) => rank % (n.max(1) * nodes) as u64 == g as u64,
        }
    }
}

impl std::fmt::Display for Evaluators {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Evaluators::PerNode(n) => write!(f, "per-node:{n}"),
            Evaluators::Total(n) => write!(f, "total:{n}"),
            Evaluators::FirstNode(n) => write!(f, "first-node:{n}"),
            Evaluators::Unbound(n) => write!(f, "unbound:{n}"),
        }
    }
}

impl std::str::FromStr for Evaluators {
    type Err = String;

    /// `per-node:N | total:N | first-node:N | unbound:N` (a bare `N` is `per-node:N`).
    fn from_str(s: &str) -> std::result::Result<Evaluators, String> {
        let (kind, n) = s.split_once(':').unwrap_or(("per-node", s));
        let n: usize = n.parse().map_err(|_| format!("evaluators: {s:?}: {n:?} is not a count"))?;
        match kind {
            "per-node" => Ok(Evaluators::PerNode(n)),
            "total" => Ok(Evaluators::Total(n)),
            "first-node" => Ok(Evaluators::FirstNode(n)),
            "unbound" => Ok(Evaluators::Unbound(n)),
            _ => Err(format!(
                "evaluators: {s:?} is not per-node:N | total:N | first-node:N | unbound:N"
            )),
        }
    }
}

/// Options of an F3-tree (all per session except `node_size`, which the tree records).
#[derive(Clone, Debug)]
pub struct F3TreeOptions {
    /// Node size of the global FAST&FAIR tree (shapes its format; the stored value wins).
    pub node_size: usize,
    /// Entries per FO (1..=4094; default 126: a 4 KiB FO).
    pub fo_entries: usize,
    /// FOs a producer's list may hold before the producer waits for the evaluators (the
    /// paper's FO limit, Fig. 6); at least 2 (the head FO is never freed); `None` = unlimited.
    pub fo_limit: Option<usize>,
    /// Evaluate threads: how many, where they run, which lists each serves (default
    /// `PerNode(2)`, the paper's F3-tree(N)).
    pub evaluators: Evaluators,
    /// Evaluate a list once it holds this many unprocessed entries.
    pub count_threshold: u64,
    /// ... or once it has unprocessed entries and was last evaluated this long ago.
    pub time_threshold: Duration,
    /// Key-based or node-based batched evaluation.
    pub evaluation: Evaluation,
    /// Memory placement: `true` (default, the paper's non-interleaved policy) puts FOs on
    /// their producer's node and tree nodes on the allocating evaluator's node; `false`
    /// interleaves both over the nodes (`numactl --interleave`). Where the evaluators run is
    /// [`F3TreeOptions::evaluators`].
    pub numa_aware: bool,
    /// Lookups consult the hash table (default). `false` is the paper's "No Hash" read path of
    /// Fig. 10: a lookup searches every PTFO (newest first) before the tree. The table still
    /// serialises writers either way.
    pub hash_lookups: bool,
}

impl Default for F3TreeOptions {
    fn default() -> Self {
        F3TreeOptions {
            node_size: numakv_fastfair::layout::DEFAULT_NODE_SIZE,
            fo_entries: 126,
            fo_limit: None,
            evaluators: Evaluators::PerNode(2),
            count_threshold: 64,
            time_threshold: Duration::from_millis(1),
            evaluation: Evaluation::KeyBased,
            numa_aware: true,
            hash_lookups: true,
        }
    }
}

impl F3TreeOptions {
    /// The batched (F3-N) preset.
    pub fn batched() -> F3TreeOptions {
        F3TreeOptions {
            evaluation: Evaluation::NodeBatched { batch: 1024 },
            ..F3TreeOptions::default()
        }
    }

    /// `f3tree-nonuma`, our stand-in for §3.2's F3-tree(I): FOs and tree interleaved over the
    /// nodes, two unpinned evaluators per node serving any list (the paper's (I) has two in
    /// total, pinned to the first node).
    pub fn non_numa() -> F3TreeOptions {
        F3TreeOptions {
            numa_aware: false,
            evaluators: Evaluators::Unbound(2),
            ..F3TreeOptions::default()
        }
    }

    /// F3-tree(NI), Fig. 9's baseline: PTFOs in the producer's local PM, two evaluate threads in
    /// total pinned to the first node and serving every list (the tree they grow lives there).
    pub fn ni() -> F3TreeOptions {
        F3TreeOptions { evaluators: Evaluators::FirstNode(2), ..F3TreeOptions::default() }
    }

    /// F3-tree(N2), Figs. 8-9: NUMA-aware with two evaluate threads in total.
    pub fn n2() -> F3TreeOptions {
        F3TreeOptions { evaluators: Evaluators::Total(2), ..F3TreeOptions::default() }
    }

    fn validate(&self) -> Result<()> {
        if self.fo_entries == 0 || self.fo_entries > MAX_FO_ENTRIES {
            return Err(Error::InvalidOptions(format!(
                "fo_entries {} not in 1..={MAX_FO_ENTRIES}",
                self.fo_entries
            )));
        }
        if self.evaluators.count() == 0 {
            return Err(Error::InvalidOptions(format!(
                "evaluators {}: at least 1 evaluate thread is needed",
                self.evaluators
            )));
        }
        // A list always keeps its head FO (the producer appends there; `drain` never frees
        // it), so with a limit of 1 a producer whose only FO is full would wait forever.
        if matches!(self.fo_limit, Some(n) if n < 2) {
            return Err(Error::InvalidOptions(
                "fo_limit must be at least 2 (a list always keeps its head FO) or unlimited".into(),
            ));
        }
        if let Evaluation::NodeBatched { batch: 0 } = self.evaluation {
            return Err(Error::InvalidOptions("a batch must hold at least 1 entry".into()));
        }
        Ok(())
    }

    fn tree_options(&self) -> FastFairOptions {
        FastFairOptions {
            node_size: self.node_size,
            nsm_mode: self.nsm_mode(),
            root_slot_base: layout::TREE_SLOT_BASE,
            // The tree is opened with `FastFair::open_with` over the NSM this engine shares and
            // recovers itself, which always repairs eagerly (docs/design.md, "Sharing a pool").
            recovery: numakv_fastfair::RecoveryMode::Eager,
        }
    }

    fn nsm_mode(&self) -> NsmMode {
        if self.numa_aware {
            NsmMode::Local
        } else {
            NsmMode::RoundRobin
        }
    }
}

/// Event counters (DRAM, per session).
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub applied: AtomicU64,
    pub skipped: AtomicU64,
    pub evaluations: AtomicU64,
    pub fos_allocated: AtomicU64,
    pub fos_freed: AtomicU64,
    pub producer_waits: AtomicU64,
    pub eval_errors: AtomicU64,
    /// Evaluate threads pinned to a CPU of their node (NUMA-aware), and pinning failures.
    pub evaluators_pinned: AtomicU64,
    pub pin_failures: AtomicU64,
    /// Node-batched evaluation: entries written into the leaf of the previous entry without a
    /// descent from the root.
    pub leaf_reuses: AtomicU64,
    /// Evaluations of an entry that waited for another evaluator's tree write of the same key.
    pub apply_waits: AtomicU64,
    /// PM lines per phase (while accounting is on).
    pub phases: Phases,
}

/// What evaluate threads and operations share.
#[derive(Debug)]
pub(crate) struct Inner {
    pub pool: Arc<Pool>,
    pub nsm: Arc<Nsm>,
    pub tree: FastFair,
    pub dir: PPtr,
    pub table: PendingTable,
    pub opts: F3TreeOptions,
    /// Every list evaluators serve (active and recovering).
    pub lists: RwLock<Vec<Arc<List>>>,
    /// Producer (thread id, node) → its list.
    pub by_thread: Box<[OnceLock<Arc<List>>]>,
    /// Free directory slots.
    pub free_slots: Mutex<Vec<usize>>,
    /// Evaluators hold it shared while they process; `check()` exclusively.
    pub gate: RwLock<()>,
    /// Evaluate everything regardless of thresholds (close).
    pub draining: AtomicBool,
    /// Evaluators exit.
    pub stop: AtomicBool,
    /// Round-robin node for the non-NUMA variant's FOs.
    pub rr: AtomicU64,
    pub counters: Counters,
    /// The last error an evaluator hit (reported by `check()` and `close()`).
    pub eval_error: Mutex<Option<String>>,
    /// Set while an evaluator's last attempt failed for lack of space (the node it needed).
    pub eval_oos: Mutex<Option<usize>>,
    /// Lists created so far per node (node-bound evaluators) or in all: the rank that spreads
    /// lists over evaluators.
    pub ranks: Vec<AtomicU64>,
}

/// What a write does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Write {
    Insert,
    Upsert,
    Update,
    Remove,
}

impl Inner {
    pub fn desc(&self, slot: usize) -> Result<&Desc> {
        let dir: &Directory = layout::directory(&self.pool, self.dir)?;
        dir.get(slot).ok_or_else(|| Error::corrupted(ENGINE, format!("directory slot {slot}")))
    }

    /// The calling thread's list (created on first use).
    fn my_list(&self) -> Result<&Arc<List>> {
        let tid = numa::try_tid().map_err(numakv_pmem::PoolError::from)?;
        let node = numa::current_node().min(self.pool.nodes() - 1);
        let cell = self
            .by_thread
            .get(tid * self.pool.nodes() + node)
            .ok_or_else(|| Error::InvalidOptions(format!("thread id {tid} out of range")))?;
        if let Some(l) = cell.get() {
            return Ok(l);
        }
        // Only the thread holding `tid` gets here for this cell: no race on creation.
        self.headroom()?;
        let slot = self.free_slots.lock().pop().ok_or_else(|| {
            Error::Unsupported(format!("more than {DIR_SLOTS} PTFO lists at once"))
        })?;
        let fo_node = self.fo_node(node);
        let list = match ptfo::create_list(
            &self.pool,
            &self.nsm,
            self.desc(slot)?,
            slot,
            fo_node,
            self.opts.fo_entries,
        ) {
            Ok(l) => Arc::new(l),
            Err(e) => {
                self.free_slots.lock().push(slot);
                return Err(e);
            }
        };
        self.counters.fos_allocated.fetch_add(1, Ordering::Relaxed);
        assign_rank(&self.opts, &self.ranks, &list);
        self.lists.write().push(Arc::clone(&list));
        let _ = cell.set(list);
        cell.get().ok_or_else(|| Error::corrupted(ENGINE, "list cell"))
    }

    /// The node of a new FO of a list on `node`: that node when NUMA-aware; the non-NUMA variant
    /// interleaves FO by FO over all nodes (an FO of the default size is one 4 KiB page: what
    /// `numactl --interleave` does page by page), whoever writes it.
    fn fo_node(&self, node: usize) -> usize {
        if self.opts.numa_aware {
            node
        } else {
            // ORDERING: Relaxed; a round-robin counter.
            (self.rr.fetch_add(1, Ordering::Relaxed) % self.pool.nodes() as u64) as usize
        }
    }

    /// Fails with `OutOfSpace` when a node's page heap is down to [`HEADROOM_PAGES`] free
    /// pages. Producers stop there so that the evaluate threads can still grow the tree for
    /// the entries already accepted: FAST&FAIR running out of space in the middle of a split
    /// leaves an orphan node that only its recovery relinks.
    fn headroom(&self) -> Result<()> {
        for node in 0..self.pool.nodes() {
            let (used, total) = self.pool.heap_usage(node)?;
            if total.saturating_sub(used) < HEADROOM_PAGES {
                return Err(numakv_pmem::PoolError::OutOfSpace {
                    node,
                    requested: layout::fo_bytes(self.opts.fo_entries) as u64,
                }
                .into());
            }
        }
        Ok(())
    }

    /// Makes room for one entry in the producer's head FO: links a new FO when it is full,
    /// waiting first while the list is at the FO limit. Called without any shard lock held
    /// (evaluators need them to make progress).
    fn reserve(&self, list: &List) -> Result<usize> {
        // ORDERING: Relaxed; only this thread (the producer) writes `head_used`.
        let used = list.head_used.load(Ordering::Relaxed);
        if used < list.cap {
            return Ok(used);
        }
        if let Some(limit) = self.opts.fo_limit {
            let mut waited = false;
            // ORDERING: Relaxed; `fos` is a counter the consumer decrements, re-read in a loop.
            while list.fos.load(Ordering::Relaxed) >= limit {
                if !waited {
                    waited = true;
                    self.counters.producer_waits.fetch_add(1, Ordering::Relaxed);
                    list.waiting.store(true, Ordering::Relaxed);
                }
                if self.stop.load(Ordering::Relaxed) || self.pool.has_crashed() {
                    return Err(Error::Unsupported("f3tree: engine stopped or crashed".into()));
                }
                // The evaluators cannot free FOs while the tree has no room: waiting would
                // never end, so the write fails as an allocation would (nothing was changed).
                if let Some(node) = *self.eval_oos.lock() {
                    list.waiting.store(false, Ordering::Relaxed);
                    return Err(numakv_pmem::PoolError::OutOfSpace {
                        node,
                        requested: layout::fo_bytes(list.cap) as u64,
                    }
                    .into());
                }
                std::thread::sleep(Duration::from_micros(20));
            }
            list.waiting.store(false, Ordering::Relaxed);
        }
        self.headroom()?;
        ptfo::link_new_fo(
            &self.pool,
            &self.nsm,
            self.desc(list.slot)?,
            list,
            self.fo_node(list.node),
        )?;
        self.counters.fos_allocated.fetch_add(1, Ordering::Relaxed);
        Ok(0)
    }

    fn write(&self, key: u64, value: u64, kind: Write) -> Result<bool> {
        check_key(key)?;
        let list = self.my_list()?;
        let idx = self.reserve(list)?;
        self.counters.phases.end(Phase::ProducerPtfo);
        let mut shard = self.table.lock(key);
        let pending::Shard { map, next_version } = &mut *shard;
        // One probe of the shard's map: the entry decides the result and takes the new value.
        let slot = map.entry(key);
        // A blind write (upsert) needs no current value: its entry supersedes whatever the key
        // holds. The others decide their result from the logical value: table, else tree.
        let current = match &slot {
            _ if kind == Write::Upsert => None,
            Entry::Occupied(p) => p.get().value,
            Entry::Vacant(_) => self.tree.get(key)?,
        };
        self.counters.phases.end(Phase::ProducerTree);
        let tomb = match kind {
            Write::Insert if current.is_some() => return Ok(false),
            Write::Update | Write::Remove if current.is_none() => return Ok(false),
            Write::Remove => true,
            _ => false,
        };
        let version = *next_version;
        *next_version += 1;
        let meta = version | if tomb { TOMB } else { 0 };
        let loc = ptfo::append(&self.pool, list, idx, key, if tomb { 0 } else { value }, meta)?;
        let mut new = Pending { version, loc, value: (!tomb).then_some(value), applying: false };
        match slot {
            Entry::Occupied(mut p) => {
                // The new entry is durable: the superseded one must never be replayed.
                ptfo::mark_dead(&self.pool, p.get().loc)?;
                // An evaluator still writing the superseded entry into the tree clears this.
                new.applying = p.get().applying;
                p.insert(new);
            }
            Entry::Vacant(v) => {
                v.insert(new);
            }
        }
        self.counters.phases.end(Phase::ProducerPtfo);
        Ok(true)
    }

    fn get(&self, key: u64) -> Result<Option<u64>> {
        check_key(key)?;
        if self.opts.hash_lookups {
            let shard = self.table.lock(key);
            if let Some(p) = shard.map.get(&key) {
                // Hash table → PTFO: the value is read from the entry (one PM line), as the
                // paper's lookup does; the DRAM copy serves scans.
                let e = self.pool.get::<layout::FoEntry>(p.loc)?;
                let meta = e.meta.load(Ordering::Acquire);
                return Ok(if meta & TOMB != 0 {
                    None
                } else {
                    Some(e.value.load(Ordering::Relaxed))
                });
            }
        } else if let Some(v) = self.search_ptfos(key)? {
            return Ok(v);
        }
        self.tree.get(key)
    }

    /// The "No Hash" lookup of Fig. 10: every list's live entries, newest version of `key`
    /// wins. Each list is walked under its cursor lock, so its consumer frees no FO meanwhile.
    /// Not linearizable against concurrent writers of `key` (a write may move the key to a list
    /// already walked): a measurement mode for read-only runs, not for mixed workloads.
    fn search_ptfos(&self, key: u64) -> Result<Option<Option<u64>>> {
        let lists: Vec<Arc<List>> = self.lists.read().clone();
        numakv_pmem::pause_point!("f3tree.search_ptfos.listed");
        let mut best: Option<(u64, Option<u64>)> = None;
        for l in &lists {
            let cur = l.cursor.lock();
            // A recovered list retired since it was listed: its last FO (`cur.fo`) is freed and
            // may already be another block. `retired` is set under this cursor lock, so it is
            // seen here whenever the free happened.
            if l.retired.load(Ordering::Relaxed) {
                continue;
            }
            let head = l.head();
            let mut fo = cur.fo;
            let mut start = cur.idx;
            while !fo.is_null() {
                let f = layout::Fo::resolve(&self.pool, fo)?;
                let end = if fo == head { l.head_used.load(Ordering::Acquire) } else { f.cap };
                for i in start..end.min(f.cap) {
                    let e = f.entry(&self.pool, i);
                    if e.key.load(Ordering::Relaxed) != key {
                        continue;
                    }
                    let meta = e.meta.load(Ordering::Acquire);
                    if meta == 0 || meta & layout::DEAD != 0 {
                        continue;
                    }
                    let v = meta & layout::VERSION_MASK;
                    if best.map_or(true, |(bv, _)| v > bv) {
                        let val = (meta & TOMB == 0).then(|| e.value.load(Ordering::Relaxed));
                        best = Some((v, val));
                    }
                }
                if fo == head {
                    break;
                }
                fo = f.prev();
                start = 0;
            }
        }
        // Not found: the key is not pending, or its entry was applied during the walk — the
        // tree has it either way.
        Ok(best.map(|(_, v)| v))
    }
}

/// An F3-tree; see the [crate docs](crate).
#[derive(Debug)]
pub struct F3Tree {
    inner: Arc<Inner>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl F3Tree {
    fn start(inner: Arc<Inner>) -> Result<F3Tree> {
        let threads = evaluate::spawn(&inner)?;
        Ok(F3Tree { inner, threads: Mutex::new(threads) })
    }

    /// The global FAST&FAIR tree (entries not yet evaluated are not in it).
    pub fn tree(&self) -> &FastFair {
        &self.inner.tree
    }

    /// Whether the background part of the last open (the tree's walk, NSM's collection, the
    /// tree's repairs) is still running.
    pub fn recovery_pending(&self) -> bool {
        self.inner.tree.recovery_pending()
    }

    /// Waits for the background part of the last open; its report (`None` after a create).
    pub fn wait_recovery(&self) -> Result<Option<RecoveryReport>> {
        self.inner.tree.wait_recovery()
    }

    /// Keys currently pending in PTFOs.
    pub fn pending_keys(&self) -> usize {
        self.inner.table.len()
    }

    /// Waits until every entry written so far has been evaluated into the tree (or `timeout`
    /// passes, or evaluation makes no progress for a second — e.g. the pool is full); `true`
    /// if drained.
    pub fn wait_drained(&self, timeout: Duration) -> bool {
        self.inner.draining.store(true, Ordering::Relaxed);
        let ok = evaluate::wait_idle(&self.inner, timeout, Duration::from_secs(1));
        self.inner.draining.store(false, Ordering::Relaxed);
        ok
    }

    /// Stops and joins the evaluate threads (idempotent).
    fn stop(&self) {
        self.inner.stop.store(true, Ordering::Relaxed);
        for h in self.threads.lock().drain(..) {
            let _ = h.join();
        }
    }
}

impl Drop for F3Tree {
    fn drop(&mut self) {
        // A drop without close is a crash for the store: stop evaluating, do not drain.
        self.stop();
    }
}

impl Index for F3Tree {
    fn name(&self) -> &'static str {
        ENGINE
    }

    fn insert(&self, key: u64, value: u64) -> Result<bool> {
        self.inner.write(key, value, Write::Insert)
    }

    fn upsert(&self, key: u64, value: u64) -> Result<()> {
        self.inner.write(key, value, Write::Upsert).map(|_| ())
    }

    fn update(&self, key: u64, value: u64) -> Result<bool> {
        self.inner.write(key, value, Write::Update)
    }

    fn get(&self, key: u64) -> Result<Option<u64>> {
        self.inner.get(key)
    }

    fn remove(&self, key: u64) -> Result<bool> {
        self.inner.write(key, 0, Write::Remove)
    }

    fn scan(&self, start: u64, max: usize, out: &mut Vec<(u64, u64)>) -> Result<usize> {
        scan::scan(&self.inner, start, max, out)
    }

    /// Drains the PTFOs ([`F3Tree::wait_drained`]): the evaluate threads apply every entry
    /// written so far to the tree.
    fn quiesce(&self, limit: Duration) -> Result<Vec<Backlog>> {
        if self.wait_drained(limit) {
            return Ok(Vec::new());
        }
        let entries: u64 = self.inner.lists.read().iter().map(|l| l.pending()).sum();
        Ok(vec![
            Backlog { what: "entries to evaluate", count: entries },
            Backlog { what: "keys pending in PTFOs", count: self.pending_keys() as u64 },
        ])
    }

    fn stats(&self) -> EngineStats {
        let i = &self.inner;
        let mut s = i.tree.stats();
        let c = &i.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let lists = i.lists.read();
        let fos: usize = lists.iter().map(|l| l.fos.load(Ordering::Relaxed)).sum();
        let pending: u64 = lists.iter().map(|l| l.pending()).sum();
        s.dram_bytes += i.table.dram_bytes();
        s.counters.extend([
            ("lists", lists.len() as u64),
            ("fos", fos as u64),
            ("pending_entries", pending),
            ("pending_keys", i.table.len() as u64),
            ("entries_applied", get(&c.applied)),
            ("entries_skipped", get(&c.skipped)),
            ("evaluations", get(&c.evaluations)),
            ("fos_allocated", get(&c.fos_allocated)),
            ("fos_freed", get(&c.fos_freed)),
            ("producer_waits", get(&c.producer_waits)),
            ("eval_errors", get(&c.eval_errors)),
            ("evaluators_pinned", get(&c.evaluators_pinned)),
            ("leaf_reuses", get(&c.leaf_reuses)),
            ("apply_waits", get(&c.apply_waits)),
            ("evaluator_pin_failures", get(&c.pin_failures)),
        ]);
        for ph in Phase::ALL {
            let (local, remote) = c.phases.lines(ph);
            let (l, r) = PHASE_COUNTERS[ph as usize];
            s.counters.extend([(l, local), (r, remote)]);
        }
        s
    }

    fn check(&self) -> Result<CheckReport> {
        check::check(&self.inner)
    }
}

/// Counter names of [`Phase::ALL`]: (local lines, remote lines).
const PHASE_COUNTERS: [(&str, &str); 4] = [
    ("pm_producer_tree_local", "pm_producer_tree_remote"),
    ("pm_producer_ptfo_local", "pm_producer_ptfo_remote"),
    ("pm_eval_ptfo_local", "pm_eval_ptfo_remote"),
    ("pm_eval_tree_local", "pm_eval_tree_remote"),
];

/// Builds the engine state shared by create and open.
#[allow(clippy::too_many_arguments)]
pub(crate) fn new_inner(
    pool: Arc<Pool>,
    nsm: Arc<Nsm>,
    tree: FastFair,
    dir: PPtr,
    table: PendingTable,
    opts: &F3TreeOptions,
    lists: Vec<Arc<List>>,
    used_slots: &[usize],
) -> Arc<Inner> {
    let nodes = pool.nodes();
    let by_thread = (0..numa::MAX_THREADS * nodes).map(|_| OnceLock::new()).collect();
    let ranks: Vec<AtomicU64> = (0..nodes).map(|_| AtomicU64::new(0)).collect();
    for l in &lists {
        assign_rank(opts, &ranks, l);
    }
    let free_slots = (0..DIR_SLOTS).rev().filter(|s| !used_slots.contains(s)).collect();
    Arc::new(Inner {
        pool,
        nsm,
        tree,
        dir,
        table,
        opts: opts.clone(),
        lists: RwLock::new(lists),
        by_thread,
        free_slots: Mutex::new(free_slots),
        gate: RwLock::new(()),
        draining: AtomicBool::new(false),
        stop: AtomicBool::new(false),
        rr: AtomicU64::new(0),
        counters: Counters::default(),
        eval_error: Mutex::new(None),
        eval_oos: Mutex::new(None),
        ranks,
    })
}

/// Gives `l` the next rank of its node (node-bound evaluators) or of all lists (the others), so
/// that consecutive lists go to different evaluators.
pub(crate) fn assign_rank(opts: &F3TreeOptions, ranks: &[AtomicU64], l: &List) {
    let counter = if opts.evaluators.ranks_per_node() {
        &ranks[l.node.min(ranks.len() - 1)]
    } else {
        &ranks[0]
    };
    // ORDERING: Relaxed; a counter, read by nobody else.
    l.rank.store(counter.fetch_add(1, Ordering::Relaxed), Ordering::Relaxed);
}

impl Engine for F3Tree {
    type Options = F3TreeOptions;

    const NAME: &'static str = "f3tree";
    const FORMAT_VERSION: u32 = layout::FORMAT_VERSION;

    fn create(pool: Arc<Pool>, opts: &F3TreeOptions) -> Result<F3Tree> {
        opts.validate()?;
        numakv_index::check_fresh_pool(&pool, Self::NAME, layout::SLOT_META, "an f3tree")?;
        let nsm = Nsm::new(Arc::clone(&pool), opts.nsm_mode())?;
        let tree =
            FastFair::create_with(Arc::clone(&pool), Arc::clone(&nsm), &opts.tree_options())?;
        let dir = nsm.alloc_on(DIR_BYTES, Some(0))?;
        let bytes = pool.bytes(dir, DIR_BYTES)?;
        // SAFETY: the block was just allocated; nobody else can reach it.
        unsafe {
            bytes.fill(0, DIR_BYTES, 0);
        }
        // PERSIST: an empty directory (every slot free) before it is published.
        pool.persist(bytes.as_ptr(), DIR_BYTES);
        let slot = pool.root(layout::SLOT_DIR)?;
        slot.store(dir.raw(), Ordering::Release);
        // PERSIST: the directory pointer before the format word that commits the store.
        pool.persist_obj(slot);
        let meta = pool.root(layout::SLOT_META)?;
        meta.store(layout::meta_word(), Ordering::Release);
        // PERSIST: the store exists durably before create returns.
        pool.persist_obj(meta);
        let inner = new_inner(pool, nsm, tree, dir, PendingTable::new(1), opts, Vec::new(), &[]);
        F3Tree::start(inner)
    }

    fn open(pool: Arc<Pool>, opts: &F3TreeOptions) -> Result<(F3Tree, RecoveryReport)> {
        opts.validate()?;
        let (inner, report) = recovery::open(pool, opts)?;
        Ok((F3Tree::start(inner)?, report))
    }

    fn close(self) -> Result<()> {
        // Drain: every pending entry reaches the tree and every FO but the heads is freed —
        // best effort: entries that cannot be applied now (the pool is full for the tree) stay
        // durable in their FOs, and the next open replays them exactly as after a crash.
        self.wait_drained(Duration::from_secs(600));
        self.stop();
        if let Some(e) = self.inner.eval_error.lock().take() {
            return Err(Error::corrupted(ENGINE, format!("evaluation failed: {e}")));
        }
        // The tree's background recovery (after a lazy open) finishes before the pool closes,
        // so that a cleanly closed store is collected and repaired.
        self.inner.tree.wait_recovery()?;
        self.inner.pool.close()?;
        Ok(())
    }

    fn pool(&self) -> &Arc<Pool> {
        &self.inner.pool
    }
}

impl F3Tree {
    /// NSM, shared by the tree and the FOs.
    pub fn nsm(&self) -> &Arc<Nsm> {
        &self.inner.nsm
    }
}

#[cfg(test)]
mod tests {
    use super::Evaluators;

    /// Every list (node, rank) is served by exactly one evaluator, and node-bound placements
    /// serve a list from its own node whenever that node has an evaluator.
    #[test]
    fn every_list_has_exactly_one_evaluator() {
        for nodes in 1..=5 {
            for n in 1..=5 {
                for ev in [
                    Evaluators::PerNode(n),
                    Evaluators::Total(n),
                    Evaluators::FirstNode(n),
                    Evaluators::Unbound(n),
                ] {
                    let total = ev.threads(nodes);
                    for node in 0..nodes {
                        for rank in 0..12u64 {
                            let who: Vec<usize> =
                                (0..total).filter(|&g| ev.serves(g, nodes, node, rank)).collect();
                            assert_eq!(who.len(), 1, "{ev} on {nodes} nodes, list {node}/{rank}");
                            let (at, pinned) = ev.node_of(who[0], nodes);
                            match ev {
                                Evaluators::PerNode(_) => assert_eq!(at, node),
                                Evaluators::Total(t) if node < t => assert_eq!(at, node),
                                Evaluators::FirstNode(_) => assert_eq!(at, 0),
                                _ => {}
                            }
                            assert_eq!(pinned, !matches!(ev, Evaluators::Unbound(_)));
                        }
                    }
                    // Ranks spread a node's lists over all of its evaluators.
                    if let Evaluators::PerNode(_) = ev {
                        let used: std::collections::HashSet<usize> = (0..n as u64)
                            .flat_map(|r| (0..total).filter(move |&g| ev.serves(g, nodes, 0, r)))
                            .collect();
                        assert_eq!(used.len(), n);
                    }
                    assert_eq!(ev.to_string().parse::<Evaluators>(), Ok(ev));
                }
            }
        }
        assert!("sideways:2".parse::<Evaluators>().is_err());
        assert_eq!("3".parse::<Evaluators>(), Ok(Evaluators::PerNode(3)));
    }
}
