//! Create and open-with-recovery (papers/nap.txt §4.6).
//!
//! Open:
//! 1. the raw engine recovers (its own protocol);
//! 2. a valid undo record (`UNDO_STATE = 1`) rolls the three NAL pointers back;
//! 3. the PC-views of `pre`, then of `cur`, are flushed into the raw index — per key the highest
//!    version across nodes wins, a deletion marker removes — so `cur`'s newer values land last;
//! 4. `PRE`, then `CUR`, then `GC` are cleared (in that order: a crash between leaves at worst
//!    `cur` to flush again, never `pre` alone over `cur`'s values);
//! 5. every page-heap extent owned by Nap is freed: the views just flushed, `gc`'s, and any
//!    orphan of a switch interrupted before its pointers were logged.
//!
//! Every step is idempotent, so a crash during recovery just runs it again. The session then
//! starts with the empty NAL; the switch thread finds the hot set again within a period.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use numakv_index::{Error, RecoveryReport, Result};
use numakv_pmem::alloc::epoch;
use numakv_pmem::{PPtr, Pool};

use crate::layout::{
    DEL, ENGINE, NAP_META, OWNER_NAP, SLOT_BASE, SLOT_CUR, SLOT_GC, SLOT_META, SLOT_PRE, SLOT_UNDO,
    SLOT_UNDO_STATE,
};
use crate::{nal, Inner, NapOptions};

/// Refuses a pool whose Nap slots are in use (before the raw engine is created).
pub(crate) fn create<I: Inner>(pool: &Pool, _opts: &NapOptions<I::Options>) -> Result<()> {
    for s in SLOT_BASE..SLOT_BASE + 8 {
        if pool.root(s)?.load(Ordering::Acquire) != 0 {
            return Err(Error::InvalidOptions("pool already holds a nap layer".into()));
        }
    }
    Ok(())
}

/// Marks the pool as holding a Nap layer (after the raw engine was created).
pub(crate) fn init_slots(pool: &Pool) -> Result<()> {
    let meta = pool.root(SLOT_META)?;
    meta.store(NAP_META, Ordering::Release);
    // PERSIST: the layer exists from now on; the pointers are 0 (empty NAL).
    pool.persist_obj(meta);
    Ok(())
}

fn clear(pool: &Pool, slot: usize) -> Result<()> {
    let w = pool.root(slot)?;
    w.store(0, Ordering::Release);
    // PERSIST: each pointer is retired durably before the next one (order in the module docs).
    pool.persist_obj(w);
    Ok(())
}

/// [`numakv_index::Engine::open`] for Nap: returns the recovered raw engine.
pub(crate) fn open<I: Inner>(
    pool: Arc<Pool>,
    opts: &NapOptions<I::Options>,
) -> Result<(I, RecoveryReport)> {
    let t0 = Instant::now();
    let meta = pool.root(SLOT_META)?.load(Ordering::Acquire);
    if meta != NAP_META {
        return Err(Error::corrupted(
            ENGINE,
            format!("META: slot {SLOT_META} holds {meta:#x}, not a nap layer of this format"),
        ));
    }
    let (raw, raw_report) = I::open(Arc::clone(&pool), &opts.inner)?;
    let state = pool.root(SLOT_UNDO_STATE)?.load(Ordering::Acquire);
    let rolled_back = match state {
        0 => false,
        1 => {
            for (k, s) in [SLOT_CUR, SLOT_PRE, SLOT_GC].into_iter().enumerate() {
                let old = pool.root(SLOT_UNDO + k)?.load(Ordering::Acquire);
                pool.root(s)?.store(old, Ordering::Release);
            }
            // PERSIST: the pointers are back to their logged values before the record is
            // retired.
            pool.persist_obj(pool.root(SLOT_CUR)?);
            clear(&pool, SLOT_UNDO_STATE)?;
            true
        }
        s => {
            return Err(Error::corrupted(ENGINE, format!("undo log: state word {s:#x}")));
        }
    };
    let mut flushed = 0u64;
    let mut removed = 0u64;
    for slot in [SLOT_PRE, SLOT_CUR] {
        let root = PPtr::from_raw(pool.root(slot)?.load(Ordering::Acquire));
        if root.is_null() {
            continue;
        }
        for (key, value, version) in nal::read_pm(&pool, root)? {
            if version & !DEL == 0 {
                continue;
            }
            if version & DEL != 0 {
                raw.remove(key)?;
                removed += 1;
            } else {
                raw.upsert(key, value)?;
            }
            flushed += 1;
        }
    }
    for slot in [SLOT_PRE, SLOT_CUR, SLOT_GC] {
        clear(&pool, slot)?;
    }
    if removed > 0 {
        // Removes may have merged raw nodes, whose blocks wait for an epoch grace period; no
        // other thread runs yet, so a few flushes of the epoch machinery return them now and the
        // recovered store starts without blocks allocated but unreachable.
        for _ in 0..64 {
            epoch::pin().flush();
        }
    }
    let mut extents = 0u64;
    for node in 0..pool.nodes() {
        for e in pool.extents(node)? {
            if e.owner == OWNER_NAP {
                pool.free_pages(e.ptr)?;
                extents += 1;
            }
        }
    }
    let mut counters = raw_report.counters;
    counters.extend([
        ("nap_undo_rolled_back", u64::from(rolled_back)),
        ("nap_entries_flushed", flushed),
        ("nap_extents_freed", extents),
    ]);
    let report =
        RecoveryReport { was_clean: raw_report.was_clean, elapsed: t0.elapsed(), counters };
    Ok((raw, report))
}
