//! `check()`: the structural fsck. Run quiescent (no concurrent writers).
//!
//! Invariants (names as they appear in the errors, see docs/design.md "FAST&FAIR"):
//! - `root range`: the root covers `[0, +inf)` and has no sibling;
//! - `root entries`: an internal root has at least one entry (an emptied root is shrunk);
//! - `live nodes`: no reachable node is marked DEAD;
//! - `node magic` / `node level`: every node of a level's chain is a node of that level;
//! - `terminator`: a node has an `END` slot;
//! - `sorted entries`: keys strictly increase, no hidden slot, all inside `[low, high)`;
//! - `sibling ranges`: along a level, `high` of a node is `low` of its sibling; the first node
//!   has `low = 0`, the last `high = +inf` and no sibling;
//! - `children`: the children of a level, in order (leftmost, then entries), are exactly the next
//!   level's sibling chain, and each child's `low` is its separator (the leftmost: the parent's low);
//! - `reachable allocated`: every node is a block NSM considers allocated.

use std::collections::HashSet;
use std::sync::atomic::Ordering;

use numakv_index::{CheckReport, Error, Result};
use numakv_pmem::PPtr;

use crate::layout::{END, ENGINE, HIDDEN};
use crate::recovery::{chain, children};
use crate::FastFair;

fn bad(what: impl Into<String>) -> Error {
    Error::corrupted(ENGINE, what)
}

impl FastFair {
    pub(crate) fn check_tree(&self) -> Result<CheckReport> {
        let root_p = self.root()?;
        let root = self.node(root_p)?;
        if root.low() != 0 || root.high() != END || !root.sibling().is_null() {
            return Err(bad("root range: the root must cover [0, +inf) and have no sibling"));
        }
        if !root.is_leaf() && root.used() == 0 {
            return Err(bad(format!(
                "root entries: internal root {root_p} (level {}) has only its leftmost child",
                root.level()
            )));
        }
        let mut seen = HashSet::new();
        let mut entries = 0u64;
        let mut first = root_p;
        let mut expected: Option<Vec<(u64, PPtr)>> = None;
        for level in (0..=root.level()).rev() {
            let nodes = chain(&self.pool, self.node_size, first, level, &mut seen)?;
            let mut kids = Vec::new();
            let mut prev_high = 0u64;
            for (idx, &p) in nodes.iter().enumerate() {
                let n = self.node(p)?;
                if n.is_dead() {
                    return Err(bad(format!("live nodes: node {p} (level {level}) is DEAD")));
                }
                let (low, high) = (n.low(), n.high());
                if low != prev_high {
                    return Err(bad(format!(
                        "sibling ranges: node {p} (level {level}) has low {low}, left neighbour's high is {prev_high}"
                    )));
                }
                if low >= high {
                    return Err(bad(format!("sibling ranges: node {p} has an empty range")));
                }
                prev_high = high;
                if (idx + 1 == nodes.len()) != (high == END) {
                    return Err(bad(format!(
                        "sibling ranges: node {p}: only the last node may end at +inf"
                    )));
                }
                let used = n.used();
                if used >= n.entries.len() {
                    return Err(bad(format!("terminator: node {p} has no END slot")));
                }
                let mut prev = None;
                for i in 0..used {
                    let k = n.key(i);
                    if k == HIDDEN || prev.is_some_and(|q| k <= q) || k < low || k >= high {
                        return Err(bad(format!(
                            "sorted entries: node {p} slot {i} key {k} (range [{low}, {high}), previous {prev:?})"
                        )));
                    }
                    prev = Some(k);
                }
                if level == 0 {
                    entries += used as u64;
                } else {
                    kids.extend(children(n));
                    if n.hdr.leftmost.load(Ordering::Acquire) == 0 {
                        return Err(bad(format!(
                            "children: internal node {p} has no leftmost child"
                        )));
                    }
                }
            }
            if let Some(exp) = &expected {
                let got: Vec<PPtr> = exp.iter().map(|e| e.1).collect();
                if got != nodes {
                    return Err(bad(format!(
                        "children: level {level} chain ({} nodes) differs from its parents' children ({} nodes)",
                        nodes.len(),
                        got.len()
                    )));
                }
                for &(sep, c) in exp {
                    if self.node(c)?.low() != sep {
                        return Err(bad(format!(
                            "children: child {c} low differs from its separator {sep}"
                        )));
                    }
                }
            }
            if level > 0 {
                first = kids[0].1;
            }
            expected = Some(kids);
        }
        // Nodes retired by the last merges are freed after their grace period (check runs
        // quiescent, unpinned): let them settle before comparing. A shared NSM (an embedder's)
        // holds other blocks too; its owner settles the total.
        if self.owns_nsm {
            numakv_pmem::alloc::settle_deferred_frees(
                seen.len() as u64,
                std::time::Duration::from_secs(5),
                || self.nsm.allocated_blocks().len() as u64,
            );
        }
        let allocated = self.nsm.allocated_blocks();
        for p in &seen {
            if allocated.binary_search(p).is_err() {
                return Err(bad(format!(
                    "reachable allocated: node {p} is not an allocated block"
                )));
            }
        }
        Ok(CheckReport {
            entries,
            reachable_blocks: seen.len() as u64,
            allocated_blocks: allocated.len() as u64,
        })
    }
}
