//! Structural modifications: the log-free split of Algorithm 4 (shadow sibling pointers and a
//! `sib_ver` flip), the propagation of a split to the parent (Algorithm 3 `recursive_insert`),
//! the growth of the first subindex below the height threshold (Algorithm 3 lines 26–29), the
//! synchronous insert of a split subindex root into every upper replica with the temporary list
//! (lines 14–22), and the rebuild of the upper layer (lines 10–13, §IV-C).
//!
//! # Split (node `N` locked, full)
//!
//! 1. Allocate `S` (NSM, round-robin) and write it completely: the upper half of `N`'s records
//!    (and the new record if it belongs there), `low` = the split key, `sib[0]` = `N`'s
//!    functional sibling; persist all of `S`. `S` is unreachable: a crash frees it by GC.
//! 2. Store `S` into `N`'s *non-functional* sibling pointer; persist. Still invisible.
//! 3. Flip `sib_ver` (one store to `state`); persist. **Commit**: `S` is now `N`'s sibling and
//!    `N`'s high key is `S.low`, so `N`'s moved records (keys ≥ `S.low`) are dead even though
//!    its slot word still lists them — readers route those keys right, scans cut at the high
//!    key, recovery trims them.
//! 4. Store the trimmed slot word; persist. The moved records' physical slots are free again.
//! 5. Insert the new record into `N` if it belongs left (ordinary insert).
//!
//! No step needs a log: before 3 the old node is intact, after 3 the new structure is complete.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use numakv_index::Result;
use numakv_pmem::alloc::epoch::{Guard, Owned};
use numakv_pmem::alloc::PmAllocator;
use numakv_pmem::PPtr;

use crate::bottom::{find, init_node, insert_record, Step};
use crate::layout::{
    self, sl_build, sl_count, sl_positions, st_sib_ver, st_with, NODE_SIZE, RECORDS,
};
use crate::lock::{ReadSnapshot, WriteGuard};
use crate::upper::{Upper, Writers};
use crate::Tree;

impl Tree {
    /// Splits the locked, full node of `g` and inserts `(key, val)` into the proper half.
    /// Returns the split key and the new right node. Nothing changes if allocation fails.
    pub(crate) fn split(&self, g: &WriteGuard<'_>, key: u64, val: u64) -> Result<(u64, PPtr)> {
        let n = g.node();
        let s = g.state();
        let w = n.slots();
        let (sib, high) = self.high_of(&n, s)?;
        let mine: Vec<(usize, u64, u64)> = sl_positions(w)
            .into_iter()
            .map(|p| (p, n.key(p), n.val(p)))
            .filter(|&(_, k, _)| k < high)
            .collect();
        let mut all: Vec<(u64, u64)> = mine.iter().map(|&(_, k, v)| (k, v)).collect();
        let at = all.partition_point(|&(k, _)| k < key);
        all.insert(at, (key, val));
        let level = n.level();
        let (sep, right, leftmost) = if level == 0 {
            let left = all.len().div_ceil(2);
            (all[left].0, all[left..].to_vec(), PPtr::NULL)
        } else {
            let m = all.len() / 2;
            (all[m].0, all[m + 1..].to_vec(), PPtr::from_raw(all[m].1))
        };
        // Step 1: the new node, complete and durable before anything points to it.
        let sp = self.nsm.alloc_on(NODE_SIZE, None)?;
        if let Err(e) = init_node(&self.pool, sp, level, leftmost, sep, sib, self.new_id(), &right)
        {
            // SAFETY: allocated just above and never linked.
            let _ = unsafe { self.nsm.free(sp) };
            return Err(e);
        }
        // Step 2: the shadow pointer.
        let v = st_sib_ver(s);
        let shadow = &n.hdr.sib[((v + 1) & 1) as usize];
        // ORDERING: Release; a reader that finds the pointer after the flip sees S's contents.
        shadow.store(sp.raw(), Ordering::Release);
        // PERSIST: the shadow pointer is durable before the flip makes it functional.
        self.pool.persist(n.hdr_addr(), 64);
        // Step 3: the flip (commit).
        let keep: Vec<usize> =
            mine.iter().filter(|&&(_, k, _)| k < sep).map(|&(p, _, _)| p).collect();
        g.set_state(st_with(s, keep.len() as u64, v + 1));
        // PERSIST: the flip is durable: S belongs to the structure from here on.
        self.pool.persist(n.hdr_addr(), 64);
        // Step 4: trim.
        // ORDERING: Release; version-validated readers see either slot word.
        n.hdr.slots.store(sl_build(&keep), Ordering::Release);
        // PERSIST: the trimmed slot word is durable before a freed slot is reused.
        self.pool.persist(n.hdr_addr(), 64);
        // Step 5.
        if key < sep {
            insert_record(&self.pool, g, key, val);
        }
        self.counters.splits.fetch_add(1, Ordering::Relaxed);
        Ok((sep, sp))
    }

    /// Algorithm 4's split branch for a leaf write: split, release, propagate.
    pub(crate) fn split_and_insert(
        &self,
        g: WriteGuard<'_>,
        key: u64,
        val: u64,
        path: &mut [PPtr],
        guard: &Guard,
    ) -> Result<()> {
        let level = g.node().level();
        let (sep, right) = self.split(&g, key, val)?;
        drop(g);
        self.link(level, sep, right, path, guard)
    }

    /// Makes the node `right` (at `level`, split key `sep`) known above it: a new subindex root
    /// goes to the upper layer; otherwise its separator goes into the parent, splitting upwards.
    /// Running out of space up here leaves `right` linked only by its left sibling (readers
    /// reach it; the next recovery links it): the write that caused the split has committed.
    pub(crate) fn link(
        &self,
        level: u32,
        sep: u64,
        right: PPtr,
        path: &mut [PPtr],
        guard: &Guard,
    ) -> Result<()> {
        match self.link_inner(level, sep, right, path, guard) {
            Err(e) if e.is_out_of_space() => {
                self.counters.orphans_deferred.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            r => r,
        }
    }

    fn link_inner(
        &self,
        mut level: u32,
        mut sep: u64,
        mut right: PPtr,
        path: &mut [PPtr],
        guard: &Guard,
    ) -> Result<()> {
        loop {
            if level >= self.top() {
                self.counters.subindex_splits.fetch_add(1, Ordering::Relaxed);
                self.upper_insert(sep, right);
                return Ok(());
            }
            let mut cand = path.get(level as usize + 1).copied().unwrap_or(PPtr::NULL);
            if cand.is_null() {
                if self.node(self.head()?)?.level() <= level {
                    self.grow_root(level)?;
                }
                let mut p2 = [PPtr::NULL; crate::bottom::MAX_PATH];
                cand = self.descend(sep, level + 1, &mut p2, guard)?.0;
            }
            let g = loop {
                let g = WriteGuard::lock(self.node(cand)?);
                match self.must_leave(&g.node(), g.state(), sep)? {
                    Some(Step::Restart) => {
                        drop(g);
                        let mut p2 = [PPtr::NULL; crate::bottom::MAX_PATH];
                        cand = self.descend(sep, level + 1, &mut p2, guard)?.0;
                    }
                    Some(Step::Right(s)) => cand = s,
                    None => break g,
                }
            };
            let n = g.node();
            let w = n.slots();
            if find(&n, w, sep).is_some() {
                // Already linked (a root growth adopted it, or recovery did).
                return Ok(());
            }
            if sl_count(w) < RECORDS {
                insert_record(&self.pool, &g, sep, right.raw());
                return Ok(());
            }
            let (s2, r2) = self.split(&g, sep, right.raw())?;
            drop(g);
            level += 1;
            sep = s2;
            right = r2;
        }
    }

    /// Whether the nodes of `level` have a parent level: the head (the first node of the
    /// highest level that exists) is above it. Monotone: the head only ever grows, so once
    /// true it stays true. False transiently between a split at the head's level and its
    /// `grow_root`, and for as long as a `grow_root` that ran out of space is not retried
    /// (the next split at that level retries it).
    pub(crate) fn has_parent_level(&self, level: u32) -> Result<bool> {
        Ok(self.node(self.head()?)?.level() > level)
    }

    /// Algorithm 3 lines 26–29: the first subindex is below the height threshold and its top
    /// level (the head's) has more than one node: a new root above them becomes the head.
    pub(crate) fn grow_root(&self, level: u32) -> Result<()> {
        let _g = self.grow_lock.lock();
        let head = self.head()?;
        if self.node(head)?.level() > level {
            return Ok(());
        }
        if numakv_pmem::fail_point!("nobtree.grow_root") {
            // As if the new root's allocation found the pool full.
            let requested = NODE_SIZE as u64;
            return Err(numakv_pmem::PoolError::OutOfSpace { node: 0, requested }.into());
        }
        let mut chain = Vec::new();
        let mut p = head;
        while !p.is_null() {
            let n = self.node(p)?;
            let snap = ReadSnapshot::begin(&n);
            let sib = n.sibling(snap.state);
            chain.push((n.low(), p));
            p = sib;
        }
        if chain.len() < 2 {
            return Ok(());
        }
        let recs: Vec<(u64, u64)> =
            chain[1..].iter().take(RECORDS).map(|&(low, p)| (low, p.raw())).collect();
        let r = self.nsm.alloc_on(NODE_SIZE, None)?;
        if let Err(e) =
            init_node(&self.pool, r, level + 1, head, 0, PPtr::NULL, self.new_id(), &recs)
        {
            // SAFETY: allocated just above and never linked.
            let _ = unsafe { self.nsm.free(r) };
            return Err(e);
        }
        let slot = self.pool.root(layout::SLOT_HEAD)?;
        // ORDERING: Release; pairs with the Acquire in `head()`: R's contents are visible.
        slot.store(r.raw(), Ordering::Release);
        // PERSIST: the new head is durable (R itself was persisted by init_node before).
        self.pool.persist_obj(slot);
        self.counters.grows.fetch_add(1, Ordering::Relaxed);
        let mut writers = self.upper_lock.lock();
        let guard = numakv_pmem::alloc::epoch::pin();
        // SAFETY: loaded under `guard` (see `upper_root`).
        let up = unsafe { self.upper.load(Ordering::Acquire, &guard).as_ref() };
        // Key 0 exists: this replaces the head entry in place, it cannot fail.
        writers.put(up, &self.pool, 0, r);
        Ok(())
    }

    /// Algorithm 3 lines 14–22: the new subindex root goes into every replica, or into the
    /// temporary list when its leaf is full.
    pub(crate) fn upper_insert(&self, sep: u64, root: PPtr) {
        let mut writers = self.upper_lock.lock();
        let guard = numakv_pmem::alloc::epoch::pin();
        // SAFETY: loaded under `guard` (see `upper_root`).
        let up = unsafe { self.upper.load(Ordering::Acquire, &guard).as_ref() };
        if !writers.put(up, &self.pool, sep, root) {
            self.counters.upper_insert_failed.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Algorithm 3 lines 10–13, after every insert: rebuild when the average walk along the
    /// root list exceeds the threshold — in the background (rebuild.rs: the inserting thread
    /// only requests it), or, with `background_rebuild: false`, inline by the one thread that
    /// wins `try_lock` while the others go on with the old layer. A rebuild that runs out of
    /// space is skipped (the old layer and the temporary list stay; the root list keeps lookups
    /// right).
    pub(crate) fn after_insert(&self, steps: u64) {
        self.walk.add(steps);
        if steps == 0 {
            return;
        }
        let (q, st) = self.walk.sum();
        if q < self.opts.rebuild_min_ops || (st as f64) <= self.opts.rebuild_threshold * q as f64 {
            return;
        }
        if let Some(r) = &self.rebuilder {
            r.request();
            return;
        }
        if let Some(_one) = self.rebuild_lock.try_lock() {
            let _ = self.rebuild_snapshot(false);
        }
    }

    /// Rebuilds the upper layer (one at a time; see [`Tree::rebuild_snapshot`]). With `force`
    /// false nothing is built while the temporary list is empty (the walk's average restarts
    /// instead: its steps came from roots between their commit and their upper insert).
    pub(crate) fn rebuild_upper(&self, force: bool) -> Result<bool> {
        let _one = self.rebuild_lock.lock();
        self.rebuild_snapshot(force)
    }

    /// Algorithm 3 `rebuild_upper` / §IV-C from a snapshot; the caller holds `rebuild_lock`.
    ///
    /// 1. Under the upper-layer mutex, for a moment: copy the temporary list and start the log
    ///    of writes (`Writers::since_snapshot`).
    /// 2. Without it: read replica 0 leaf by leaf under the leaves' versions
    ///    ([`Upper::snapshot`]), merge the copied list in, build the new replicas on every
    ///    node. Writers meanwhile insert new subindex roots and rewrite migrated ones in the
    ///    old replicas (readers see them at once) or its temporary list, and log them.
    /// 3. Under the mutex again, briefly: apply the log in order to the new replicas (a full
    ///    leaf sends an entry to the new temporary list), swap the descriptor, retire the old
    ///    replicas under the epoch, install the new temporary list.
    ///
    /// A write the snapshot already saw is applied again, which changes nothing: every logged
    /// write sets an entry (`key` names `root`), and the last one for a key wins either way.
    /// Returns whether a new layer was published; out of space leaves the old one (and stops
    /// the log).
    pub(crate) fn rebuild_snapshot(&self, force: bool) -> Result<bool> {
        let temp = {
            let mut w = self.upper_lock.lock();
            if w.temp.is_empty() && !force {
                self.walk.reset();
                return Ok(false);
            }
            w.since_snapshot = Some(Vec::new());
            w.temp.clone()
        };
        // Pinned only to read the snapshot, not through the build (which allocates on every
        // node): a pin held that long holds back every retired block of the tree (issue 36).
        let mut map: BTreeMap<u64, PPtr> = {
            let guard = numakv_pmem::alloc::epoch::pin();
            // SAFETY: loaded under `guard`; only a rebuild replaces it, and the caller's
            // `rebuild_lock` makes this the one.
            let old = unsafe { self.upper.load(Ordering::Acquire, &guard).as_ref() };
            old.map(|o| o.snapshot(&self.pool)).unwrap_or_default().into_iter().collect()
        };
        map.extend(temp);
        let entries: Vec<(u64, PPtr)> = map.into_iter().collect();
        numakv_pmem::pause_point!("nobtree.rebuild.snapshot");
        let built = Upper::build(&self.nsm, &self.pool, &entries);
        let guard = numakv_pmem::alloc::epoch::pin();
        let mut w = self.upper_lock.lock();
        let log = w.since_snapshot.take().unwrap_or_default();
        let new = built?;
        let mut fresh = Writers::default();
        fresh.apply(&new, &self.pool, log);
        // ORDERING: AcqRel; the Release publishes the built replicas (with the log applied)
        // to readers' Acquire load of the descriptor.
        let old = self.upper.swap(Owned::new(new), Ordering::AcqRel, &guard);
        // SAFETY: `old` is unreachable for new readers from here on; current readers are
        // pinned, and both the descriptor and its blocks are reclaimed only after they unpin.
        unsafe {
            if let Some(o) = old.as_ref() {
                for &p in &o.replicas {
                    self.retire_block(&guard, p);
                }
            }
            guard.defer_destroy(old);
        }
        w.temp = fresh.temp;
        drop(w);
        self.walk.reset();
        self.counters.rebuilds.fetch_add(1, Ordering::Relaxed);
        Ok(true)
    }
}

/// Merge (leaves and inner nodes below the subindex roots) — see docs/design.md "NOBtree",
/// "Merge".
impl Tree {
    /// After a delete (or a merge below) left few records in the node at `node`: merges its
    /// right sibling into it when both are sparse, then, if that left the parent sparse, merges
    /// the parent the same way (a cascade up to the level below the subindex roots). Returns
    /// whether it merged at the first level. Never merges subindex roots (the upper layer names
    /// them) or a right sibling that is its parent's leftmost child.
    pub(crate) fn try_merge(&self, node: PPtr, guard: &Guard) -> Result<bool> {
        let mut cur = node;
        let mut first = None;
        loop {
            let next = self.merge_once(cur, guard)?;
            first.get_or_insert(next.is_some());
            match next {
                Some((parent, left)) if left <= MERGE_TRIGGER => cur = parent,
                _ => return Ok(first.unwrap_or(false)),
            }
        }
    }

    /// One merge at `node`'s level. Returns the parent it removed a separator from and the
    /// records the parent kept, or `None` when it did not merge.
    ///
    /// Protocol (locks: the node `N`, its right sibling `R`, then their parent `P` — within a
    /// level left to right, then upwards. A merge is the only operation that holds more than
    /// one node lock: a split holds its node alone, and a migration holds one node lock at a
    /// time, for a moment, to set a freeze flag. So a thread waiting for a lock while holding
    /// one waits for a node right of it or a level up, and no cycle of waits can form. None
    /// of the three is waited for while frozen — [`WriteGuard::lock_unless_frozen`] gives
    /// up: the migration may be about to lock `N` (its previous sibling), and `N`'s and `R`'s
    /// readers would wait for the migration through this merge):
    /// 1. remove `R`'s separator from `P` (persist): `R` is now reached only through `N`'s
    ///    sibling pointer, like an orphan of a split; `P` is released;
    /// 2. copy `R`'s records into free slots of `N` — for an inner node first `(R.low,
    ///    R.leftmost)`, the separator that routed to `R`'s leftmost child — and list them in
    ///    `N`'s slot word (persist): they lie beyond `N`'s high key (`R.low`), so they are
    ///    invisible (a crash here: recovery trims them and re-links `R`);
    /// 3. store `R`'s functional sibling into `N`'s shadow pointer (persist), flip `sib_ver`
    ///    (persist) — the commit: `N` covers `R`'s range, `R` is unreachable;
    /// 4. mark `R` obsolete, unlock, retire `R` under the epoch (a writer that still holds `R`
    ///    in its path sees the flag and restarts from the upper layer).
    fn merge_once(&self, node: PPtr, guard: &Guard) -> Result<Option<(PPtr, usize)>> {
        // A node's level never changes: check it, and that the level has a parent level,
        // before taking any lock. Without a parent level (the young first subindex, a root
        // growth not yet run or failed for lack of space) the descent to `level + 1` below
        // would end on this very level's chain — on `N` or `R`, held by this thread — and spin
        // forever on its own lock.
        let level = self.node(node)?.level();
        if level >= self.top() || !self.has_parent_level(level)? {
            return Ok(None);
        }
        // All three nodes (`N`, `R`, then `P`) give up rather than wait for a migration that
        // froze one: it may be about to lock the left one (its previous sibling), and while
        // this thread holds `N` and `R` their readers wait (no reader may wait for a
        // migration, papers/nobtree.txt §III-D).
        let Some(ng) = WriteGuard::lock_unless_frozen(self.node(node)?) else {
            return Ok(None);
        };
        let n = ng.node();
        if n.is_obsolete() {
            return Ok(None);
        }
        let ns = ng.state();
        let rp = n.sibling(ns);
        if rp.is_null() {
            return Ok(None);
        }
        let Some(rg) = WriteGuard::lock_unless_frozen(self.node(rp)?) else {
            return Ok(None);
        };
        let r = rg.node();
        if r.is_obsolete() || r.level() != level {
            return Ok(None);
        }
        let nw = n.slots();
        let rw = r.slots();
        let rs = rg.state();
        let (rsib, rhigh) = self.high_of(&r, rs)?;
        let rlow = r.low();
        let mut rrecs: Vec<(u64, u64)> = Vec::with_capacity(RECORDS + 1);
        if level > 0 {
            rrecs.push((rlow, r.leftmost().raw()));
        }
        rrecs.extend(r.records(rw).into_iter().filter(|&(k, _)| k < rhigh));
        if sl_count(nw) + rrecs.len() > MERGE_MAX {
            return Ok(None);
        }
        let mut path = [PPtr::NULL; crate::bottom::MAX_PATH];
        let (mut pp, _) = self.descend(rlow, level + 1, &mut path, guard)?;
        let pg = loop {
            // The parent too: a merge holding `N` and `R` (which their readers wait for) must
            // not wait for a migration that froze `P` (one of `P`'s other children is moving;
            // it may stay frozen for as long as the copy takes). Giving up leaves a sparse
            // node, which the next delete there merges (issue 36).
            let Some(g) = WriteGuard::lock_unless_frozen(self.node(pp)?) else {
                return Ok(None);
            };
            match self.must_leave(&g.node(), g.state(), rlow)? {
                Some(Step::Right(s)) => pp = s,
                Some(Step::Restart) => return Ok(None),
                None => break g,
            }
        };
        let p = pg.node();
        if p.level() != level + 1 {
            return Ok(None); // cannot happen: the parent level existed before the locks
        }
        let pw = p.slots();
        let Some(q) = find(&p, pw, rlow).filter(|&q| p.val(q) == rp.raw()) else {
            return Ok(None); // the parent's leftmost child, or an orphan: not merged
        };
        // Step 1.
        let ppos: Vec<usize> = sl_positions(pw).into_iter().filter(|&x| x != q).collect();
        // ORDERING: Release; version-validated readers see either slot word.
        p.hdr.slots.store(sl_build(&ppos), Ordering::Release);
        let ps = pg.state();
        pg.set_state(st_with(ps, ppos.len() as u64, st_sib_ver(ps)));
        // PERSIST: the separator is gone before the sibling's records move.
        self.pool.persist(p.hdr_addr(), 64);
        drop(pg);
        // Step 2.
        let mut pos = sl_positions(nw);
        let mut used: u16 = pos.iter().fold(0, |a, &x| a | (1 << x));
        for &(k, v) in &rrecs {
            let Some(free) = (0..RECORDS).find(|&x| used & (1 << x) == 0) else {
                return Ok(None); // cannot happen: counted above
            };
            used |= 1 << free;
            n.recs[free].key.store(k, Ordering::Relaxed);
            n.recs[free].val.store(v, Ordering::Relaxed);
            pos.push(free);
            // PERSIST (batched below): the copied records.
            self.pool.flush(n.rec_addr(free), 16);
        }
        self.pool.fence();
        // ORDERING: Release; the listed records (beyond the high key for now) are published.
        n.hdr.slots.store(sl_build(&pos), Ordering::Release);
        // PERSIST: the copies are durable (fence above) and listed before the flip.
        self.pool.persist(n.hdr_addr(), 64);
        // Step 3.
        let v = st_sib_ver(ns);
        n.hdr.sib[((v + 1) & 1) as usize].store(rsib.raw(), Ordering::Release);
        // PERSIST: the shadow pointer before the flip.
        self.pool.persist(n.hdr_addr(), 64);
        ng.set_state(st_with(ns, pos.len() as u64, v + 1));
        // PERSIST: the flip (commit): the sibling is unlinked.
        self.pool.persist(n.hdr_addr(), 64);
        // Step 4.
        r.hdr.meta.store(layout::meta_word(level, layout::FLAG_OBSOLETE), Ordering::Release);
        drop(rg);
        drop(ng);
        // SAFETY: `rp` is unreachable (no parent entry, no sibling pointer) and marked obsolete
        // for threads holding it; retired once, after the grace period.
        unsafe { self.retire_block(guard, rp) };
        self.counters.merges.fetch_add(1, Ordering::Relaxed);
        if level > 0 {
            self.counters.inner_merges.fetch_add(1, Ordering::Relaxed);
        }
        Ok(Some((pp, ppos.len())))
    }
}

/// Most records a merged node may hold (room is left for inserts before it splits again).
const MERGE_MAX: usize = 8;
/// A delete that leaves at most this many records tries a merge.
pub(crate) const MERGE_TRIGGER: usize = 2;
