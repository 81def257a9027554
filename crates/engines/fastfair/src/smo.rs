//! FAIR structural modifications: node creation, split (with root split) and merge, without
//! logging. Every intermediate durable state is one readers already tolerate and recovery (or
//! a writer) completes or rolls back; see docs/design.md "FAST&FAIR".
//!
//! **Split** of a full, locked node A that must take `(k, v)`:
//! ```text
//! 1. B = new node with the upper half (leaf: entries m.., low = key m; internal: leftmost =
//!    child m, entries m+1.., low = separator m), high = A.high, sibling = A.sibling;
//!    persisted whole before anything points to it
//! 2. A.switch += 2; A.sibling = B; A.high = B.low; persist A's header (one line)
//! 3. A.key[first slot ≥ B.low] = END; persist                      (cut the moved half)
//! 4. if k < B.low: FAST-insert (k, v) into A
//! 5. insert (B.low → B) into the parent level, still holding A's lock (child → parent);
//!    if A is the root: new root R = [leftmost A, (B.low → B)], persisted, then the root
//!    slot switches to R in one 8-byte store, persisted
//! ```
//! A crash after 2 but before the parent insert leaves B reachable only via A.sibling: correct
//! for readers (B-link); recovery inserts the missing separator. A crash between the sibling and
//! high stores (same line: durable together or in order) leaves A.high > B.low: the repair sets
//! A.high = B.low and cuts A.
//!
//! **Merge** of leaf R into its left sibling C (C, R and their parent P locked, in that order —
//! level ascending, left to right), only when P holds the entry (R.low → R):
//! ```text
//! 1. C.switch += 2; append R's entries behind C's terminator (beyond C.high: invisible); persist
//! 2. C.high = R.high; persist                 C now covers R's range; R still identical
//! 3. FAST-delete (R.low → R) from P            searches for R's keys go to C
//! 4. C.sibling = R.sibling; persist            R unreachable
//! 5. R.flags = DEAD; unlock; retire R after an epoch grace period
//! ```
//! Crash after 2 or 3: C.high > C.sibling.low = R.low, so repair rolls the merge back (C.high =
//! R.low, cut C) and R, if no longer in P, is re-linked like any orphan. Internal nodes are never
//! merged (they may become empty: only a leftmost child); the root never shrinks.

use std::sync::atomic::Ordering;

use numakv_index::{Error, Result};
use numakv_pmem::alloc::epoch::Guard;
use numakv_pmem::alloc::retire;
use numakv_pmem::PPtr;

use crate::layout::{Node, END, ENGINE, FLAG_DEAD, NODE_MAGIC};
use crate::lock::WriteGuard;
use crate::FastFair;

impl FastFair {
    /// A fresh node block (contents unspecified until [`FastFair::init_node`]).
    pub(crate) fn alloc_node(&self) -> Result<PPtr> {
        Ok(self.nsm.alloc_on(self.node_size, None)?)
    }

    /// Writes a complete node into the fresh block `p` and persists every line a reader can
    /// look at (header and slots up to the terminator) before returning: nothing points to it
    /// yet, so this needs no order inside, only completeness before publication.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn init_node(
        &self,
        p: PPtr,
        level: u32,
        leftmost: PPtr,
        low: u64,
        high: u64,
        sibling: PPtr,
        entries: &[(u64, u64)],
    ) -> Result<Node<'_>> {
        if entries.len() > self.cap {
            return Err(Error::corrupted(ENGINE, "node image larger than capacity"));
        }
        let n = self.node(p)?;
        let h = n.hdr;
        h.lock.store(0, Ordering::Relaxed);
        h.switch.store(0, Ordering::Relaxed);
        h.sibling.store(sibling.raw(), Ordering::Relaxed);
        h.leftmost.store(leftmost.raw(), Ordering::Relaxed);
        h.low.store(low, Ordering::Relaxed);
        h.high.store(high, Ordering::Relaxed);
        h.level.store(level, Ordering::Relaxed);
        h.magic.store(NODE_MAGIC, Ordering::Relaxed);
        h.flags.store(0, Ordering::Relaxed);
        for (i, &(k, v)) in entries.iter().enumerate() {
            n.entries[i].key.store(k, Ordering::Relaxed);
            n.entries[i].val.store(v, Ordering::Relaxed);
        }
        n.entries[entries.len()].key.store(END, Ordering::Relaxed);
        n.entries[entries.len()].val.store(0, Ordering::Relaxed);
        // PERSIST: header and every slot up to the terminator are durable before any pointer
        // to the node is stored (the caller publishes it with a Release store afterwards).
        let len = n.slot_addr(entries.len()) as usize + 16 - n.hdr_addr() as usize;
        self.pool.persist(n.hdr_addr(), len);
        Ok(n)
    }

    /// Splits the full node held by `g` and inserts `(key, val)` into the proper half, then
    /// links the new node into the parent level.
    pub(crate) fn split_insert(
        &self,
        g: &WriteGuard<'_>,
        key: u64,
        val: u64,
        guard: &Guard,
    ) -> Result<()> {
        let a = g.node();
        let level = a.level();
        let used = a.used();
        let mut all: Vec<(u64, u64)> = (0..used).map(|i| (a.key(i), a.val(i))).collect();
        let pos = all.partition_point(|e| e.0 < key);
        all.insert(pos, (key, val));
        let m = all.len() / 2;
        let sep = all[m].0;
        let (leftmost, right) = if level == 0 {
            (PPtr::NULL, &all[m..])
        } else {
            (PPtr::from_raw(all[m].1), &all[m + 1..])
        };

        // Step 1 (allocation first: out of space leaves A untouched).
        let b = self.alloc_node()?;
        self.init_node(b, level, leftmost, sep, a.high(), a.sibling(), right)?;

        // Step 2.
        self.bump_switch(a);
        // ORDERING: Release; pairs with the Acquire in Node::sibling: B's contents are visible
        // to whoever follows the link.
        a.hdr.sibling.store(b.raw(), Ordering::Release);
        // ORDERING: Release; a reader that sees the smaller high key also sees the link.
        a.hdr.high.store(sep, Ordering::Release);
        // PERSIST: link and range are durable before A loses its upper half.
        self.pool.persist(a.hdr_addr(), 64);

        // Step 3.
        let cut = (0..used).find(|&i| a.key(i) >= sep).unwrap_or(used);
        a.entries[cut].key.store(END, Ordering::Release);
        // PERSIST: the cut is durable before A takes the new entry.
        self.pool.persist(a.slot_addr(cut), 8);

        // Step 4.
        if key < sep {
            let at = (0..cut).find(|&i| a.key(i) > key).unwrap_or(cut);
            self.shift_insert(a, at, cut, key, val);
        }
        self.counters.splits.fetch_add(1, Ordering::Relaxed);

        // Step 5. A failure here (out of space for a parent split) leaves B linked only through
        // A.sibling, which every reader and writer follows; recovery adds the separator.
        match self.insert_separator(level + 1, sep, b, a.ptr, guard) {
            Err(e) if e.is_out_of_space() => Ok(()),
            r => r,
        }
    }

    /// Inserts the separator `(key → child)` into the node at `level` covering `key`. `from` is
    /// the node (at `level - 1`, locked by the caller) that was split; if it is the root, a new
    /// root is installed.
    pub(crate) fn insert_separator(
        &self,
        level: u32,
        key: u64,
        child: PPtr,
        from: PPtr,
        guard: &Guard,
    ) -> Result<()> {
        loop {
            let root_p = self.root()?;
            let root = self.node(root_p)?;
            if root.level() < level {
                if root_p != from {
                    // Another thread holds the old root's lock and is installing the new root
                    // above it (our node is the old root's right sibling): wait for it.
                    std::thread::yield_now();
                    continue;
                }
                let r = self.alloc_node()?;
                self.init_node(r, level, from, 0, END, PPtr::NULL, &[(key, child.raw())])?;
                let slot = self.pool.root(crate::layout::SLOT_ROOT)?;
                // ORDERING: Release; pairs with the Acquire in FastFair::root.
                slot.store(r.raw(), Ordering::Release);
                // PERSIST: the new root was persisted whole by init_node; the root pointer
                // switches in one durable 8-byte store.
                self.pool.persist_obj(slot);
                self.counters.root_splits.fetch_add(1, Ordering::Relaxed);
                return Ok(());
            }
            let p = self.descend(level, key, guard)?;
            let Some(pg) = self.lock_covering(p, key)? else {
                self.retry();
                continue;
            };
            let node = pg.node();
            let (used, at) = self.locate(node, key);
            return match at {
                Ok(i) if node.val(i) == child.raw() => Ok(()),
                Ok(_) => Err(Error::corrupted(ENGINE, "two children with one separator")),
                Err(pos) if used < self.cap => {
                    self.shift_insert(node, pos, used, key, child.raw());
                    Ok(())
                }
                Err(_) => self.split_insert(&pg, key, child.raw(), guard),
            };
        }
    }

    /// Merges the right sibling of the locked leaf `g` into it when both are small and their
    /// parent holds the sibling's separator; otherwise does nothing.
    pub(crate) fn try_merge(&self, g: &WriteGuard<'_>, guard: &Guard) -> Result<()> {
        let c = g.node();
        let r_ptr = c.sibling();
        if r_ptr.is_null() {
            return Ok(());
        }
        let rg = WriteGuard::lock(self.node(r_ptr)?, self.generation);
        let r = rg.node();
        if r.is_dead() || r.low() != c.high() {
            return Ok(());
        }
        self.repair_entries(&rg)?;
        let (cu, ru) = (c.used(), r.used());
        if cu + ru > self.cap * 3 / 4 {
            return Ok(());
        }
        let rlow = r.low();
        if self.node(self.root()?)?.level() < 1 {
            return Ok(()); // the root split that made R is still being installed
        }
        let p = self.descend(1, rlow, guard)?;
        let Some(pg) = self.lock_covering(p, rlow)? else { return Ok(()) };
        let pn = pg.node();
        let (pused, at) = self.locate(pn, rlow);
        let Ok(pos) = at else { return Ok(()) };
        if pn.val(pos) != r_ptr.raw() {
            return Ok(());
        }

        // Step 1: append behind the terminator; the slot of the old terminator last.
        self.bump_switch(c);
        if ru > 0 {
            for i in 1..ru {
                let s = &c.entries[cu + i];
                s.key.store(r.key(i), Ordering::Release);
                s.val.store(r.val(i), Ordering::Release);
            }
            c.entries[cu + ru].key.store(END, Ordering::Release);
            let s = &c.entries[cu];
            s.key.store(crate::layout::HIDDEN, Ordering::Release);
            s.val.store(r.val(0), Ordering::Release);
            s.key.store(r.key(0), Ordering::Release);
        }
        // PERSIST: the appended entries are durable before C's range covers them.
        let from = c.slot_addr(cu);
        let len = c.slot_addr(cu + ru) as usize + 16 - from as usize;
        self.pool.persist(from, len);

        // Step 2.
        // ORDERING: Release; readers that see the larger range see the appended entries.
        c.hdr.high.store(r.high(), Ordering::Release);
        // PERSIST: C's new range is durable before R loses its parent entry.
        self.pool.persist(c.hdr_addr(), 64);

        // Step 3 (persisted by the shift).
        self.shift_delete(pn, pos, pused);

        // Step 4.
        // ORDERING: Release, as for the split's link.
        c.hdr.sibling.store(r.sibling().raw(), Ordering::Release);
        // PERSIST: R is unlinked durably before the operation returns.
        self.pool.persist(c.hdr_addr(), 64);

        // Step 5.
        // ORDERING: Release; a reader or writer that sees DEAD restarts from the root.
        r.hdr.flags.store(FLAG_DEAD, Ordering::Release);
        drop(pg);
        drop(rg);
        // SAFETY: R came from this tree's NSM, is now unreachable from the root, the parent
        // and the sibling chain (steps 3 and 4), is retired exactly once (only the merger that
        // set DEAD gets here), and readers still inside it are protected by their epoch pin.
        unsafe { retire(&self.nsm, guard, r_ptr) };
        self.counters.merges.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}
