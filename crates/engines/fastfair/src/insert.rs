//! FAST insert: the failure-atomic right shift, and the leaf write path (insert, upsert, update).
//!
//! Store order of a right shift that inserts `(K, V)` at slot `p` of a node with `n` entries
//! (terminator at `n`, `n + 1 < slots`), all stores Release:
//!
//! ```text
//! 1. key[n+1] = END                               new terminator first
//! 2. for i = n-1 down to p:                       move entry i to slot i+1
//!        key[i+1] = HIDDEN; val[i+1] = val[i]; key[i+1] = key[i]
//! 3. key[p] = HIDDEN; val[p] = V; key[p] = K      the new entry
//! ```
//!
//! Before the first store to a cache line other than the previous store's line, the previous
//! line is flushed and fenced (ADR); the last line is persisted at the end. So the durable image
//! is always a prefix of this store order, i.e. a state a concurrent reader may see. The argument
//! that ascending readers never miss a stable key nor pair a key with another key's value is in
//! docs/design.md, "FAST&FAIR".

use std::sync::atomic::Ordering;

use numakv_index::{Error, Result};
use numakv_pmem::alloc::epoch;

use crate::layout::{Node, END, ENGINE, HIDDEN};
use crate::lock::WriteGuard;
use crate::smo::NodeReserve;
use crate::{FastFair, WriteKind};

/// Flushes a node's lines in the order a shift dirties them: when the shift moves on to another
/// line, the previous one is flushed and fenced first.
pub(crate) struct LineFlusher<'a> {
    tree: &'a FastFair,
    line: Option<usize>,
}

impl<'a> LineFlusher<'a> {
    pub(crate) fn new(tree: &'a FastFair) -> Self {
        LineFlusher { tree, line: None }
    }

    /// Announces a store to the line of `addr`.
    #[inline]
    pub(crate) fn touch(&mut self, addr: *const u8) {
        let line = addr as usize & !63;
        if let Some(prev) = self.line {
            if prev != line {
                // PERSIST: every earlier store of the shift (all in line `prev`, or in lines
                // already persisted) is durable before the first store to the next line.
                self.tree.pool.persist(prev as *const u8, 64);
            }
        }
        self.line = Some(line);
    }

    /// Persists the last line.
    pub(crate) fn finish(self) {
        if let Some(line) = self.line {
            // PERSIST: the shift is complete and durable before the operation returns.
            self.tree.pool.persist(line as *const u8, 64);
        }
    }
}

impl FastFair {
    /// Sets the switch counter's direction bit before a shift: `desc` = leftward (delete).
    #[inline]
    pub(crate) fn set_direction(&self, node: Node<'_>, desc: bool) {
        let c = node.hdr.switch.load(Ordering::Relaxed);
        if (c & 1 == 1) != desc {
            // ORDERING: Relaxed suffices: every shift store after it is Release, so a reader
            // that observes any of them (Acquire) also observes the new counter.
            node.hdr.switch.store(c + 1, Ordering::Relaxed);
        }
    }

    /// Marks the start of a structural change (split truncation, merge append): +2 keeps the
    /// direction and makes readers that straddle it retry.
    #[inline]
    pub(crate) fn bump_switch(&self, node: Node<'_>) {
        let c = node.hdr.switch.load(Ordering::Relaxed);
        // ORDERING: as in `set_direction`.
        node.hdr.switch.store(c.wrapping_add(2), Ordering::Relaxed);
    }

    /// The FAST right shift: inserts `(key, val)` at slot `pos` of a locked node with `used`
    /// entries (`used < cap`). See the module docs for the store order.
    pub(crate) fn shift_insert(&self, node: Node<'_>, pos: usize, used: usize, key: u64, val: u64) {
        debug_assert!(used < self.cap && pos <= used);
        self.set_direction(node, false);
        let e = node.entries;
        let mut fl = LineFlusher::new(self);
        fl.touch(node.slot_addr(used + 1));
        e[used + 1].key.store(END, Ordering::Release);
        for i in (pos..used).rev() {
            fl.touch(node.slot_addr(i + 1));
            let (k, v) = (node.key(i), node.val(i));
            e[i + 1].key.store(HIDDEN, Ordering::Release);
            e[i + 1].val.store(v, Ordering::Release);
            e[i + 1].key.store(k, Ordering::Release);
        }
        fl.touch(node.slot_addr(pos));
        e[pos].key.store(HIDDEN, Ordering::Release);
        e[pos].val.store(val, Ordering::Release);
        e[pos].key.store(key, Ordering::Release);
        fl.finish();
    }

    /// Entries of a locked, repaired node: `used` and the slot of `key` (`Ok`) or where it
    /// would go (`Err`).
    pub(crate) fn locate(
        &self,
        node: Node<'_>,
        key: u64,
    ) -> (usize, std::result::Result<usize, usize>) {
        let used = node.used();
        for i in 0..used {
            let k = node.key(i);
            if k == key {
                return (used, Ok(i));
            }
            if k > key {
                return (used, Err(i));
            }
        }
        (used, Err(used))
    }

    /// Locks the node at `level` covering `key`, starting from `node` (found by a lock-free
    /// descent) and moving right while `key ≥ high`. Repairs every node it locks (before
    /// looking at its high key: the repair may lower it). `None` when a node on the way was
    /// merged away: restart from the root.
    pub(crate) fn lock_covering<'a>(
        &'a self,
        mut node: Node<'a>,
        key: u64,
    ) -> Result<Option<WriteGuard<'a>>> {
        loop {
            let g = WriteGuard::lock(node, self.generation);
            if node.is_dead() {
                return Ok(None);
            }
            self.repair_entries(&g)?;
            if key >= node.high() {
                let next = node.sibling();
                if next.is_null() {
                    return Err(Error::corrupted(
                        ENGINE,
                        "node with a finite high key has no sibling",
                    ));
                }
                drop(g);
                node = self.node(next)?;
                continue;
            }
            return Ok(Some(g));
        }
    }

    /// Locks the leaf covering `key`, restarting the descent when a merge removed a node on
    /// the way.
    pub(crate) fn lock_leaf<'a>(
        &'a self,
        key: u64,
        guard: &epoch::Guard,
    ) -> Result<WriteGuard<'a>> {
        loop {
            let leaf = self.leaf_for(key, guard)?;
            // Window: the leaf is found, not yet locked; it may split or die meanwhile.
            numakv_pmem::pause_point!("fastfair.write.leaf_found");
            match self.lock_covering(leaf, key)? {
                Some(g) => return Ok(g),
                None => self.retry(),
            }
        }
    }

    /// insert / upsert / update of a leaf entry.
    pub(crate) fn write(&self, key: u64, val: u64, kind: WriteKind) -> Result<bool> {
        let guard = epoch::pin();
        let g = self.lock_leaf(key, &guard)?;
        self.write_locked(&g, key, val, kind, &guard)
    }

    /// [`Index::update_with`](numakv_index::Index::update_with): under the lock of the leaf
    /// covering `key`, `f` sees the value and may replace it.
    pub(crate) fn update_locked_with(
        &self,
        key: u64,
        f: &mut dyn FnMut(u64) -> Result<Option<u64>>,
    ) -> Result<Option<u64>> {
        let guard = epoch::pin();
        let g = self.lock_leaf(key, &guard)?;
        let node = g.node();
        let (_, at) = self.locate(node, key);
        let Ok(i) = at else { return Ok(None) };
        // ORDERING: Acquire, as a reader of the entry; under the leaf lock nobody stores to it.
        let old = node.entries[i].val.load(Ordering::Acquire);
        if let Some(new) = f(old)? {
            // An 8-byte store: readers see the old or the new value, never a mix.
            node.entries[i].val.store(new, Ordering::Release);
            // PERSIST: the new value is durable before the operation returns.
            self.pool.persist(node.slot_addr(i), 16);
        }
        Ok(Some(old))
    }

    /// Locks `leaf` if it is alive and covers `key` (`low ≤ key < high`, after repairing it);
    /// `None` otherwise (the caller descends from the root). A live node's `low` never changes
    /// (splits move the upper half to a new node, merges move the right node into the left),
    /// so under its lock the range test is exactly what a descent would establish.
    pub(crate) fn lock_if_covers<'a>(
        &'a self,
        leaf: Node<'a>,
        key: u64,
    ) -> Result<Option<WriteGuard<'a>>> {
        // A look at the header first (one line, no lock, no repair): most misses end here.
        if leaf.level() != 0 || leaf.is_dead() || !(leaf.low() <= key && key < leaf.high()) {
            return Ok(None);
        }
        let g = WriteGuard::lock(leaf, self.generation);
        if leaf.is_dead() {
            return Ok(None);
        }
        self.repair_entries(&g)?;
        Ok((leaf.low() <= key && key < leaf.high()).then_some(g))
    }

    /// The leaf write of `key` in the locked leaf `g`, which covers it.
    pub(crate) fn write_locked(
        &self,
        g: &WriteGuard<'_>,
        key: u64,
        val: u64,
        kind: WriteKind,
        guard: &epoch::Guard,
    ) -> Result<bool> {
        let node = g.node();
        let (used, at) = self.locate(node, key);
        match (at, kind) {
            (Ok(_), WriteKind::Insert) => Ok(false),
            (Ok(i), _) => {
                // An 8-byte store: readers see the old or the new value, never a mix.
                node.entries[i].val.store(val, Ordering::Release);
                // PERSIST: the new value is durable before the operation returns.
                self.pool.persist(node.slot_addr(i), 16);
                Ok(true)
            }
            (Err(_), WriteKind::Update) => Ok(false),
            (Err(pos), _) if used < self.cap => {
                self.shift_insert(node, pos, used, key, val);
                Ok(true)
            }
            (Err(_), _) => {
                let mut reserve = NodeReserve::for_split(self, node.level())?;
                self.split_insert(g, key, val, guard, &mut reserve)?;
                Ok(true)
            }
        }
    }

    /// A writer for a run of keys in ascending order (node-based batching, papers/f3tree.txt
    /// F3-N): see [`LeafCursor`].
    pub fn leaf_cursor(&self) -> LeafCursor<'_> {
        LeafCursor { tree: self, guard: epoch::pin(), leaf: None, hits: 0, descents: 0 }
    }
}

/// Writes keys starting from the leaf the previous write used, when that leaf still covers the
/// key, instead of descending from the root: for a batch sorted by key, every run of keys that
/// falls into one leaf costs one descent. Each write is exactly an [`Index::upsert`] otherwise —
/// same leaf write path, same shifts, splits and persistence — so FAST&FAIR's crash states are
/// unchanged; only how the leaf is found differs. Any key order is correct (a leaf that does not
/// cover the key is passed over for a descent); ascending order is what makes the leaf reusable.
///
/// The cursor holds an epoch guard, so the remembered leaf's memory stays valid (a merge frees
/// nodes only after the grace period); keep it for one batch, not for long.
///
/// [`Index::upsert`]: numakv_index::Index::upsert
#[derive(Debug)]
pub struct LeafCursor<'t> {
    tree: &'t FastFair,
    guard: epoch::Guard,
    leaf: Option<numakv_pmem::PPtr>,
    hits: u64,
    descents: u64,
}

impl LeafCursor<'_> {
    /// Inserts or overwrites `key` (as [`Index::upsert`](numakv_index::Index::upsert)).
    pub fn upsert(&mut self, key: u64, val: u64) -> Result<()> {
        numakv_index::check_key(key)?;
        let tree = self.tree;
        let held = match self.leaf {
            Some(p) => tree.lock_if_covers(tree.node(p)?, key)?,
            None => None,
        };
        let g = match held {
            Some(g) => {
                self.hits += 1;
                g
            }
            None => {
                self.descents += 1;
                tree.lock_leaf(key, &self.guard)?
            }
        };
        self.leaf = Some(g.node().ptr);
        tree.write_locked(&g, key, val, WriteKind::Upsert, &self.guard).map(|_| ())
    }

    /// Writes that reused the previous leaf.
    pub fn hits(&self) -> u64 {
        self.hits
    }

    /// Writes that descended from the root.
    pub fn descents(&self) -> u64 {
        self.descents
    }
}
