//! `check()`: the structural fsck. Run quiescent (no concurrent writers).
//!
//! Invariants (names as they appear in the errors; docs/design.md "NOBtree"):
//! - `head`: the head covers from key 0 and is on a level below the height threshold;
//! - `node magic` / `node level` / `sibling ranges`: every level's chain holds nodes of that
//!   level with strictly ascending `low`, the first at 0;
//! - `unlocked`: no node is write-locked, none is obsolete or frozen;
//! - `slot word`: count ≤ 12, distinct positions, keys strictly ascending in logical order, all
//!   inside `[low, high)`; the state counter mirrors the count;
//! - `children`: the children of every inner node (leftmost, then records in order) are nodes of
//!   the next level's chain, in chain order, each child's `low` equal to its separator (the
//!   leftmost child's to the parent's `low`); the first node of a level is the first child of
//!   the level above. A chain node no parent references (an orphan: a split whose parent
//!   insert ran out of space) is allowed — readers reach it through its left sibling;
//!   Merged nodes (leaf or inner: `R`'s records, for an inner node led by `(R.low,
//!   R.leftmost)`, moved into `N`) are held to the same rules, so a merge that lost or
//!   duplicated a child fails here;
//! - `node ids`: reachable nodes have distinct ids (the migration statistics are keyed by id; a
//!   split, a merge target and a migrated copy each carry their own);
//! - `upper ...`: every replica holds the same sorted entries, routes each entry's key to it,
//!   and every entry is a node of the head's level whose `low` is the entry key; the entries and
//!   the temporary list together name every node of that level — or, while the head is below
//!   the top level (the young first subindex, whose growth may have run out of space), the head
//!   alone;
//! - `reachable allocated`: every node, replica and log block is a block NSM considers
//!   allocated. The reported `allocated_blocks` leaves out blocks retired (a migrated or merged
//!   node, a replaced replica) and still awaiting their epoch grace period: they are known
//!   garbage, not leaks.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;

use numakv_index::{CheckReport, Error, Result};
use numakv_pmem::alloc::epoch;
use numakv_pmem::PPtr;

use crate::bottom::counter_matches;
use crate::layout::{sl_count, sl_pos, st_locked, Node, END, ENGINE, RECORDS};
use crate::recovery::walk;
use crate::Tree;

fn bad(what: impl Into<String>) -> Error {
    Error::corrupted(ENGINE, what)
}

impl Tree {
    pub(crate) fn check_tree(&self) -> Result<CheckReport> {
        // The coordinator is a writer too: hold it off for the duration.
        let _paused = self.migrator.as_ref().map(|m| m.pause());
        let head = self.head()?;
        let levels = walk(&self.pool, head, self.height)?;
        let mut entries = 0u64;
        let mut blocks: Vec<PPtr> = Vec::new();
        let mut ids = HashSet::new();
        for (li, chain) in levels.iter().enumerate() {
            let below = levels.get(li + 1);
            let index: HashMap<PPtr, usize> = below
                .map(|b| b.iter().enumerate().map(|(i, &p)| (p, i)).collect())
                .unwrap_or_default();
            let mut last_child: Option<usize> = None;
            for (ci, &p) in chain.iter().enumerate() {
                blocks.push(p);
                let n = Node::resolve(&self.pool, p)?;
                if !ids.insert(n.hdr.id.load(Ordering::Relaxed)) {
                    return Err(bad(format!("node ids: node {p} repeats an id")));
                }
                let s = n.state();
                if st_locked(s) || n.is_obsolete() || n.is_frozen() {
                    return Err(bad(format!("unlocked: node {p} is locked, obsolete or frozen")));
                }
                let sib = n.sibling(s);
                let high = if sib.is_null() { END } else { Node::resolve(&self.pool, sib)?.low() };
                let w = n.slots();
                let count = sl_count(w);
                if count > RECORDS {
                    return Err(bad(format!("slot word: node {p} count {count}")));
                }
                let mut used = 0u16;
                let mut prev: Option<u64> = None;
                let low = n.low();
                let mut kids = vec![(low, n.leftmost())];
                for i in 0..count {
                    let q = sl_pos(w, i);
                    if q >= RECORDS || used & (1 << q) != 0 {
                        return Err(bad(format!("slot word: node {p} repeats position {q}")));
                    }
                    used |= 1 << q;
                    let k = n.key(q);
                    if prev.is_some_and(|x| k <= x) || k < low || k >= high {
                        return Err(bad(format!(
                            "slot word: node {p} key {k} out of order or outside [{low}, {high})"
                        )));
                    }
                    prev = Some(k);
                    kids.push((k, PPtr::from_raw(n.val(q))));
                }
                if !counter_matches(&n) {
                    return Err(bad(format!("slot word: node {p} counter mirror differs")));
                }
                if n.level() == 0 {
                    entries += count as u64;
                    continue;
                }
                for (j, &(sep, c)) in kids.iter().enumerate() {
                    let Some(&at) = index.get(&c) else {
                        return Err(bad(format!(
                            "children: node {p} child {c} is not on the next level"
                        )));
                    };
                    if last_child.is_some_and(|l| at <= l) || (ci == 0 && j == 0 && at != 0) {
                        return Err(bad(format!(
                            "children: node {p} child {c} out of chain order"
                        )));
                    }
                    last_child = Some(at);
                    if Node::resolve(&self.pool, c)?.low() != sep {
                        return Err(bad(format!(
                            "children: child {c} low differs from separator {sep}"
                        )));
                    }
                }
            }
        }
        // Upper layer.
        let guard = epoch::pin();
        // Held to the end: no rebuild runs (its replicas, built outside the upper mutex and
        // not yet published, would count as allocated and unreachable), and no writer of the
        // upper layer swaps replicas or changes the temporary list while they are checked and
        // counted. The order — `rebuild_lock`, then the upper mutex — is the rebuild's.
        let _no_rebuild = self.rebuild_lock.lock();
        let temp_guard = self.upper_lock.lock();
        let temp: &[(u64, PPtr)] = &temp_guard.temp;
        // SAFETY: loaded under `guard` (see bottom.rs `upper_root`).
        let up = unsafe { self.upper.load(Ordering::Acquire, &guard).as_ref() }
            .ok_or_else(|| bad("upper: no upper layer"))?;
        let ents = up.check(&self.pool)?;
        let top: HashSet<PPtr> = levels[0].iter().copied().collect();
        let mut named = HashSet::new();
        for &(k, p) in ents.iter().chain(temp.iter()) {
            if !top.contains(&p) || Node::resolve(&self.pool, p)?.low() != k {
                return Err(bad(format!("upper entries: ({k}, {p}) is not a top-level node")));
            }
            named.insert(p);
        }
        // The young first subindex (head below the top level) is named by the key-0 entry
        // alone; other nodes of its level (a root growth not run yet, or out of space) are
        // reached from the head through sibling pointers.
        let young = Node::resolve(&self.pool, head)?.level() < self.top();
        if young && (named.len() != 1 || !named.contains(&head)) {
            return Err(bad(
                "upper entries: a young first subindex must be named by the head alone",
            ));
        }
        if !young && named.len() != top.len() {
            return Err(bad(format!(
                "upper entries: {} top-level nodes but {} named by the upper layer",
                top.len(),
                named.len()
            )));
        }
        blocks.extend(up.replicas.iter().copied());
        if let Some(m) = crate::migration::log_block(&self.pool)? {
            blocks.push(m);
        }
        // Give pending retirements a chance to run (the coordinator is paused, so a few
        // flushes usually advance the epoch far enough); what still waits is not a leak.
        for _ in 0..8 {
            if self.retiring.load(Ordering::Relaxed) == 0 {
                break;
            }
            epoch::pin().flush();
        }
        let allocated = self.nsm.allocated_blocks();
        let retiring = self.retiring.load(Ordering::Relaxed);
        for p in &blocks {
            if allocated.binary_search(p).is_err() {
                return Err(bad(format!("reachable allocated: block {p} is not allocated")));
            }
        }
        Ok(CheckReport {
            entries,
            reachable_blocks: blocks.len() as u64,
            allocated_blocks: (allocated.len() as u64).saturating_sub(retiring),
        })
    }
}
