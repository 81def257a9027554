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
use crate::leaf::{LeafMeta, COMMIT_MASK, FLAG_LIVE, NEXT_TAGS, TAG_BUSY, TAG_SEAL};
use crate::{LeafAllocator, NbTree, NbTreeOptions};

/// Children per rebuilt inner node (room left for later separators).
const FILL: usize = INNER_CAP * 3 / 4;

/// The validated block list: `(block, low)` in key order. The strictly ascending `low` keys
/// also rule out cycles (a block reached twice would repeat its `low`).
fn walk(pool: &Pool, shape: Shape, head: PPtr) -> Result<Vec<(PPtr, u64)>> {
    Ok(scan(pool, shape, head)?.0.into_iter().map(|l| (l.block, l.low)).collect())
}

/// What the recovery scan keeps of one block (no per-leaf allocation: the metadata is built
/// from this once the allocator has been opened).
struct Scanned {
    block: PPtr,
    low: u64,
    /// Last live slot + 1.
    num: u8,
    fps: [u8; layout::MAX_SLOTS],
}

/// One pass over the key-value layer: every block validated (bounds, alignment, ascending
/// `low` — which also rules out cycles —, keys inside `[low, next.low)`, no key twice in a
/// block), fingerprints and `num` computed. Returns the leaves and the entry count.
fn scan(pool: &Pool, shape: Shape, head: PPtr) -> Result<(Vec<Scanned>, u64)> {
    let mut out: Vec<Scanned> = Vec::new();
    let mut entries = 0u64;
    // Keys of the previous block, checked against its high key (this block's low).
    let mut prev = [0u64; layout::MAX_SLOTS];
    let mut nprev = 0;
    let mut p = head;
    // `prev` is sorted: its last key is the largest.
    let check_prev =
        |prev: &[u64], high: u64, block: PPtr| match prev.last().filter(|&&k| k >= high) {
            Some(k) => Err(Error::corrupted(
                ENGINE,
                format!("block {block}: key {k} at or above the next block's low key {high}"),
            )),
            None => Ok(()),
        };
    while !p.is_null() {
        let b = Block::checked(pool, p, shape)?;
        let low = b.head.low.load_unaccounted(Ordering::Acquire);
        match out.last() {
            None if low != 0 => {
                return Err(Error::corrupted(ENGINE, format!("first block {p} has low key {low}")))
            }
            Some(last) if low <= last.low => {
                return Err(Error::corrupted(
                    ENGINE,
                    format!("block {p}: low keys not ascending (or a cycle)"),
                ))
            }
            Some(last) => check_prev(&prev[..nprev], low, last.block)?,
            None => {}
        }
        let mut leaf = Scanned { block: p, low, num: 0, fps: [0; layout::MAX_SLOTS] };
        nprev = 0;
        for i in 0..shape.slots {
            let k = b.entry(i).key.load_unaccounted(Ordering::Acquire);
            if k == 0 {
                continue;
            }
            if k < low {
                return Err(Error::corrupted(
                    ENGINE,
                    format!("block {p}: key {k} below the leaf's low key {low}"),
                ));
            }
            prev[nprev] = k;
            nprev += 1;
            leaf.fps[i] = fingerprint(k);
            leaf.num = i as u8 + 1;
            entries += 1;
        }
        // A key twice in the block: sorted, duplicates are neighbours (n log n, where a
        // pairwise check cost 63²/2 comparisons per 1 KB block — most of the scan's CPU).
        prev[..nprev].sort_unstable();
        if let Some(w) = prev[..nprev].windows(2).find(|w| w[0] == w[1]) {
            return Err(Error::corrupted(ENGINE, format!("block {p}: key {} twice", w[0])));
        }
        out.push(leaf);
        p = PPtr::from_raw(b.head.next.load_unaccounted(Ordering::Acquire));
    }
    if let Some(last) = out.last() {
        check_prev(&prev[..nprev], u64::MAX, last.block)?;
    } else {
        return Err(Error::corrupted(ENGINE, "empty block list"));
    }
    Ok((out, entries))
}

/// [`numakv_index::Engine::open`] for NBTree.
pub(crate) fn open(pool: Arc<Pool>, opts: &NbTreeOptions) -> Result<(NbTree, RecoveryReport)> {
    let t0 = Instant::now();
    let meta = pool.root(SLOT_META)?.load(Ordering::Acquire);
    let shape = layout::decode_meta(meta).ok_or_else(|| {
        Error::corrupted(ENGINE, format!("format word {meta:#x} is not an nbtree format"))
    })?;
    match layout::meta_allocator(meta) {
        Some(LeafAllocator::Calloc) => {}
        Some(other) => return Err(crate::alloc::not_recoverable(other)),
        None => {
            return Err(Error::corrupted(
                ENGINE,
                format!("format word {meta:#x}: unknown allocator"),
            ))
        }
    }
    let dir = PPtr::from_raw(pool.root(SLOT_CALLOC)?.load(Ordering::Acquire));
    let head = PPtr::from_raw(pool.root(SLOT_HEAD)?.load(Ordering::Acquire));
    let slots = shape.slots;
    let (leaves, entries) = scan(&pool, shape, head)?;
    let t_scan = t0.elapsed();
    // Calloc asks only about logged blocks (a handful): a sorted vector is enough.
    let mut reachable: Vec<u64> = leaves.iter().map(|l| l.block.raw()).collect();
    reachable.sort_unstable();
    let (calloc, crec) =
        Calloc::open(Arc::clone(&pool), dir, |p| reachable.binary_search(&p.raw()).is_ok())?;
    drop(reachable);
    let t_calloc = t0.elapsed();
    if calloc.block_size() != shape.block_size() {
        return Err(Error::corrupted(ENGINE, "Calloc block size does not match the leaf size"));
    }

    // The metadata layer (DRAM only, except the coupled layout's PM metadata line).
    let mut metas: Vec<*mut LeafMeta> = Vec::with_capacity(leaves.len());
    for (idx, l) in leaves.iter().enumerate() {
        let high = leaves.get(idx + 1).map_or(u64::MAX, |n| n.low);
        let m = LeafMeta::new(slots, l.block, l.low, high);
        let num = usize::from(l.num);
        for i in 0..num {
            // ORDERING: Relaxed; the tree is published to other threads only after open.
            m.fps[i].store(l.fps[i], Ordering::Relaxed);
        }
        m.num.store(num as u32, Ordering::Relaxed);
        m.bitmap.store(((1u64 << num) - 1) & COMMIT_MASK, Ordering::Relaxed);
        if shape.coupled {
            let b = Block::checked(&pool, l.block, shape)?;
            // The PM metadata line is rewritten from the keys, like the DRAM one.
            for i in 0..slots {
                b.pm_fp(i).store(l.fps[i], Ordering::Relaxed);
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
    let t_leaves = t0.elapsed();
    let bounds: Vec<(PPtr, u64)> = leaves.iter().map(|l| (l.block, l.low)).collect();
    let root = build_inner(&metas, &bounds);
    let tree = NbTree::new_handle(pool, calloc, None, shape, opts, root, metas[0]);
    let elapsed = t0.elapsed();
    let us = |d: std::time::Duration| d.as_micros() as u64;
    let report = RecoveryReport {
        was_clean: tree.pool.was_clean(),
        elapsed,
        counters: vec![
            ("leaves", metas.len() as u64),
            ("entries", entries),
            ("smo_blocks_reclaimed", crec.blocks_recovered),
            ("log_slots_replayed", crec.log_slots_replayed),
            ("scan_us", us(t_scan)),
            ("calloc_us", us(t_calloc - t_scan)),
            ("leaf_metadata_us", us(t_leaves - t_calloc)),
            ("inner_nodes_us", us(elapsed - t_leaves)),
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
    /// leaf is settled (live, no SMO leftovers, no tagged `next`, no pending insert), keys lie
    /// in their leaf's range without duplicates and with matching fingerprints; and every inner
    /// level, from the root down, is a sibling chain whose nodes' high keys are the next node's
    /// low key (`u64::MAX` for the last), whose separators ascend strictly inside the node's
    /// range, and whose children, concatenated, are exactly the level below (the leaves, for
    /// level 1) with each separator equal to its child's low key.
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
            if !m.copy_ptr().is_null() || m.flags() != FLAG_LIVE {
                return bad(format!(
                    "leaf {i}: SMO leftovers on a quiescent tree (flags {:#x}, copy {:?})",
                    m.flags(),
                    m.copy_ptr()
                ));
            }
            // ORDERING: Relaxed; quiescent.
            if m.next.load(Ordering::Relaxed) as usize & NEXT_TAGS != 0 {
                return bad(format!("leaf {i}: tagged next pointer on a quiescent tree"));
            }
            // ORDERING: Relaxed; quiescent.
            if m.pending.load(Ordering::Relaxed) != 0
                || m.num.load(Ordering::Relaxed) as usize > self.slots
            {
                return bad(format!("leaf {i}: pending inserts or claims past the slot count"));
            }
            // ORDERING: Relaxed; quiescent.
            let num = m.num.load(Ordering::Relaxed) as usize;
            let committed = m.committed();
            // Every committed slot was claimed: `num` is past the highest one. Below it, the
            // next insert claims a committed slot again, stores over its value and then waits
            // forever on its own (same-fingerprint) pending slot (review-nbtree).
            let top = 64 - committed.leading_zeros() as usize;
            if num < top {
                return bad(format!(
                    "leaf {i}: claim counter {num} below its committed slots (highest {})",
                    top - 1
                ));
            }
            // The SMO bit is set only by an insert that found no slot left to claim; with no
            // copy on a quiescent tree, it is an SMO that could not allocate (`OutOfSpace`),
            // which leaves the full leaf as it was. On a leaf with slots left it is corruption.
            if m.in_smo() && num < self.slots {
                return bad(format!("leaf {i}: SMO bit on a leaf with free slots ({num} claimed)"));
            }
            let blk = self.blk(m.data);
            let mut keys = HashSet::new();
            for s in 0..self.slots {
                // ORDERING: Relaxed; quiescent.
                let tag = m.tags[s].load(Ordering::Relaxed);
                // SEAL marks the old leaf of an SMO in its sync phase (never a live leaf in
                // the list); BUSY is a one-store section no quiescent tree is inside.
                if tag & (TAG_SEAL | TAG_BUSY) != 0 {
                    return bad(format!("leaf {i} slot {s}: tag {tag:#x} (SEAL/BUSY) at rest"));
                }
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
        // The inner levels, top-down: `level` lists the nodes of one level in key order, each
        // with its low key (the separator that leads to it; 0 for the leftmost).
        let root = self.root_node(&g);
        if root.high.load(Ordering::Acquire) != u64::MAX
            || !root.sibling.load(Ordering::Acquire).is_null()
        {
            return bad("the root has a high key or a sibling".into());
        }
        let mut level: Vec<(u64, usize)> = vec![(0, root as *const Inner as usize)];
        let mut depth = root.level;
        loop {
            let mut below: Vec<(u64, usize)> = Vec::new();
            for (idx, &(low, np)) in level.iter().enumerate() {
                let n = self.inner_ref(np);
                let high = level.get(idx + 1).map_or(u64::MAX, |e| e.0);
                let next = level.get(idx + 1).map_or(0, |e| e.1);
                if n.level != depth {
                    return bad(format!("inner node at level {depth} says level {}", n.level));
                }
                if n.high.load(Ordering::Acquire) != high {
                    return bad(format!(
                        "level-{depth} node {idx}: high key {} but the next node's low is {high}",
                        n.high.load(Ordering::Acquire)
                    ));
                }
                if n.sibling.load(Ordering::Acquire) as usize != next {
                    return bad(format!("level-{depth} node {idx}: sibling is not the next node"));
                }
                if n.count.load(Ordering::Acquire) > INNER_CAP {
                    return bad(format!("level-{depth} node {idx}: count over capacity"));
                }
                for (j, (sep, c)) in n.children().into_iter().enumerate() {
                    let sep = if j == 0 { low } else { sep };
                    if j > 0 && (sep <= below.last().map_or(0, |e| e.0) || sep >= high) {
                        return bad(format!(
                            "level-{depth} node {idx}: separator {sep} out of order or range"
                        ));
                    }
                    below.push((sep, c));
                }
            }
            if depth == 1 {
                if below.len() != leaves.len() || below.iter().zip(&leaves).any(|(a, &l)| a.1 != l)
                {
                    return bad("level-1 inner nodes do not list the leaves in order".into());
                }
                if let Some((i, _)) =
                    below.iter().zip(&blocks).enumerate().find(|(_, (a, b))| a.0 != b.1)
                {
                    return bad(format!("the separator of leaf {i} differs from its low key"));
                }
                break;
            }
            level = below;
            depth -= 1;
        }
        // Leaves retired by the last SMOs (e.g. a layer's recovery writing into this tree just
        // before) are freed after their grace period; `g` must not hold it up.
        drop(g);
        if self.plain.is_some() {
            // Naive and page-heap blocks are not tracked per block (the naive ones never come
            // back): the reachability check is Calloc's.
            let reachable = blocks.len() as u64;
            return Ok(CheckReport {
                entries,
                reachable_blocks: reachable,
                allocated_blocks: reachable,
            });
        }
        let allocated = numakv_pmem::alloc::settle_deferred_frees(
            blocks.len() as u64,
            std::time::Duration::from_secs(5),
            || self.calloc.allocated_blocks().len() as u64,
        );
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

#[cfg(test)]
mod tests {
    //! `check()` sees every level: each test breaks one invariant of a quiescent tree and
    //! expects the check to name it, then restores it.

    use std::sync::atomic::Ordering;

    use numakv_index::{Engine, Index};
    use numakv_pmem::{Pool, PoolConfig};

    use crate::leaf::{FLAG_LIVE, NEXT_FROZEN, SMO_BIT, TAG_BUSY, TAG_SEAL};
    use crate::{NbTree, NbTreeOptions};

    /// Three inner levels over 4-slot leaves.
    fn tall() -> NbTree {
        let pool = Pool::volatile(PoolConfig::new(NbTree::engine_id(), 64 << 20)).unwrap();
        let t =
            NbTree::create(pool, &NbTreeOptions { leaf_slots: 4, ..Default::default() }).unwrap();
        for k in 1..=20_000u64 {
            assert!(t.insert(k * 7, k).unwrap());
        }
        let g = numakv_pmem::alloc::epoch::pin();
        assert!(t.root_node(&g).level >= 3, "the test needs inner levels above 1");
        drop(g);
        t.check().unwrap();
        t
    }

    fn fails_with(t: &NbTree, what: &str) {
        let e = t.check().expect_err(what).to_string();
        assert!(e.contains(what), "{e}");
    }

    #[test]
    fn check_sees_every_inner_level_and_leaf_state() {
        let t = tall();
        let g = numakv_pmem::alloc::epoch::pin();
        let root = t.root_node(&g);
        // A separator of the root (a level ≥ 3 node).
        let k0 = root.keys[0].load(Ordering::Relaxed);
        root.keys[0].store(k0 + 1, Ordering::Relaxed);
        fails_with(&t, "high key");
        root.keys[0].store(k0, Ordering::Relaxed);
        // The high key of a level-2 node.
        let l2 = t.inner_ref(root.leftmost.load(Ordering::Relaxed));
        let h = l2.high.load(Ordering::Relaxed);
        l2.high.store(h - 1, Ordering::Relaxed);
        fails_with(&t, "high key");
        l2.high.store(h, Ordering::Relaxed);
        // A level-1 separator set to 0 (used to be skipped).
        let mut l1 = t.inner_ref(l2.leftmost.load(Ordering::Relaxed));
        l1 = t.inner_ref(l1.sibling.load(Ordering::Relaxed) as usize);
        let s = l1.keys[1].load(Ordering::Relaxed);
        l1.keys[1].store(0, Ordering::Relaxed);
        fails_with(&t, "separator");
        l1.keys[1].store(s, Ordering::Relaxed);
        // A leaf that is not live, and one with a tagged `next`.
        let leaf = t.find_leaf(700, &g);
        leaf.flags.fetch_and(!FLAG_LIVE, Ordering::Relaxed);
        fails_with(&t, "SMO leftovers");
        leaf.flags.fetch_or(FLAG_LIVE, Ordering::Relaxed);
        let n = leaf.next.load(Ordering::Relaxed);
        leaf.next.store((n as usize | NEXT_FROZEN) as *mut _, Ordering::Relaxed);
        fails_with(&t, "tagged next");
        leaf.next.store(n, Ordering::Relaxed);
        drop(g);
        t.check().unwrap();
    }

    /// The leaf states review-nbtree found `check()` blind to: a claim counter below the
    /// committed slots, a SEAL or BUSY tag left on a live leaf, and an SMO bit on a leaf with
    /// free slots — each set on one leaf, named by the check, then undone. The SMO bit on a
    /// *full* leaf with no copy stays accepted: an SMO that could not allocate leaves it so.
    #[test]
    fn check_sees_claims_tags_and_smo_bit() {
        let pool = Pool::volatile(PoolConfig::new(NbTree::engine_id(), 64 << 20)).unwrap();
        let t =
            NbTree::create(pool, &NbTreeOptions { leaf_slots: 4, ..Default::default() }).unwrap();
        for k in [10, 20, 30] {
            assert!(t.insert(k, k).unwrap());
        }
        t.check().unwrap();
        let g = numakv_pmem::alloc::epoch::pin();
        let leaf = t.find_leaf(10, &g);
        assert_eq!(leaf.num.load(Ordering::Relaxed), 3);
        // A deleted slot stays committed: the counter must stay past it too.
        assert!(t.remove(30).unwrap());
        leaf.num.store(2, Ordering::Relaxed);
        fails_with(&t, "claim counter 2 below its committed slots");
        leaf.num.store(3, Ordering::Relaxed);
        t.check().unwrap();
        for tag in [TAG_SEAL, TAG_BUSY] {
            leaf.tags[1].fetch_or(tag, Ordering::Relaxed);
            fails_with(&t, "(SEAL/BUSY) at rest");
            leaf.tags[1].fetch_and(!tag, Ordering::Relaxed);
        }
        t.check().unwrap();
        leaf.bitmap.fetch_or(SMO_BIT, Ordering::Relaxed);
        fails_with(&t, "SMO bit on a leaf with free slots");
        leaf.num.store(4, Ordering::Relaxed); // full: a failed SMO's leftover, accepted
        t.check().unwrap();
        leaf.bitmap.fetch_and(!SMO_BIT, Ordering::Relaxed);
        drop(g);
        t.check().unwrap();
    }
}
