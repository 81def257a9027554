//! Ordered scans over unsorted leaves (not in the prototype).
//!
//! Leaf after leaf from the one holding `start`: the live entries of a leaf in its range
//! `[max(low, next), high)` are gathered, sorted in DRAM, and appended; the scan resumes at the
//! leaf's (immutable) high key, re-entering the tree there, so leaves split meanwhile are found
//! through the inner nodes and `settle`. A leaf whose SMO has a copy is first helped to
//! completion (sync and link) and the new leaves are read instead: during the sync phase the old
//! leaf may hold a write not yet synchronised (Table III, "dirty"), which a scan must not
//! return. Leaves in the copy phase are read directly (latest and clean). Each pair is read
//! between two reads of its key, so it was present at that moment; keys ascend strictly because
//! leaf ranges are disjoint and visited in order.

use numakv_index::Result;
use numakv_pmem::alloc::epoch::Guard;

use crate::leaf::LeafMeta;
use crate::{NbTree, Variant};

impl NbTree {
    /// Appends up to `max` pairs with keys `≥ start` in ascending order.
    pub(crate) fn range(
        &self,
        start: u64,
        max: usize,
        out: &mut Vec<(u64, u64)>,
        g: &Guard,
    ) -> Result<usize> {
        let mut from = start;
        let mut n = 0;
        let mut buf: Vec<(u64, u64)> = Vec::with_capacity(self.slots);
        while n < max {
            let leaf = self.find_leaf(from, g);
            if leaf.in_smo() && !leaf.copy_ptr().is_null() {
                self.help_smo(leaf, g)?;
                continue;
            }
            buf.clear();
            {
                let _r = (self.variant == Variant::WR).then(|| leaf.lock.read());
                let blk = self.blk(leaf.data);
                let mut bits = leaf.committed();
                while bits != 0 {
                    let i = bits.trailing_zeros() as usize;
                    bits &= bits - 1;
                    // ORDERING: Acquire; pairs with the Release key store of inserts.
                    let k = blk.entry(i).key.load(std::sync::atomic::Ordering::Acquire);
                    if k < from || k >= leaf.high {
                        continue; // 0 (deleted) is below every `from`
                    }
                    if let Some(v) = LeafMeta::read_slot(&blk, i, k) {
                        buf.push((k, v));
                    }
                }
            }
            buf.sort_unstable_by_key(|e| e.0);
            for &e in buf.iter().take(max - n) {
                out.push(e);
                n += 1;
            }
            if leaf.high == u64::MAX {
                break;
            }
            from = leaf.high;
        }
        Ok(n)
    }
}
