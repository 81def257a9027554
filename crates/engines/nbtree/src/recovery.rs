//! Open with recovery, and `check()`.
//!
//! The PM key-value layer is the whole persistent state (papers/nbtree.txt §III-B, "Crash
//! Consistency"). Open walks the block list from the head root slot, validating every block
//! (in the heap, aligned, no cycle, `low` strictly ascending, every key inside its leaf's range),
//! replays Calloc's recyclable logs with that reachability (blocks of an SMO cut by the crash:
//! new blocks before the link, or the old block after it, are freed), then rebuilds the DRAM
//! metadata layer (fingerprints, `num` = last live slot + 1, commit bits for `0..num`) and the
//! inner nodes bottom-up. Slots with key 0 are empty or deleted — an insert cut before its key
//! store left at most a value there, which is no entry.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use numakv_index::{CheckReport, Error, RecoveryReport, Result};
use numakv_pmem::alloc::calloc::Calloc;
use numakv_pmem::{PPtr, Pool};

use crate::inner::{leaf_word, Inner, INNER_CAP};
use crate::layout::{self, fingerprint, Block, Shape, ENGINE, SLOT_CALLOC, SLOT_HEAD, SLOT_META};
use crate::leaf::{LeafMeta, COMMIT_MASK};
use crate::{NbTree, NbTreeOptions};

/// Children per rebuilt inner node (room left for later separators).
const FILL: usize = INNER_CAP * 3 / 4;

/// The validated block list: `(block, low)` in key order.
fn walk(pool: &Pool, shape: Shape, head: PPtr) -> Result<Vec<(PPtr, u64)>> {
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    let mut p = head;
    while !p.is_null() {
        if !seen.insert(p) {
            return Err(Error::corrupted(ENGINE, format!("block {p} reached twice (cycle)")));
        }
        let b = Block::checked(pool, p, shape)?;
        let low = b.head.low.load_unaccounted(Ordering::Acquire);
        match out.last() {
            None if low != 0 => {
                return Err(Error::corrupted(ENGINE, format!("first block {p} has low key {low}")))
            }
            Some(&(_, prev)) if low <= prev => {
                return Err(Error::corrupted(ENGINE, format!("block {p}: low keys not ascending")))
            }
            _ => {}
        }
        out.push((p, low));
        p = PPtr::from_raw(b.head.next.load_unaccounted(Ordering::Acquire));
    }
    if out.is_empty() {
        return Err(Error::corrupted(ENGINE, "empty block list"));
    }
    Ok(out)
}

/// [`numakv_index::Engine::open`] for NBTree.
pub(crate) fn open(pool: Arc<Pool>, opts: &NbTreeOptions) -> Result<(NbTree, RecoveryReport)> {
    let t0 = Instant::now();
    let meta = pool.root(SLOT_META)?.load(Ordering::Acquire);
    let shape = layout::decode_meta(meta).ok_or_else(|| {
        Error::corrupted(ENGINE, format!("format word {meta:#x} is not an nbtree format"))
    })?;
    let dir = PPtr::from_raw(pool.root(SLOT_CALLOC)?.load(Ordering::Acquire));
    let head = PPtr::from_raw(pool.root(SLOT_HEAD)?.load(Ordering::Acquire));
    let slots = shape.slots;
    let blocks = walk(&pool, shape, head)?;
    let reachable: HashSet<PPtr> = blocks.iter().map(|b| b.0).collect();
    let (calloc, crec) = Calloc::open(Arc::clone(&pool), dir, |p| reachable.contains(&p))?;
    if calloc.block_size() != shape.block_size() {
        return Err(Error::corrupted(ENGINE, "Calloc block size does not match the leaf size"));
    }

    // The metadata layer.
    let mut metas: Vec<*mut LeafMeta> = Vec::with_capacity(blocks.len());
    let mut entries = 0u64;
    for (idx, &(p, low)) in blocks.iter().enumerate() {
        let high = blocks.get(idx + 1).map_or(u64::MAX, |b| b.1);
        let b = Block::checked(&pool, p, shape)?;
        let m = LeafMeta::new(slots, p, low, high);
        let mut num = 0;
        let mut keys = HashSet::new();
        for i in 0..slots {
            let k = b.entry(i).key.load_unaccounted(Ordering::Acquire);
            if k == 0 {
                continue;
            }
            if k < low || k >= high || k == u64::MAX {
                return Err(Error::corrupted(
                    ENGINE,
                    format!("block {p}: key {k} outside the leaf range [{low}, {high})"),
                ));
            }
            if !keys.insert(k) {
                return Err(Error::corrupted(ENGINE, format!("block {p}: key {k} twice")));
            }
            // ORDERING: Relaxed; the tree is published to other threads only after open.
            m.fps[i].store(fingerprint(k), Ordering::Relaxed);
            num = i + 1;
            entries += 1;
        }
        m.num.store(num as u32, Ordering::Relaxed);
        m.bitmap.store(((1u64 << num) - 1) & COMMIT_MASK, Ordering::Relaxed);
        if shape.coupled {
            // The PM metadata line is rewritten from the keys, like the DRAM one.
            for i in 0..slots {
                b.pm_fp(i).store(m.fps[i].load(Ordering::Relaxed), Ordering::Relaxed);
            }
            b.pm_num().store(num as u64, Ordering::Relaxed);
            b.pm_bitmap().store(((1u64 << num) - 1) & COMMIT_MASK, Ordering::Relaxed);
            // PERSIST: the rebuilt metadata line (ADR); nothing depends on it before open ends.
            pool.persist(b.addr(), 64);
        }
        metas.push(Box::into_raw(Box::new(m)));
    }
    for w in metas.windows(2) {
        // SAFETY: fresh boxes owned by this function.
        unsafe { (*w[0]).next.store(w[1], Ordering::Relaxed) };
    }
    let root = build_inner(&metas, &blocks);
    let tree = NbTree::new_handle(pool, calloc, shape, opts, root, metas[0]);
    let report = RecoveryReport {
        was_clean: tree.pool.was_clean(),
        elapsed: t0.elapsed(),
        counters: vec![
            ("leaves", metas.len() as u64),
            ("entries", entries),
            ("smo_blocks_reclaimed", crec.blocks_recovered),
            ("log_slots_replayed", crec.log_slots_replayed),
        ],
    };
    Ok((tree, report))
}

/// Builds the inner levels over `leaves` (bounds from `blocks`) and returns the root.
pub(crate) fn build_inner(leaves: &[*mut LeafMeta], blocks: &[(PPtr, u64)]) -> *mut Inner {
    // (low, child) of the current level.
    let mut level_items: Vec<(u64, usize)> =
        leaves.iter().zip(blocks).map(|(&m, &(_, low))| (low, leaf_word(m))).collect();
    let mut level = 1;
    loop {
        let groups: Vec<&[(u64, usize)]> = level_items.chunks(FILL).collect();
        let mut nodes: Vec<*mut Inner> = Vec::with_capacity(groups.len());
        for (gi, grp) in groups.iter().enumerate() {
            let high = groups.get(gi + 1).map_or(u64::MAX, |n| n[0].0);
            let n = Inner::new(level, grp[0].1, high);
            for (i, &(k, c)) in grp[1..].iter().enumerate() {
                // ORDERING: Relaxed; published with the tree.
                n.keys[i].store(k, Ordering::Relaxed);
                n.kids[i].store(c, Ordering::Relaxed);
            }
            n.count.store(grp.len() - 1, Ordering::Relaxed);
            nodes.push(Box::into_raw(Box::new(n)));
        }
        for w in nodes.windows(2) {
            // SAFETY: fresh boxes owned by this function.
            unsafe { (*w[0]).sibling.store(w[1], Ordering::Relaxed) };
        }
        if nodes.len() == 1 {
            return nodes[0];
        }
        level_items = groups.iter().zip(&nodes).map(|(g, &n)| (g[0].0, n as usize)).collect();
        level += 1;
    }
}

impl NbTree {
    /// Structural check (quiescent tree): the DRAM leaf list mirrors the PM block list, every
    /// leaf is settled (no SMO leftovers), keys lie in their leaf's range without duplicates and
    /// with matching fingerprints, and the level-1 inner nodes list exactly the leaves, in order,
    /// with separators equal to the leaves' low keys.
    pub(crate) fn check_tree(&self) -> Result<CheckReport> {
        let bad = |m: String| Err(Error::corrupted(ENGINE, m));
        let g = numakv_pmem::alloc::epoch::pin();
        let head = PPtr::from_raw(self.pool.root(SLOT_HEAD)?.load(Ordering::Acquire));
        let blocks = walk(&self.pool, self.shape, head)?;
        let mut leaves = Vec::new();
        // ORDERING: Acquire; pairs with the SeqCst head CAS.
        let mut p = self.head.load(Ordering::Acquire);
        let mut entries = 0u64;
        while !p.is_null() {
            let m = self.meta(p, &g);
            let i = leaves.len();
            let Some(&(bp, low)) = blocks.get(i) else {
                return bad(format!("DRAM leaf list longer than the PM list ({i}+)"));
            };
            if m.data != bp || m.low != low {
                return bad(format!("leaf {i}: DRAM metadata does not mirror block {bp}"));
            }
            let high = blocks.get(i + 1).map_or(u64::MAX, |b| b.1);
            if m.high != high {
                return bad(format!("leaf {i}: high key {} but next low {high}", m.high));
            }
            if !m.copy_ptr().is_null() || m.flags() != 0 {
                return bad(format!("leaf {i}: SMO leftovers on a quiescent tree"));
            }
            let blk = self.blk(m.data);
            let mut keys = HashSet::new();
            let committed = m.committed();
            for s in 0..self.slots {
                let k = blk.entry(s).key.load_unaccounted(Ordering::Acquire);
                if k == 0 {
                    continue;
                }
                if committed & (1 << s) == 0 {
                    return bad(format!("leaf {i} slot {s}: key without commit bit"));
                }
                if k < m.low || k >= m.high || !keys.insert(k) {
                    return bad(format!("leaf {i} slot {s}: key {k} out of range or duplicated"));
                }
                // ORDERING: Relaxed; quiescent.
                if m.fps[s].load(Ordering::Relaxed) != fingerprint(k) {
                    return bad(format!("leaf {i} slot {s}: fingerprint mismatch"));
                }
                entries += 1;
            }
            leaves.push(p as usize);
            p = m.next_ptr();
        }
        if leaves.len() != blocks.len() {
            return bad(format!("{} DRAM leaves but {} PM blocks", leaves.len(), blocks.len()));
        }
        // Level 1 of the inner nodes lists the leaves.
        let mut n = self.root_node(&g);
        while n.level > 1 {
            n = self.inner_ref(n.leftmost.load(Ordering::Acquire));
        }
        let mut kids = Vec::new();
        let mut node: *const Inner = n;
        while !node.is_null() {
            // SAFETY: inner nodes live as long as the tree.
            let nr = unsafe { &*node };
            for (sep, c) in nr.children() {
                kids.push((sep, c));
            }
            node = nr.sibling.load(Ordering::Acquire);
        }
        if kids.len() != leaves.len() || kids.iter().zip(&leaves).any(|(a, b)| a.1 != *b) {
            return bad("level-1 inner nodes do not list the leaves in order".into());
        }
        if kids.iter().zip(&blocks).skip(1).any(|(a, b)| a.0 != b.1 && a.0 != 0) {
            return bad("a separator differs from its leaf's low key".into());
        }
        let allocated = self.calloc.allocated_blocks().len() as u64;
        Ok(CheckReport {
            entries,
            reachable_blocks: blocks.len() as u64,
            allocated_blocks: allocated,
        })
    }

    fn inner_ref(&self, p: usize) -> &Inner {
        // SAFETY: inner nodes live as long as the tree.
        unsafe { &*(p as *const Inner) }
    }
}
