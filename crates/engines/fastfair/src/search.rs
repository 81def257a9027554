//! Lock-free searches: descent through internal nodes and point lookups in leaves.
//!
//! A reader never locks and never writes. At every node it
//! 1. reads the switch counter `c1` (its bit 0 chooses the scan direction) and the high key `h1`;
//!    a node marked DEAD sends it back to the root; `key ≥ h1` sends it to the sibling (read
//!    after `h1`, then `h1` re-validated, so a merge that moved the sibling pointer is noticed);
//! 2. scans the slots in the direction the last shift used — ascending after an insert (entries
//!    move right), descending after a delete (entries move left) — skipping `HIDDEN` slots and
//!    accepting a slot only if its key read before and after its value is the same;
//! 3. re-reads the counter and the high key and retries the node when either changed.
//!
//! Why this returns exactly the stable keys with their own values: docs/design.md "FAST&FAIR".

use std::sync::atomic::Ordering;

use numakv_index::{Error, Result};
use numakv_pmem::alloc::epoch::Guard;
use numakv_pmem::PPtr;

use crate::layout::{Node, END, ENGINE, FLAG_DEAD, HIDDEN};
use crate::FastFair;

/// Outcome of one validated node read.
pub(crate) enum Read<R> {
    /// `key` is at or past the node's high key: continue at this sibling.
    Right(PPtr),
    /// The node was merged away: restart from the root.
    Dead,
    /// The result of the scan, validated.
    Done(R),
}

impl FastFair {
    /// Runs `f(descending)` over `node` between two reads of its switch counter and high key,
    /// retrying until neither changed; handles DEAD and move-right first.
    #[inline]
    pub(crate) fn stable<R>(
        &self,
        node: Node<'_>,
        key: u64,
        mut f: impl FnMut(bool) -> R,
    ) -> Result<Read<R>> {
        loop {
            // The header line is accounted once here and once before the second reads (the
            // same lines, in the same order, as one hook per load: tests/pm_accounting.rs in
            // crates/bench), and its words are read unrecorded.
            node.record_header_read();
            // ORDERING: Acquire; pairs with the Release stores of a shift, which the counter
            // update precedes (insert.rs).
            let c1 = node.hdr.switch.load_unaccounted(Ordering::Acquire);
            // ORDERING: Acquire, as `Node::is_dead`.
            if node.hdr.flags.load_unaccounted(Ordering::Acquire) & FLAG_DEAD != 0 {
                return Ok(Read::Dead);
            }
            // ORDERING: Acquire, as `Node::high`.
            let h1 = node.hdr.high.load_unaccounted(Ordering::Acquire);
            // While a lazy recovery is repairing ranges, a crash may have left `high` above the
            // sibling's low key (a rolled-back merge whose sibling is written again): the
            // sibling's low is the real bound then (docs/design.md, "Recovery").
            let mut bound = h1;
            let mut s = PPtr::NULL;
            if key < h1 && self.repairing() {
                s = node.sibling();
                if !s.is_null() {
                    bound = h1.min(self.node(s)?.low());
                }
            }
            if key >= bound {
                let clipped = bound < h1;
                if !clipped {
                    s = node.sibling();
                }
                // ORDERING: Acquire, as c1. A clipped bound came from this sibling pointer: any
                // change of it (split, merge, repair) also bumped the switch counter.
                if node.high() != h1 || (clipped && node.hdr.switch.load(Ordering::Acquire) != c1) {
                    self.retry();
                    continue;
                }
                if s.is_null() {
                    return Err(Error::corrupted(
                        ENGINE,
                        "node with a finite high key has no sibling",
                    ));
                }
                return Ok(Read::Right(s));
            }
            let r = f(c1 & 1 == 1);
            node.record_header_read();
            // ORDERING: Acquire loads of the slots above cannot be reordered after these loads.
            let c2 = node.hdr.switch.load_unaccounted(Ordering::Acquire);
            let h2 = node.hdr.high.load_unaccounted(Ordering::Acquire);
            if c1 == c2 && h1 == h2 {
                return Ok(Read::Done(r));
            }
            self.retry();
        }
    }

    /// Leaf lookup in one direction (called inside [`FastFair::stable`]). Reads the slots with
    /// unrecorded loads and accounts the slots it read once, before returning.
    #[inline]
    pub(crate) fn leaf_search(node: Node<'_>, key: u64, desc: bool) -> Option<u64> {
        let (found, last) = Self::leaf_scan(node, key, desc);
        node.record_slots_read(last);
        found
    }

    /// [`FastFair::leaf_search`]'s scan: the value found, and the highest slot it read.
    #[inline(always)]
    fn leaf_scan(node: Node<'_>, key: u64, desc: bool) -> (Option<u64>, usize) {
        let n = node.entries.len();
        // `k > bound` is "END, or a key past `key`": END is u64::MAX and HIDDEN (0) is below
        // every user key, so the sentinels need no tests of their own (`bound` keeps END itself
        // a stop for internal callers that look up END).
        let bound = key.min(END - 1);
        if !desc {
            for i in 0..n {
                let k = node.key_unrecorded(i);
                if k > bound {
                    return (None, i);
                }
                if k == key {
                    // Window: the key is read, its value not yet; a shift may move both on.
                    numakv_pmem::pause_point!("fastfair.leaf.key_read");
                    let v = node.val_unrecorded(i);
                    if node.key_unrecorded(i) == k {
                        return (Some(v), i);
                    }
                    // Being overwritten by a smaller key: its copy is already in slot i + 1.
                }
            }
            (None, n.saturating_sub(1))
        } else {
            // `used()`, unrecorded: the scan reads slots 0..=used (the END) first.
            let used = (0..n).find(|&i| node.key_unrecorded(i) == END).unwrap_or(n);
            let last = used.min(n.saturating_sub(1));
            for i in (0..used).rev() {
                let k = node.key_unrecorded(i);
                if k == HIDDEN || k == END || k > key {
                    continue;
                }
                if k < key {
                    return (None, last);
                }
                numakv_pmem::pause_point!("fastfair.leaf.key_read");
                let v = node.val_unrecorded(i);
                if node.key_unrecorded(i) == k {
                    return (Some(v), last);
                }
                // Being overwritten by a larger key: its copy is already in slot i - 1.
            }
            (None, last)
        }
    }

    /// Internal-node routing in one direction: the child of the largest separator `≤ key`.
    /// Reads the slots unrecorded and accounts them once, as [`FastFair::leaf_search`] does.
    #[inline]
    pub(crate) fn route(node: Node<'_>, key: u64, desc: bool) -> PPtr {
        // ORDERING: Acquire; the leftmost child is written before the node is published.
        let leftmost = node.hdr.leftmost.load(Ordering::Acquire);
        let (best, last) = Self::route_scan(node, key, desc, leftmost);
        node.record_slots_read(last);
        PPtr::from_raw(best)
    }

    /// [`FastFair::route`]'s scan: the child, and the highest slot it read.
    ///
    /// Ascending, it reads only keys up to the first one past `key`, then the chosen slot's
    /// value, and validates it by reading the key again (as the original FAST_FAIR reads only
    /// the chosen pointer): a shift rewrites a slot as `key = HIDDEN, val, key`, and within one
    /// direction a slot's key only moves down (right shifts copy smaller keys into it; a delete
    /// flips the direction bit, a split bumps the counter, and [`FastFair::stable`] retries),
    /// so an unchanged key brackets a value of that key. When the chosen slot changed under us,
    /// [`FastFair::route_scan_validating`] redoes the node slot by slot.
    #[inline(always)]
    fn route_scan(node: Node<'_>, key: u64, desc: bool, leftmost: u64) -> (u64, usize) {
        let n = node.entries.len();
        if desc {
            return Self::route_scan_validating(node, key, true, leftmost);
        }
        // As in `leaf_scan`: END and keys past `key` end the scan; HIDDEN (0) never does.
        let bound = key.min(END - 1);
        let mut chosen = None;
        let mut last = n.saturating_sub(1);
        for i in 0..n {
            let k = node.key_unrecorded(i);
            if k > bound {
                last = i;
                break;
            }
            if k != HIDDEN {
                chosen = Some((i, k));
            }
        }
        let Some((i, k)) = chosen else { return (leftmost, last) };
        let c = node.val_unrecorded(i);
        if node.key_unrecorded(i) == k {
            return (c, last);
        }
        Self::route_scan_validating(node, key, false, leftmost)
    }

    /// The slot-by-slot scan: each slot at or below `key` is validated (key, value, key) as it
    /// is read, the last valid one wins.
    #[cold]
    #[inline(never)]
    fn route_scan_validating(node: Node<'_>, key: u64, desc: bool, leftmost: u64) -> (u64, usize) {
        let n = node.entries.len();
        let mut best = leftmost;
        if !desc {
            for i in 0..n {
                let k = node.key_unrecorded(i);
                if k == END || (k > key && k != HIDDEN) {
                    return (best, i);
                }
                if k == HIDDEN {
                    continue;
                }
                let c = node.val_unrecorded(i);
                if node.key_unrecorded(i) == k {
                    best = c;
                }
            }
            (best, n.saturating_sub(1))
        } else {
            let used = (0..n).find(|&i| node.key_unrecorded(i) == END).unwrap_or(n);
            let last = used.min(n.saturating_sub(1));
            for i in (0..used).rev() {
                let k = node.key_unrecorded(i);
                if k == HIDDEN || k == END || k > key {
                    continue;
                }
                let c = node.val_unrecorded(i);
                if node.key_unrecorded(i) == k {
                    best = c;
                    break;
                }
            }
            (best, last)
        }
    }

    /// Lock-free descent to the node at `level` whose range holds `key` (at the time it was
    /// read). `None` when the root is below `level`: a root split not yet installed, or a root
    /// shrink that happened after the caller looked at the root's level (callers re-decide).
    pub(crate) fn descend<'a>(
        &'a self,
        level: u32,
        key: u64,
        _guard: &Guard,
    ) -> Result<Option<Node<'a>>> {
        'restart: loop {
            let mut node = self.node(self.root()?)?;
            if node.level() < level {
                return Ok(None);
            }
            loop {
                let lvl = node.level();
                let step = self.stable(node, key, |desc| {
                    (lvl != level).then(|| Self::route(node, key, desc))
                })?;
                match step {
                    Read::Dead => {
                        self.retry();
                        continue 'restart;
                    }
                    Read::Right(p) => {
                        node = self.node(p)?;
                        if node.level() != lvl {
                            return Err(Error::corrupted(ENGINE, "sibling on another level"));
                        }
                    }
                    Read::Done(None) => return Ok(Some(node)),
                    Read::Done(Some(child)) => {
                        node = self.node(child)?;
                        if node.level() + 1 != lvl {
                            return Err(Error::corrupted(
                                ENGINE,
                                "child level is not parent level - 1",
                            ));
                        }
                    }
                }
            }
        }
    }

    /// Lock-free descent to the leaf whose range holds `key`.
    pub(crate) fn leaf_for<'a>(&'a self, key: u64, guard: &Guard) -> Result<Node<'a>> {
        // Every root is at level ≥ 0: `None` is impossible.
        self.descend(0, key, guard)?.ok_or_else(|| Error::corrupted(ENGINE, "no leaf level"))
    }

    /// Point lookup.
    pub(crate) fn lookup(&self, key: u64, guard: &Guard) -> Result<Option<u64>> {
        'restart: loop {
            let mut node = self.leaf_for(key, guard)?;
            // Window: the leaf is chosen, not yet read; it may split or die meanwhile.
            numakv_pmem::pause_point!("fastfair.lookup.leaf");
            loop {
                match self.stable(node, key, |desc| Self::leaf_search(node, key, desc))? {
                    Read::Dead => {
                        self.retry();
                        continue 'restart;
                    }
                    Read::Right(p) => node = self.node(p)?,
                    Read::Done(v) => return Ok(v),
                }
            }
        }
    }
}
