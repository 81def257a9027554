//! Three-phase SMO (papers/nbtree.txt §IV-B, Algorithm 2): copy, sync, link — run cooperatively
//! by every thread that meets the leaf (inserts help, so do readers and scans that need the new
//! leaves), each phase idempotent and its hand-over made with one CAS.
//!
//! - **Copy**: wait until no committed insert is still writing its key (pending bits), copy the
//!   live entries into one new leaf, or two when more than half the slots are live, split at the
//!   median key; allocate them through a Calloc SMO (recyclable log: old + new blocks logged
//!   before the new blocks are durably allocated); install the first one with
//!   `CAS(copy_ptr, null, new)`. Losers abort their Calloc SMO.
//! - **Sync**: seal the old leaf's committed slots (no delete or update commits there any more;
//!   one that finds a sealed slot goes to the copy), then for every live entry of the old leaf
//!   whose copy is not a direct write's (tag COPY or SYNC) and differs, store the old leaf's
//!   current — after the seal, final — value (tag → SYNC); zero every copied key that is no
//!   longer live in the old leaf. Then set `FLAG_SYNC`.
//! - **Link**: patch the copy's `next` — freeze the old leaf's `next` (a successor that links
//!   afterwards finds it frozen, helps this SMO and links into the copy) and write it into the
//!   last new leaf, once (issue 33, defect 1) —; then `CAS(pred.block.next, old.block,
//!   new.block)` in PM — the SMO's durability point — then `CAS(pred.next, old, new)` in DRAM;
//!   if the predecessor's `next` is frozen, finish the predecessor's SMO (its copy exists: no
//!   allocation) and link into its copy. Then, in one inner-node transaction, replace the
//!   parent's pointer, insert the right leaf's separator, set `FLAG_LIVE` on the new leaves and
//!   `FLAG_LINK` on the old one. The thread that sets LINK retires the old leaf (metadata
//!   through the epoch, block through the Calloc SMO's commit, which clears the log after the
//!   grace period). A new leaf reached along `next` before LIVE takes no direct write and runs
//!   no SMO until it is live (`NbTree::make_live`).

use std::cell::{Cell, RefCell};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use numakv_index::Result;
use numakv_pmem::alloc::calloc::{Calloc, Smo};
use numakv_pmem::alloc::epoch::Guard;
use numakv_pmem::{account, PPtr};

use crate::alloc::SmoBlocks;
use crate::inner::leaf_word;
use crate::layout::{fingerprint, Block, MAX_SLOTS, SLOT_HEAD};
use crate::leaf::{
    untag, LeafMeta, FLAG_LINK, FLAG_LIVE, FLAG_SYNC, NEXT_FROZEN, NEXT_PATCHING, NEXT_UNPATCHED,
    TAG_COPY, TAG_SYNC,
};
use crate::NbTree;

thread_local! {
    /// A Calloc SMO the copy phase could not begin while pinned: (allocator, old block, count).
    static WANT: Cell<Option<(usize, PPtr, usize)>> = const { Cell::new(None) };
    /// A Calloc SMO begun unpinned for the retried operation (see `NbTree::pinned`).
    static RESERVED: RefCell<Option<(usize, PPtr, usize, Smo)>> = const { RefCell::new(None) };
}

fn calloc_id(c: &Arc<Calloc>) -> usize {
    Arc::as_ptr(c) as usize
}

/// Records that the copy phase wanted a Calloc SMO replacing `old` by `n` blocks.
pub(crate) fn want_reservation(c: &Arc<Calloc>, old: PPtr, n: usize) {
    WANT.with(|w| w.set(Some((calloc_id(c), old, n))));
}

/// The recorded wish, if it was for this allocator.
pub(crate) fn take_want(c: &Arc<Calloc>) -> Option<(PPtr, usize)> {
    WANT.with(|w| w.take()).filter(|w| w.0 == calloc_id(c)).map(|w| (w.1, w.2))
}

/// Begins the wished Calloc SMO (the caller is not pinned) and keeps it for the retry.
pub(crate) fn reserve(c: &Arc<Calloc>, old: PPtr, n: usize) -> Result<()> {
    let _acct = account::smo_scope();
    let smo = c.smo_begin(&[old], n)?;
    RESERVED.with(|r| *r.borrow_mut() = Some((calloc_id(c), old, n, smo)));
    Ok(())
}

/// The reservation, if it matches.
fn take_reservation(c: &Arc<Calloc>, old: PPtr, n: usize) -> Option<Smo> {
    RESERVED.with(|r| {
        let mut r = r.borrow_mut();
        match r.take() {
            Some((id, o, k, smo)) if id == calloc_id(c) && o == old && k == n => Some(smo),
            other => {
                *r = other;
                None
            }
        }
    })
}

/// Aborts an unused reservation (its new blocks are freed, its log slot cleared).
pub(crate) fn drop_reservation() {
    if let Some((_, _, _, smo)) = RESERVED.with(|r| r.borrow_mut().take()) {
        smo.abort();
    }
}

/// Raw pointer wrapper for deferred destruction.
struct SendPtr(*mut LeafMeta);
// SAFETY: the pointee is Send + Sync (LeafMeta) and the pointer is used once, by the deferred
// destructor, after the grace period.
unsafe impl Send for SendPtr {}

impl NbTree {
    /// Runs (or helps) the SMO of `leaf` to completion.
    pub(crate) fn smo(&self, leaf: &LeafMeta, g: &Guard) -> Result<()> {
        // Everything below — copy, sync, link, Calloc allocation and retirement — is the SMO's
        // share of PM accesses (`repro pm-lines` reports it beside the per-operation figure).
        let _acct = account::smo_scope();
        if leaf.copy_ptr().is_null() {
            self.copy_phase(leaf, g)?;
        }
        numakv_pmem::pause_point!("nbtree.smo.copied");
        self.pause();
        let nl = self.meta(leaf.copy_ptr(), g);
        if leaf.flags() & FLAG_SYNC == 0 {
            self.sync_phase(leaf, nl, g);
            // ORDERING: Release; pairs with the Acquire of readers that then read the new leaf
            // only: the synchronised values are visible to them.
            leaf.flags.fetch_or(FLAG_SYNC, Ordering::Release);
        }
        self.pause();
        if leaf.flags() & FLAG_LINK == 0 {
            self.link_phase(leaf, nl, g)?;
        }
        Ok(())
    }

    /// An operation that found `leaf` in an SMO: NBTree helps it (cooperative SMO);
    /// NBTree-W and NBTree-WR wait for the leaf's write lock, which the initiator holds
    /// through its SMO, and then finish the SMO only if the initiator failed.
    pub(crate) fn help_smo(&self, leaf: &LeafMeta, g: &Guard) -> Result<()> {
        if self.variant.locks_writes() {
            let _w = leaf.lock.write();
            self.smo(leaf, g)
        } else {
            self.smo(leaf, g)
        }
    }

    /// The stress-test hook ([`crate::NbTreeOptions::smo_yield`]).
    #[inline]
    fn pause(&self) {
        if self.smo_yield {
            std::thread::yield_now();
        }
    }

    /// The new leaf of `leaf`'s SMO that covers `key` (not settled: the leaf the SMO created).
    pub(crate) fn copy_target<'g>(&self, nl: &'g LeafMeta, key: u64, g: &'g Guard) -> &'g LeafMeta {
        if key >= nl.high && !nl.pair.is_null() {
            self.meta(nl.pair, g)
        } else {
            nl
        }
    }

    pub(crate) fn copy_phase(&self, leaf: &LeafMeta, g: &Guard) -> Result<()> {
        let _acct = account::smo_scope();
        leaf.wait_pending();
        let blk = self.blk(leaf.data);
        // (key, value, old slot): the old slot travels into the copy's `src`.
        let mut live: Vec<(u64, u64, u8)> = Vec::with_capacity(self.slots);
        let mut bits = leaf.committed();
        while bits != 0 {
            let i = bits.trailing_zeros() as usize;
            bits &= bits - 1;
            let e = blk.entry(i);
            // ORDERING: Acquire; pairs with the Release key store of the insert.
            let k = e.key.load(Ordering::Acquire);
            if k == 0 {
                continue;
            }
            if let Some(v) = LeafMeta::read_slot(&blk, i, k) {
                live.push((k, v, i as u8));
            }
        }
        self.pause();
        live.sort_unstable_by_key(|e| e.0);
        // Paper: two new leaves when the valid entries exceed half the capacity.
        let two = live.len() > self.slots / 2 && live.len() >= 2;
        let split = if two { live[live.len() / 2].0 } else { leaf.high };
        let n = if two { 2 } else { 1 };
        if numakv_pmem::fail_point!("nbtree.smo.alloc") {
            // Test hook: the SMO's allocation fails as on a full pool.
            let requested = (n * self.shape.block_size()) as u64;
            return Err(numakv_pmem::PoolError::OutOfSpace { node: 0, requested }.into());
        }
        let smo = match &self.plain {
            Some(plain) => {
                SmoBlocks::begin_plain(&self.pool, plain, self.shape.block_size(), leaf.data, n)?
            }
            None => SmoBlocks::Calloc(match take_reservation(&self.calloc, leaf.data, n) {
                Some(smo) => smo,
                None => match self.calloc.smo_begin(&[leaf.data], n) {
                    Ok(smo) => smo,
                    Err(e) => {
                        want_reservation(&self.calloc, leaf.data, n);
                        return Err(e.into());
                    }
                },
            }),
        };
        let blocks = smo.new_blocks().to_vec();
        // The last new leaf starts with the old leaf's `next` of now, tagged UNPATCHED: a
        // successor's link phase may still change the old leaf's `next`, and the link phase
        // of this SMO replaces it by the old leaf's frozen `next` before linking (patch_copy).
        let old_next = (leaf.next_ptr() as usize | NEXT_UNPATCHED) as *mut LeafMeta;
        // ORDERING: Relaxed; a placeholder, rewritten by the patch before the block is linked.
        let old_next_blk = blk.head.next.load(Ordering::Relaxed);
        let src = leaf as *const LeafMeta as *mut LeafMeta;
        let (lhs, rhs) =
            live.split_at(live.iter().position(|e| e.0 >= split).unwrap_or(live.len()));
        let mk = |p: PPtr, low: u64, high: u64, ents: &[(u64, u64, u8)], next_blk: u64| {
            let kv: Vec<(u64, u64)> = ents.iter().map(|e| (e.0, e.1)).collect();
            self.init_block(p, low, next_blk, &kv);
            let mut m = LeafMeta::new(self.slots, p, low, high);
            // Not live until the link phase completes (FLAG_LIVE).
            m.flags = 0.into();
            m.source = src;
            for (i, &(k, _, from)) in ents.iter().enumerate() {
                m.src[i] = from;
                // ORDERING: Relaxed; the metadata is published by the copy_ptr CAS (AcqRel).
                m.fps[i].store(fingerprint(k), Ordering::Relaxed);
                m.tags[i].store(TAG_COPY, Ordering::Relaxed);
            }
            m.num.store(ents.len() as u32, Ordering::Relaxed);
            m.bitmap.store((1u64 << ents.len()) - 1, Ordering::Relaxed);
            m.copied = ents.len() as u32;
            m
        };
        // The Calloc SMO travels inside the first new leaf, set before the copy is published:
        // whoever completes the link finds it there. (Stored into the old leaf after the CAS,
        // a helper could finish the SMO in between, find nothing to commit, and the handle
        // would later be dropped with the retired leaf — aborting, i.e. freeing, the new
        // blocks that are by then linked.)
        let mut smo = Some(smo);
        let nl_ptr = if two {
            let mut r = mk(blocks[1], split, leaf.high, rhs, old_next_blk);
            r.next = old_next.into();
            let r = Box::into_raw(Box::new(r));
            let mut l = mk(blocks[0], leaf.low, split, lhs, blocks[1].raw());
            l.next = r.into();
            l.pair = r;
            l.smo = smo.take().into();
            Box::into_raw(Box::new(l))
        } else {
            let mut l = mk(blocks[0], leaf.low, leaf.high, lhs, old_next_blk);
            l.next = old_next.into();
            l.smo = smo.take().into();
            Box::into_raw(Box::new(l))
        };
        // ORDERING: SeqCst; Release publishes the new leaves (metadata and PM contents) to the
        // Acquire in copy_ptr(); SeqCst places it in the total order with the fence an update
        // issues between its value store and its load of `copy_ptr` (ops.rs, write_existing).
        match leaf.copy.compare_exchange(
            std::ptr::null_mut(),
            nl_ptr,
            Ordering::SeqCst,
            Ordering::Acquire,
        ) {
            Ok(_) => {
                self.counters.smos.fetch_add(1, Ordering::Relaxed);
                // The new leaves are part of the tree from here (the old one until retire).
                self.counters.live_leaves.fetch_add(n as u64, Ordering::Relaxed);
            }
            Err(_) => {
                // Another copier won; ours was never visible.
                // SAFETY: nl_ptr (and its pair) came from Box::into_raw above and were never
                // published.
                let mut l = unsafe { Box::from_raw(nl_ptr) };
                if !l.pair.is_null() {
                    // SAFETY: as above, the pair was never published either.
                    drop(unsafe { Box::from_raw(l.pair) });
                }
                let smo = l.smo.get_mut().take();
                drop(l);
                match (smo, &self.plain) {
                    (Some(SmoBlocks::Calloc(smo)), _) => smo.abort(),
                    (Some(blocks), Some(plain)) => blocks.abort(&self.pool, plain),
                    _ => {}
                }
                self.counters.copies_lost.fetch_add(1, Ordering::Relaxed);
            }
        }
        let _ = g;
        Ok(())
    }

    /// Writes a fresh block: entries, then header; persisted as a whole (ADR) before the caller
    /// can link it. Only the live entries are copied; a free slot gets key 0 (and value 0, in
    /// the same line). The key of every free slot must be written: a recycled
    /// block holds a retired leaf's keys, which recovery would take for entries — so every
    /// line of the block is written (the SMO share of `repro pm-lines`).
    fn init_block(&self, p: PPtr, low: u64, next: u64, ents: &[(u64, u64)]) {
        let blk = self.blk(p);
        for (i, &(k, v)) in ents.iter().enumerate() {
            let e = blk.entry(i);
            // ORDERING: Relaxed; the block is private until the copy is published (AcqRel CAS).
            e.val.store(v, Ordering::Relaxed);
            e.key.store(k, Ordering::Relaxed);
        }
        for i in ents.len()..self.slots {
            // ORDERING: Relaxed, as above.
            blk.entry(i).val.store(0, Ordering::Relaxed);
            blk.entry(i).key.store(0, Ordering::Relaxed);
        }
        blk.head.low.store(low, Ordering::Relaxed);
        blk.head.next.store(next, Ordering::Relaxed);
        if self.shape.coupled {
            for (i, &(k, _)) in ents.iter().enumerate() {
                blk.pm_fp(i).store(fingerprint(k), Ordering::Relaxed);
            }
            blk.pm_num().store(ents.len() as u64, Ordering::Relaxed);
            blk.pm_bitmap().store((1u64 << ents.len()) - 1, Ordering::Relaxed);
        }
        // PERSIST: the new block is durable before it can be linked into the key-value layer.
        self.pool.persist(blk.addr(), self.shape.block_size());
    }

    fn sync_phase(&self, leaf: &LeafMeta, nl: &LeafMeta, g: &Guard) {
        let blk = self.blk(leaf.data);
        // Seal first: from here on no delete commits in the old leaf (a delete in its BUSY
        // section finishes before the seal, and we read its key after), and deletes that arrive
        // go to the copy instead. Without it, a delete that found the key in the old
        // leaf before the sync pass read the slot, but committed there after, was neither
        // carried over by the pass nor excluded from succeeding again on a copy that had become
        // the live leaf (docs/design.md "NBTree", sealing).
        let mut bits = leaf.committed();
        while bits != 0 {
            let i = bits.trailing_zeros() as usize;
            bits &= bits - 1;
            leaf.seal(i);
        }
        numakv_pmem::pause_point!("nbtree.smo.sealed");
        // Each copied slot's old slot (`src`), inverted: the copy of old slot `i`. An old slot
        // holds one key for life (a key only goes to 0) and no insert commits once the SMO bit
        // is set, so the copy of a key still live in old slot `i` is exactly `copy_of[i]`, and a
        // copied key is live in the old leaf exactly when its old slot still holds it: the
        // passes below look slots up instead of searching fingerprints (63 × 63 probes per SMO
        // of a full 1 KB leaf, most of the SMO's time).
        let targets: Vec<&LeafMeta> =
            [Some(nl), (!nl.pair.is_null()).then(|| self.meta(nl.pair, g))]
                .into_iter()
                .flatten()
                .collect();
        let mut copy_of: [Option<(usize, usize)>; MAX_SLOTS] = [None; MAX_SLOTS];
        for (t, tgt) in targets.iter().enumerate() {
            for j in 0..tgt.copied as usize {
                copy_of[usize::from(tgt.src[j])] = Some((t, j));
            }
        }
        let mut bits = leaf.committed();
        while bits != 0 {
            let i = bits.trailing_zeros() as usize;
            bits &= bits - 1;
            // ORDERING: Acquire, as in copy_phase.
            let k = blk.entry(i).key.load(Ordering::Acquire);
            if k == 0 {
                continue;
            }
            let Some(v) = LeafMeta::read_slot(&blk, i, k) else { continue };
            self.pause();
            let Some((t, j)) = copy_of[i] else { continue };
            let tgt = targets[t];
            let tb = self.blk(tgt.data);
            // ORDERING: Acquire; pairs with the Release CAS of a delete on the copy.
            if tb.entry(j).key.load(Ordering::Acquire) != k {
                continue; // deleted in the copy since
            }
            // ORDERING: Acquire; pairs with the Release value stores.
            if tb.entry(j).val.load(Ordering::Acquire) == v {
                continue;
            }
            // Paper: CAS(&syncEntry.val, v|copy_bit, val|sync_bit) — a value not overwritten by a
            // direct write. A SYNC slot too: after the seal the old slot's value is final, and a
            // value synchronised before it (sync-on-write, sync-on-read) may predate an update
            // whose store became visible later (issue 33, defect 4).
            tgt.tagged_store(
                j,
                |t| t & (TAG_COPY | TAG_SYNC) != 0,
                TAG_SYNC,
                || {
                    let cur = LeafMeta::read_slot(&blk, i, k).unwrap_or(v);
                    // ORDERING: Release; pairs with readers' Acquire.
                    tb.entry(j).val.store(cur, Ordering::Release);
                },
            );
        }
        // Lost deletions: copied keys no longer live in the old leaf (their old slot lost them).
        for tgt in &targets {
            let tb = self.blk(tgt.data);
            for j in 0..tgt.copied as usize {
                if leaf.flags() & FLAG_LINK != 0 {
                    return; // paper line 17: another thread completed the SMO
                }
                // ORDERING: Acquire, as above.
                let k = tb.entry(j).key.load(Ordering::Acquire);
                // ORDERING: Acquire; pairs with the Release CAS of the delete in the old leaf.
                let old = blk.entry(usize::from(tgt.src[j])).key.load(Ordering::Acquire);
                if k != 0 && old != k {
                    // ORDERING: Release CAS; only this copied key is removed.
                    let _ = tb.entry(j).key.compare_exchange(
                        k,
                        0,
                        Ordering::Release,
                        Ordering::Relaxed,
                    );
                }
            }
        }
        // PERSIST: the synchronised new blocks are durable before the link makes them reachable.
        self.pool.persist(self.blk(nl.data).addr(), self.shape.block_size());
        if !nl.pair.is_null() {
            let r = self.meta(nl.pair, g);
            self.pool.persist(self.blk(r.data).addr(), self.shape.block_size());
        }
    }

    fn link_phase(&self, leaf: &LeafMeta, nl: &LeafMeta, g: &Guard) -> Result<()> {
        let leaf_ptr = leaf as *const LeafMeta as *mut LeafMeta;
        let nl_ptr = nl as *const LeafMeta as *mut LeafMeta;
        loop {
            if leaf.flags() & FLAG_LINK != 0 {
                return Ok(());
            }
            // The copy's `next` is the old leaf's final one before the copy is linked.
            self.patch_copy(leaf, nl, g);
            if leaf.low == 0 {
                // The first leaf: its predecessor is the anchor (root slot + DRAM head).
                let slot = self.pool.root(SLOT_HEAD)?;
                // ORDERING: SeqCst, as every link CAS.
                let _ = slot.compare_exchange(
                    leaf.data.raw(),
                    nl.data.raw(),
                    Ordering::SeqCst,
                    Ordering::SeqCst,
                );
                // PERSIST: durability point of the SMO (new leaves reachable in PM).
                self.pool.persist_obj(slot);
                let _ = self.head.compare_exchange(
                    leaf_ptr,
                    nl_ptr,
                    Ordering::SeqCst,
                    Ordering::SeqCst,
                );
                break;
            }
            let Some(pred) = self.find_pred(leaf, nl, g) else { continue };
            self.pause();
            let pb = self.blk(pred.data);
            // ORDERING: SeqCst, as every link CAS (one order with the DRAM CAS below).
            let pm = pb.head.next.compare_exchange(
                leaf.data.raw(),
                nl.data.raw(),
                Ordering::SeqCst,
                Ordering::SeqCst,
            );
            if pm.is_err_and(|cur| cur != nl.data.raw()) {
                // The PM layer does not show this predecessor linking the old leaf (nor the new
                // one): never link in DRAM what PM does not link; look for the predecessor again.
                continue;
            }
            // PERSIST: durability point of the SMO.
            self.pool.persist_obj(&pb.head.next);
            // ORDERING: SeqCst; one order with the freeze of the predecessor's `next`
            // (freeze_next): either the freeze sees our new leaf, and the predecessor's copy is
            // patched to it, or our CAS fails on the frozen word.
            match pred.next.compare_exchange(leaf_ptr, nl_ptr, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(_) => {}
                Err(cur) if untag(cur) == nl_ptr => {} // another thread linked it
                Err(cur) if cur as usize == leaf_ptr as usize | NEXT_FROZEN => {
                    // The predecessor's link phase has begun and its copy will name the old
                    // leaf: finish the predecessor's SMO (its copy exists: no allocation) and
                    // link into its copy instead. (Its PM word we just changed belongs to a
                    // block its own SMO is about to unlink; our new leaves are not reachable in
                    // DRAM yet, so nothing was written into them directly.)
                    self.smo(pred, g)?;
                    self.counters.smo_helps.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                Err(_) => continue,
            }
            // The copy is reachable along `next`; the parent still names the old leaf.
            numakv_pmem::pause_point!("nbtree.smo.linked_pred");
            break;
        }
        self.link_parent(leaf, nl, g);
        Ok(())
    }

    /// Freezes `leaf`'s `next` (the link phase has begun: a successor that links afterwards
    /// finds the word frozen and links into the copy instead) and returns it, untagged.
    fn freeze_next(&self, leaf: &LeafMeta) -> *mut LeafMeta {
        loop {
            // ORDERING: SeqCst, as the link CAS it races with.
            let n = leaf.next.load(Ordering::SeqCst);
            if n as usize & NEXT_FROZEN != 0 {
                return untag(n);
            }
            let f = (n as usize | NEXT_FROZEN) as *mut LeafMeta;
            // ORDERING: SeqCst, as above.
            if leaf.next.compare_exchange(n, f, Ordering::SeqCst, Ordering::SeqCst).is_ok() {
                return untag(n);
            }
        }
    }

    /// The link phase's patch (issue 33, defect 1): the last new leaf of `leaf`'s SMO got the
    /// old leaf's `next` of copy time, but a successor's SMO may have linked its own copy into
    /// the old leaf since — durably. Linking our copy with the stale pointer would unlink that
    /// successor's new leaves, and writes acknowledged in them, from PM. So the old leaf's
    /// `next` is frozen (no successor links into it any more: it helps us and links into our
    /// copy instead) and the copy's `next`, in PM and DRAM, set to it, once: the thread that
    /// moves the word from UNPATCHED to PATCHING writes it; others wait the few instructions
    /// until it is done (after that the word may change again only by a successor's link into
    /// the copy, which a late patch must not undo — hence one writer).
    fn patch_copy(&self, leaf: &LeafMeta, nl: &LeafMeta, g: &Guard) {
        let last = if nl.pair.is_null() { nl } else { self.meta(nl.pair, g) };
        loop {
            // ORDERING: Acquire; pairs with the Release store that ends the patch.
            let m = last.next.load(Ordering::Acquire);
            let m_bits = m as usize;
            if m_bits & NEXT_UNPATCHED == 0 {
                return;
            }
            if m_bits & NEXT_PATCHING != 0 {
                std::hint::spin_loop();
                continue;
            }
            let claim = (m_bits | NEXT_PATCHING) as *mut LeafMeta;
            // ORDERING: Acquire on success, as the load above.
            if last.next.compare_exchange(m, claim, Ordering::Acquire, Ordering::Relaxed).is_ok() {
                break;
            }
        }
        let n0 = self.freeze_next(leaf);
        let n0_blk = if n0.is_null() { 0 } else { self.meta(n0, g).data.raw() };
        let lb = self.blk(last.data);
        // ORDERING: SeqCst, as every write of a link word.
        lb.head.next.store(n0_blk, Ordering::SeqCst);
        // PERSIST: the copy names the old leaf's final successor before it is linked.
        self.pool.persist_obj(&lb.head.next);
        // ORDERING: Release; publishes the patch (and the successor it names) to next_ptr().
        last.next.store(n0, Ordering::Release);
    }

    /// The leaf whose `next` is `leaf` (or already `nl`), walking from the leaf left of
    /// `leaf.low`; `None` to retry.
    fn find_pred<'g>(&self, leaf: &LeafMeta, nl: &LeafMeta, g: &'g Guard) -> Option<&'g LeafMeta> {
        let mut cur = self.find_leaf(leaf.low - 1, g);
        for _ in 0..1_000_000 {
            let n = cur.next_ptr();
            if std::ptr::eq(n, leaf) || std::ptr::eq(n, nl) {
                return Some(cur);
            }
            if n.is_null() {
                return None;
            }
            let nm = self.meta(n, g);
            if nm.low >= leaf.high {
                return None;
            }
            cur = nm;
        }
        None
    }

    /// Replaces `leaf` by its copies in the parent, in one inner-node transaction that also sets
    /// `FLAG_LINK`; the thread that does it retires the old leaf.
    fn link_parent(&self, leaf: &LeafMeta, nl: &LeafMeta, g: &Guard) {
        let mut node = self.descend(leaf.low, 1, g);
        let pending = loop {
            let txn = node.lock.begin();
            // ORDERING: Relaxed inside the transaction.
            if leaf.low >= node.high.load(Ordering::Relaxed) {
                let s = node.sibling.load(Ordering::Relaxed);
                drop(txn);
                // SAFETY: inner nodes are never freed while the tree lives.
                node = unsafe { &*s };
                continue;
            }
            if leaf.flags() & FLAG_LINK != 0
                || !node.replace_child(&txn, leaf_word(leaf), leaf_word(nl))
            {
                return; // someone else linked it
            }
            let pending = if nl.pair.is_null() {
                None
            } else {
                self.insert_locked(node, &txn, nl.high, leaf_word(nl.pair))
            };
            // The new leaves are live (direct writes, SMOs of their own) from here, before LINK:
            // whoever sees LINK sees them live.
            // ORDERING: Release; pairs with the Acquire in flags().
            nl.flags.fetch_or(FLAG_LIVE, Ordering::Release);
            if !nl.pair.is_null() {
                // ORDERING: Release, as above.
                self.meta(nl.pair, g).flags.fetch_or(FLAG_LIVE, Ordering::Release);
            }
            // ORDERING: Release; pairs with the Acquire in flags(): readers that see LINK go to
            // the copy.
            leaf.flags.fetch_or(FLAG_LINK, Ordering::Release);
            break pending;
        };
        if let Some((sep, sib)) = pending {
            self.insert_separator(2, sep, sib as usize, g);
        }
        self.retire(leaf, g);
    }

    /// Retires an unlinked leaf: its metadata after the grace period, its block through the
    /// Calloc SMO's commit (freed after the grace period, then the log slot cleared).
    fn retire(&self, leaf: &LeafMeta, g: &Guard) {
        let nl = self.meta(leaf.copy_ptr(), g);
        if let Some(smo) = nl.smo.lock().take() {
            // SAFETY: the new blocks are linked in both layers and the parent; the old block is
            // unreachable for new readers, and only this thread (the one that set FLAG_LINK
            // under the parent's transaction) commits it.
            unsafe { smo.commit(&self.pool, self.plain.as_ref(), g) };
        }
        // Hand the deferred frees to the global queue now, so that the log slot returns after
        // the grace period instead of waiting for the thread-local bag to fill.
        g.flush();
        self.counters.live_leaves.fetch_sub(1, Ordering::Relaxed);
        let p = SendPtr(leaf as *const LeafMeta as *mut LeafMeta);
        // SAFETY: the leaf is unlinked from the leaf list and its parent; readers that still
        // hold it are pinned, and the destructor runs after they unpin. Box::into_raw origin.
        unsafe {
            g.defer_unchecked(move || {
                let p = p;
                drop(Box::from_raw(p.0));
            });
        }
    }

    /// The block of a leaf.
    #[inline]
    pub(crate) fn blk(&self, p: PPtr) -> Block<'_> {
        // SAFETY: every `data` pointer of a leaf is a Calloc block of this tree of
        // `shape.block_size()` bytes; blocks are freed only after an epoch grace period
        // following their leaf's unlink, and every caller holds a guard.
        unsafe { Block::at(&self.pool, p, self.shape) }
    }
}
