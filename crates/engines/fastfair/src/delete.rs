//! FAST delete: the failure-atomic left shift, the leaf remove path, and the writers' in-node
//! repair of transient states a crash left behind.
//!
//! Store order of a left shift that removes slot `p` of a node with `n` entries (terminator at
//! `n`), all stores Release:
//!
//! ```text
//! 1. for i = p to n-2:                            move entry i+1 to slot i
//!        key[i] = HIDDEN; val[i] = val[i+1]; key[i] = key[i+1]
//!    (the first HIDDEN store, on slot p, is the linearization point of the delete)
//! 2. key[n-1] = END                               terminator last
//! ```
//!
//! (For `p = n-1` only step 2 runs: the key is replaced by the terminator in one store.) Lines are
//! persisted when the shift leaves them, as for the right shift, so the durable image is always a
//! prefix of this order. Readers scan descending while the switch counter is odd.

use std::sync::atomic::Ordering;

use numakv_index::{Error, Result};
use numakv_pmem::alloc::epoch;

use crate::insert::LineFlusher;
use crate::layout::{Node, END, ENGINE, HIDDEN};
use crate::lock::WriteGuard;
use crate::FastFair;

impl FastFair {
    /// The FAST left shift: removes slot `pos` of a locked node with `used` entries.
    #[allow(clippy::needless_range_loop)] // slot i and i + 1 in one store order
    pub(crate) fn shift_delete(&self, node: Node<'_>, pos: usize, used: usize) {
        debug_assert!(pos < used && used < node.entries.len());
        self.set_direction(node, true);
        let e = node.entries;
        let mut fl = LineFlusher::new(self);
        for i in pos..used - 1 {
            fl.touch(node.slot_addr(i));
            let (k, v) = (node.key(i + 1), node.val(i + 1));
            e[i].key.store(HIDDEN, Ordering::Release);
            e[i].val.store(v, Ordering::Release);
            e[i].key.store(k, Ordering::Release);
        }
        fl.touch(node.slot_addr(used - 1));
        e[used - 1].key.store(END, Ordering::Release);
        fl.finish();
    }

    /// Removes `key`.
    pub(crate) fn delete(&self, key: u64) -> Result<bool> {
        let guard = epoch::pin();
        let g = self.lock_leaf(key, &guard)?;
        let node = g.node();
        let (used, at) = self.locate(node, key);
        let Ok(pos) = at else { return Ok(false) };
        self.shift_delete(node, pos, used);
        if used - 1 <= self.cap / 4 {
            // The delete is complete and durable; the merge cascade (smo.rs) only restructures.
            self.rebalance(g, &guard)?;
        }
        Ok(true)
    }

    /// Writers' repair of a locked node: while a lazy recovery has not repaired every range,
    /// first `high = sibling.low` where a crash left `high > sibling.low` (recovery.rs); then
    /// removes hidden slots and duplicates (left shifts, themselves failure-atomic) and cuts
    /// entries at or beyond the high key (a split or merge interrupted by a crash). In a
    /// session these states exist only transiently under another writer's lock, so this finds
    /// work only on nodes a crash left behind.
    pub(crate) fn repair_entries(&self, g: &WriteGuard<'_>) -> Result<()> {
        let node = g.node();
        if self.repairing() {
            self.fix_range(g)?;
        } else if g.released_clean() {
            // Released by a writer of this session: no residue to look for (lock.rs).
            return Ok(());
        }
        loop {
            let used = node.used();
            if used >= node.entries.len() {
                return Err(Error::corrupted(ENGINE, "node has no terminator slot"));
            }
            let high = node.high();
            let mut prev = 0u64;
            let mut bad = None;
            for i in 0..used {
                let k = node.key(i);
                if k == HIDDEN || k <= prev {
                    bad = Some((i, false));
                    break;
                }
                if k >= high {
                    bad = Some((i, true));
                    break;
                }
                prev = k;
            }
            match bad {
                None => return Ok(()),
                Some((i, true)) => {
                    // Entries from i on belong to the right sibling: cut them.
                    self.bump_switch(node);
                    node.entries[i].key.store(END, Ordering::Release);
                    // PERSIST: the cut is durable before the node is modified further.
                    self.pool.persist(node.slot_addr(i), 8);
                }
                Some((i, false)) => self.shift_delete(node, i, used),
            }
            self.counters.repairs.fetch_add(1, Ordering::Relaxed);
        }
    }
}
