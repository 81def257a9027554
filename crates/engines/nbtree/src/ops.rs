//! Point operations (papers/nbtree.txt §V, Algorithms 1, 3, 4, 5): log-structured insert,
//! in-place update and delete with sync-on-write, search with sync-on-read.

use std::sync::atomic::Ordering;

use numakv_index::Result;
use numakv_pmem::account;
use numakv_pmem::alloc::epoch::Guard;

use crate::layout::fingerprint;
use crate::leaf::{InsertOutcome, LeafMeta, COMMIT_MASK, FLAG_SYNC, SMO_BIT, TAG_COPY, TAG_SYNC};
use crate::{NbTree, Variant};

impl NbTree {
    /// Algorithm 5: search.
    pub(crate) fn lookup(&self, key: u64, g: &Guard) -> Result<Option<u64>> {
        self.lookup_from(self.find_leaf(key, g), key, g)
    }

    /// [`NbTree::lookup`] from `leaf`.
    fn lookup_from<'g>(&self, leaf: &'g LeafMeta, key: u64, g: &'g Guard) -> Result<Option<u64>> {
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
            // Link phase or later: the new leaf is latest and clean; it may be in an SMO of its
            // own, so search it the same way.
            drop(_r);
            let r = self.lookup_from(self.settle(tgt, key, g), key, g)?;
            if r.is_none() {
                // Until the PM link only the old block survives a crash.
                let _acct = account::smo_scope();
                self.mirror_absence(leaf, key);
            }
            return Ok(r);
        }
        // Sync phase: sync-on-read (PM accesses counted as the SMO's share). Read the old leaf
        // again now that the copy is known: `val` may predate the SMO (even the key's insert),
        // and applying it to the copy would delete a live key or store a stale value.
        let _acct = account::smo_scope();
        let slot = leaf.find(&blk, key);
        let val = slot.and_then(|i| LeafMeta::read_slot(&blk, i, key));
        let tb = self.blk(tgt.data);
        let Some(j) = tgt.find(&tb, key) else {
            // The copy lost a key the old leaf still holds: a delete redirected to the copy,
            // not yet mirrored back.
            if val.is_some() {
                self.mirror_absence(leaf, key);
            }
            return Ok(None);
        };
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
                Ok(None)
            }
            Some(v) => {
                // ORDERING: Acquire; pairs with Release value stores.
                if tb.entry(j).val.load(Ordering::Acquire) != v {
                    tgt.tagged_store(
                        j,
                        |t| t == TAG_COPY,
                        TAG_SYNC,
                        || {
                            // The old slot's value of now, read inside the copy slot's BUSY
                            // section (as sync-on-write does), not `v`: an update may have
                            // stored and synchronised a newer value since (issue 33, defect 4).
                            let cur = slot.and_then(|i| LeafMeta::read_slot(&blk, i, key));
                            // ORDERING: Release; pairs with readers' Acquire.
                            tb.entry(j).val.store(cur.unwrap_or(v), Ordering::Release);
                        },
                    );
                    // PERSIST: the value we return is durable in the new leaf.
                    self.pool.persist_obj(tb.entry(j));
                    self.counters.sync_on_read.fetch_add(1, Ordering::Relaxed);
                }
                Ok(LeafMeta::read_slot(&tb, j, key))
            }
        }
    }

    /// A read is about to return "absent" from the copy of `leaf` (issue 33, defect 3): if the
    /// old leaf still holds `key` in a sealed slot, a delete decided on the copy and has not
    /// mirrored its removal yet, and until the SMO's PM link only the old block survives a
    /// crash. The reader does the mirror itself (the same CAS; whoever comes second finds 0)
    /// and persists it, so the absence it returns is as durable as the delete will be.
    fn mirror_absence(&self, leaf: &LeafMeta, key: u64) {
        let blk = self.blk(leaf.data);
        let Some(i) = leaf.find(&blk, key) else { return };
        if !leaf.sealed(i) {
            return; // not redirected: a delete in this leaf commits here (and syncs on)
        }
        let e = blk.entry(i);
        // ORDERING: Release CAS, as every key removal.
        let _ = e.key.compare_exchange(key, 0, Ordering::Release, Ordering::Relaxed);
        // PERSIST: the absence we return survives a crash before the SMO's PM link.
        self.pool.persist_obj(e);
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
            if !leaf.live() {
                // Reached along a predecessor's `next` before its SMO's link phase completed.
                self.make_live(leaf, g)?;
                continue;
            }
            if leaf.in_smo() {
                // Cooperative SMO: help it, then retry from the root. NBTree-W(R) instead waits
                // for the leaf's lock, which the SMO's initiator holds throughout
                // (`help_smo`).
                self.help_smo(leaf, g)?;
                continue;
            }
            let _w = self.variant.locks_writes().then(|| leaf.lock.write());
            if self.variant.locks_writes() && leaf.in_smo() {
                // Under the lock: the SMO is over unless its initiator failed; finish it.
                self.smo(leaf, g)?;
                continue;
            }
            let blk = self.blk(leaf.data);
            if let Some(i) = leaf.find(&blk, key) {
                if upsert && !self.write_existing(leaf, i, key, value, g) {
                    // Sealed: finish the SMO (under NBTree-W(R)'s lock too: a helping scan
                    // may have begun it), then retry on the new leaf.
                    self.smo(leaf, g)?;
                    continue;
                }
                return Ok(false);
            }
            match self.leaf_insert(leaf, key, value)? {
                InsertOutcome::Inserted => return Ok(true),
                InsertOutcome::Present(i) => {
                    if upsert && !self.write_existing(leaf, i, key, value, g) {
                        self.smo(leaf, g)?; // sealed, as above
                        continue;
                    }
                    return Ok(false);
                }
                InsertOutcome::Smo => {
                    // NBTree-W(R) keeps the leaf's lock through the whole SMO (`_w` drops at
                    // the end of this iteration): node-grained write locks in place of the
                    // cooperative SMO, so other writers of the leaf wait instead of helping.
                    self.smo(leaf, g)?;
                }
            }
        }
    }

    /// The leaf part of Algorithm 1.
    fn leaf_insert(&self, leaf: &LeafMeta, key: u64, value: u64) -> Result<InsertOutcome> {
        numakv_pmem::pause_point!("nbtree.insert.claim");
        // Claim a slot only while one is left: `num` never exceeds the slot count. (A plain
        // `fetch_add` counted every failed claim; with the leaf full and its SMO unable to start
        // — no PM — 2^32 failed inserts wrapped it to 0 and the next one overwrote slot 0.)
        // ORDERING: Relaxed; `num` only hands out distinct slots, the commit CAS publishes.
        let claim = leaf.num.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
            ((n as usize) < self.slots).then(|| n + 1)
        });
        let Ok(pos) = claim.map(|n| n as usize) else {
            // ORDERING: AcqRel; an RMW in the release sequence of every commit CAS, which
            // wait_pending's Acquire load relies on. (It was a SeqCst Dekker pair with the
            // successor's link phase; the link phase now freezes `next` instead.)
            leaf.bitmap.fetch_or(SMO_BIT, Ordering::AcqRel);
            return Ok(InsertOutcome::Smo);
        };
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
        // Pending before the commit: a checker that sees our commit bit sees this bit too
        // (leaf.rs, the pending word).
        // ORDERING: Relaxed; published by the commit CAS (Release) that follows.
        leaf.pending.fetch_or(mine, Ordering::Relaxed);
        let mut checked = 0u64;
        loop {
            // ORDERING: Acquire; pairs with other inserts' commit CAS.
            let b = leaf.bitmap.load(Ordering::Acquire);
            if b & SMO_BIT != 0 {
                // ORDERING: Release; pairs with the Acquire of wait_pending.
                leaf.pending.fetch_and(!mine, Ordering::Release);
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
                // ORDERING: Acquire; pairs with the Release fetch_and after its key store (and
                // the bit, set before its commit CAS, is visible through our Acquire of `b`).
                if leaf.pending.load(Ordering::Acquire) & (1 << i) != 0 {
                    wait = true; // its key is being written: look again
                    continue;
                }
                // ORDERING: Acquire; pairs with the Release key store.
                if blk.entry(i).key.load(Ordering::Acquire) == key {
                    // Our slot stays uncommitted (never an entry); drop its pending bit.
                    // ORDERING: Release; pairs with the Acquire of wait_pending.
                    leaf.pending.fetch_and(!mine, Ordering::Release);
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
                .compare_exchange(b, b | mine, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                break;
            }
        }
        if self.shape.coupled {
            // ORDERING: Release; pairs with the Acquire in find_coupled (fingerprint visible).
            blk.pm_bitmap().fetch_or(mine, Ordering::Release);
            // PERSIST: the metadata line(s) written — bitmap and num, and the fingerprint's
            // (the second line for slots ≥ 32) — with the entry below (ADR).
            self.pool.flush(blk.addr(), 32 + pos + 1);
        }
        // ORDERING: Release; pairs with readers' Acquire key loads (the value is visible).
        e.key.store(key, Ordering::Release);
        // PERSIST: the entry line (value and key) is durable before the insert returns; one
        // flush per insert in ADR.
        self.pool.persist_obj(e);
        // ORDERING: Release; pairs with the Acquire of wait_pending and inserts' checks.
        leaf.pending.fetch_and(!mine, Ordering::Release);
        Ok(InsertOutcome::Inserted)
    }

    /// [`Index::update_with`](numakv_index::Index::update_with) in one descent: the value is
    /// read from the leaf the descent found and the new one written into that same leaf
    /// ([`NbTree::update_from`]), where the default runs a [`NbTree::lookup`] and then an
    /// upsert, each from the root. Like the default it excludes no other writer (the caller
    /// serialises the writers of a key when it needs to; the byte-string layer does).
    ///
    /// `computed` carries `f`'s result across retries of the caller's [`NbTree::pinned`] loop
    /// (an SMO that must wait for a Calloc slot unpins and runs the operation again): `f` runs
    /// at most once, a retry only writes what it returned. `Ok(None)`: `key` is absent.
    pub(crate) fn update_with_from_root(
        &self,
        key: u64,
        f: &mut dyn FnMut(u64) -> Result<Option<u64>>,
        computed: &mut Option<(u64, Option<u64>)>,
        g: &Guard,
    ) -> Result<Option<u64>> {
        if let Some((old, new)) = *computed {
            // A retry: `f` has run; write what it returned, as the default's upsert would.
            if let Some(new) = new {
                self.insert_or_upsert(key, new, true, g)?;
            }
            return Ok(Some(old));
        }
        let leaf = self.find_leaf(key, g);
        // The fast path reads the leaf as `lookup` does when the leaf is in no SMO (the check
        // comes after the read, as there); the locked variants and a leaf in an SMO take
        // `lookup`'s full path instead (its read lock, sync-on-read, the copy's value).
        let fast = if self.variant.locks_writes() {
            None
        } else {
            let blk = self.blk(leaf.data);
            let val = leaf.find(&blk, key).and_then(|i| LeafMeta::read_slot(&blk, i, key));
            (!leaf.in_smo()).then_some(val)
        };
        let old = match fast {
            Some(v) => v,
            None => self.lookup(key, g)?,
        };
        let Some(old) = old else { return Ok(None) };
        let new = f(old)?;
        *computed = Some((old, new));
        let Some(new) = new else { return Ok(Some(old)) };
        // The write starts at the leaf found above; `update_from` follows SMOs (a sealed slot
        // finishes the SMO and retries from the root) exactly as an update does.
        if !self.update_from(leaf, key, new, g)? {
            // Removed since we read it (only a writer the caller does not exclude can do
            // that): store it anyway, as the default's upsert would.
            self.insert_or_upsert(key, new, true, g)?;
        }
        Ok(Some(old))
    }

    /// Algorithm 3 (update): returns false when the key is absent.
    pub(crate) fn update_key(&self, key: u64, value: u64, g: &Guard) -> Result<bool> {
        let leaf = self.find_leaf(key, g);
        self.update_from(leaf, key, value, g)
    }

    /// [`NbTree::update_key`] from `leaf`, the leaf the descent found (possibly long ago).
    pub(crate) fn update_from<'g>(
        &self,
        mut leaf: &'g LeafMeta,
        key: u64,
        value: u64,
        g: &'g Guard,
    ) -> Result<bool> {
        loop {
            if !leaf.live() {
                self.make_live(leaf, g)?;
                continue;
            }
            let _w = self.variant.locks_writes().then(|| leaf.lock.write());
            if self.variant.locks_writes() && leaf.in_smo() {
                // Under the lock: the SMO is over unless its initiator failed; finish it.
                self.smo(leaf, g)?;
                drop(_w);
                leaf = self.find_leaf(key, g);
                continue;
            }
            let blk = self.blk(leaf.data);
            let Some(i) = leaf.find(&blk, key) else { return Ok(false) };
            if self.write_existing(leaf, i, key, value, g) {
                return Ok(true);
            }
            // Sealed: the copy decides. Finish the SMO (its PM link makes a write on the copy
            // durable) and retry from the root, which now leads past the old leaf.
            self.smo(leaf, g)?;
            drop(_w);
            leaf = self.find_leaf(key, g);
        }
    }

    /// In-place update of slot `i` of `leaf`, then sync-on-write along the chain of SMO copies;
    /// false (nothing written) when the slot is sealed: the caller helps the SMO to completion
    /// and retries on the new leaf.
    ///
    /// An update stores into the leaf it found only while the slot is unsealed, in the slot's
    /// BUSY section ([`LeafMeta::begin_unsealed`]), exactly as deletes commit, and then fences
    /// (StoreLoad) before it looks for a copy. So every
    /// update's value is either in the old leaf before the sync pass reads it (the pass or the
    /// update's own sync-on-write carries it to the copy) or written on the copy after the
    /// SMO's PM link (the help makes sure of the link: until then only the old block survives
    /// a crash). Before, updates wrote sealed slots too, which lost acknowledged updates in
    /// three ways (docs/design.md "NBTree", Update): a store still buffered when the update
    /// looked for a copy (R1), a write into the old leaf inside a redirected delete's window
    /// that a completed read had already seen removed (R2), and a write into the old leaf after
    /// a direct write on the copy, which sync-on-write then skipped (R3).
    fn write_existing<'g>(
        &self,
        leaf: &'g LeafMeta,
        i: usize,
        key: u64,
        value: u64,
        g: &'g Guard,
    ) -> bool {
        let blk = self.blk(leaf.data);
        // Test hook (tests/interleavings.rs): the value store and the tag's release are still
        // in the store buffer — issued, not yet visible to other cores — where x86-TSO lets
        // them be: past the loads that follow them, up to the next fence (none here).
        let buffered = numakv_pmem::fail_point!("nbtree.update.store_buffered");
        let Some(tag) = leaf.begin_unsealed(i) else { return false };
        let store = || {
            // ORDERING: Release; pairs with the Acquire loads of readers.
            blk.entry(i).val.store(value, Ordering::Release);
            leaf.end_unsealed(i, tag, 0);
            // PERSIST: one flush per update (ADR).
            self.pool.persist_obj(blk.entry(i));
        };
        if !buffered {
            store();
        }
        numakv_pmem::pause_point!("nbtree.update.stored");
        if buffered {
            store(); // the fence below drains the store buffer
        }
        // The paper's `mfence` per persisted store (eADR): StoreLoad between the value store
        // (and the tag's release) and the loads of sync-on-write, which neither the Release
        // stores nor ADR's sfence give. Without it, on x86-TSO the update could see no copy
        // while its store was still buffered, and an earlier update's sync-on-write could carry
        // the older value into the copy meanwhile (issue 33, defect 4).
        // ORDERING: SeqCst fence; pairs with the SeqCst CAS that publishes the copy (copy_phase):
        // either our load below sees the copy, or the copy phase and everything after it see
        // our store.
        std::sync::atomic::fence(Ordering::SeqCst);
        // What sync-on-write touches exists only because of an SMO: counted as the SMO's share
        // of PM accesses.
        let _acct = account::smo_scope();
        self.sync_on_write(leaf, i, key, g);
        numakv_pmem::pause_point!("nbtree.update.checked");
        true
    }

    /// Brings `leaf` — a new leaf of an SMO, reached along its predecessor's `next` before the
    /// SMO's link phase completed — to life by finishing that SMO (only its link phase is left,
    /// which allocates nothing). A leaf is written directly, or runs an SMO of its own, only
    /// once live: until then the old leaf's link may still be undone by the predecessor's SMO
    /// (see `patch_copy`) or the parent still names the old leaf (issue 33, defects 1 and 2).
    pub(crate) fn make_live(&self, leaf: &LeafMeta, g: &Guard) -> Result<()> {
        if leaf.live() || leaf.source.is_null() {
            return Ok(());
        }
        // `source` is retired only after its LINK, which follows our LIVE: the caller, pinned,
        // saw the leaf not live, so the old leaf is not freed before the guard goes.
        let src = self.meta(leaf.source, g);
        self.smo(src, g)?;
        self.counters.smo_helps.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Sync-on-write: while the leaf written has an SMO copy, bring the copy's entry up to date
    /// unless a direct write there is newer (tag state 0), following the copies' own SMOs.
    /// Only the copy of the instance written (`src` matches) is touched: a copied slot holding
    /// a later instance of the key (removed and inserted again in the old leaf before the copy
    /// phase) belongs to others, and tagging it SYNC would make the sync phase skip it.
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
            if j as u32 >= tgt.copied || tgt.src[j] as usize != i {
                return; // our instance was removed; this one was inserted later
            }
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
                return; // a direct write in the copy is newer: ours precedes it
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
        let leaf = self.find_leaf(key, g);
        self.delete_from(leaf, key, g)
    }

    /// [`NbTree::delete_key`] from `leaf`, the leaf the descent found (possibly long ago).
    pub(crate) fn delete_from<'g>(
        &self,
        leaf: &'g LeafMeta,
        key: u64,
        g: &'g Guard,
    ) -> Result<bool> {
        while !leaf.live() {
            self.make_live(leaf, g)?;
        }
        self.delete_in(leaf, key, g)
    }

    /// [`NbTree::delete_from`] without the liveness check: also the redirected delete of a
    /// sealed slot, on the copy of an SMO in progress (the copy decides; the old leaf gets the
    /// mirror).
    fn delete_in<'g>(&self, mut leaf: &'g LeafMeta, key: u64, g: &'g Guard) -> Result<bool> {
        loop {
            let _w = self.variant.locks_writes().then(|| leaf.lock.write());
            if self.variant.locks_writes() && leaf.in_smo() {
                // Under the lock: the SMO is over unless its initiator failed; finish it.
                self.smo(leaf, g)?;
                drop(_w);
                leaf = self.find_leaf(key, g);
                while !leaf.live() {
                    self.make_live(leaf, g)?; // a fresh descent writes live leaves only
                }
                continue;
            }
            let blk = self.blk(leaf.data);
            let Some(i) = leaf.find(&blk, key) else { return Ok(false) };
            let e = blk.entry(i);
            // The key CAS commits only while the slot is unsealed (see leaf.rs, SEAL): a sealed
            // old leaf is frozen for deletes, and the copy — which may already have lost the key
            // to a delete run there — decides.
            // ORDERING: Release CAS: exactly one of two racing deletes succeeds.
            let cas = || e.key.compare_exchange(key, 0, Ordering::Release, Ordering::Relaxed);
            match leaf.unsealed(i, cas) {
                None => {
                    let tgt = self.copy_target(self.meta(leaf.copy_ptr(), g), key, g);
                    let deleted = self.delete_in(tgt, key, g)?;
                    numakv_pmem::pause_point!("nbtree.delete.redirected");
                    let _acct = account::smo_scope(); // the mirror: the SMO's share
                                                      // Mirror into the old leaf whatever the copy decided: until the SMO's PM
                                                      // link (its durability point) only the old block survives a crash. When
                                                      // the copy removed the key here, an acknowledged delete must survive; when
                                                      // the copy had already lost it (a delete redirected before us, parked
                                                      // before its own mirror), the absence we report must survive too — as
                                                      // `mirror_absence` does for a read (review-nbtree). The same holds one
                                                      // level down: the recursive call above mirrored into `tgt` when `tgt`'s
                                                      // slot was itself sealed. Readers and syncers of the old leaf then see the
                                                      // key gone, which the copy already shows.
                                                      // ORDERING: Release CAS, as every key removal.
                    let _ = e.key.compare_exchange(key, 0, Ordering::Release, Ordering::Relaxed);
                    // PERSIST: the mirrored deletion (ours or the absence the copy showed),
                    // before we return.
                    self.pool.persist_obj(e);
                    return Ok(deleted);
                }
                Some(Err(_)) => return Ok(false),
                Some(Ok(_)) => {}
            }
            // PERSIST: one flush per delete (ADR).
            self.pool.persist_obj(e);
            let _acct = account::smo_scope(); // sync-on-write of the delete: the SMO's share
            self.sync_delete(leaf, i, key, g);
            return Ok(true);
        }
    }
    /// Sync-on-write of a delete that zeroed slot `i` of `leaf`: along the chain of SMO copies.
    pub(crate) fn sync_delete<'g>(&self, leaf: &'g LeafMeta, i: usize, key: u64, g: &'g Guard) {
        // Sync the deletion along the copies: the copy of the instance deleted (slot `si`
        // of `src`), not a later instance of the key — one inserted into the old leaf after
        // our CAS and copied, or into the copy after the SMO — which belongs to others.
        let (mut src, mut si) = (leaf, i);
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
            if j as u32 >= tgt.copied || tgt.src[j] as usize != si {
                break; // not our instance: the copy phase did not take it (we were first)
            }
            // ORDERING: Release CAS, as above.
            let _ = tb.entry(j).key.compare_exchange(key, 0, Ordering::Release, Ordering::Relaxed);
            // PERSIST: the synchronised deletion is durable before we return.
            self.pool.persist_obj(tb.entry(j));
            (src, si) = (tgt, j);
        }
    }
}

#[cfg(test)]
mod tests {
    //! Stale writers: an operation that found its leaf before the leaf's SMO and acts on it
    //! after the SMO (here: after the whole SMO, and after a delete on the copy). Forced
    //! deterministically by holding the leaf the descent returned across the SMO, which is
    //! what a preempted thread does.

    use numakv_index::{Engine, Index};
    use numakv_pmem::alloc::epoch;
    use numakv_pmem::{Pool, PoolConfig};

    use crate::leaf::{FLAG_LINK, FLAG_SYNC};
    use crate::{NbTree, NbTreeOptions};

    fn tree(coupled: bool) -> NbTree {
        let pool = Pool::volatile(PoolConfig::new(NbTree::engine_id(), 64 << 20)).unwrap();
        let opts = NbTreeOptions { leaf_slots: 3, coupled, ..Default::default() };
        NbTree::create(pool, &opts).unwrap()
    }

    /// Fills the first leaf (3 slots), returns it as a stale descent would hold it, and then
    /// splits it with a fourth insert (which helps the SMO through its link phase).
    fn stale_leaf<'g>(t: &NbTree, g: &'g epoch::Guard) -> &'g crate::leaf::LeafMeta {
        for k in 1..=3 {
            assert!(t.insert(k, k * 10).unwrap());
        }
        let leaf = t.find_leaf(2, g);
        assert!(t.insert(4, 40).unwrap());
        assert_eq!(leaf.flags() & (FLAG_SYNC | FLAG_LINK), FLAG_SYNC | FLAG_LINK);
        leaf
    }

    /// remove(k) → true on the copy, then a delete that found `k` in the old leaf before the
    /// SMO commits: it must not succeed a second time (before the fix its key CAS on the
    /// retired leaf, which still holds `k`, returned true).
    #[test]
    fn stale_delete_after_smo_does_not_remove_twice() {
        for coupled in [false, true] {
            let t = tree(coupled);
            let g = epoch::pin();
            let old = stale_leaf(&t, &g);
            assert!(t.remove(2).unwrap());
            assert!(!t.delete_from(old, 2, &g).unwrap(), "coupled={coupled}");
            assert_eq!(t.get(2).unwrap(), None);
            // Reinserted (the copy holding 2 is full: a second SMO moves it on). The stale
            // delete meets the copy that lost 2 — sealed by its own SMO — and reports absent
            // (linearized before the reinsert, inside its interval); the new instance stays.
            assert!(t.insert(2, 99).unwrap());
            assert!(!t.delete_from(old, 2, &g).unwrap());
            assert_eq!(t.get(2).unwrap(), Some(99));
            assert!(t.remove(2).unwrap());
            assert!(!t.remove(2).unwrap());
            for k in [1, 3, 4] {
                assert_eq!(t.get(k).unwrap(), Some(k * 10));
            }
            drop(g);
            t.check().unwrap();
        }
    }

    /// update(k) that found `k` in a leaf before the leaf's whole SMO, after a delete on the
    /// copy removed `k`: the old slot is sealed, so it stores nothing there, follows the SMO
    /// to the copy and reports "absent" (it runs after the delete); its value never appears.
    /// (Before sealing applied to updates it wrote the retired leaf and returned true.)
    #[test]
    fn stale_update_after_smo_and_delete_leaves_the_key_removed() {
        for coupled in [false, true] {
            let t = tree(coupled);
            let g = epoch::pin();
            let old = stale_leaf(&t, &g);
            assert!(t.remove(2).unwrap());
            assert!(!t.update_from(old, 2, 77, &g).unwrap(), "coupled={coupled}");
            assert_eq!(t.get(2).unwrap(), None);
            assert!(!t.remove(2).unwrap());
            let mut out = Vec::new();
            t.scan(1, 10, &mut out).unwrap();
            assert!(out.iter().all(|e| e.0 != 2 && e.1 != 77), "{out:?}");
            // A stale update whose instance is still live in the copy succeeds there.
            assert!(t.update_from(old, 3, 33, &g).unwrap());
            assert_eq!(t.get(3).unwrap(), Some(33));
            for k in [1, 4] {
                assert_eq!(t.get(k).unwrap(), Some(k * 10));
            }
            drop(g);
            t.check().unwrap();
        }
    }

    /// A stale update of a removed instance (slot `i`) must not touch the copy of a later
    /// instance of the key (slot `m`, inserted again before the copy phase): before the fix
    /// its sync-on-write tagged that copy SYNC, and the sync phase then skipped it, losing an
    /// update of the new instance that landed in the old leaf while the copy was being made.
    #[test]
    fn stale_update_spares_the_copy_of_a_reinserted_key() {
        let t = tree(false);
        let g = epoch::pin();
        assert!(t.insert(1, 10).unwrap());
        assert!(t.insert(2, 20).unwrap());
        let leaf = t.find_leaf(2, &g);
        let blk = t.blk(leaf.data);
        let old_slot = leaf.find(&blk, 2).unwrap();
        assert!(t.remove(2).unwrap());
        assert!(t.insert(2, 21).unwrap());
        let new_slot = leaf.find(&blk, 2).unwrap();
        assert_ne!(new_slot, old_slot);
        // The copy phase only, as a helper preempted after it leaves it.
        leaf.bitmap.fetch_or(crate::leaf::SMO_BIT, std::sync::atomic::Ordering::SeqCst);
        t.copy_phase(leaf, &g).unwrap();
        // An update of the new instance whose sync-on-write ran before the copy was published
        // (it saw no copy and left the value to the sync phase): its store, alone.
        blk.entry(new_slot).val.store(55, std::sync::atomic::Ordering::Release);
        // The stale update of the removed instance.
        assert!(t.write_existing(leaf, old_slot, 2, 77, &g)); // unsealed: no sync phase yet
        t.smo(leaf, &g).unwrap();
        assert_eq!(t.get(2).unwrap(), Some(55));
        drop(g);
        t.check().unwrap();
    }

    /// A delete in the old leaf before its SMO's sync pass (copy published, not synced) is
    /// carried to the copy, and the key never comes back.
    #[test]
    fn delete_between_copy_and_sync_is_carried_over() {
        let t = tree(false);
        let g = epoch::pin();
        for k in 1..=3 {
            assert!(t.insert(k, k * 10).unwrap());
        }
        let leaf = t.find_leaf(2, &g);
        // Force the copy phase only, as a helper preempted after it would leave it.
        leaf.bitmap.fetch_or(crate::leaf::SMO_BIT, std::sync::atomic::Ordering::SeqCst);
        t.copy_phase(leaf, &g).unwrap();
        assert!(!leaf.copy_ptr().is_null());
        assert_eq!(leaf.flags() & FLAG_SYNC, 0);
        assert!(t.delete_from(leaf, 2, &g).unwrap());
        assert_eq!(t.get(2).unwrap(), None);
        t.smo(leaf, &g).unwrap();
        assert_eq!(t.get(2).unwrap(), None);
        assert!(!t.remove(2).unwrap());
        assert!(!t.delete_from(leaf, 2, &g).unwrap());
        drop(g);
        t.check().unwrap();
    }

    /// A delete whose sync-on-write runs late: between its key CAS (slot 1 of the first leaf)
    /// and the walk along the copies, the key is inserted again (slot 2 of the same leaf) and
    /// the leaf splits, copying the new instance. The walk must leave that instance alone
    /// (before the fix it zeroed it: a key lost with no remove).
    #[test]
    fn late_delete_sync_spares_a_reinserted_key() {
        for coupled in [false, true] {
            let t = tree(coupled);
            let g = epoch::pin();
            assert!(t.insert(1, 10).unwrap());
            assert!(t.insert(2, 20).unwrap());
            let leaf = t.find_leaf(2, &g);
            let blk = t.blk(leaf.data);
            let old_slot = leaf.find(&blk, 2).unwrap();
            assert!(t.remove(2).unwrap());
            assert!(t.insert(2, 21).unwrap());
            assert_ne!(leaf.find(&blk, 2), Some(old_slot));
            assert!(t.insert(3, 30).unwrap());
            assert!(t.insert(4, 40).unwrap()); // the leaf is full: SMO, copy holds 2 → 21
            assert_ne!(leaf.flags() & FLAG_LINK, 0);
            t.sync_delete(leaf, old_slot, 2, &g); // the first remove's walk, late
            assert_eq!(t.get(2).unwrap(), Some(21), "coupled={coupled}");
            drop(g);
            t.check().unwrap();
        }
    }
}
