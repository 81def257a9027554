//! Tree-level navigation: from the root through the inner nodes to a leaf, B-link moves, leaf
//! settling (past retired leaves), and separator insertion with inner splits and root growth.

use std::sync::atomic::Ordering;

use numakv_pmem::alloc::epoch::Guard;

use crate::inner::{htm, Inner, Step, INNER_CAP};
use crate::leaf::{LeafMeta, FLAG_LINK};
use crate::NbTree;

impl NbTree {
    /// A leaf reference valid for the guard's lifetime.
    #[inline]
    pub(crate) fn meta<'g>(&self, p: *mut LeafMeta, _g: &'g Guard) -> &'g LeafMeta {
        debug_assert!(!p.is_null());
        // SAFETY: leaf metadata is created by Box::into_raw and destroyed only through the epoch
        // (defer after unlink) or at drop of the tree; the caller is pinned by `_g`.
        unsafe { &*p }
    }

    #[inline]
    fn inner<'g>(&self, p: *mut Inner, _g: &'g Guard) -> &'g Inner {
        // SAFETY: inner nodes are never freed while the tree lives (no merges); Box::into_raw.
        unsafe { &*p }
    }

    /// The root inner node.
    #[inline]
    pub(crate) fn root_node<'g>(&self, g: &'g Guard) -> &'g Inner {
        // ORDERING: Acquire; pairs with the Release store of a new root (its contents visible).
        self.inner(self.root.load(Ordering::Acquire), g)
    }

    /// The inner node of `level` whose range should hold `key` (not yet locked: callers moving
    /// right under a transaction re-check the high key).
    pub(crate) fn descend<'g>(&self, key: u64, level: u32, g: &'g Guard) -> &'g Inner {
        let mut n = self.root_node(g);
        while n.level > level {
            n = match n.step(key) {
                Step::Right(s) => self.inner(s, g),
                Step::Child(c) => self.inner(c as *mut Inner, g),
            };
        }
        n
    }

    /// The leaf whose range holds `key`, after B-link moves and past retired leaves.
    pub(crate) fn find_leaf<'g>(&self, key: u64, g: &'g Guard) -> &'g LeafMeta {
        let mut n = self.root_node(g);
        let leaf = loop {
            match n.step(key) {
                Step::Right(s) => n = self.inner(s, g),
                Step::Child(c) if n.level == 1 => break c as *mut LeafMeta,
                Step::Child(c) => n = self.inner(c as *mut Inner, g),
            }
        };
        // A descent holding a leaf it read from a parent long ago (a preempted thread).
        numakv_pmem::pause_point!("nbtree.find_leaf.child");
        self.settle(self.meta(leaf, g), key, g)
    }

    /// From `leaf`, the current leaf for `key`: through the copy of a leaf whose SMO completed,
    /// and right along `next` while `key` is beyond the high key (leaf-level B-link).
    pub(crate) fn settle<'g>(
        &self,
        mut leaf: &'g LeafMeta,
        key: u64,
        g: &'g Guard,
    ) -> &'g LeafMeta {
        loop {
            if leaf.flags() & FLAG_LINK != 0 {
                let c = leaf.copy_ptr();
                if !c.is_null() {
                    leaf = self.meta(c, g);
                    continue;
                }
            }
            if key >= leaf.high {
                let n = leaf.next_ptr();
                if !n.is_null() {
                    leaf = self.meta(n, g);
                    continue;
                }
            }
            return leaf;
        }
    }

    /// Inserts separator `key` → `child` at `level` (the right half of a split below).
    pub(crate) fn insert_separator(
        &self,
        mut level: u32,
        mut key: u64,
        mut child: usize,
        g: &Guard,
    ) {
        loop {
            let mut node = self.descend(key, level, g);
            let txn = loop {
                let txn = node.lock.begin();
                // ORDERING: Relaxed inside the transaction (the lock's Acquire covers it).
                if key < node.high.load(Ordering::Relaxed) {
                    break txn;
                }
                let s = node.sibling.load(Ordering::Relaxed);
                drop(txn);
                node = self.inner(s, g);
            };
            match self.insert_locked(node, &txn, key, child) {
                None => return,
                Some((sep, sib)) => {
                    drop(txn);
                    level += 1;
                    key = sep;
                    child = sib as usize;
                }
            }
        }
    }

    /// Inserts into `node` (transaction open), splitting it when full. A split of the root
    /// installs a new root inside the transaction; any other split returns the separator and
    /// the new sibling for the caller to insert one level up after committing.
    pub(crate) fn insert_locked(
        &self,
        node: &Inner,
        txn: &htm::Txn<'_>,
        key: u64,
        child: usize,
    ) -> Option<(u64, *mut Inner)> {
        // ORDERING: Relaxed inside the transaction.
        if node.count.load(Ordering::Relaxed) < INNER_CAP {
            node.insert_entry(txn, key, child);
            return None;
        }
        let (sep, sib) = node.split(txn);
        if key < sep {
            node.insert_entry(txn, key, child);
        } else {
            let stx = sib.lock.begin();
            sib.insert_entry(&stx, key, child);
        }
        let sib = Box::into_raw(sib);
        self.counters.inner_splits.fetch_add(1, Ordering::Relaxed);
        self.counters.inner_nodes.fetch_add(1, Ordering::Relaxed);
        // ORDERING: Acquire; the root only changes inside the root's transaction, which we hold
        // if `node` is the root.
        if std::ptr::eq(self.root.load(Ordering::Acquire), node) {
            let r = Inner::new(node.level + 1, node as *const Inner as usize, u64::MAX);
            r.keys[0].store(sep, Ordering::Relaxed);
            r.kids[0].store(sib as usize, Ordering::Relaxed);
            r.count.store(1, Ordering::Relaxed);
            // ORDERING: Release; publishes the new root's contents to the Acquire in root_node.
            self.root.store(Box::into_raw(Box::new(r)), Ordering::Release);
            self.counters.inner_nodes.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        Some((sep, sib))
    }
}
