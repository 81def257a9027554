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
//! **Reservation.** Before step 1 the split takes from NSM every node its cascade can need (one
//! per level from A's up to the root, plus a new root: [`NodeReserve`]); out of space there
//! refuses the insert with nothing changed. Unused nodes go straight back (never published).
//! Only a root that grew meanwhile (a concurrent root split) can outrun the reservation; then
//! step 5 allocates, and out of space leaves B linked through A.sibling only, as a crash would.
//!
//! A crash after 2 but before the parent insert leaves B reachable only via A.sibling: correct
//! for readers (B-link); recovery inserts the missing separator. A crash between the sibling and
//! high stores (same line: durable together or in order) leaves A.high > B.low: the repair sets
//! A.high = B.low and cuts A.
//!
//! **Merge** of node R into its left sibling C, at any level (C, R and their parent P locked,
//! in that order — level ascending, left to right), only when P holds the entry (R.low → R):
//! ```text
//! 1. C.switch += 2; append behind C's terminator (beyond C.high: invisible) R's entries —
//!    internal nodes first (R.low → R.leftmost): R's leftmost child becomes an entry; all but
//!    the first with the new terminator, persisted, then the first over the old terminator,
//!    persisted
//! 2. C.high = R.high; persist                 C now covers R's range; R still identical
//! 3. FAST-delete (R.low → R) from P            searches for R's keys go to C
//! 4. C.sibling = R.sibling; persist            R unreachable
//! 5. R.flags = DEAD; unlock; retire R after an epoch grace period
//! ```
//! Crash after 2 or 3: C.high > C.sibling.low = R.low, so repair rolls the merge back (C.high =
//! R.low, cut C) and R, if no longer in P, is re-linked like any orphan. Children never change:
//! an internal merge only moves the routing entries that point to them.
//!
//! **Cascade.** A leaf delete that leaves N with ≤ cap/4 entries merges N with its right sibling
//! (N absorbs it) or, if that is impossible, with its left neighbour (which absorbs N: N is
//! released, the neighbour locked, then N again — left to right). A merge whose separator delete
//! leaves P with ≤ cap/4 entries continues with P (still locked), and so on upward. When R's
//! separator is not in C's parent because R is the leftmost child of the parent's right
//! neighbour, the two parents merge first (if they fit), then C and R are tried once more.
//!
//! **Root shrink.** When a merge leaves the root internal with no entries (only its leftmost
//! child X) and X has no sibling (no split of X awaits its separator), the root slot switches
//! to X in one 8-byte persisted store, under the old root's lock; the old root is marked DEAD
//! and retired. Repeated while the new root is itself empty.

use std::sync::atomic::Ordering;

use numakv_index::{Error, Result};
use numakv_pmem::alloc::epoch::Guard;
use numakv_pmem::alloc::retire;
use numakv_pmem::PPtr;

use crate::layout::{self, Node, END, ENGINE, FLAG_DEAD, HIDDEN, NODE_MAGIC};
use crate::lock::WriteGuard;
use crate::FastFair;

/// What [`FastFair::merge_right`] did.
pub(crate) enum Merge<'a> {
    /// The right sibling was absorbed; this is the parent, still locked, which lost its entry.
    Done(WriteGuard<'a>),
    /// The right sibling is the leftmost child of the parent's right neighbour: the two nodes
    /// have different parents, which would have to merge first.
    OtherParent,
    /// No merge: no sibling, too many entries, or a split or merge nearby still in flight.
    No,
}

/// How [`FastFair::shrink_root`] frees an old root.
#[derive(Clone, Copy)]
pub(crate) enum Reclaim<'g> {
    /// After an epoch grace period: lock-free readers may still be inside it.
    Epoch(&'g Guard),
    /// At once: recovery, before any other thread can see the tree.
    Now,
    /// Handed to the caller, which frees them after an epoch grace period it waits for itself
    /// (the background pass of a lazy recovery, once NSM's collection is done: so that its
    /// report, like an eager open's, leaves no block awaiting a grace period).
    Later(&'g std::cell::RefCell<Vec<PPtr>>),
}

/// Node blocks taken from NSM for one split cascade before it changes anything (module docs,
/// "Reservation"). Blocks not used are freed when it drops: nothing ever pointed to them.
pub(crate) struct NodeReserve<'t> {
    tree: &'t FastFair,
    nodes: Vec<PPtr>,
}

impl<'t> NodeReserve<'t> {
    /// Reserves what splitting a node at `level` can take: one node per level up to the
    /// current root's, and a new root. `OutOfSpace` (nothing reserved) if NSM cannot.
    pub(crate) fn for_split(tree: &'t FastFair, level: u32) -> Result<NodeReserve<'t>> {
        let root_level = tree.node(tree.root()?)?.level();
        let want = root_level.saturating_sub(level) as usize + 2;
        let mut r = NodeReserve { tree, nodes: Vec::with_capacity(want) };
        for _ in 0..want {
            r.nodes.push(tree.alloc_node()?); // on error, drop frees what was taken
        }
        Ok(r)
    }

    /// A reserved node, or a fresh one if the root grew since the reservation.
    fn take(&mut self) -> Result<PPtr> {
        match self.nodes.pop() {
            Some(p) => Ok(p),
            None => self.tree.alloc_node(),
        }
    }
}

impl Drop for NodeReserve<'_> {
    fn drop(&mut self) {
        for p in self.nodes.drain(..) {
            // SAFETY: `p` came from this tree's NSM and was never published (no pointer to it
            // was stored anywhere), so no thread can reach it.
            // A failure leaves the block allocated but unreachable: recovery's GC reclaims it.
            let _ = unsafe { numakv_pmem::alloc::PmAllocator::free(&*self.tree.nsm, p) };
        }
    }
}

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
        reserve: &mut NodeReserve<'_>,
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

        // Step 1 (the cascade's nodes were reserved first: out of space left A untouched).
        let b = reserve.take()?;
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
        // FAIR's window: B is durable and linked through A.sibling only; no parent names it.
        numakv_pmem::pause_point!("fastfair.split.linked");

        // Step 5. Out of space here (only if the root grew past the reservation) leaves B
        // linked only through A.sibling, which every reader and writer follows; recovery adds
        // the separator.
        match self.insert_separator(level + 1, sep, b, a.ptr, guard, reserve) {
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
        reserve: &mut NodeReserve<'_>,
    ) -> Result<()> {
        loop {
            let root_p = self.root()?;
            let root = self.node(root_p)?;
            if root.level() < level {
                if root_p != from {
                    // Our node is the old root's right sibling. Normally the old root's holder
                    // is installing the new root above it: wait. If nobody holds it (its
                    // install failed for lack of space), install it ourselves. A try-lock only:
                    // we hold a node to the right of the root.
                    if let Some(rg) = WriteGuard::try_lock(root, self.generation) {
                        let s = root.sibling();
                        if self.root()? == root_p && !s.is_null() {
                            let low = self.node(s)?.low();
                            self.insert_separator(level, low, s, root_p, guard, reserve)?;
                        }
                        drop(rg);
                    } else {
                        std::thread::yield_now();
                    }
                    continue;
                }
                // A root switch (this, or a shrink) happens only under the lock of the current
                // root, here `from`, held by the caller: the root cannot change under us.
                let r = reserve.take()?;
                self.init_node(r, level, from, 0, END, PPtr::NULL, &[(key, child.raw())])?;
                let slot = self.root_slot(layout::SLOT_ROOT)?;
                // ORDERING: Release; pairs with the Acquire in FastFair::root.
                slot.store(r.raw(), Ordering::Release);
                // PERSIST: the new root was persisted whole by init_node; the root pointer
                // switches in one durable 8-byte store.
                self.pool.persist_obj(slot);
                self.counters.root_splits.fetch_add(1, Ordering::Relaxed);
                return Ok(());
            }
            let Some(p) = self.descend(level, key, guard)? else {
                // The root shrank below `level` after we looked (it cannot go below `from`,
                // which has a sibling): decide again.
                self.retry();
                continue;
            };
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
                Err(_) => self.split_insert(&pg, key, child.raw(), guard, reserve),
            };
        }
    }

    /// Merges the right sibling R of the locked node `g` (C) into it when both fit in 3/4 of a
    /// node and their parent holds R's separator; see the module docs for the steps.
    pub(crate) fn merge_right<'a>(
        &'a self,
        g: &WriteGuard<'a>,
        guard: &Guard,
    ) -> Result<Merge<'a>> {
        let c = g.node();
        let level = c.level();
        let r_ptr = c.sibling();
        if r_ptr.is_null() || self.node(self.root()?)?.level() <= level {
            // No sibling, or C's level is the root's: a root split is still being installed
            // (checked before locking R: a thread installing a root may hold R and try-lock C).
            // The root cannot shrink to C's level while we hold C and C has a sibling, so the
            // check stays true until we unlock.
            return Ok(Merge::No);
        }
        let rg = WriteGuard::lock(self.node(r_ptr)?, self.generation);
        let r = rg.node();
        if r.is_dead() || r.low() != c.high() || r.level() != level {
            return Ok(Merge::No);
        }
        self.repair_entries(&rg)?;
        let (cu, ru) = (c.used(), r.used());
        // Internal nodes take one entry more: R's leftmost child.
        let add = if level == 0 { ru } else { ru + 1 };
        if cu + add > self.cap * 3 / 4 {
            return Ok(Merge::No);
        }
        let rlow = r.low();
        let Some(p) = self.descend(level + 1, rlow, guard)? else { return Ok(Merge::No) };
        let Some(pg) = self.lock_covering(p, rlow)? else { return Ok(Merge::No) };
        let pn = pg.node();
        let (pused, at) = self.locate(pn, rlow);
        let pos = match at {
            Ok(pos) if pn.val(pos) == r_ptr.raw() => pos,
            // ORDERING: Acquire, as every leftmost read (published before the node).
            Err(_)
                if pn.low() == rlow && pn.hdr.leftmost.load(Ordering::Acquire) == r_ptr.raw() =>
            {
                return Ok(Merge::OtherParent)
            }
            // R is an orphan (its split's separator insert is in flight), or P is corrupted.
            _ => return Ok(Merge::No),
        };
        let mut moved = Vec::with_capacity(add);
        if level > 0 {
            // ORDERING: Acquire; R is locked, its leftmost child does not change.
            moved.push((rlow, r.hdr.leftmost.load(Ordering::Acquire)));
        }
        moved.extend((0..ru).map(|i| (r.key(i), r.val(i))));

        // Step 1: append behind the terminator; the slot of the old terminator last, hidden
        // first, so that until then every reader still stops at C's old end.
        self.bump_switch(c);
        if let Some(&(k0, v0)) = moved.first() {
            for (i, &(k, v)) in moved.iter().enumerate().skip(1) {
                let s = &c.entries[cu + i];
                s.key.store(k, Ordering::Release);
                s.val.store(v, Ordering::Release);
            }
            c.entries[cu + moved.len()].key.store(END, Ordering::Release);
            // PERSIST: the tail and its new terminator are durable before the old terminator
            // is overwritten: a durable image never holds a node without an END slot (the
            // slots behind a terminator are garbage and may hold none).
            let from = c.slot_addr(cu + 1);
            let len = c.slot_addr(cu + moved.len()) as usize + 16 - from as usize;
            self.pool.persist(from, len);
            let s = &c.entries[cu];
            s.key.store(HIDDEN, Ordering::Release);
            s.val.store(v0, Ordering::Release);
            s.key.store(k0, Ordering::Release);
            // PERSIST: the appended entries are complete and durable before C's range covers
            // them (step 2).
            self.pool.persist(c.slot_addr(cu), 16);
        }

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
        drop(rg);
        // SAFETY: R came from this tree's NSM, is now unreachable from the root, the parent
        // and the sibling chain (steps 3 and 4), is retired exactly once (only the merger that
        // set DEAD gets here), and readers still inside it are protected by their epoch pin.
        unsafe { retire(&self.nsm, guard, r_ptr) };
        let counter =
            if level == 0 { &self.counters.merges } else { &self.counters.internal_merges };
        counter.fetch_add(1, Ordering::Relaxed);
        Ok(Merge::Done(pg))
    }

    /// The merge cascade from the locked node `g` (a node left with ≤ cap/4 entries): `g`
    /// absorbs its right sibling or, failing that, its left neighbour absorbs it; if that left
    /// the parent (still locked) with ≤ cap/4 entries, the parent goes through the same, and
    /// so on upward; a root left without entries shrinks. Locks are taken level ascending, left
    /// to right: to reach the left neighbour, `g` is released first.
    pub(crate) fn rebalance<'a>(&'a self, mut g: WriteGuard<'a>, guard: &Guard) -> Result<()> {
        loop {
            let pg = match self.absorb_right(&g, guard)? {
                Some(pg) => {
                    drop(g);
                    pg
                }
                None => {
                    let n = g.node();
                    let (level, low, ptr) = (n.level(), n.low(), n.ptr);
                    drop(g);
                    if low == 0 {
                        return Ok(()); // leftmost of its level
                    }
                    let Some(l) = self.descend(level, low - 1, guard)? else { return Ok(()) };
                    let Some(lg) = self.lock_covering(l, low - 1)? else { return Ok(()) };
                    if lg.node().sibling() != ptr {
                        return Ok(()); // changed meanwhile (split or merged away)
                    }
                    let Some(pg) = self.absorb_right(&lg, guard)? else { return Ok(()) };
                    drop(lg);
                    pg
                }
            };
            g = pg;
            let p = g.node();
            if p.used() == 0 && self.root()? == p.ptr {
                return self.shrink_root(g, Reclaim::Epoch(guard));
            }
            if p.used() > self.cap / 4 {
                return Ok(());
            }
        }
    }

    /// `g` absorbs its right sibling R ([`FastFair::merge_right`]); the parent, locked, if it
    /// did. When R's separator is in the right neighbour of `g`'s parent (R is its leftmost
    /// child), the two parents are merged first if they fit (a cascade one level up, `g` still
    /// locked: it locks only higher levels), then `g` and R are tried once more.
    fn absorb_right<'a>(
        &'a self,
        g: &WriteGuard<'a>,
        guard: &Guard,
    ) -> Result<Option<WriteGuard<'a>>> {
        match self.merge_right(g, guard)? {
            Merge::Done(pg) => Ok(Some(pg)),
            Merge::No => Ok(None),
            Merge::OtherParent => {
                let c = g.node();
                // In C's range (C has a sibling, so its high key is finite and above its low).
                let key = c.high() - 1;
                let Some(p) = self.descend(c.level() + 1, key, guard)? else { return Ok(None) };
                let Some(pg) = self.lock_covering(p, key)? else { return Ok(None) };
                self.rebalance(pg, guard)?;
                match self.merge_right(g, guard)? {
                    Merge::Done(pg) => Ok(Some(pg)),
                    Merge::OtherParent | Merge::No => Ok(None),
                }
            }
        }
    }

    /// Root shrink: while the locked `g` is the root, internal, without entries and without a
    /// sibling, and its only child X has no sibling, switches the root slot to X (one 8-byte
    /// store, persisted), marks the old root DEAD and frees it as `reclaim` says; then does the
    /// same with X.
    ///
    /// Why X must have no sibling: a sibling of X with no entry in the root is a split of X
    /// whose separator insert is in flight; its splitter (holding X) will put the separator
    /// into this root — or, if it finds the root switched to X, install a new root over X.
    /// Why no race with a root split: both switch the root slot only under the lock of the
    /// current root and after checking, under that lock, that it is the root.
    pub(crate) fn shrink_root<'a>(
        &'a self,
        mut g: WriteGuard<'a>,
        reclaim: Reclaim<'_>,
    ) -> Result<()> {
        loop {
            let r = g.node();
            if r.is_leaf()
                || r.is_dead()
                || r.used() != 0
                || !r.sibling().is_null()
                || self.root()? != r.ptr
            {
                return Ok(());
            }
            // ORDERING: Acquire, as every leftmost read.
            let x_ptr = PPtr::from_raw(r.hdr.leftmost.load(Ordering::Acquire));
            let x = self.node(x_ptr)?;
            if x.level() + 1 != r.level() {
                return Err(Error::corrupted(ENGINE, "child level is not parent level - 1"));
            }
            if !x.sibling().is_null() {
                return Ok(());
            }
            let slot = self.root_slot(layout::SLOT_ROOT)?;
            // ORDERING: Release; pairs with the Acquire in FastFair::root.
            slot.store(x_ptr.raw(), Ordering::Release);
            // PERSIST: the root switches in one durable 8-byte store; X was durable already
            // (it has been reachable as the root's child).
            self.pool.persist_obj(slot);
            // ORDERING: Release; a reader or writer that still reaches the old root restarts.
            r.hdr.flags.store(FLAG_DEAD, Ordering::Release);
            drop(g);
            match reclaim {
                // SAFETY: the old root came from this tree's NSM, is unreachable (the root slot
                // no longer names it and no node points to a root), and only the thread that
                // set DEAD under its lock retires it; pinned readers are protected.
                Reclaim::Epoch(guard) => unsafe { retire(&self.nsm, guard, r.ptr) },
                // SAFETY: as above, and no other thread can hold it: recovery runs before the
                // tree is handed out.
                Reclaim::Now => unsafe {
                    numakv_pmem::alloc::PmAllocator::free(&*self.nsm, r.ptr)?
                },
                Reclaim::Later(list) => list.borrow_mut().push(r.ptr),
            }
            self.counters.root_shrinks.fetch_add(1, Ordering::Relaxed);
            g = WriteGuard::lock(x, self.generation);
            self.repair_entries(&g)?;
        }
    }
}
