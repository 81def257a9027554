//! Open with recovery (papers/nobtree.txt §III-E, issue 6 "NSM and recovery").
//!
//! 1. Validate the format word and the head.
//! 2. Finish an interrupted migration from the migration log (redo: the copy is complete and
//!    durable before the log is armed) — [`crate::migration::recover_log`].
//! 3. Walk the bottom layer level by level from the head (each level's chain through the
//!    functional sibling pointers, the next level from the first node's `leftmost`), validating
//!    every node; this is the reachable set NSM's garbage-collecting recovery needs (nodes of an
//!    uncommitted split, the previous session's upper replicas, a migration's discarded copy or
//!    original: all unreachable, all reclaimed).
//! 4. Repair every node: unlock (an odd version left by a crash), trim records at or beyond the
//!    high key (a split that crashed between its flip and its trim), rewrite the counter mirror,
//!    clear a stale obsolete flag.
//! 5. Link orphans bottom-up: a node no parent references (a crash between a split's commit and
//!    its parent insert) gets its separator inserted through the ordinary path; a head level
//!    below the height threshold with more than one node gets its lost root growth.
//! 6. Build the upper-layer replicas from the top level.
//!
//! Everything here runs before the tree is shared, single-threaded.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use numakv_index::{Error, RecoveryReport, Result};
use numakv_pmem::alloc::epoch;
use numakv_pmem::alloc::nsm::Nsm;
use numakv_pmem::alloc::PmAllocator;
use numakv_pmem::{PPtr, Pool};

use crate::layout::{
    self, decode_format, meta_word, sl_build, sl_count, sl_pos, st_locked, st_sib_ver, st_with,
    Node, END, ENGINE, FLAG_FROZEN, FLAG_OBSOLETE, RECORDS, VERSION_ONE,
};
use crate::upper::Upper;
use crate::{NobtreeOptions, Tree};

/// The chain of `level` starting at `first`, every node validated.
pub(crate) fn chain(
    pool: &Pool,
    first: PPtr,
    level: u32,
    seen: &mut HashSet<PPtr>,
) -> Result<Vec<PPtr>> {
    let mut out = Vec::new();
    let mut p = first;
    let mut prev_low = None;
    while !p.is_null() {
        if !seen.insert(p) {
            return Err(Error::corrupted(ENGINE, format!("node {p} reached twice (cycle)")));
        }
        let n = Node::resolve(pool, p)?;
        if !n.magic_ok() {
            return Err(Error::corrupted(ENGINE, format!("node magic: node {p} has a bad magic")));
        }
        if n.level() != level {
            return Err(Error::corrupted(
                ENGINE,
                format!("node level: node {p} on level {level} says {}", n.level()),
            ));
        }
        let low = n.low();
        if prev_low.is_some_and(|q| low <= q) || (prev_low.is_none() && low != 0) {
            return Err(Error::corrupted(
                ENGINE,
                format!("sibling ranges: node {p} low {low} after {prev_low:?}"),
            ));
        }
        prev_low = Some(low);
        out.push(p);
        p = n.sibling(n.state());
    }
    Ok(out)
}

/// Chains of every level, from the head's level down to the leaves.
pub(crate) fn walk(pool: &Pool, head: PPtr, height: u32) -> Result<Vec<Vec<PPtr>>> {
    let top = Node::resolve(pool, head)?.level();
    if top >= height {
        return Err(Error::corrupted(ENGINE, format!("head level {top} ≥ height {height}")));
    }
    let mut seen = HashSet::new();
    let mut levels = Vec::new();
    let mut first = head;
    for level in (0..=top).rev() {
        let c = chain(pool, first, level, &mut seen)?;
        if level > 0 {
            first = Node::resolve(pool, c[0])?.leftmost();
            if first.is_null() {
                return Err(Error::corrupted(ENGINE, "children: inner node without leftmost"));
            }
        }
        levels.push(c);
    }
    Ok(levels)
}

/// [`numakv_index::Engine::open`].
pub(crate) fn open(pool: Arc<Pool>, opts: &NobtreeOptions) -> Result<(Tree, RecoveryReport)> {
    let t0 = Instant::now();
    let word = pool.root(layout::SLOT_META)?.load(Ordering::Acquire);
    let height = decode_format(word).filter(|h| (1..=8).contains(h)).ok_or_else(|| {
        Error::corrupted(ENGINE, format!("format word {word:#x} is not nobtree's"))
    })?;
    let head = PPtr::from_raw(pool.root(layout::SLOT_HEAD)?.load(Ordering::Acquire));
    if head.is_null() {
        return Err(Error::corrupted(ENGINE, "head: no head node"));
    }
    // Step 2.
    let (log_block, redone) = crate::migration::recover_log(&pool)?;
    // Step 3.
    let levels = walk(&pool, head, height)?;
    let mut reachable: Vec<PPtr> = levels.iter().flatten().copied().collect();
    let nodes = reachable.len() as u64;
    reachable.extend(log_block);
    let (nsm, nrec) = Nsm::recover(Arc::clone(&pool), opts.nsm_mode, reachable)?;
    // Step 4.
    let mut repaired = 0u64;
    let mut trimmed = 0u64;
    let mut max_id = 0u64;
    for &p in levels.iter().flatten() {
        let n = Node::resolve(&pool, p)?;
        max_id = max_id.max(n.hdr.id.load(Ordering::Relaxed));
        let (changed, trim) = repair(&pool, &n)?;
        repaired += u64::from(changed);
        trimmed += u64::from(trim);
    }
    // Step 6 (first build, so that step 5 can use the ordinary paths).
    let top_entries = entries_of(&pool, &levels[0])?;
    let upper = Upper::build(&nsm, &pool, &top_entries)?;
    let tree = Tree::new_handle(pool, nsm, height, opts, upper, max_id + 1);
    // Step 5.
    let linked = tree.link_orphans()?;
    // Step 6, final: the top level may have changed.
    let levels = walk(&tree.pool, tree.head()?, height)?;
    let entries = entries_of(&tree.pool, &levels[0])?;
    {
        let mut writers = tree.upper_lock.lock();
        writers.temp.clear();
        let guard = epoch::pin();
        let fresh = Upper::build(&tree.nsm, &tree.pool, &entries)?;
        let old = tree.upper.swap(epoch::Owned::new(fresh), Ordering::AcqRel, &guard);
        // SAFETY: single-threaded: nobody else has seen `old`; its blocks were never
        // published beyond this function, so they are freed at once, and the descriptor with
        // them.
        unsafe {
            if let Some(o) = old.as_ref() {
                for &p in &o.replicas {
                    let _ = tree.nsm.free(p);
                }
            }
            if !old.is_null() {
                drop(old.into_owned());
            }
        }
    }
    let report = RecoveryReport {
        was_clean: tree.pool.was_clean(),
        elapsed: t0.elapsed(),
        counters: vec![
            ("nodes", nodes),
            ("nodes_repaired", repaired),
            ("nodes_trimmed", trimmed),
            ("orphans_linked", linked),
            ("migration_redone", u64::from(redone)),
            ("subindexes", entries.len() as u64),
            ("nsm_free_blocks", nrec.blocks_free),
            ("pages_reclaimed", nrec.pages_freed + nrec.large_freed),
        ],
    };
    Ok((tree, report))
}

/// `(low, node)` of a top-level chain: the upper layer's entries.
fn entries_of(pool: &Pool, top: &[PPtr]) -> Result<Vec<(u64, PPtr)>> {
    top.iter().map(|&p| Ok((Node::resolve(pool, p)?.low(), p))).collect()
}

/// Step 4 on one node: whether it changed anything durable, and whether it trimmed records at
/// or beyond the high key (a split between its flip and its trim, or a merge between listing
/// the copied records and its flip).
fn repair(pool: &Pool, n: &Node<'_>) -> Result<(bool, bool)> {
    let mut s = n.state();
    let mut changed = false;
    if st_locked(s) {
        s = s.wrapping_add(VERSION_ONE);
    }
    let sib = n.sibling(s);
    let high = if sib.is_null() { END } else { Node::resolve(pool, sib)?.low() };
    let w = n.slots();
    let count = sl_count(w);
    if count > RECORDS {
        return Err(Error::corrupted(ENGINE, format!("slot word: node {} count {count}", n.ptr)));
    }
    let pos: Vec<usize> = (0..count).map(|i| sl_pos(w, i)).collect();
    let keep: Vec<usize> = pos.iter().copied().filter(|&p| n.key(p) < high).collect();
    let trim = keep.len() != pos.len();
    if trim {
        n.hdr.slots.store(sl_build(&keep), Ordering::Release);
        changed = true;
    }
    let s2 = st_with(s, keep.len() as u64, st_sib_ver(s));
    if s2 != n.state() {
        n.hdr.state.store(s2, Ordering::Release);
        changed = true;
    }
    if n.is_obsolete() || n.is_frozen() {
        let flags = n.meta() >> 8 & !(FLAG_OBSOLETE | FLAG_FROZEN);
        n.hdr.meta.store(meta_word(n.level(), flags), Ordering::Release);
        changed = true;
    }
    if changed {
        // PERSIST: the trimmed slot word (the only repair that matters durably) is durable
        // before the tree is used.
        pool.persist(n.hdr_addr(), 64);
    }
    Ok((changed, trim))
}

impl Tree {
    /// Step 5: links every node no parent references, bottom-up; grows a head level with more
    /// than one node below the threshold. Returns how many nodes it linked.
    fn link_orphans(&self) -> Result<u64> {
        let guard = epoch::pin();
        let mut linked = 0u64;
        let mut level = 0u32;
        loop {
            let levels = walk(&self.pool, self.head()?, self.height)?;
            let head_level = levels.len() as u32 - 1;
            if level > head_level {
                return Ok(linked);
            }
            let here = &levels[(head_level - level) as usize];
            if level == head_level {
                if level < self.top() && here.len() > 1 {
                    self.grow_root(level)?;
                    linked += here.len() as u64 - 1;
                    // The new root holds at most 12; the rest become ordinary orphans one level
                    // up: go round again at this level (now below the head).
                    continue;
                }
                return Ok(linked);
            }
            let parents = &levels[(head_level - level - 1) as usize];
            let mut referenced = HashSet::new();
            for &p in parents {
                let n = Node::resolve(&self.pool, p)?;
                referenced.insert(n.leftmost());
                let w = n.slots();
                for i in 0..sl_count(w) {
                    referenced.insert(PPtr::from_raw(n.val(sl_pos(w, i))));
                }
            }
            for &p in here {
                if !referenced.contains(&p) {
                    let low = Node::resolve(&self.pool, p)?.low();
                    if low == 0 {
                        return Err(Error::corrupted(ENGINE, "children: leftmost node orphaned"));
                    }
                    let mut path = [PPtr::NULL; crate::bottom::MAX_PATH];
                    self.link(level, low, p, &mut path, &guard)?;
                    linked += 1;
                }
            }
            level += 1;
        }
    }
}
