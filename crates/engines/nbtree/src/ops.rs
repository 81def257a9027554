//! Point operations (papers/nbtree.txt §V, Algorithms 1, 3, 4, 5): log-structured insert,
//! in-place update and delete with sync-on-write, search with sync-on-read.

use std::sync::atomic::Ordering;

use numakv_index::Result;
use numakv_pmem::alloc::epoch::Guard;

use crate::layout::fingerprint;
use crate::leaf::{InsertOutcome, LeafMeta, COMMIT_MASK, FLAG_SYNC, SMO_BIT, TAG_COPY, TAG_SYNC};
use crate::{NbTree, Variant};

impl NbTree {
    /// Algorithm 5: search.
    pub(crate) fn lookup(&self, key: u64, g: &Guard) -> Result<Option<u64>> {
        let mut leaf = self.find_leaf(key, g);
        loop {
            let _r = (self.variant == Variant::WR).then(|| leaf.lock.read());
            let blk = self.blk(leaf.data);
            let val = leaf.find(&blk, key).and_then(|i| LeafMeta::read_slot(&blk, i, key));
            if !leaf.in_smo() {
                return Ok(val);
            }
            let nl = leaf.copy_ptr();
            if nl.is_null() {
                return Ok(val); // copy phase: the old leaf is latest and clean
            }
            let nl = self.meta(nl, g);
            let tgt = self.copy_target(nl, key, g);
            if leaf.flags() & FLAG_SYNC != 0 {
                // Link phase or later: the new leaf is latest and clean; it may be in an SMO of
                // its own, so search it the same way.
                drop(_r);
                leaf = self.settle(tgt, key, g);
                continue;
            }
            // Sync phase: sync-on-read.
            let tb = self.blk(tgt.data);
            let Some(j) = tgt.find(&tb, key) else { return Ok(None) };
            match val {
                None => {
                    if (j as u32) < tgt.copied {
                        // A deletion not yet synchronised: apply it to the new leaf.
                        // ORDERING: Release CAS, as every key removal.
                        let _ = tb.entry(j).key.compare_exchange(
                            key,
                            0,
                            Ordering::Release,
                            Ordering::Relaxed,
                        );
                        // PERSIST: the synchronised deletion is durable before we report it.
                        self.pool.persist_obj(tb.entry(j));
                    }
                    return Ok(None);
                }
                Some(v) => {
                    // ORDERING: Acquire; pairs with Release value stores.
                    if tb.entry(j).val.load(Ordering::Acquire) != v {
                        tgt.tagged_store(
                            j,
                            |t| t == TAG_COPY,
                            TAG_SYNC,
                            || {
                                // ORDERING: Release; pairs with readers' Acquire.
                                tb.entry(j).val.store(v, Ordering::Release);
                            },
                        );
                        // PERSIST: the value we return is durable in the new leaf.
                        self.pool.persist_obj(tb.entry(j));
                        self.counters.sync_on_read.fetch_add(1, Ordering::Relaxed);
                    }
                    return Ok(LeafMeta::read_slot(&tb, j, key));
                }
            }
        }
    }

    /// Algorithm 1 (insert), and upsert (insert, or update when present).
    pub(crate) fn insert_or_upsert(
        &self,
        key: u64,
        value: u64,
        upsert: bool,
        g: &Guard,
    ) -> Result<bool> {
        loop {
            let leaf = self.find_leaf(key, g);
            if leaf.in_smo() {
                // Cooperative SMO: help it, then retry from the root.
                self.smo(leaf, g)?;
                continue;
            }
            let _w = self.variant.locks_writes().then(|| leaf.lock.write());
            if self.variant.locks_writes() && leaf.in_smo() {
                continue;
            }
            let blk = self.blk(leaf.data);
            if let Some(i) = leaf.find(&blk, key) {
                if upsert {
                    self.write_existing(leaf, i, key, value, g);
                }
                return Ok(false);
            }
            match self.leaf_insert(leaf, key, value)? {
                InsertOutcome::Inserted => return Ok(true),
                InsertOutcome::Present(i) => {
                    if upsert {
                        self.write_existing(leaf, i, key, value, g);
                    }
                    return Ok(false);
                }
                InsertOutcome::Smo => {
                    drop(_w);
                    self.smo(leaf, g)?;
                }
            }
        }
    }

    /// The leaf part of Algorithm 1.
    fn leaf_insert(&self, leaf: &LeafMeta, key: u64, value: u64) -> Result<InsertOutcome> {
        // ORDERING: Relaxed; `num` only hands out distinct slots, the commit CAS publishes.
        let pos = leaf.num.fetch_add(1, Ordering::Relaxed) as usize;
        if pos >= self.slots {
            // ORDERING: SeqCst; Dekker pair with the link phase of the successor (it CASes our
            // `next`, then reads this bit; our copy reads `next` after setting it).
            leaf.bitmap.fetch_or(SMO_BIT, Ordering::SeqCst);
            return Ok(InsertOutcome::Smo);
        }
        let blk = self.blk(leaf.data);
        let e = blk.entry(pos);
        // The slot's key is still 0: the value alone is no entry, in DRAM or after a crash.
        // ORDERING: Relaxed; published by the commit CAS (AcqRel) and the key store (Release).
        e.val.store(value, Ordering::Relaxed);
        let fp = fingerprint(key);
        leaf.fps[pos].store(fp, Ordering::Relaxed);
        if self.shape.coupled {
            // Coupled leaf: the metadata changes are PM writes (same line: num and fps).
            // ORDERING: Relaxed; published by the Release fetch_or of the bitmap mirror.
            blk.pm_num().fetch_add(1, Ordering::Relaxed);
            blk.pm_fp(pos).store(fp, Ordering::Relaxed);
        }
        let mine = 1u64 << pos;
        let mut checked = 0u64;
        loop {
            // ORDERING: Acquire; pairs with other inserts' commit CAS and pending release.
            let b = leaf.bitmap.load(Ordering::Acquire);
            if b & SMO_BIT != 0 {
                return Ok(InsertOutcome::Smo); // the slot stays uncommitted: never an entry
            }
            let mut fresh = b & COMMIT_MASK & !checked;
            let mut wait = false;
            while fresh != 0 {
                let i = fresh.trailing_zeros() as usize;
                fresh &= fresh - 1;
                if leaf.fps[i].load(Ordering::Relaxed) != fp {
                    checked |= 1 << i;
                    continue;
                }
                if b & Self::pending_bit(i) != 0 {
                    wait = true; // its key is being written: look again
                    continue;
                }
                // ORDERING: Acquire; pairs with the Release key store.
                if blk.entry(i).key.load(Ordering::Acquire) == key {
                    return Ok(InsertOutcome::Present(i));
                }
                checked |= 1 << i;
            }
            if wait {
                std::hint::spin_loop();
                continue;
            }
            // ORDERING: AcqRel; Release publishes fingerprint and value of the slot.
            if leaf
                .bitmap
                .compare_exchange(
                    b,
                    b | mine | Self::pending_bit(pos),
                    Ordering::AcqRel,
                    Ordering::Acquire,
                )
                .is_ok()
            {
                break;
            }
        }
        if self.shape.coupled {
            // ORDERING: Release; pairs with the Acquire in find_coupled (fingerprint visible).
            blk.pm_bitmap().fetch_or(mine, Ordering::Release);
            // PERSIST: the metadata line, with the entry below (ADR).
            self.pool.flush(blk.addr(), 64);
        }
        // ORDERING: Release; pairs with readers' Acquire key loads (the value is visible).
        e.key.store(key, Ordering::Release);
        // PERSIST: the entry line (value and key) is durable before the insert returns; one
        // flush per insert in ADR.
        self.pool.persist_obj(e);
        // ORDERING: Release; pairs with the Acquire of wait_pending and inserts' checks.
        leaf.bitmap.fetch_and(!Self::pending_bit(pos), Ordering::Release);
        Ok(InsertOutcome::Inserted)
    }

    /// Algorithm 3 (update): returns false when the key is absent.
    pub(crate) fn update_key(&self, key: u64, value: u64, g: &Guard) -> Result<bool> {
        loop {
            let leaf = self.find_leaf(key, g);
            let _w = self.variant.locks_writes().then(|| leaf.lock.write());
            if self.variant.locks_writes() && leaf.in_smo() {
                drop(_w);
                self.smo(leaf, g)?;
                continue;
            }
            let blk = self.blk(leaf.data);
            let Some(i) = leaf.find(&blk, key) else { return Ok(false) };
            self.write_existing(leaf, i, key, value, g);
            return Ok(true);
        }
    }

    /// In-place update of slot `i` of `leaf`, then sync-on-write along the chain of SMO copies.
    fn write_existing<'g>(&self, leaf: &'g LeafMeta, i: usize, key: u64, value: u64, g: &'g Guard) {
        let blk = self.blk(leaf.data);
        leaf.direct_store(&blk, i, value);
        // PERSIST: one flush per update (ADR).
        self.pool.persist_obj(blk.entry(i));
        self.sync_on_write(leaf, i, key, g);
    }

    /// Sync-on-write: while the leaf written has an SMO copy, bring the copy's entry up to date
    /// unless a direct write there is newer (tag state 0), following the copies' own SMOs.
    fn sync_on_write<'g>(&self, mut src: &'g LeafMeta, mut i: usize, key: u64, g: &'g Guard) {
        loop {
            if !src.in_smo() {
                return;
            }
            let nl = src.copy_ptr();
            if nl.is_null() {
                return; // copy phase: the sync phase will pick our write up
            }
            let tgt = self.copy_target(self.meta(nl, g), key, g);
            let tb = self.blk(tgt.data);
            let Some(j) = tgt.find(&tb, key) else { return };
            let sb = self.blk(src.data);
            let synced = tgt.tagged_store(
                j,
                |t| t & (TAG_COPY | TAG_SYNC) != 0,
                TAG_SYNC,
                || {
                    if let Some(cur) = LeafMeta::read_slot(&sb, i, key) {
                        // ORDERING: Release; pairs with readers' Acquire.
                        tb.entry(j).val.store(cur, Ordering::Release);
                    }
                },
            );
            if !synced {
                return;
            }
            // PERSIST: the synchronised value is durable in the new leaf before we return.
            self.pool.persist_obj(tb.entry(j));
            self.counters.sync_on_write.fetch_add(1, Ordering::Relaxed);
            src = tgt;
            i = j;
        }
    }

    /// Algorithm 4 (delete).
    pub(crate) fn delete_key(&self, key: u64, g: &Guard) -> Result<bool> {
        loop {
            let leaf = self.find_leaf(key, g);
            let _w = self.variant.locks_writes().then(|| leaf.lock.write());
            if self.variant.locks_writes() && leaf.in_smo() {
                drop(_w);
                self.smo(leaf, g)?;
                continue;
            }
            let blk = self.blk(leaf.data);
            let Some(i) = leaf.find(&blk, key) else { return Ok(false) };
            let e = blk.entry(i);
            // ORDERING: Release CAS: exactly one of two racing deletes succeeds.
            if e.key.compare_exchange(key, 0, Ordering::Release, Ordering::Relaxed).is_err() {
                return Ok(false);
            }
            // PERSIST: one flush per delete (ADR).
            self.pool.persist_obj(e);
            // Sync the deletion along the copies.
            let mut src = leaf;
            loop {
                if !src.in_smo() {
                    break;
                }
                let nl = src.copy_ptr();
                if nl.is_null() {
                    break;
                }
                let tgt = self.copy_target(self.meta(nl, g), key, g);
                let tb = self.blk(tgt.data);
                let Some(j) = tgt.find(&tb, key) else { break };
                // ORDERING: Release CAS, as above.
                let _ =
                    tb.entry(j).key.compare_exchange(key, 0, Ordering::Release, Ordering::Relaxed);
                // PERSIST: the synchronised deletion is durable before we return.
                self.pool.persist_obj(tb.entry(j));
                src = tgt;
            }
            return Ok(true);
        }
    }
}
