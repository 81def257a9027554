//! Open with recovery.
//!
//! FAST&FAIR needs no log: every durable state is one readers tolerate. Open therefore
//! 1. walks every level along its sibling chain (from the root down the leftmost children),
//!    validating each node (magic, level, pointers in the heap, no cycle) — this is also the
//!    reachability NSM's garbage-collecting recovery needs (nodes allocated but never linked by
//!    an interrupted split are reclaimed);
//! 2. repairs every node: an interrupted split or merge (`high > sibling.low`) gets
//!    `high = sibling.low`; hidden slots, duplicates and entries beyond the high key (crash in a
//!    shift, split or merge) are removed by the writers' repair (delete.rs);
//! 3. links orphans bottom-up: a node in a level's chain that no parent references (a split
//!    whose parent insert was lost, or a merge rolled back) gets its separator inserted through
//!    the ordinary path; a root level with more than one node gets a new root (lost root split);
//! 4. shrinks the root while it is internal and has no entries (a merge emptied it and the root
//!    switch was lost), freeing the old root at once.
//!
//! Between crashes, readers and writers do not need any of this: they follow sibling pointers
//! past orphans and skip hidden slots and duplicates (the "instant recovery" of the paper); the
//! pass exists because NSM's recovery must see every node anyway and a clean tree makes
//! `check()` strict.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use numakv_index::{Error, RecoveryReport, Result};
use numakv_pmem::alloc::epoch;
use numakv_pmem::alloc::nsm::Nsm;
use numakv_pmem::{PPtr, Pool};

use crate::layout::{self, Node, END, ENGINE, HIDDEN, NODE_MAGIC};
use crate::lock::WriteGuard;
use crate::smo::Reclaim;
use crate::{FastFair, FastFairOptions};

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
        prev = k;
        out.push((k, PPtr::from_raw(node.val(i))));
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
        out.push(p);
        p = n.sibling();
    }
    Ok(out)
}

/// Chains of every level, top level first.
fn walk(pool: &Pool, node_size: usize, root: PPtr) -> Result<Vec<Vec<PPtr>>> {
    let r = Node::resolve(pool, root, node_size)?;
    let top = r.level();
    if top > 64 {
        return Err(Error::corrupted(ENGINE, "root level above 64"));
    }
    let mut seen = HashSet::new();
    let mut levels = Vec::new();
    let mut first = root;
    for level in (0..=top).rev() {
        let c = chain(pool, node_size, first, level, &mut seen)?;
        if level > 0 {
            let head = Node::resolve(pool, c[0], node_size)?;
            first = PPtr::from_raw(head.hdr.leftmost.load(Ordering::Acquire));
            if first.is_null() {
                return Err(Error::corrupted(ENGINE, "internal node without leftmost child"));
            }
        }
        levels.push(c);
    }
    Ok(levels)
}

/// The format word and the chains of the tree at `base`: node size, levels top first.
fn read_tree(pool: &Pool, base: usize) -> Result<(usize, Vec<Vec<PPtr>>)> {
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
    let root = PPtr::from_raw(pool.root(base + layout::SLOT_ROOT)?.load(Ordering::Acquire));
    let levels = walk(pool, node_size, root)?;
    Ok((node_size, levels))
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
    let (node_size, levels) = read_tree(&pool, opts.root_slot_base)?;
    let reachable: Vec<PPtr> = levels.iter().flatten().copied().collect();
    let (nsm, nrec) = Nsm::recover(Arc::clone(&pool), opts.nsm_mode, reachable)?;
    let tree = FastFair::new_handle(pool, nsm, node_size, opts.root_slot_base);
    let mut report = repair(&tree, &levels, t0)?;
    report.counters.push(("nsm_free_blocks", nrec.blocks_free));
    report.counters.push(("pages_reclaimed", nrec.pages_freed + nrec.large_freed));
    Ok((tree, report))
}

/// [`FastFair::open_with`]: NSM was recovered by the caller.
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

/// Steps 2–4 of the module docs on a tree whose NSM is recovered.
fn repair(tree: &FastFair, levels: &[Vec<PPtr>], t0: Instant) -> Result<RecoveryReport> {
    let nodes: u64 = levels.iter().map(|l| l.len() as u64).sum();
    // Step 2: node-local repairs.
    let mut ranges_fixed = 0u64;
    for p in levels.iter().flatten() {
        let g = WriteGuard::lock(tree.node(*p)?, tree.generation);
        if tree.fix_range(&g)? {
            ranges_fixed += 1;
        }
        tree.repair_entries(&g)?;
    }
    // Step 3: orphans, bottom-up.
    let orphans = tree.link_orphans()?;
    // Step 4: an emptied root.
    let shrinks_before = tree.counters.root_shrinks.load(Ordering::Relaxed);
    let root = WriteGuard::lock(tree.node(tree.root()?)?, tree.generation);
    tree.shrink_root(root, Reclaim::Now)?;
    let roots_shrunk = tree.counters.root_shrinks.load(Ordering::Relaxed) - shrinks_before;

    let c = &tree.counters;
    Ok(RecoveryReport {
        was_clean: tree.pool.was_clean(),
        elapsed: t0.elapsed(),
        counters: vec![
            ("nodes", nodes),
            ("ranges_fixed", ranges_fixed),
            ("slots_repaired", c.repairs.load(Ordering::Relaxed)),
            ("orphans_linked", orphans),
            ("roots_shrunk", roots_shrunk),
        ],
    })
}

impl FastFair {
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
        Ok(true)
    }

    /// Inserts the separator of every node no parent references; returns how many.
    fn link_orphans(&self) -> Result<u64> {
        let guard = epoch::pin();
        let mut linked = 0;
        let mut level = 0u32;
        loop {
            let root_p = self.root()?;
            let root = self.node(root_p)?;
            let top = root.level();
            if level > top {
                return Ok(linked);
            }
            // Leftmost node of `level` and of `level + 1`.
            let mut firsts = vec![root_p];
            let mut n = root;
            while n.level() > level {
                let c = PPtr::from_raw(n.hdr.leftmost.load(Ordering::Acquire));
                firsts.push(c);
                n = self.node(c)?;
            }
            let first = firsts[firsts.len() - 1];
            let mut seen = HashSet::new();
            let here = chain(&self.pool, self.node_size, first, level, &mut seen)?;
            if level == top {
                for &p in &here[1..] {
                    let low = self.node(p)?.low();
                    self.insert_separator(level + 1, low, p, here[0], &guard)?;
                    linked += 1;
                }
            } else {
                let parent_first = firsts[firsts.len() - 2];
                let mut referenced = HashSet::new();
                for p in chain(&self.pool, self.node_size, parent_first, level + 1, &mut seen)? {
                    referenced.extend(children(self.node(p)?).into_iter().map(|(_, c)| c));
                }
                for &p in &here {
                    if !referenced.contains(&p) {
                        let low = self.node(p)?.low();
                        if low == 0 || low == END {
                            return Err(Error::corrupted(ENGINE, "orphan node without a low key"));
                        }
                        self.insert_separator(level + 1, low, p, PPtr::NULL, &guard)?;
                        linked += 1;
                    }
                }
            }
            level += 1;
        }
    }
}
