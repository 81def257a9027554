//! Open with recovery, eager or lazy (instant).
//!
//! FAST&FAIR needs no log: every durable state is one readers and writers tolerate. What a crash
//! leaves behind is
//! 1. blocks allocated but unreachable (a split's new node, a new root, a retired node, an old
//!    root whose shrink's root switch was durable), which NSM's garbage-collecting recovery
//!    reclaims given the reachable set;
//! 2. nodes with `high > sibling.low` (interrupted split or merge, at any level):
//!    `high = sibling.low`, then the writers' repair removes hidden slots, duplicates and entries
//!    beyond the high key (delete.rs) — a writer does this for every node it locks while ranges
//!    may be stale;
//! 3. orphans: a node in a level's chain that no parent references (a split whose parent insert
//!    was lost, or a merge rolled back), and a root level with more than one node (a lost root
//!    split) — readers and writers reach them through `sibling`, linking them is an ordinary
//!    separator insert;
//! 4. an internal root without entries (a merge emptied it and the root switch was lost): the
//!    root shrinks (after the orphans are linked: an orphan child gives it an entry again).
//!
//! **Eager** ([`RecoveryMode::Eager`]): `open()` walks every level, hands the reachable set to
//! [`Nsm::recover`], repairs every node, links orphans, and only then returns — O(tree).
//!
//! **Lazy** ([`RecoveryMode::Lazy`], the default): `open()` validates the format word and the
//! root, opens NSM with [`Nsm::recover_deferred`] (every existing NSM extent frozen, new nodes
//! from new pages) and starts a background thread that walks the tree while it serves
//! operations, hands the walk to [`Nsm::collect`], repairs every node and links orphans. Until the
//! repairs are done readers take `min(high, sibling.low)` as a node's high key (search.rs,
//! scan.rs), because a rolled-back merge's stale copies must not be read once the sibling is
//! written. Why the collection is safe under concurrent splits and merges: docs/design.md,
//! "FAST&FAIR", "Recovery and invariants".
//!
//! Orphans are linked under a lock of their left neighbour, so linking is safe next to splits
//! and merges in flight (both hold that lock while they add or remove the orphan's parent entry).

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use numakv_index::{Error, RecoveryReport, Result};
use numakv_pmem::alloc::epoch::{self, Guard};
use numakv_pmem::alloc::nsm::Nsm;
use numakv_pmem::{PPtr, Pool};

use crate::layout::{self, Node, END, ENGINE, HIDDEN, NODE_MAGIC};
use crate::lock::WriteGuard;
use crate::search::Read;
use crate::smo::{NodeReserve, Reclaim};
use crate::{FastFair, FastFairOptions, RecoveryMode};

/// A lock-free walk re-pins (at a locked live node) every this many nodes, so that one long
/// chain does not hold back memory reclamation for the whole walk.
const REPIN_EVERY: usize = 1024;

/// Valid child pointers of an internal node, in key order: the leftmost child, then the child
/// of every accepted entry below the high key (hidden slots, duplicates and cut-off entries of an
/// interrupted split are skipped).
pub(crate) fn children(node: Node<'_>) -> Vec<(u64, PPtr)> {
    let mut out = vec![(node.low(), PPtr::from_raw(node.hdr.leftmost.load(Ordering::Acquire)))];
    let high = node.high();
    let mut prev = 0;
    for i in 0..node.used() {
        let k = node.key(i);
        if k == HIDDEN || k <= prev || k >= high {
            continue;
        }
        let v = node.val(i);
        if node.key(i) != k {
            continue; // being rewritten (concurrent shift): not a stable entry
        }
        prev = k;
        out.push((k, PPtr::from_raw(v)));
    }
    out
}

/// The sibling chain starting at `first`, every node checked to be a node of `level`.
pub(crate) fn chain(
    pool: &Pool,
    node_size: usize,
    first: PPtr,
    level: u32,
    seen: &mut HashSet<PPtr>,
) -> Result<Vec<PPtr>> {
    let mut out = Vec::new();
    let mut p = first;
    while !p.is_null() {
        if !seen.insert(p) {
            return Err(Error::corrupted(
                ENGINE,
                format!("node {p} reached twice (cycle or shared node)"),
            ));
        }
        let n = checked(pool, node_size, p, level)?;
        out.push(p);
        p = n.sibling();
    }
    Ok(out)
}

/// Resolves `p` and checks that it is a node of `level`.
fn checked(pool: &Pool, node_size: usize, p: PPtr, level: u32) -> Result<Node<'_>> {
    let n = Node::resolve(pool, p, node_size)?;
    if n.hdr.magic.load(Ordering::Acquire) != NODE_MAGIC {
        return Err(Error::corrupted(ENGINE, format!("node {p} has a bad magic")));
    }
    if n.level() != level {
        return Err(Error::corrupted(
            ENGINE,
            format!("node {p} on level {level} says level {}", n.level()),
        ));
    }
    Ok(n)
}

/// The leftmost child of an internal node, which must exist.
fn leftmost(n: Node<'_>) -> Result<PPtr> {
    // ORDERING: Acquire; the leftmost child is written before the node is published.
    let first = PPtr::from_raw(n.hdr.leftmost.load(Ordering::Acquire));
    if first.is_null() {
        return Err(Error::corrupted(ENGINE, "internal node without leftmost child"));
    }
    Ok(first)
}

/// Chains of every level, top level first (quiescent: eager open only).
fn walk(pool: &Pool, node_size: usize, root: PPtr) -> Result<Vec<Vec<PPtr>>> {
    let top = Node::resolve(pool, root, node_size)?.level();
    let mut seen = HashSet::new();
    let mut levels = Vec::new();
    let mut first = root;
    for level in (0..=top).rev() {
        let c = chain(pool, node_size, first, level, &mut seen)?;
        if level > 0 {
            first = leftmost(Node::resolve(pool, c[0], node_size)?)?;
        }
        levels.push(c);
    }
    Ok(levels)
}

/// The format word and the chains of the tree at `base`: node size, levels top first.
fn read_tree(pool: &Pool, base: usize) -> Result<(usize, Vec<Vec<PPtr>>)> {
    let node_size = read_meta(pool, base)?;
    let root = PPtr::from_raw(pool.root(base + layout::SLOT_ROOT)?.load(Ordering::Acquire));
    let levels = walk(pool, node_size, root)?;
    Ok((node_size, levels))
}

/// The node size recorded in the format word of the tree at `base`.
fn read_meta(pool: &Pool, base: usize) -> Result<usize> {
    layout::validate_root_slot_base(base)?;
    let meta = pool.root(base + layout::SLOT_META)?.load(Ordering::Acquire);
    let node_size = layout::decode_meta(meta)
        .filter(|&s| layout::validate_node_size(s).is_ok())
        .ok_or_else(|| {
            Error::corrupted(
                ENGINE,
                format!(
                    "format word {meta:#x} in root slot {} is not a fastfair format \
                         (wrong root_slot_base?)",
                    base + layout::SLOT_META
                ),
            )
        })?;
    Ok(node_size)
}

/// [`FastFair::reachable`].
pub(crate) fn reachable(pool: &Pool, opts: &FastFairOptions) -> Result<Vec<PPtr>> {
    let (_, levels) = read_tree(pool, opts.root_slot_base)?;
    Ok(levels.into_iter().flatten().collect())
}

/// [`numakv_index::Engine::open`] for FAST&FAIR: NSM is recovered with this tree's nodes as
/// the only reachable blocks.
pub(crate) fn open(pool: Arc<Pool>, opts: &FastFairOptions) -> Result<(FastFair, RecoveryReport)> {
    let t0 = Instant::now();
    let base = opts.root_slot_base;
    match opts.recovery {
        RecoveryMode::Eager => {
            let (node_size, levels) = read_tree(&pool, base)?;
            let reachable: Vec<PPtr> = levels.iter().flatten().copied().collect();
            let (nsm, nrec) = Nsm::recover(Arc::clone(&pool), opts.nsm_mode, reachable)?;
            let tree = FastFair::new_handle(pool, nsm, node_size, base);
            let mut report = repair(&tree, &levels, t0)?;
            report.counters.push(("nsm_free_blocks", nrec.blocks_free));
            report.counters.push(("pages_reclaimed", nrec.pages_freed + nrec.large_freed));
            Ok((tree, report))
        }
        RecoveryMode::Lazy => {
            let node_size = read_meta(&pool, base)?;
            let root = PPtr::from_raw(pool.root(base + layout::SLOT_ROOT)?.load(Ordering::Acquire));
            let r = Node::resolve(&pool, root, node_size)?;
            if r.hdr.magic.load(Ordering::Acquire) != NODE_MAGIC || r.level() > 64 {
                return Err(Error::corrupted(
                    ENGINE,
                    format!("root {root} is not a node (or above 64)"),
                ));
            }
            let was_clean = pool.was_clean();
            let nsm = Nsm::recover_deferred(Arc::clone(&pool), opts.nsm_mode)?;
            let tree = FastFair::new_handle(pool, nsm, node_size, base);
            // ORDERING: Relaxed; the handle is not shared yet (the spawn below publishes it).
            tree.repairing.store(true, Ordering::Relaxed);
            start(&tree, Vec::new())?;
            let report = RecoveryReport {
                was_clean,
                elapsed: t0.elapsed(),
                counters: vec![("deferred", 1)],
            };
            Ok((tree, report))
        }
    }
}

/// [`FastFair::open_with`]: NSM was recovered by the caller (an embedder, with the union of
/// every structure's reachable blocks). Always eager, whatever `opts.recovery` says: the
/// deferred protocol needs `Nsm::recover_deferred` and one `Nsm::collect` over the union of
/// every structure's concurrent walk, which the embedder drives; here the collection is already
/// done, so only the node repairs, orphans and root shrink remain, done before returning.
pub(crate) fn open_with(
    pool: Arc<Pool>,
    nsm: Arc<Nsm>,
    opts: &FastFairOptions,
) -> Result<(FastFair, RecoveryReport)> {
    let t0 = Instant::now();
    let (node_size, levels) = read_tree(&pool, opts.root_slot_base)?;
    let allocated = nsm.allocated_blocks();
    if let Some(p) = levels.iter().flatten().find(|p| allocated.binary_search(p).is_err()) {
        return Err(Error::corrupted(
            ENGINE,
            format!("node {p} is not allocated in the given NSM (recovered without this tree?)"),
        ));
    }
    let tree = FastFair::new_handle(pool, nsm, node_size, opts.root_slot_base);
    let report = repair(&tree, &levels, t0)?;
    Ok((tree, report))
}

/// Steps 2–4 of the module docs on a tree whose NSM is recovered, before the tree is shared
/// (eager open, `open_with`).
fn repair(tree: &FastFair, levels: &[Vec<PPtr>], t0: Instant) -> Result<RecoveryReport> {
    let nodes: u64 = levels.iter().map(|l| l.len() as u64).sum();
    // Step 2: node-local repairs.
    for p in levels.iter().flatten() {
        let g = WriteGuard::lock(tree.node(*p)?, tree.generation);
        tree.fix_range(&g)?;
        tree.repair_entries(&g)?;
    }
    // Step 3: orphans, bottom-up.
    tree.link_orphans(&AtomicBool::new(false))?;
    // Step 4: an emptied root (freed at once: nobody else can see the tree yet).
    let root = WriteGuard::lock(tree.node(tree.root()?)?, tree.generation);
    tree.shrink_root(root, Reclaim::Now)?;
    Ok(RecoveryReport {
        was_clean: tree.pool.was_clean(),
        elapsed: t0.elapsed(),
        counters: tree.report_counters(nodes),
    })
}

// -------------------------------------------------------------------------------------------------
// The background pass of a lazy open
// -------------------------------------------------------------------------------------------------

/// State of a lazy open's background recovery (in [`FastFair`]).
#[derive(Debug, Default)]
pub(crate) enum Background {
    /// None was started (eager open, create).
    #[default]
    Idle,
    /// Running on its own thread.
    Running { cancel: Arc<AtomicBool>, handle: JoinHandle<Result<Option<RecoveryReport>>> },
    /// Finished.
    Done(RecoveryReport),
    /// Failed; the error as text (reported by every later `wait`).
    Failed(String),
    /// Cancelled by drop (or by a close from a pinned thread).
    Cancelled,
}

/// [`FastFair::open_deferred_with`]: the lazy open over an embedder's deferred NSM, whose
/// collection also keeps `extra`.
pub(crate) fn open_deferred_with(
    pool: Arc<Pool>,
    nsm: Arc<Nsm>,
    opts: &FastFairOptions,
    extra: Vec<PPtr>,
) -> Result<(FastFair, RecoveryReport)> {
    let t0 = Instant::now();
    if !nsm.collection_pending() {
        return Err(Error::InvalidOptions(
            "open_deferred_with needs an NSM opened with Nsm::recover_deferred".into(),
        ));
    }
    let base = opts.root_slot_base;
    let node_size = read_meta(&pool, base)?;
    let root = PPtr::from_raw(pool.root(base + layout::SLOT_ROOT)?.load(Ordering::Acquire));
    let r = Node::resolve(&pool, root, node_size)?;
    if r.hdr.magic.load(Ordering::Acquire) != NODE_MAGIC || r.level() > 64 {
        return Err(Error::corrupted(ENGINE, format!("root {root} is not a node (or above 64)")));
    }
    let was_clean = pool.was_clean();
    let tree = FastFair::new_handle(pool, nsm, node_size, base);
    // ORDERING: Relaxed; the handle is not shared yet (the spawn below publishes it).
    tree.repairing.store(true, Ordering::Relaxed);
    start(&tree, extra)?;
    Ok((tree, RecoveryReport { was_clean, elapsed: t0.elapsed(), counters: vec![("deferred", 1)] }))
}

/// Starts the background pass of a lazy open on its own thread; `extra` joins the walk in the
/// NSM collection (an embedder's blocks).
fn start(tree: &FastFair, extra: Vec<PPtr>) -> Result<()> {
    let worker = tree.sibling_handle();
    let cancel = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&cancel);
    let handle = std::thread::Builder::new()
        .name("fastfair-recovery".into())
        .spawn(move || worker.background_pass(&flag, extra))
        .map_err(|e| Error::Unsupported(format!("cannot start the recovery thread: {e}")))?;
    *tree.background.lock().unwrap_or_else(|e| e.into_inner()) =
        Background::Running { cancel, handle };
    Ok(())
}

/// Joins a running pass and records its outcome.
fn finish(state: &mut Background, tree: &FastFair) {
    if !matches!(state, Background::Running { .. }) {
        return;
    }
    if let Background::Running { handle, .. } = std::mem::take(state) {
        *state = match handle.join() {
            Ok(Ok(Some(report))) => Background::Done(report),
            Ok(Ok(None)) => Background::Cancelled,
            Ok(Err(e)) if tree.pool.has_crashed() => {
                Background::Failed(format!("the pool crashed during recovery ({e})"))
            }
            Ok(Err(e)) => Background::Failed(e.to_string()),
            Err(_) => Background::Failed("the recovery thread panicked".into()),
        };
    }
}

/// [`FastFair::wait_recovery`].
pub(crate) fn wait(tree: &FastFair) -> Result<Option<RecoveryReport>> {
    let mut state = tree.background.lock().unwrap_or_else(|e| e.into_inner());
    if matches!(&*state, Background::Running { handle, .. } if !handle.is_finished())
        && epoch::is_pinned()
    {
        // The pass waits for every pin older than its collection: it would wait for us.
        return Err(Error::Unsupported(
            "waiting for the background recovery from a thread pinned in the epoch".into(),
        ));
    }
    finish(&mut state, tree);
    match &*state {
        Background::Idle => Ok(None),
        Background::Done(r) => Ok(Some(r.clone())),
        Background::Failed(why) => {
            Err(Error::corrupted(ENGINE, format!("background recovery failed: {why}")))
        }
        Background::Cancelled | Background::Running { .. } => {
            Err(Error::corrupted(ENGINE, "background recovery was cancelled"))
        }
    }
}

/// [`FastFair::recovery_pending`].
pub(crate) fn pending(tree: &FastFair) -> bool {
    let state = tree.background.lock().unwrap_or_else(|e| e.into_inner());
    matches!(&*state, Background::Running { handle, .. } if !handle.is_finished())
}

/// Ends a running pass and waits for its thread: lets it finish (`close()`, so that a cleanly
/// closed store is collected and repaired) or cancels it (drop; and close from a thread pinned in
/// the epoch, which the pass would wait for).
pub(crate) fn stop(tree: &FastFair, finish_it: bool) {
    let mut state = tree.background.lock().unwrap_or_else(|e| e.into_inner());
    if let Background::Running { cancel, .. } = &*state {
        if !finish_it || epoch::is_pinned() {
            // ORDERING: Relaxed; the flag only ends the pass early, and the join below orders
            // everything the thread did before this thread goes on.
            cancel.store(true, Ordering::Relaxed);
        }
    }
    finish(&mut state, tree);
}

impl FastFair {
    /// The background pass: walk, NSM collection, node repairs, orphans. `Ok(None)` when
    /// cancelled (nothing half done matters: each step is one the next open repeats).
    fn background_pass(
        &self,
        cancel: &AtomicBool,
        extra: Vec<PPtr>,
    ) -> Result<Option<RecoveryReport>> {
        let t0 = Instant::now();
        numakv_pmem::pause_point!("fastfair.recovery.background");
        let Some(mut reachable) = self.walk_concurrent(cancel)? else { return Ok(None) };
        let nodes = reachable.len() as u64;
        reachable.extend(extra);
        let Some(nrec) = self.nsm.collect(reachable, cancel)? else { return Ok(None) };
        if !self.repair_all(cancel)? {
            return Ok(None);
        }
        // ORDERING: Release; pairs with the Acquire in `repairing()`: a reader that sees
        // `false` sees every range repair above.
        self.repairing.store(false, Ordering::Release);
        if self.link_orphans(cancel)?.is_none() {
            return Ok(None);
        }
        // An emptied root left by a crash (its switch lost): shrink it like a merger would.
        // Readers and writers may be inside the old root: it is freed after a grace period,
        // waited for here (unpinned) so that the pass ends with no block awaiting one.
        let old_roots = std::cell::RefCell::new(Vec::new());
        {
            let _guard = epoch::pin();
            let root = WriteGuard::lock(self.node(self.root()?)?, self.generation);
            self.shrink_root(root, Reclaim::Later(&old_roots))?;
        }
        let old_roots = old_roots.into_inner();
        if !old_roots.is_empty() {
            if !numakv_pmem::alloc::wait_for_unpin(cancel) {
                return Ok(None); // the old roots are unreachable: the next open reclaims them
            }
            for p in old_roots {
                // SAFETY: each old root came from this tree's NSM, is unreachable (the root slot
                // moved on, no node points to a root), was marked DEAD and listed by exactly one
                // shrink (under its lock), and every thread pinned when it was unlinked has
                // unpinned since (the wait above). NSM's collection is complete: this is an
                // ordinary free.
                unsafe { numakv_pmem::alloc::PmAllocator::free(&*self.nsm, p)? };
            }
        }
        let mut counters = self.report_counters(nodes);
        counters.push(("nsm_free_blocks", nrec.blocks_free));
        counters.push(("pages_reclaimed", nrec.pages_freed + nrec.large_freed));
        Ok(Some(RecoveryReport {
            was_clean: self.pool.was_clean(),
            elapsed: t0.elapsed(),
            counters,
        }))
    }

    /// The recovery report's counters (eager open, `open_with`, the background pass).
    fn report_counters(&self, nodes: u64) -> Vec<(&'static str, u64)> {
        let c = &self.counters;
        vec![
            ("nodes", nodes),
            // ORDERING: Relaxed, all: statistics (shared with the writers, which repair, link
            // and shrink too during a lazy recovery: the counts include theirs).
            ("ranges_fixed", c.ranges_fixed.load(Ordering::Relaxed)),
            ("slots_repaired", c.repairs.load(Ordering::Relaxed)),
            ("orphans_linked", c.orphans_linked.load(Ordering::Relaxed)),
            ("roots_shrunk", c.root_shrinks.load(Ordering::Relaxed)),
        ]
    }

    /// The root's level now (read pinned: the root may be shrunk and retired meanwhile). Levels
    /// added above it later hold only nodes of this session.
    fn top_level(&self) -> Result<u32> {
        let _guard = epoch::pin();
        Ok(self.node(self.root()?)?.level())
    }

    /// The first node of `level` (low 0), read from the current root down the leftmost
    /// children under the caller's pin; `None` when the root is below `level`. The first node
    /// of a level is never merged away, but it dies when it is the root and shrinks: a DEAD
    /// node on the way means the root switched meanwhile (the switch precedes DEAD), so the
    /// descent restarts from the new root.
    fn level_head(&self, level: u32, _guard: &Guard) -> Result<Option<PPtr>> {
        'restart: loop {
            let mut p = self.root()?;
            let mut n = self.node(p)?;
            if n.level() > 64 {
                return Err(Error::corrupted(ENGINE, format!("root {p} says level {}", n.level())));
            }
            if n.level() < level {
                return Ok(None);
            }
            loop {
                if n.is_dead() {
                    self.retry();
                    continue 'restart;
                }
                let lvl = n.level();
                if lvl == level {
                    return Ok(Some(p));
                }
                p = leftmost(n)?;
                n = checked(&self.pool, self.node_size, p, lvl - 1)?;
            }
        }
    }

    /// Visits every node of `level`'s chain (lock-free, pinned), from the level's first node as
    /// it is now ([`Self::level_head`], under the same pin), calling `f`; `false` when
    /// cancelled. Validates magic, level and strictly ascending low keys (which also rules out
    /// cycles). Nodes that die while the walk is at them (merged away, or a root that shrank)
    /// are followed through their frozen sibling pointer; every node that stays in the chain
    /// until the walk passes it is visited (design.md, "Recovery and invariants").
    fn for_each_in_chain(
        &self,
        level: u32,
        cancel: &AtomicBool,
        mut f: impl FnMut(Node<'_>) -> Result<()>,
    ) -> Result<bool> {
        let mut guard = epoch::pin();
        let Some(first) = self.level_head(level, &guard)? else { return Ok(true) };
        let mut p = first;
        let mut prev_low = None;
        let mut visited = 0usize;
        while !p.is_null() {
            // ORDERING: Relaxed; the flag only ends the walk early.
            if cancel.load(Ordering::Relaxed) {
                return Ok(false);
            }
            let n = checked(&self.pool, self.node_size, p, level)?;
            let low = n.low();
            if prev_low.is_some_and(|q| low <= q) {
                return Err(Error::corrupted(
                    ENGINE,
                    format!("sibling chain of level {level}: node {p} does not ascend"),
                ));
            }
            prev_low = Some(low);
            f(n)?;
            visited += 1;
            if visited % REPIN_EVERY == 0 {
                // Re-pin only at a node that cannot be freed meanwhile: locked and alive, it
                // cannot be removed (a merge locks the node it removes, a root shrink the root).
                let g = WriteGuard::lock(n, self.generation);
                if !n.is_dead() {
                    guard.repin();
                }
                drop(g);
            }
            p = n.sibling();
        }
        Ok(true)
    }

    /// The walk handed to NSM's collection: every node of every level, top down, each level
    /// from its first node as found from the current root when the level's walk starts (a root
    /// shrink may kill the first node of the top levels meanwhile).
    fn walk_concurrent(&self, cancel: &AtomicBool) -> Result<Option<Vec<PPtr>>> {
        let top = self.top_level()?;
        let mut out = Vec::new();
        for level in (0..=top).rev() {
            if !self.for_each_in_chain(level, cancel, |n| {
                out.push(n.ptr);
                Ok(())
            })? {
                return Ok(None);
            }
        }
        Ok(Some(out))
    }

    /// Locks every node of every level in turn and repairs it (range, then slots); `false`
    /// when cancelled. Each level starts from its first node as found from the current root.
    fn repair_all(&self, cancel: &AtomicBool) -> Result<bool> {
        let top = self.top_level()?;
        for level in (0..=top).rev() {
            let mut guard = epoch::pin();
            let Some(first) = self.level_head(level, &guard)? else { continue };
            let mut p = first;
            while !p.is_null() {
                // ORDERING: Relaxed; the flag only ends the pass early.
                if cancel.load(Ordering::Relaxed) {
                    return Ok(false);
                }
                let n = checked(&self.pool, self.node_size, p, level)?;
                let g = WriteGuard::lock(n, self.generation);
                let alive = !n.is_dead();
                if alive {
                    self.fix_range(&g)?;
                    self.repair_entries(&g)?;
                }
                p = n.sibling();
                if alive {
                    // `p` cannot die while we hold its left neighbour's lock (a merge of `p`
                    // locks that neighbour first; a root shrink kills only a node without a left
                    // neighbour), so re-pinning here cannot lose it.
                    guard.repin();
                }
                drop(g);
            }
        }
        Ok(true)
    }

    /// An interrupted split or merge leaves `high > sibling.low`; the sibling holds (a copy of)
    /// everything from its low key on, so the node's range is cut back to it. `true` if fixed.
    pub(crate) fn fix_range(&self, g: &WriteGuard<'_>) -> Result<bool> {
        let node = g.node();
        let s = node.sibling();
        if s.is_null() {
            return Ok(false);
        }
        let slow = self.node(s)?.low();
        if slow >= node.high() {
            return Ok(false);
        }
        self.bump_switch(node);
        // ORDERING: Release, as every high-key store.
        node.hdr.high.store(slow, Ordering::Release);
        // PERSIST: the range is cut durably before the entries beyond it are.
        self.pool.persist(node.hdr_addr(), 64);
        self.counters.ranges_fixed.fetch_add(1, Ordering::Relaxed);
        Ok(true)
    }

    /// Links every orphan, bottom-up; the number linked, `None` when cancelled. Safe next to
    /// concurrent operations: each candidate is re-checked under locks by [`Self::link_orphan`].
    pub(crate) fn link_orphans(&self, cancel: &AtomicBool) -> Result<Option<u64>> {
        let mut linked = 0;
        let mut level = 0u32;
        loop {
            // ORDERING: Relaxed; the flag only ends the pass early.
            if cancel.load(Ordering::Relaxed) {
                return Ok(None);
            }
            let guard = epoch::pin();
            let root_p = self.root()?;
            let root = self.node(root_p)?;
            let top = root.level();
            if level > top || (level == top && root.sibling().is_null()) {
                return Ok(Some(linked));
            }
            if level == top {
                // A lost root split: the root has a sibling. Window: decided from `root_p`,
                // whose lock is not taken yet (a foreground splitter may install the root).
                numakv_pmem::pause_point!("fastfair.recovery.lost_root");
                match self.install_lost_root(root_p, &guard)? {
                    Some(true) => linked += 1,
                    Some(false) => {} // someone else did it: look again
                    None => return Ok(Some(linked)), // out of space: leave it to a later open
                }
                continue;
            }
            drop(guard);
            // Each chain from its first node as found when its walk starts (the root may shrink
            // meanwhile); the lists are only candidates, every one is re-checked under locks.
            // A DEAD parent (merged away or shrunk) contributes nothing: its children are
            // referenced by the node that absorbed them, or are candidates re-checked anyway.
            let mut referenced = HashSet::new();
            let walked = self.for_each_in_chain(level + 1, cancel, |p| {
                if let Read::Done(kids) =
                    self.stable(p, p.low(), |_| children(p).into_iter().map(|(_, c)| c))?
                {
                    referenced.extend(kids);
                }
                Ok(())
            })?;
            let mut candidates = Vec::new();
            let walked = walked
                && self.for_each_in_chain(level, cancel, |o| {
                    // The first node (low 0) is its parent's leftmost child; a DEAD node is
                    // never linked again (it is unlinked and retired).
                    if o.low() != 0 && !o.is_dead() && !referenced.contains(&o.ptr) {
                        candidates.push(o.ptr);
                    }
                    Ok(())
                })?;
            if !walked {
                return Ok(None);
            }
            for o in candidates {
                if self.link_orphan(level, o)? {
                    linked += 1;
                }
            }
            level += 1;
        }
    }

    /// Inserts the separator of `o` (a node of `level`, below the root level) into the next
    /// level if no parent references it. Holds the lock of `o`'s left neighbour meanwhile: every
    /// operation that adds or removes `o`'s parent entry (the split that created `o`, a merge
    /// removing `o`, another linker) holds that lock too, so the check under the parent's lock
    /// cannot be overtaken. `true` if linked.
    fn link_orphan(&self, level: u32, o: PPtr) -> Result<bool> {
        let guard = epoch::pin();
        loop {
            // `o` may have died and been reused since it was listed: everything is re-checked
            // under locks below, so a stale read only makes this return `false`.
            let low = self.node(o)?.low();
            if low == 0 || low == END {
                return Ok(false);
            }
            let Some(left) = self.descend(level, low - 1, &guard)? else {
                return Ok(false); // the root shrank below `level`: no orphan there any more
            };
            let Some(lg) = self.lock_covering(left, low - 1)? else {
                self.retry();
                continue;
            };
            if lg.node().sibling() != o || self.node(self.root()?)?.level() <= level {
                return Ok(false); // not (or no longer) in the chain, or now on the root level
            }
            // `o` is L's sibling and L is locked and alive: `o` is in the chain, so not DEAD
            // (a merge unlinks before marking DEAD; a shrink kills only a node without left
            // neighbour), and it cannot die or change its low key until L is unlocked. A block
            // freed and reused since it was listed may carry another low key: look again.
            let on = self.node(o)?;
            if on.is_dead() || on.level() != level {
                return Ok(false);
            }
            if on.low() != low {
                continue;
            }
            let Some(p) = self.descend(level + 1, low, &guard)? else {
                // The root is at `level` now, which the check above excludes while L is
                // locked; be conservative all the same.
                return Ok(false);
            };
            let Some(pg) = self.lock_covering(p, low)? else {
                self.retry();
                continue;
            };
            let pn = pg.node();
            if pn.low() == low {
                // `o` would be pn's leftmost child (a parent split moved its entry there).
                // ORDERING: Acquire, as in `leftmost` (pn is locked: it cannot change anyway).
                return if PPtr::from_raw(pn.hdr.leftmost.load(Ordering::Acquire)) == o {
                    Ok(false)
                } else {
                    Err(Error::corrupted(ENGINE, format!("two children with low key {low}")))
                };
            }
            let (used, at) = self.locate(pn, low);
            let linked = match at {
                Ok(i) if pn.val(i) == o.raw() => false,
                Ok(_) => return Err(Error::corrupted(ENGINE, "two children with one separator")),
                Err(pos) if used < self.cap => {
                    self.shift_insert(pn, pos, used, low, o.raw());
                    true
                }
                Err(_) => match NodeReserve::for_split(self, pn.level())
                    .and_then(|mut r| self.split_insert(&pg, low, o.raw(), &guard, &mut r))
                {
                    Err(e) if e.is_out_of_space() => false, // a later open links it
                    r => r.map(|()| true)?,
                },
            };
            if linked {
                self.counters.orphans_linked.fetch_add(1, Ordering::Relaxed);
            }
            return Ok(linked);
        }
    }

    /// Installs a new root above the root and its sibling (a lost root split), under the root's
    /// lock. `Some(true)` if installed, `Some(false)` if the root changed meanwhile (nothing to
    /// do), `None` when out of space.
    fn install_lost_root(&self, root_p: PPtr, guard: &Guard) -> Result<Option<bool>> {
        let root = self.node(root_p)?;
        let g = WriteGuard::lock(root, self.generation);
        let s = root.sibling();
        if self.root()? != root_p || s.is_null() {
            return Ok(Some(false));
        }
        self.fix_range(&g)?;
        self.repair_entries(&g)?;
        let low = self.node(s)?.low();
        // With the old root locked, insert_separator installs the new root [root, (low → s)];
        // further nodes of this level become ordinary orphans.
        let mut reserve = match NodeReserve::for_split(self, root.level()) {
            Ok(r) => r,
            Err(e) if e.is_out_of_space() => return Ok(None),
            Err(e) => return Err(e),
        };
        match self.insert_separator(root.level() + 1, low, s, root_p, guard, &mut reserve) {
            Ok(()) => {
                self.counters.orphans_linked.fetch_add(1, Ordering::Relaxed);
                Ok(Some(true))
            }
            Err(e) if e.is_out_of_space() => Ok(None),
            Err(e) => Err(e),
        }
    }
}
