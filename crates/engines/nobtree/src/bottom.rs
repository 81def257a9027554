//! Bottom-layer operations that do not change the structure: lookup (Algorithm 2), the
//! in-node insert of Algorithm 4 (the non-splitting branch), update in place, delete.
//!
//! Every operation first asks the local upper-layer replica for a subindex root, walks the root
//! list to the right while the key is at or beyond the next root's `low` (Algorithm 2 lines
//! 4–6, counted as Algorithm 3's `goes_step`), then descends. At every node it moves right while
//! the key is at or beyond the functional sibling's `low` (a split it has not seen yet), and a
//! node marked obsolete (migrated away) restarts the operation from the upper layer.

use std::sync::atomic::Ordering;

use numakv_index::Result;
use numakv_pmem::alloc::epoch::Guard;
use numakv_pmem::{PPtr, Pool};

use crate::layout::{
    meta_word, sl_build, sl_count, sl_free, sl_index_of, sl_insert, sl_pos, sl_remove, st_counter,
    st_sib_ver, st_with, Node, END, NODE_SIZE, RECORDS, VERSION_ONE,
};
use crate::lock::{ReadSnapshot, WriteGuard};
use crate::{Tree, WriteKind};

/// Writes a complete node at `p` and persists it (a node is unreachable until linked, so the
/// whole node is durable before any pointer to it is).
#[allow(clippy::too_many_arguments)]
pub(crate) fn init_node(
    pool: &Pool,
    p: PPtr,
    level: u32,
    leftmost: PPtr,
    low: u64,
    sibling: PPtr,
    id: u64,
    records: &[(u64, u64)],
) -> Result<()> {
    let n = Node::resolve(pool, p)?;
    debug_assert!(records.len() <= RECORDS);
    for (i, &(k, v)) in records.iter().enumerate() {
        n.recs[i].key.store(k, Ordering::Relaxed);
        n.recs[i].val.store(v, Ordering::Relaxed);
    }
    let h = n.hdr;
    h.state.store(st_with(0, records.len() as u64, 0), Ordering::Relaxed);
    h.leftmost.store(leftmost.raw(), Ordering::Relaxed);
    h.slots.store(sl_build(&(0..records.len()).collect::<Vec<_>>()), Ordering::Relaxed);
    h.sib[0].store(sibling.raw(), Ordering::Relaxed);
    h.sib[1].store(0, Ordering::Relaxed);
    h.low.store(low, Ordering::Relaxed);
    h.id.store(id, Ordering::Relaxed);
    // ORDERING: Release; the node's words are visible to whoever later loads `meta` (and the
    // pointer that links the node is itself a Release store, after this).
    h.meta.store(meta_word(level, 0), Ordering::Release);
    // PERSIST: the whole node (4 lines) is durable before the caller links it.
    pool.persist(n.hdr_addr(), NODE_SIZE);
    Ok(())
}

/// Entries of a descent's path: one per level, the height threshold is at most 8.
pub(crate) const MAX_PATH: usize = 9;

/// A descent's path (`path[l]` = the node visited at level `l`, or null), on the stack: no
/// operation allocates one on the heap.
pub(crate) type Path = [PPtr; MAX_PATH];

/// What an optimistic visit of a node found.
pub(crate) enum Step {
    /// The key lies to the right: continue at this sibling.
    Right(PPtr),
    /// The node was migrated away: restart from the upper layer.
    Restart,
}

impl Tree {
    /// A fresh node id.
    pub(crate) fn new_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// The high key of a node for state `s`: the functional sibling's `low`, or +inf.
    #[inline]
    pub(crate) fn high_of(&self, n: &Node<'_>, s: u64) -> Result<(PPtr, u64)> {
        let sib = n.sibling(s);
        if sib.is_null() {
            return Ok((sib, END));
        }
        Ok((sib, self.node(sib)?.low()))
    }

    /// Whether `key` belongs right of `n` (state `s`), or `n` is obsolete.
    #[inline]
    pub(crate) fn must_leave(&self, n: &Node<'_>, s: u64, key: u64) -> Result<Option<Step>> {
        if n.is_obsolete() {
            return Ok(Some(Step::Restart));
        }
        let (sib, high) = self.high_of(n, s)?;
        Ok((key >= high).then_some(Step::Right(sib)))
    }

    /// Algorithm 2 lines 2–3: the subindex root for `key` from the local replica (the head
    /// without a layer). The walk along the root list (lines 4–6) is the descent's own
    /// move-right at the top level ([`Tree::descend_snap`]), so no root is visited twice.
    #[inline]
    pub(crate) fn upper_root(&self, key: u64, guard: &Guard) -> Result<PPtr> {
        // SAFETY: loaded under `guard`; a replaced descriptor is destroyed only after every
        // guard pinned before the swap is gone (the rebuild defers it).
        let up = unsafe { self.upper.load(Ordering::Acquire, guard).as_ref() };
        match up {
            Some(u) => Ok(u.lookup(&self.pool, numakv_pmem::numa::current_node(), key)),
            None => self.head(),
        }
    }

    /// Descends from the upper layer to the node of `level` covering `key`, recording the
    /// visited node of every level above in `path` (`path[l]` = node at level `l`, or null).
    /// Returns the node and the steps walked along the root list. Without a node of `level`
    /// (the young first subindex is lower) it returns the head.
    pub(crate) fn descend(
        &self,
        key: u64,
        level: u32,
        path: &mut Path,
        guard: &Guard,
    ) -> Result<(PPtr, u64)> {
        self.descend_snap(key, level, path, guard).map(|(p, steps, _)| (p, steps))
    }

    /// [`Tree::descend`], also returning the snapshot under which the returned node was found
    /// to cover `key` (not obsolete, `key` below its high key): a reader that validates it
    /// after reading the node need not visit the node's header (and its sibling's) again.
    ///
    /// Each node is visited once: one snapshot, one look at the functional sibling's `low`,
    /// one routing step, one validation. Moves right at the level the upper layer's root
    /// was found on are Algorithm 2's walk along the root list (lines 4–6) and are counted
    /// as Algorithm 3's `goes_step`.
    pub(crate) fn descend_snap(
        &self,
        key: u64,
        level: u32,
        path: &mut Path,
        guard: &Guard,
    ) -> Result<(PPtr, u64, ReadSnapshot)> {
        'restart: loop {
            path.fill(PPtr::NULL);
            let mut cur = self.upper_root(key, guard)?;
            let mut steps = 0;
            // Still on the root list (no step down yet).
            let mut on_roots = true;
            loop {
                let n = self.node(cur)?;
                let snap = ReadSnapshot::begin(&n);
                let lv = n.level();
                if on_roots && lv < level {
                    // A stale entry below the wanted level (the first subindex grew since
                    // the layer named it): start again from the head, whatever its level.
                    on_roots = false;
                    cur = self.head()?;
                    continue;
                }
                match self.must_leave(&n, snap.state, key)? {
                    Some(Step::Restart) => {
                        self.retry();
                        continue 'restart;
                    }
                    Some(Step::Right(s)) => {
                        if on_roots {
                            steps += 1;
                        }
                        cur = s;
                        continue;
                    }
                    None => {}
                }
                if lv <= level {
                    return Ok((cur, steps, snap));
                }
                let child = route(&n, n.slots(), key);
                if !snap.validate(&n) {
                    self.retry();
                    continue;
                }
                if let Some(slot) = path.get_mut(lv as usize) {
                    *slot = cur;
                }
                on_roots = false;
                cur = child;
            }
        }
    }

    /// Counts a sampled access to the leaf `n` (and, from `path`, the inner nodes of its
    /// descent) for the migration coordinator (every `sample_every`-th access of the thread).
    /// Caller is pinned.
    #[inline]
    pub(crate) fn sample(&self, n: &Node<'_>, path: &[PPtr]) {
        if let Some(m) = &self.migrator {
            m.sample(&self.pool, n, n.ptr, path, &self.next_id);
        }
    }

    /// Algorithm 2 `Lookup`.
    pub(crate) fn lookup(&self, key: u64, guard: &Guard) -> Result<Option<u64>> {
        let mut path = [PPtr::NULL; crate::bottom::MAX_PATH];
        'restart: loop {
            // The leaf with the snapshot under which the descent checked it: valid unless the
            // leaf changed since, which the validation below detects.
            let (mut cur, _, mut snap) = self.descend_snap(key, 0, &mut path, guard)?;
            loop {
                let n = self.node(cur)?;
                let w = n.slots();
                let found = find(&n, w, key).map(|p| n.val(p));
                if snap.validate(&n) {
                    self.sample(&n, &path);
                    return Ok(found);
                }
                self.retry();
                // The leaf changed: check it again (it may have split or been migrated).
                loop {
                    let n = self.node(cur)?;
                    snap = ReadSnapshot::begin(&n);
                    match self.must_leave(&n, snap.state, key)? {
                        Some(Step::Restart) => continue 'restart,
                        Some(Step::Right(s)) => cur = s,
                        None => break,
                    }
                }
            }
        }
    }

    /// Locks the leaf covering `key` (moving right under locks, restarting on obsolete nodes).
    pub(crate) fn lock_leaf<'a>(
        &'a self,
        key: u64,
        path: &mut Path,
        guard: &Guard,
        steps_out: &mut u64,
    ) -> Result<WriteGuard<'a>> {
        'restart: loop {
            let (mut cur, steps, snap) = self.descend_snap(key, 0, path, guard)?;
            *steps_out = steps;
            // The state the descent saw the leaf covering `key` in, as it reads once locked
            // by this thread (the version one up, odd).
            let mut seen = snap.state.wrapping_add(VERSION_ONE);
            loop {
                let g = WriteGuard::lock(self.node(cur)?);
                // Unchanged since the descent checked it (same version, so the same functional
                // sibling and high key) and not migrated away (OBSOLETE lives in `meta`, which
                // the version does not cover): no second look at the sibling's `low`.
                if g.state() == seen && !g.node().is_obsolete() {
                    return Ok(g);
                }
                seen = 0; // an odd state never equals 0: check fully from here on
                match self.must_leave(&g.node(), g.state(), key)? {
                    Some(Step::Restart) => continue 'restart,
                    Some(Step::Right(s)) => {
                        cur = s;
                        continue;
                    }
                    None => return Ok(g),
                }
            }
        }
    }

    /// Insert / upsert / update (Algorithm 3 `Insert` with Algorithm 4 `store` at the leaf).
    pub(crate) fn write(&self, key: u64, val: u64, kind: WriteKind) -> Result<bool> {
        let guard = numakv_pmem::alloc::epoch::pin();
        let mut path = [PPtr::NULL; crate::bottom::MAX_PATH];
        let mut steps = 0;
        let g = self.lock_leaf(key, &mut path, &guard, &mut steps)?;
        let n = g.node();
        let w = n.slots();
        let res = match find(&n, w, key) {
            Some(p) => {
                if kind == WriteKind::Insert {
                    false
                } else {
                    // ORDERING: Release; readers validate by version anyway.
                    n.recs[p].val.store(val, Ordering::Release);
                    // PERSIST: the new value (one failure-atomic word) is durable before the
                    // call returns.
                    self.pool.persist(n.rec_addr(p), 16);
                    true
                }
            }
            None if kind == WriteKind::Update => false,
            None if sl_count(w) < RECORDS => {
                insert_record(&self.pool, &g, key, val);
                true
            }
            None => {
                // Full: Algorithm 4's split branch (smo.rs); releases the leaf.
                self.split_and_insert(g, key, val, &mut path, &guard)?;
                self.after_insert(steps);
                return Ok(true);
            }
        };
        drop(g);
        // After the unlock: the statistics cost nothing to the node's other writers (the node
        // stays readable: this thread is pinned).
        self.sample(&n, &path);
        if kind != WriteKind::Update {
            self.after_insert(steps);
        }
        Ok(res)
    }

    /// Removes `key` from its leaf: one slot-word store takes it out of the logical order.
    pub(crate) fn delete(&self, key: u64) -> Result<bool> {
        let guard = numakv_pmem::alloc::epoch::pin();
        let mut path = [PPtr::NULL; crate::bottom::MAX_PATH];
        let mut steps = 0;
        let g = self.lock_leaf(key, &mut path, &guard, &mut steps)?;
        let n = g.node();
        let w = n.slots();
        let Some(p) = find(&n, w, key) else {
            drop(g);
            self.sample(&n, &path);
            return Ok(false);
        };
        let Some(i) = sl_index_of(w, p) else {
            return Ok(false); // cannot happen: `find` returned a listed slot
        };
        let nw = sl_remove(w, i);
        // ORDERING: Release; the new logical order is published at once (version-validated).
        n.hdr.slots.store(nw, Ordering::Release);
        let s = g.state();
        let left = sl_count(nw);
        g.set_state(st_with(s, left as u64, st_sib_ver(s)));
        // PERSIST: the shorter slot word is durable before the call returns; the record's bytes
        // stay as garbage in a now-free slot.
        self.pool.persist(n.hdr_addr(), 64);
        let leaf = n.ptr;
        drop(g);
        // A delete is a leaf access too (the paper monitors all of them); sampled after the
        // unlock, before a merge may retire the leaf (this thread is pinned either way).
        self.sample(&n, &path);
        if left <= crate::smo::MERGE_TRIGGER {
            // The delete is durable; a merge that fails (out of space cannot happen: it
            // allocates nothing) or aborts leaves a valid tree.
            let _ = self.try_merge(leaf, &guard);
        }
        Ok(true)
    }
}

/// The physical slot holding `key` in a leaf with slot word `w` (binary search over the
/// logical order).
#[inline]
pub(crate) fn find(n: &Node<'_>, w: u64, key: u64) -> Option<usize> {
    let (mut lo, mut hi) = (0usize, sl_count(w).min(RECORDS));
    while lo < hi {
        let mid = (lo + hi) / 2;
        let p = sl_pos(w, mid);
        let k = n.key(p);
        if k == key {
            return Some(p);
        }
        if k < key {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    None
}

/// Algorithm 2 `get_child` in an inner node: the child of the last record whose key is ≤
/// `key`, or `leftmost`.
#[inline]
pub(crate) fn route(n: &Node<'_>, w: u64, key: u64) -> PPtr {
    let (mut lo, mut hi) = (0usize, sl_count(w).min(RECORDS));
    // Number of records with key ≤ `key`.
    while lo < hi {
        let mid = (lo + hi) / 2;
        if n.key(sl_pos(w, mid)) <= key {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    if lo == 0 {
        n.leftmost()
    } else {
        PPtr::from_raw(n.val(sl_pos(w, lo - 1)))
    }
}

/// Algorithm 4's non-splitting branch: the record goes into a free physical slot, then one
/// slot-word store inserts its position into the logical order. Caller holds the node, which
/// has a free slot.
pub(crate) fn insert_record(pool: &Pool, g: &WriteGuard<'_>, key: u64, val: u64) {
    let n = g.node();
    let w = n.slots();
    let Some(p) = sl_free(w) else {
        debug_assert!(false, "insert_record on a full node");
        return;
    };
    n.recs[p].key.store(key, Ordering::Relaxed);
    n.recs[p].val.store(val, Ordering::Relaxed);
    // PERSIST: the record is durable in its (unlisted) slot before the slot word lists it.
    pool.persist(n.rec_addr(p), 16);
    // The logical index of the first record with a larger key (binary search).
    let (mut lo, mut hi) = (0, sl_count(w).min(RECORDS));
    while lo < hi {
        let mid = (lo + hi) / 2;
        if n.key(sl_pos(w, mid)) < key {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    let nw = sl_insert(w, lo, p);
    // ORDERING: Release; a reader that sees the new slot word sees the record.
    n.hdr.slots.store(nw, Ordering::Release);
    let s = g.state();
    g.set_state(st_with(s, sl_count(nw) as u64, st_sib_ver(s)));
    // PERSIST: the slot word (the commit point) is durable before the call returns.
    pool.persist(n.hdr_addr(), 64);
}

/// `counter` mirror check helper for check.rs.
pub(crate) fn counter_matches(n: &Node<'_>) -> bool {
    st_counter(n.state()) as usize == sl_count(n.slots())
}
