//! Range scans along the leaf chain, lock-free.
//!
//! Each leaf is read as a validated snapshot (switch counter and high key unchanged, see
//! [`FastFair::stable`]): all accepted `(key, value)` slots plus the node's high key and sibling.
//! The snapshot is sorted and de-duplicated (a shift leaves adjacent copies), keys at or beyond
//! the high key are dropped (they belong to the sibling: an interrupted split or merge), and only
//! keys `≥ next` are emitted, where `next` is one past the last key returned. So the output is
//! strictly ascending even while splits and merges move entries between nodes under the scan.

use numakv_index::Result;
use numakv_pmem::alloc::epoch::Guard;
use numakv_pmem::PPtr;

use crate::layout::{Node, END, HIDDEN};
use crate::search::Read;
use crate::FastFair;

impl FastFair {
    /// Collects the accepted slots of `node` in the given direction into `buf`; returns the
    /// high key and sibling read in the same window.
    fn snapshot(node: Node<'_>, desc: bool, buf: &mut Vec<(u64, u64)>) -> (u64, PPtr) {
        buf.clear();
        let high = node.high();
        let sibling = node.sibling();
        let mut take = |i: usize| -> bool {
            let k = node.key(i);
            if k == END {
                return false;
            }
            if k != HIDDEN {
                let v = node.val(i);
                if node.key(i) == k {
                    buf.push((k, v));
                }
            }
            true
        };
        if desc {
            for i in (0..node.used()).rev() {
                take(i);
            }
        } else {
            for i in 0..node.entries.len() {
                if !take(i) {
                    break;
                }
            }
        }
        (high, sibling)
    }

    /// Scan from `start` (≥ 1); see [`numakv_index::Index::scan`].
    pub(crate) fn range(
        &self,
        start: u64,
        max: usize,
        out: &mut Vec<(u64, u64)>,
        guard: &Guard,
    ) -> Result<usize> {
        let mut n = 0usize;
        let mut next = start;
        let mut buf = Vec::with_capacity(self.slots);
        'restart: loop {
            let mut node = self.leaf_for(next, guard)?;
            loop {
                let (high, sibling) =
                    match self.stable(node, next, |desc| Self::snapshot(node, desc, &mut buf))? {
                        Read::Dead => {
                            self.retry();
                            continue 'restart;
                        }
                        Read::Right(p) => {
                            node = self.node(p)?;
                            continue;
                        }
                        Read::Done(r) => r,
                    };
                // While a lazy recovery is repairing ranges, the sibling's low key bounds the
                // node (see FastFair::stable); its entries beyond belong to the sibling.
                let high = if self.repairing() && !sibling.is_null() {
                    high.min(self.node(sibling)?.low())
                } else {
                    high
                };
                buf.sort_unstable_by_key(|e| e.0);
                buf.dedup_by_key(|e| e.0);
                let from = next;
                for &(k, v) in buf.iter().filter(|e| e.0 >= from && e.0 < high) {
                    out.push((k, v));
                    n += 1;
                    next = k + 1; // k < END, so no overflow
                    if n == max || next == END {
                        return Ok(n);
                    }
                }
                if high == END || sibling.is_null() {
                    return Ok(n);
                }
                next = next.max(high);
                // Window: one leaf emitted, the next not yet read; both may split or merge.
                numakv_pmem::pause_point!("fastfair.scan.next_leaf");
                node = self.node(sibling)?;
            }
        }
    }
}
