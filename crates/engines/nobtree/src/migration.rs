//! The migration coordinator (papers/nobtree.txt §III-D).
//!
//! **Identifying nodes.** Every `sample_every`-th operation of a thread (the paper's every
//! tenth) records, in a DRAM hash table keyed by the leaf's node id, one access from the
//! thread's NUMA node (a count per accessing node). A leaf whose sampled accesses in the
//! current window reach `hot_threshold` and are mostly remote (`remote_share` of them from
//! other nodes than the leaf's own) goes into the global queue by name — its `low`, level and
//! id — with the target node: the node that accessed it most (§III-B2), not the sampler that
//! tipped it. The coordinator finds the node again by a descent under its own pin and
//! migrates it only if it still carries that id, so no queued pointer is ever dereferenced
//! after its node could have been freed. Its previous sibling and parent are found at that
//! point too (they may change before the migration runs). The table is cleared every `window`
//! samples (the monitoring window).
//!
//! **Hysteresis** (issue 19): a migrated copy carries the original's statistics (they name
//! the target as the largest accessor, so the copy is not hot on arrival, and a short burst
//! from elsewhere does not outweigh them); a node that moved needs a 75% remote majority
//! (halfway from `remote_share` to all) to move again within the window; a node made by a
//! split or a migration is not queued during its cool-down (`MigrationOptions::cooldown`,
//! measured in samples through watermarks of the id counter: nothing is written on the split
//! path). A split's new half starts without statistics (see docs/design.md for why).
//!
//! **Migrating** (the coordinator thread, [`Tree::migrate`]; one at a time): *freeze* the node
//! `O` (under its lock for a moment: set the volatile FROZEN flag; writers then wait, merges
//! give up, readers go on reading `O`, which cannot change); copy it to a new node `O'` on the
//! target node (durable, frozen too) with no lock held; freeze the previous sibling `L` and the
//! parent `P` the same way after checking that `L`'s functional sibling is `O` and `P`
//! references `O` (else abort: unfreeze, free `O'`); arm the PM log `{old, new, parent, prev}`;
//! point `P`'s reference (one 8-byte store) and `L`'s sibling (shadow pointer + a CAS flip of
//! `sib_ver`) to `O'`; mark `O` obsolete, unfreeze `O'`; disarm the log; unfreeze `L`, `P`;
//! retire `O` under the epoch. No reader ever waits: one inside `O` reads records equal to
//! `O'`'s (no write enters `O'` until no new reader can reach `O`), one inside `L` fails
//! validation at the flip and retries.
//!
//! **Crash consistency.** The two reference updates cannot be made atomic together, hence the
//! log: `O'` is complete and durable before the log is armed, so recovery *redoes* an armed log
//! ([`recover_log`]): whichever of the two references still names `O` is pointed to `O'`.
//! Before the log is armed nothing references `O'` (garbage collection frees it); after it is
//! disarmed both references name `O'` (`O` is unreachable and collected).
//!
//! **Which nodes.** The paper monitors leaves and migrates "nodes within a subindex". With
//! `MigrationOptions::inner` (default on) a sampled operation also records every inner node of
//! its descent (levels 1 .. T-1), so hot inner nodes of a subindex migrate too, by the same
//! protocol: their parent is the node one level up that references them (leftmost or record),
//! the previous sibling the node of the same level covering `low − 1`. A *subindex root* (level
//! T-1) has no parent in PM: the upper layer is its parent. Its entry is rewritten in every
//! replica and in the temporary list under the upper-layer mutex, after the copy is durable
//! and before the original is marked obsolete; the log then holds no parent (`parent` = 0): the
//! replicas are DRAM-managed caches rebuilt from the root list at every open, so the redo only
//! has to fix the previous sibling. A root that neither the replicas nor the temporary list
//! name yet (its split has committed, its upper insert not yet run) is not migrated (abort).
//! Not migrated: the first node of a level (no previous sibling; the head slot and an old key-0
//! upper entry may name it), and a node whose level has no parent level yet (the young first
//! subindex below the height threshold, whose growth reads that level's chain).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use numakv_index::{Error, Result};
use numakv_pmem::alloc::epoch;
use numakv_pmem::alloc::PmAllocator;
use numakv_pmem::{PPtr, Pool};
use parking_lot::{Condvar, Mutex};

use crate::bottom::{find, init_node, Step};
use crate::layout::{
    self, meta_word, sl_count, sl_pos, st_locked, st_sib_ver, st_with, MigLog, Node, FLAG_FROZEN,
    FLAG_OBSOLETE, MIGLOG_ACTIVE, NODE_SIZE, VERSION_ONE,
};
use crate::lock::WriteGuard;
use crate::Tree;

/// Options of the migration coordinator.
#[derive(Clone, Debug)]
pub struct MigrationOptions {
    /// Run the coordinator (statistics, queue, background thread).
    pub enabled: bool,
    /// Sample one operation in this many per thread (the paper: 10).
    pub sample_every: u32,
    /// Samples after which the statistics table is cleared (the monitoring window).
    pub window: u64,
    /// Sampled accesses within a window that make a leaf hot.
    pub hot_threshold: u32,
    /// Share of remote accesses above which a hot leaf is queued (0.5: "the majority").
    pub remote_share: f64,
    /// Most queued migrations; further candidates are dropped until the queue drains.
    pub queue_capacity: usize,
    /// Also monitor and migrate inner nodes of the subindexes, roots included (see the module
    /// docs); `false`: leaves only.
    pub inner: bool,
    /// Cool-down, in samples of all threads together: a node created by a split or a
    /// migration (a fresh id) is not queued until at least this many (and at most 5/4 as
    /// many) samples were taken after its creation; its statistics — carried over from the
    /// node it was split from or copied from — keep counting meanwhile. 0: none. Default
    /// 2048 (1/32 of the window: about 20 000 operations at `sample_every` 10).
    pub cooldown: u64,
}

impl Default for MigrationOptions {
    fn default() -> Self {
        MigrationOptions {
            enabled: true,
            sample_every: 10,
            window: 1 << 16,
            hot_threshold: 8,
            remote_share: 0.5,
            queue_capacity: 1024,
            inner: true,
            cooldown: 2048,
        }
    }
}

impl MigrationOptions {
    pub(crate) fn validate(&self) -> Result<()> {
        if self.sample_every == 0 || self.window == 0 || self.hot_threshold == 0 {
            return Err(Error::InvalidOptions(
                "migration: sample_every, window and hot_threshold must be positive".into(),
            ));
        }
        if !(0.0..1.0).contains(&self.remote_share) {
            return Err(Error::InvalidOptions("migration: remote_share must be in [0, 1)".into()));
        }
        Ok(())
    }
}

/// One queued migration: which node, by name, not by pointer. The node may be split, merged,
/// migrated and its block freed and reused before the coordinator gets to it, so the queue holds
/// no pointer to dereference later; the coordinator finds the node again by a descent to
/// `(low, level)` under its own pin and migrates it only if that node still carries `id` (ids
/// are unique per store: a copy, a split half and a merge target each get a fresh one).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Candidate {
    low: u64,
    level: u32,
    id: u64,
    target: usize,
}

/// Statistics shards (DRAM hash table keyed by node id).
const SHARDS: usize = 16;

/// Accessing NUMA nodes whose counts a statistics entry holds inline (the bench and the
/// reproductions run 2): no heap block per entry, and no second cache miss to reach the counts
/// from the table. Sampling is on the operations' path (every `sample_every`-th one); perf on
/// nobtree-write-heavy at 1 thread put about a quarter of `record_one`'s samples on the load
/// through a boxed slice.
const INLINE_NODES: usize = 4;

/// Sampled accesses per accessing NUMA node (index = node): inline up to [`INLINE_NODES`]
/// nodes (unused entries stay 0), on the heap beyond.
#[derive(Clone, Debug)]
enum Counts {
    Inline([u32; INLINE_NODES]),
    Heap(Box<[u32]>),
}

impl Counts {
    fn new(nodes: usize) -> Counts {
        if nodes <= INLINE_NODES {
            Counts::Inline([0; INLINE_NODES])
        } else {
            Counts::Heap(vec![0; nodes].into())
        }
    }

    /// The counts; inline, the slots past the pool's nodes are 0 (they never win the largest
    /// accessor and add nothing to a sum).
    #[inline]
    fn get(&self) -> &[u32] {
        match self {
            Counts::Inline(a) => a,
            Counts::Heap(b) => b,
        }
    }

    #[inline]
    fn get_mut(&mut self) -> &mut [u32] {
        match self {
            Counts::Inline(a) => a,
            Counts::Heap(b) => b,
        }
    }
}

/// A node's sampled accesses in the current window.
#[derive(Clone, Debug)]
struct Stat {
    /// Sampled accesses per accessing NUMA node.
    by_node: Counts,
    /// Queued and not yet migrated or given up: not queued again meanwhile.
    queued: bool,
    /// Migrations of this node (and of the nodes it is a copy of) in the window.
    moves: u32,
}

/// One shard: node id → its statistics.
type StatsShard = HashMap<u64, Stat>;

#[derive(Debug, Default)]
struct MigCounters {
    sampled: AtomicU64,
    queued: AtomicU64,
    migrated: AtomicU64,
    aborted: AtomicU64,
    /// Nanoseconds completed migrations held their node locks (from the first lock that
    /// blocks other threads to the last unlock), all of them together, and the longest.
    hold_ns: AtomicU64,
    hold_max_ns: AtomicU64,
    /// The same for subindex-root migrations alone (they also hold the upper-layer mutex).
    root_migrated: AtomicU64,
    /// Completed migrations of leaves and of inner nodes below a subindex root, by anyone
    /// (coordinator or explicit): the kit's coverage gates by kind.
    leaf_migrated: AtomicU64,
    inner_migrated: AtomicU64,
    root_hold_ns: AtomicU64,
    /// Hot, mostly remote nodes not queued because they were cooling down.
    cooling: AtomicU64,
    /// Nanoseconds the coordinator spent on candidates (descent, migration or abort): the
    /// CPU it takes from the workers on a machine with no core to spare.
    busy_ns: AtomicU64,
    /// Statistics carried to a migrated copy.
    carried_migrated: AtomicU64,
    /// Nodes queued that had been migrated before within the window (ping-pong).
    queued_again: AtomicU64,
}

thread_local! {
    static TICK: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// The coordinator: statistics, queue, background thread.
#[derive(Debug)]
pub(crate) struct Migrator {
    opts: MigrationOptions,
    nodes: usize,
    stats: Box<[Mutex<StatsShard>]>,
    samples: AtomicU64,
    /// Cool-down watermarks (see `MigrationOptions::cooldown`): every quarter cool-down the
    /// tree's next id goes into the ring, and `fresh_floor` takes the value it replaces (the
    /// next id four quarters ago). So an id at or above `fresh_floor` was created less than
    /// 5/4 cool-downs ago, an id below it more than one cool-down ago.
    fresh_floor: AtomicU64,
    fresh_marks: Mutex<(usize, [u64; 4])>,
    queue: Mutex<VecDeque<Candidate>>,
    wake: Condvar,
    /// Set while the coordinator works on a popped candidate (for `drain`).
    busy: AtomicBool,
    /// Holders of [`Migrator::pause`]; the coordinator takes no candidate while nonzero.
    paused: AtomicU64,
    stop: AtomicBool,
    thread: Mutex<Option<JoinHandle<()>>>,
    counters: MigCounters,
}

impl Migrator {
    /// `first_id`: the tree's next node id now (nodes already there are not fresh).
    pub(crate) fn new(opts: MigrationOptions, nodes: usize, first_id: u64) -> Migrator {
        Migrator {
            opts,
            nodes,
            stats: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            samples: AtomicU64::new(0),
            fresh_floor: AtomicU64::new(first_id),
            fresh_marks: Mutex::new((0, [first_id; 4])),
            queue: Mutex::new(VecDeque::new()),
            wake: Condvar::new(),
            busy: AtomicBool::new(false),
            paused: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            thread: Mutex::new(None),
            counters: MigCounters::default(),
        }
    }

    /// Starts the coordinator thread (holding only a weak reference: dropping the tree ends it).
    pub(crate) fn start(&self, tree: &Arc<Tree>) -> Result<()> {
        if self.nodes < 2 {
            return Ok(()); // nothing is ever remote
        }
        let weak: Weak<Tree> = Arc::downgrade(tree);
        let h = std::thread::Builder::new()
            .name("nobtree-migrate".into())
            .spawn(move || coordinator(weak))
            .map_err(|e| Error::Unsupported(format!("cannot start the migration thread: {e}")))?;
        *self.thread.lock() = Some(h);
        Ok(())
    }

    /// Stops and joins the coordinator; idempotent.
    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        self.wake.notify_all();
        let h = self.thread.lock().take();
        if let Some(h) = h {
            if h.thread().id() != std::thread::current().id() {
                let _ = h.join();
            }
        }
    }

    /// Holds the coordinator off (for `check()`, which must see a quiescent tree): returns once
    /// no migration runs, and none starts until the guard is dropped.
    pub(crate) fn pause(&self) -> PauseGuard<'_> {
        {
            let _q = self.queue.lock();
            // ORDERING: under the queue mutex, which the coordinator holds when it checks the
            // count and sets `busy`: after this, no new migration starts.
            self.paused.fetch_add(1, Ordering::Relaxed);
        }
        // ORDERING: Acquire; pairs with the Release that clears `busy` after a migration, so
        // its stores are visible to the pausing thread.
        while self.busy.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_micros(100));
        }
        PauseGuard(self)
    }

    /// Migrations queued or running (0 once the coordinator is stopped or gone): what a
    /// benchmark's counted phase waits for.
    pub(crate) fn pending(&self) -> u64 {
        if self.stop.load(Ordering::Acquire) || self.thread.lock().is_none() {
            return 0;
        }
        let queued = self.queue.lock().len() as u64;
        // ORDERING: Acquire; pairs with the Release that clears `busy` after a migration.
        let running = u64::from(self.busy.load(Ordering::Acquire));
        if queued > 0 {
            self.wake.notify_all();
        }
        queued + running
    }

    /// Waits until the queue is empty and no migration runs.
    pub(crate) fn drain(&self) {
        loop {
            let empty = self.queue.lock().is_empty();
            if (empty && !self.busy.load(Ordering::Acquire))
                || self.stop.load(Ordering::Acquire)
                || self.thread.lock().is_none()
            {
                return;
            }
            self.wake.notify_all();
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    pub(crate) fn counters(&self) -> Vec<(&'static str, u64)> {
        let c = &self.counters;
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        vec![
            ("migration_samples", g(&c.sampled)),
            ("migrations_queued", g(&c.queued)),
            ("migrations", g(&c.migrated)),
            ("migrations_aborted", g(&c.aborted)),
            ("migration_hold_ns", g(&c.hold_ns)),
            ("migration_hold_max_ns", g(&c.hold_max_ns)),
            ("root_migrations", g(&c.root_migrated)),
            ("leaf_migrations", g(&c.leaf_migrated)),
            ("inner_migrations", g(&c.inner_migrated)),
            ("root_migration_hold_ns", g(&c.root_hold_ns)),
            ("migrations_cooling", g(&c.cooling)),
            ("migration_busy_ns", g(&c.busy_ns)),
            ("migration_stats_carried", g(&c.carried_migrated)),
            ("migrations_queued_again", g(&c.queued_again)),
        ]
    }

    pub(crate) fn dram_bytes(&self) -> u64 {
        let entries: usize = self.stats.iter().map(|s| s.lock().capacity()).sum();
        // An entry and its control byte, and the heap counts beyond INLINE_NODES nodes.
        let heap = if self.nodes > INLINE_NODES { 4 * self.nodes } else { 0 };
        (entries * (std::mem::size_of::<(u64, Stat)>() + 1 + heap)) as u64
    }

    /// Records an access to leaf `n` at `ptr` (every `sample_every`-th call of this thread);
    /// `ids` is the tree's next node id (for the cool-down's watermarks).
    #[inline]
    pub(crate) fn sample(
        &self,
        pool: &Pool,
        n: &Node<'_>,
        ptr: PPtr,
        path: &[PPtr],
        ids: &AtomicU64,
    ) {
        let tick = TICK.with(|t| {
            let v = t.get().wrapping_add(1);
            t.set(v);
            v
        });
        if tick % self.opts.sample_every != 0 || self.nodes < 2 {
            return;
        }
        self.record(pool, n, ptr, path, ids);
    }

    #[cold]
    fn record(&self, pool: &Pool, n: &Node<'_>, ptr: PPtr, path: &[PPtr], ids: &AtomicU64) {
        self.counters.sampled.fetch_add(1, Ordering::Relaxed);
        let s = self.samples.fetch_add(1, Ordering::Relaxed);
        if s % self.opts.window == self.opts.window - 1 {
            for s in self.stats.iter() {
                s.lock().clear();
            }
        }
        let quarter = self.opts.cooldown.div_ceil(4);
        if quarter > 0 && s % quarter == quarter - 1 {
            let mut ring = self.fresh_marks.lock();
            let i = ring.0;
            let floor = std::mem::replace(&mut ring.1[i], ids.load(Ordering::Relaxed));
            ring.0 = (i + 1) % 4;
            // ORDERING: Relaxed (and the id load above): the watermarks only approximate
            // ages; a sampler that reads a stale one holds a node back a little longer or
            // shorter.
            self.fresh_floor.store(floor, Ordering::Relaxed);
        }
        self.record_one(n, ptr);
        if self.opts.inner {
            // The inner nodes of this descent (`path[l]` = the node visited at level l; the
            // caller is pinned, so they are readable even if retired meanwhile).
            for &p in path.iter().skip(1) {
                if p.is_null() {
                    continue;
                }
                if let Ok(inner) = Node::resolve(pool, p) {
                    self.record_one(&inner, p);
                }
            }
        }
    }

    fn record_one(&self, n: &Node<'_>, ptr: PPtr) {
        let id = n.hdr.id.load(Ordering::Relaxed);
        let here = numakv_pmem::numa::current_node() % self.nodes;
        let at = ptr.node() % self.nodes;
        let target = {
            let mut shard = self.stats[(id as usize) % SHARDS].lock();
            let e = shard.entry(id).or_insert_with(|| Stat {
                by_node: Counts::new(self.nodes),
                queued: false,
                moves: 0,
            });
            let by_node = e.by_node.get_mut();
            by_node[here] = by_node[here].saturating_add(1);
            if e.queued {
                return;
            }
            let by_node = e.by_node.get();
            let total: u32 = by_node.iter().sum();
            let remote = total - by_node[at];
            // The first node of a level (low 0) has no previous sibling: never migratable, so
            // never queued (it was queued and aborted over and over).
            // A node that already moved in this window needs a clearer remote majority to move
            // again: halfway between `remote_share` and all (75% by default). A node read
            // about equally from two nodes then stays where it went instead of following
            // each swing of its samples (issue 19: ping-pong; measured on nobtree-write-heavy
            // at 2 threads: 910-1104 nodes queued again per run without it, 0-11 with it). The
            // window's end clears the table, this history with it: halving the counts
            // instead, to keep it, made more migrations (4666 against 3331-3541 at 1 thread).
            let share = if e.moves > 0 {
                (1.0 + self.opts.remote_share) / 2.0
            } else {
                self.opts.remote_share
            };
            let hot = n.low() != 0
                && total >= self.opts.hot_threshold
                && f64::from(remote) > share * f64::from(total);
            if !hot {
                return;
            }
            // The node that accesses it most (papers/nobtree.txt §III-B2: "to the socket that accesses
            // them most");
            // ties go to the lowest node. With three or more nodes a remote majority can still
            // leave the node's own node the largest accessor: it stays.
            let mut best = at;
            for (i, &c) in by_node.iter().enumerate() {
                if c > by_node[best] {
                    best = i;
                }
            }
            if best == at {
                return;
            }
            // Cool-down: a node made by a split or a migration moves only once it is old
            // enough; its statistics go on counting.
            if self.opts.cooldown > 0 && id >= self.fresh_floor.load(Ordering::Relaxed) {
                self.counters.cooling.fetch_add(1, Ordering::Relaxed);
                return;
            }
            e.queued = true;
            if e.moves > 0 {
                self.counters.queued_again.fetch_add(1, Ordering::Relaxed);
            }
            best
        };
        let mut q = self.queue.lock();
        if q.len() < self.opts.queue_capacity {
            q.push_back(Candidate { low: n.low(), level: n.level(), id, target });
            self.counters.queued.fetch_add(1, Ordering::Relaxed);
            self.wake.notify_one();
        } else {
            drop(q);
            self.unqueue(id);
        }
    }

    /// A queued node was not migrated (it changed, or is on its target already): it may be
    /// queued again.
    fn unqueue(&self, id: u64) {
        if let Some(e) = self.stats[(id as usize) % SHARDS].lock().get_mut(&id) {
            e.queued = false;
        }
    }

    /// Moves the statistics of node `from` to node `to` (a migration's copy: the same node
    /// under a fresh id). Its accesses so far name the target as the largest accessor, so the
    /// copy is not hot on arrival, and a node accessed from several nodes needs the others to
    /// overtake that count before it moves again — rather than the first few samples of a
    /// fresh id deciding (issue 19: ping-pong).
    pub(crate) fn carry_migrated(&self, from: u64, to: u64) {
        let stat = self.stats[(from as usize) % SHARDS].lock().remove(&from);
        if let Some(mut st) = stat {
            st.queued = false;
            st.moves += 1;
            self.stats[(to as usize) % SHARDS].lock().insert(to, st);
            self.counters.carried_migrated.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Flips `sib_ver` of the frozen node `l` without holding its lock: a CAS from an even
/// (unlocked) state to the flipped state two versions on, so readers that snapshotted the old
/// state fail validation and retry — none waits. A writer may hold the lock for an instant (it
/// took it, found the node frozen and lets go): the CAS then fails and is retried.
fn flip_frozen(l: &Node<'_>) {
    loop {
        let s = l.hdr.state.load(Ordering::Acquire);
        if st_locked(s) {
            std::hint::spin_loop();
            continue;
        }
        let flipped = st_with(s, s & 0xff, st_sib_ver(s) + 1).wrapping_add(2 * VERSION_ONE);
        // ORDERING: AcqRel; the Release publishes the shadow pointer stored before (readers
        // load the state with Acquire), the Acquire orders this after the last unlock.
        if l.hdr.state.compare_exchange(s, flipped, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
            return;
        }
    }
}

/// A node a migration froze: unfrozen on drop unless the migration committed (made it obsolete).
struct Frozen<'a> {
    node: Node<'a>,
    level: u32,
    done: bool,
}

impl Frozen<'_> {
    fn commit(mut self) {
        self.done = true;
    }
}

impl Drop for Frozen<'_> {
    fn drop(&mut self) {
        if !self.done {
            // ORDERING: Release; the migration's reads of the node are done. Writers waiting
            // for the freeze take the node's lock next (Acquire) and see it cleared.
            self.node.hdr.meta.store(meta_word(self.level, 0), Ordering::Release);
        }
    }
}

/// A migration's copy, freed on drop unless linked.
struct Unlinked<'a> {
    tree: &'a Tree,
    p: PPtr,
    done: bool,
}

impl Unlinked<'_> {
    fn commit(mut self) {
        self.done = true;
    }
}

impl Drop for Unlinked<'_> {
    fn drop(&mut self) {
        if !self.done {
            // SAFETY: allocated by this migration and never linked (no reference names it;
            // the log was not armed for it, or the migration committed and `done` is set).
            let _ = unsafe { self.tree.nsm.free(self.p) };
        }
    }
}

impl Migrator {
    /// Records how long a completed migration held its locks.
    fn held(&self, ns: u64, level: u32, root: bool) {
        let c = &self.counters;
        if level == 0 {
            c.leaf_migrated.fetch_add(1, Ordering::Relaxed);
        } else if !root {
            c.inner_migrated.fetch_add(1, Ordering::Relaxed);
        }
        c.hold_ns.fetch_add(ns, Ordering::Relaxed);
        c.hold_max_ns.fetch_max(ns, Ordering::Relaxed);
        if root {
            c.root_migrated.fetch_add(1, Ordering::Relaxed);
            c.root_hold_ns.fetch_add(ns, Ordering::Relaxed);
        }
    }
}

/// Keeps the coordinator paused while alive (see [`Migrator::pause`]).
#[derive(Debug)]
pub(crate) struct PauseGuard<'a>(&'a Migrator);

impl Drop for PauseGuard<'_> {
    fn drop(&mut self) {
        self.0.paused.fetch_sub(1, Ordering::Relaxed);
        self.0.wake.notify_all();
    }
}

/// The coordinator thread's loop.
fn coordinator(tree: Weak<Tree>) {
    loop {
        let Some(t) = tree.upgrade() else { return };
        let Some(m) = t.migrator.as_ref() else { return };
        if m.stop.load(Ordering::Acquire) {
            return;
        }
        let next = {
            let mut q = m.queue.lock();
            if q.is_empty() {
                m.wake.wait_for(&mut q, Duration::from_millis(20));
            }
            let c = if m.paused.load(Ordering::Relaxed) == 0 { q.pop_front() } else { None };
            if c.is_some() {
                m.busy.store(true, Ordering::Release);
            }
            c
        };
        if let Some(c) = next {
            let t0 = std::time::Instant::now();
            match t.migrate_queued(c) {
                Ok(Some(true)) => m.counters.migrated.fetch_add(1, Ordering::Relaxed),
                Ok(None) => 0, // already on the target node
                _ => m.counters.aborted.fetch_add(1, Ordering::Relaxed),
            };
            // Not migrated (already there, changed, aborted): it may be queued again. After a
            // migration the statistics moved to the copy's id; this finds nothing.
            m.unqueue(c.id);
            m.counters.busy_ns.fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
            // The migration's PM lines go into the thread's published totals before `busy`
            // clears, so a benchmark that waited for the queue finds them (docs/design.md §11).
            numakv_pmem::account::op_split();
            m.busy.store(false, Ordering::Release);
        }
        drop(t);
    }
}

/// The migration log block, if the store has one.
pub(crate) fn log_block(pool: &Pool) -> Result<Option<PPtr>> {
    let p = PPtr::from_raw(pool.root(layout::SLOT_MIGLOG)?.load(Ordering::Acquire));
    Ok((!p.is_null()).then_some(p))
}

/// Recovery step 2: redoes an armed migration log. Returns the log block (reachable) and
/// whether a migration was redone.
pub(crate) fn recover_log(pool: &Pool) -> Result<(Option<PPtr>, bool)> {
    let Some(lp) = log_block(pool)? else { return Ok((None, false)) };
    let log: &MigLog = pool
        .get(lp)
        .map_err(|e| Error::corrupted(crate::layout::ENGINE, format!("migration log: {e}")))?;
    if log.state.load(Ordering::Acquire) != MIGLOG_ACTIVE {
        return Ok((Some(lp), false));
    }
    let old = log.old.load(Ordering::Relaxed);
    let new = PPtr::from_raw(log.new.load(Ordering::Relaxed));
    let parent = PPtr::from_raw(log.parent.load(Ordering::Relaxed));
    let prev = PPtr::from_raw(log.prev.load(Ordering::Relaxed));
    Node::resolve(pool, new)?;
    if !parent.is_null() {
        let p = Node::resolve(pool, parent)?;
        if p.hdr.leftmost.load(Ordering::Relaxed) == old {
            p.hdr.leftmost.store(new.raw(), Ordering::Release);
        }
        let w = p.slots();
        for i in 0..sl_count(w).min(layout::RECORDS) {
            let q = sl_pos(w, i);
            if p.val(q) == old {
                p.recs[q].val.store(new.raw(), Ordering::Release);
                // PERSIST: the redone child pointer.
                pool.persist(p.rec_addr(q), 16);
            }
        }
        // PERSIST: the redone leftmost pointer.
        pool.persist(p.hdr_addr(), 64);
    }
    if !prev.is_null() {
        let l = Node::resolve(pool, prev)?;
        let s = l.state();
        if l.sibling(s).raw() == old {
            let v = st_sib_ver(s);
            l.hdr.sib[((v + 1) & 1) as usize].store(new.raw(), Ordering::Release);
            // PERSIST: the shadow pointer before the flip.
            pool.persist(l.hdr_addr(), 64);
            l.hdr.state.store(st_with(s, s & 0xff, v + 1), Ordering::Release);
            // PERSIST: the flip.
            pool.persist(l.hdr_addr(), 64);
        }
    }
    log.state.store(0, Ordering::Release);
    // PERSIST: both references name the copy; the log is disarmed after them.
    pool.persist_obj(&log.state);
    Ok((Some(lp), true))
}

impl Tree {
    /// The migration log, allocated on first use (its pointer persisted in a root slot).
    fn miglog(&self) -> Result<&MigLog> {
        let slot = self.pool.root(layout::SLOT_MIGLOG)?;
        let mut p = PPtr::from_raw(slot.load(Ordering::Acquire));
        if p.is_null() {
            p = self.nsm.alloc_on(64, Some(0))?;
            let log: &MigLog = self.pool.get(p)?;
            log.state.store(0, Ordering::Relaxed);
            // PERSIST: an idle log is durable before the slot names it.
            self.pool.persist_obj(log);
            slot.store(p.raw(), Ordering::Release);
            // PERSIST: the log block is reachable from now on.
            self.pool.persist_obj(slot);
        }
        Ok(self.pool.get(p)?)
    }

    /// Migrates node `node` (id `id`; a leaf or, see the module docs, an inner node or a
    /// subindex root) to NUMA node `target` (§III-D); `Ok(false)` when it aborted (the node
    /// changed, split, moved or is not migratable). Called by the coordinator thread and by
    /// the public `migrate_*_of`; one migration runs at a time (`Tree::migrate_lock`).
    ///
    /// `node` must have been found under `guard` (by a descent), so its block cannot have
    /// been freed and reused meanwhile: every pointer this dereferences is safe by
    /// construction.
    pub(crate) fn migrate(
        &self,
        node: PPtr,
        id: u64,
        target: usize,
        guard: &epoch::Guard,
    ) -> Result<bool> {
        if target >= self.pool.nodes() {
            return Ok(false);
        }
        // One migration at a time: the log block is shared (see `Tree::migrate_lock`).
        let _one = self.migrate_lock.lock();
        let o = self.node(node)?;
        let low = o.low();
        let level = o.level();
        if level > self.top() || low == 0 || o.is_obsolete() {
            return Ok(false);
        }
        let is_root = level == self.top();
        // Without a parent level (the young first subindex; a root growth that has not run
        // yet or ran out of space) the parent descent below would end on this level's chain —
        // on `L` or `O`, held by this thread — and wait for its own lock. Checked before any
        // lock is taken; the head only grows, so the answer cannot turn false meanwhile.
        if !is_root && !self.has_parent_level(level)? {
            return Ok(false);
        }
        // 1. Freeze `O` (under its lock, for a moment): writers wait from now on, readers do
        //    not — they go on reading `O`, which cannot change until it is obsolete.
        let (recs, sib, leftmost) = {
            let og = WriteGuard::lock(o);
            if o.is_obsolete() || o.hdr.id.load(Ordering::Relaxed) != id || o.low() != low {
                return Ok(false);
            }
            o.hdr.meta.store(meta_word(level, FLAG_FROZEN), Ordering::Release);
            (o.records(o.slots()), o.sibling(og.state()), o.leftmost())
        };
        let frozen_o = Frozen { node: o, level, done: false };
        // 2. The copy on the target node, complete and durable, before anything else.
        let np = self.nsm.alloc_on(NODE_SIZE, Some(target))?;
        let unlinked = Unlinked { tree: self, p: np, done: false };
        let new_id = self.new_id();
        init_node(&self.pool, np, level, leftmost, low, sib, new_id, &recs)?;
        // The copy is frozen too until both references name it: a write into it while `L`
        // still leads to `O` would be missed by readers (scans) walking from `L` into `O`.
        let copy = self.node(np)?;
        // ORDERING: Release; ordered before the Release stores that publish the copy.
        copy.hdr.meta.store(meta_word(level, FLAG_FROZEN), Ordering::Release);
        // 3. Freeze the previous sibling `L` (the node of this level covering low - 1) and
        //    the parent `P` the same way, after checking that they still reference `O`: a
        //    frozen node's references cannot change (writers wait, merges give up), so the
        //    checks hold until the switches below, which no reader waits for.
        let mut path = [PPtr::NULL; crate::bottom::MAX_PATH];
        let (lp, _) = self.descend(low - 1, level, &mut path, guard)?;
        let l = self.node(lp)?;
        {
            let lg = WriteGuard::lock(l);
            if l.is_obsolete() || l.level() != level || l.sibling(lg.state()) != node {
                return Ok(false);
            }
            l.hdr.meta.store(meta_word(level, FLAG_FROZEN), Ordering::Release);
        }
        let frozen_l = Frozen { node: l, level, done: false };
        let held_since = std::time::Instant::now();
        // Parent: the node one level up covering `low`, which must reference `node` (for a
        // subindex root: the upper layer, checked under its mutex below).
        let mut parent = None;
        if !is_root {
            let (mut pp, _) = self.descend(low, level + 1, &mut path, guard)?;
            let pg = loop {
                let g = WriteGuard::lock(self.node(pp)?);
                match self.must_leave(&g.node(), g.state(), low)? {
                    Some(Step::Right(s)) => pp = s,
                    Some(Step::Restart) => return Ok(false),
                    None => break g,
                }
            };
            let p = pg.node();
            if p.level() != level + 1 {
                return Ok(false); // cannot happen: the parent level existed before the locks
            }
            let pw = p.slots();
            let slot = if p.leftmost() == node {
                None
            } else {
                match find(&p, pw, low) {
                    Some(q) if p.val(q) == node.raw() => Some(q),
                    _ => return Ok(false), // an orphan, or the parent changed: abort
                }
            };
            p.hdr.meta.store(meta_word(level + 1, FLAG_FROZEN), Ordering::Release);
            drop(pg);
            parent = Some((pp, Frozen { node: p, level: level + 1, done: false }, slot));
        }
        // For a root: the upper layer must name it (replicas or temporary list). The mutex is
        // held until the reference is switched (no rebuild or upper insert in between); no
        // holder of it ever waits for a node. The replicas are searched for the root's own
        // entry, not listed.
        let mut upper_guard = None;
        if is_root {
            let writers = self.upper_lock.lock();
            // SAFETY: loaded under `guard` (see bottom.rs `upper_root`).
            let up = unsafe { self.upper.load(Ordering::Acquire, guard).as_ref() };
            let in_upper = up.is_some_and(|u| u.names(&self.pool, low, node));
            let in_temp = writers.temp.iter().any(|&(k, p)| k == low && p == node);
            if !in_upper && !in_temp {
                return Ok(false); // its upper insert has not run yet
            }
            upper_guard = Some(writers);
        }
        numakv_pmem::pause_point!("nobtree.migrate.frozen");
        // Arm the log.
        let log = self.miglog()?;
        log.old.store(node.raw(), Ordering::Relaxed);
        log.new.store(np.raw(), Ordering::Relaxed);
        log.parent.store(parent.as_ref().map_or(0, |p| p.0.raw()), Ordering::Relaxed);
        log.prev.store(lp.raw(), Ordering::Relaxed);
        // PERSIST: the log's contents are durable before it is armed.
        self.pool.persist_obj(log);
        log.state.store(MIGLOG_ACTIVE, Ordering::Release);
        // PERSIST: armed — from here recovery redoes the migration.
        self.pool.persist_obj(&log.state);
        // Parent reference: one 8-byte store in a frozen node. A reader of `P` sees `O` or
        // `O'`; both hold the same records (`O` is frozen) and `O` stays readable until the
        // epoch grace period after its retirement.
        match &parent {
            Some((_, f, None)) => {
                let p = f.node;
                // ORDERING: Release; a reader that loads `O'` from here sees its contents.
                p.hdr.leftmost.store(np.raw(), Ordering::Release);
                // PERSIST: the parent's leftmost names the copy.
                self.pool.persist(p.hdr_addr(), 64);
            }
            Some((_, f, Some(q))) => {
                let p = f.node;
                // ORDERING: Release, as above.
                p.recs[*q].val.store(np.raw(), Ordering::Release);
                // PERSIST: the parent's child pointer names the copy.
                self.pool.persist(p.rec_addr(*q), 16);
            }
            None => {
                let writers = upper_guard.as_mut().expect("root migration holds the upper mutex");
                // SAFETY: loaded under `guard` (see bottom.rs `upper_root`).
                let up = unsafe { self.upper.load(Ordering::Acquire, guard).as_ref() };
                // Logged for a rebuild building from a snapshot meanwhile.
                writers.replace(up, &self.pool, low, node, np);
            }
        }
        drop(upper_guard);
        numakv_pmem::pause_point!("nobtree.migrate.parent_switched");
        // Previous sibling: the shadow pointer (not read by anyone: it is the non-functional
        // one, and `L` is frozen, so `sib_ver` cannot move), then the flip.
        let v = st_sib_ver(l.state());
        // ORDERING: Release; a reader that sees the flipped `sib_ver` sees the pointer.
        l.hdr.sib[((v + 1) & 1) as usize].store(np.raw(), Ordering::Release);
        // PERSIST: the shadow pointer is durable before the flip.
        self.pool.persist(l.hdr_addr(), 64);
        flip_frozen(&l);
        // PERSIST: the flip: the sibling chain runs through the copy.
        self.pool.persist(l.hdr_addr(), 64);
        // Obsolete (volatile meaning only: the node is unreachable in PM already); this also
        // ends its freeze: writers waiting for `O` find it obsolete and restart.
        o.hdr.meta.store(meta_word(level, FLAG_OBSOLETE), Ordering::Release);
        frozen_o.commit();
        // Only now may writers enter the copy: no reader can reach `O` any more without having
        // started before this point.
        copy.hdr.meta.store(meta_word(level, 0), Ordering::Release);
        unlinked.commit();
        log.state.store(0, Ordering::Release);
        // PERSIST: disarmed after both references are durable (and before `P` and `L` thaw:
        // the log never names a node that may have been merged away and reused).
        self.pool.persist_obj(&log.state);
        drop(parent);
        drop(frozen_l);
        if let Some(m) = &self.migrator {
            m.held(held_since.elapsed().as_nanos() as u64, level, is_root);
            m.carry_migrated(id, new_id);
        }
        // SAFETY: `node` is unlinked (parent — or the upper layer — and previous sibling name
        // the copy, and it is marked obsolete for anyone holding it); it is retired once,
        // after the grace period.
        unsafe { self.retire_block(guard, node) };
        // Hand the deferred free to the global queue now: the coordinator may sleep for long.
        guard.flush();
        Ok(true)
    }

    /// A queued candidate: the node of `c.level` covering `c.low`, found again under a fresh
    /// pin, migrated if it is still the queued node (same id). `Ok(None)`: it is already on the
    /// target node.
    fn migrate_queued(&self, c: Candidate) -> Result<Option<bool>> {
        let guard = epoch::pin();
        let mut path = [PPtr::NULL; crate::bottom::MAX_PATH];
        let (p, _) = self.descend(c.low, c.level, &mut path, &guard)?;
        let n = self.node(p)?;
        if n.level() != c.level || n.low() != c.low || n.hdr.id.load(Ordering::Relaxed) != c.id {
            return Ok(Some(false)); // split, merged or migrated since it was queued
        }
        if p.node() == c.target {
            return Ok(None);
        }
        self.migrate(p, c.id, c.target, &guard).map(Some)
    }

    /// Migrates the node of `level` covering `key` to `target` (tests, repros).
    pub(crate) fn migrate_level_key(&self, key: u64, level: u32, target: usize) -> Result<bool> {
        let guard = epoch::pin();
        let mut path = [PPtr::NULL; crate::bottom::MAX_PATH];
        let (p, _) = self.descend(key, level, &mut path, &guard)?;
        let n = self.node(p)?;
        if n.level() != level {
            return Ok(false);
        }
        let id = n.hdr.id.load(Ordering::Relaxed);
        self.migrate(p, id, target, &guard)
    }

    /// Migrates the leaf holding `key` to `target` (tests, repros).
    pub(crate) fn migrate_key(&self, key: u64, target: usize) -> Result<bool> {
        self.migrate_level_key(key, 0, target)
    }
}
