//! Per-thread future objects (PTFOs, papers/f3tree.txt §4.4–4.5, Algorithm 1, Fig. 4): one
//! persistent doubly linked list of FOs per producer (thread, node), in that node's PM.
//!
//! The producer appends at the head, the list's one consumer (an evaluate thread) takes from the
//! tail; they share no lock. What each side writes, in order, and why (PERSIST comments below):
//!
//! - **append** (Fig. 4a): key and value, then the meta word (version, flags) that makes the entry
//!   valid; flush + fence — the *durability point* of the operation — then publish it to the
//!   consumer (`head_used`) and to the table.
//! - **new FO** (Fig. 4b, Algorithm 1 lines 10–13): the block is zeroed and its header written
//!   (`next` = the current head, `base` = the sequence number its entry 0 gets) and persisted
//!   *before* it is linked; then the old head's `prev` points to it and is persisted — from then
//!   on a walk from the tail reaches it (the multi-FO durability point); then the directory's
//!   head hint.
//! - **watermark**: once per evaluation the consumer persists the list's `applied` sequence
//!   number (only upwards): entries below it are processed and never replayed.
//! - **unlink** (Algorithm 1 lines 28–29): once every entry of the tail FO is processed (below
//!   the durable watermark) and a newer FO exists, the directory's tail moves to `prev` and is
//!   persisted; only then is the FO freed. A crash in between leaves an unreachable block that
//!   NSM's recovery reclaims.
//!
//! Freed FOs go back to NSM at once, without an epoch grace period: nobody reads an FO without
//! either being its list's producer (which only touches the head FO) or consumer, or holding the
//! shard lock of a key the table maps into it — and the consumer frees an FO only after it has
//! processed every entry of it under those shard locks, after which the table maps no key into it.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

use numakv_index::{Error, Result};
use numakv_pmem::alloc::nsm::Nsm;
use numakv_pmem::alloc::PmAllocator;
use numakv_pmem::{PPtr, Pool};
use parking_lot::Mutex;

use crate::layout::{fo_bytes, Desc, Fo, FoEntry, DEAD, ENTRY_SIZE, FO_HEADER, FO_MAGIC};

/// The consumer's position in a list.
#[derive(Debug)]
pub struct Cursor {
    /// FO holding the next entry to process.
    pub fo: PPtr,
    /// Index of that entry.
    pub idx: usize,
    /// When the list was last evaluated.
    pub last_eval: Instant,
}

/// DRAM state of one PTFO list.
#[derive(Debug)]
pub struct List {
    /// Directory slot.
    pub slot: usize,
    /// Node of the list's FOs.
    pub node: usize,
    /// A list found at open: no producer; freed entirely once drained.
    pub recovering: bool,
    /// Entry slots of this list's new FOs.
    pub cap: usize,
    /// The head FO (raw PPtr). ORDERING: Release by the producer after the FO is linked;
    /// Acquire by the consumer.
    pub head: AtomicU64,
    /// Entries published in the head FO. ORDERING: Release by the producer after the entry is
    /// durable; Acquire by the consumer, which then reads the entries.
    pub head_used: AtomicUsize,
    /// Entries appended since open (statistics, thresholds).
    pub produced: AtomicU64,
    /// Entries the consumer processed since open.
    pub consumed: AtomicU64,
    /// FOs in the list (the FO limit counts these).
    pub fos: AtomicUsize,
    /// The producer waits at the FO limit.
    pub waiting: AtomicBool,
    /// The consumer's position; the mutex serialises evaluators (one consumer at a time).
    pub cursor: Mutex<Cursor>,
    /// A recovering list that was drained and freed.
    pub retired: AtomicBool,
    /// Which evaluator serves the list: `rank % evaluators` (per node when NUMA-aware).
    pub rank: AtomicU64,
}

impl List {
    /// A list in DRAM for an existing persistent list: FOs from `tail` to `head`, `fos` of them,
    /// `head_used` entries valid in the head.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        slot: usize,
        node: usize,
        recovering: bool,
        cap: usize,
        tail: PPtr,
        head: PPtr,
        head_used: usize,
        fos: usize,
        produced: u64,
    ) -> List {
        List {
            slot,
            node,
            recovering,
            cap,
            head: AtomicU64::new(head.raw()),
            head_used: AtomicUsize::new(head_used),
            produced: AtomicU64::new(produced),
            consumed: AtomicU64::new(0),
            fos: AtomicUsize::new(fos),
            waiting: AtomicBool::new(false),
            cursor: Mutex::new(Cursor { fo: tail, idx: 0, last_eval: Instant::now() }),
            retired: AtomicBool::new(false),
            rank: AtomicU64::new(0),
        }
    }

    /// Entries appended and not yet processed.
    pub fn pending(&self) -> u64 {
        // ORDERING: Relaxed; a heuristic for the thresholds, exactness comes from the cursor.
        self.produced.load(Ordering::Relaxed).saturating_sub(self.consumed.load(Ordering::Relaxed))
    }

    /// The head FO.
    pub fn head(&self) -> PPtr {
        // ORDERING: Acquire; pairs with the Release in `link_new_fo`.
        PPtr::from_raw(self.head.load(Ordering::Acquire))
    }
}

/// Allocates an FO of `cap` entries on `node`, zeroes it, writes its header (`next` = `older`)
/// and persists it; the FO is not linked yet.
pub fn alloc_fo(
    pool: &Pool,
    nsm: &Nsm,
    node: usize,
    cap: usize,
    older: PPtr,
    slot: usize,
    base: u64,
) -> Result<PPtr> {
    let p = nsm.alloc_on(fo_bytes(cap), Some(node))?;
    let fo = match Fo::resolve_new(pool, p, cap) {
        Ok(fo) => fo,
        Err(e) => {
            // SAFETY: `p` was just allocated and is not linked anywhere.
            let _ = unsafe { nsm.free(p) };
            return Err(e);
        }
    };
    let bytes = pool.bytes(p, fo_bytes(cap))?;
    // SAFETY: the block was just allocated and is reachable by no one else; `fill` stays within
    // the block's checked bounds.
    unsafe {
        bytes.fill(FO_HEADER as usize, cap * crate::layout::ENTRY_SIZE as usize, 0);
    }
    fo.hdr.next.store(older.raw(), Ordering::Relaxed);
    fo.hdr.prev.store(0, Ordering::Relaxed);
    fo.hdr.base.store(base, Ordering::Relaxed);
    fo.hdr.cap.store(cap as u64, Ordering::Relaxed);
    fo.hdr.list.store(slot as u64, Ordering::Relaxed);
    fo.hdr.magic.store(FO_MAGIC, Ordering::Release);
    // PERSIST: the zeroed entries and the header are durable before the FO is linked, so a walk
    // after a crash never finds stale entries (NSM blocks may hold old bytes) or a bad header.
    pool.persist(bytes.as_ptr(), fo_bytes(cap));
    Ok(p)
}

/// Creates a persistent list in directory slot `slot` (free) with one empty FO on `node`.
pub fn create_list(
    pool: &Pool,
    nsm: &Nsm,
    desc: &Desc,
    slot: usize,
    node: usize,
    cap: usize,
) -> Result<List> {
    let fo = alloc_fo(pool, nsm, node, cap, PPtr::NULL, slot, 0)?;
    desc.node.store(node as u64, Ordering::Relaxed);
    desc.head.store(fo.raw(), Ordering::Relaxed);
    // A reused slot's watermark belongs to the list that had it.
    desc.applied.store(0, Ordering::Relaxed);
    // PERSIST: node, head hint and watermark are durable before the tail that commits the list.
    pool.persist_obj(desc);
    desc.tail.store(fo.raw(), Ordering::Release);
    // PERSIST: the list exists (its FO is reachable for recovery and NSM's GC).
    pool.persist_obj(&desc.tail);
    Ok(List::new(slot, node, false, cap, fo, fo, 0, 1, 0))
}

/// Links a new FO, allocated on `node`, at the head of `list` (the producer's, whose head FO is
/// full). `node` is the list's node when NUMA-aware; the non-NUMA variant interleaves.
pub fn link_new_fo(pool: &Pool, nsm: &Nsm, desc: &Desc, list: &List, node: usize) -> Result<()> {
    let old = list.head();
    let old_fo = Fo::resolve(pool, old)?;
    let base = old_fo.seq(old_fo.cap);
    let new = alloc_fo(pool, nsm, node, list.cap, old, list.slot, base)?;
    // ORDERING: Release; pairs with the consumer's Acquire of `prev` (`Fo::prev`).
    old_fo.hdr.prev.store(new.raw(), Ordering::Release);
    // PERSIST: DLP 2 of Fig. 4b — the new FO is reachable from the tail by a backward walk.
    pool.persist_obj(&old_fo.hdr.prev);
    desc.head.store(new.raw(), Ordering::Relaxed);
    // PERSIST: the head hint (recovery does not trust it; it only spares a walk in tools).
    pool.persist_obj(&desc.head);
    list.fos.fetch_add(1, Ordering::Relaxed);
    // ORDERING: the Release store of `head` below publishes `head_used = 0` with it: a consumer
    // that sees the new head sees its count.
    list.head_used.store(0, Ordering::Relaxed);
    list.head.store(new.raw(), Ordering::Release);
    Ok(())
}

/// Writes entry `idx` of the head FO (which has room) and makes it durable; returns its location.
///
/// The producer's own list only: its head FO is one `alloc_fo` made with `list.cap` entries, so
/// the entry is addressed from the cached head pointer without resolving and re-validating the
/// FO header per append.
pub fn append(
    pool: &Pool,
    list: &List,
    idx: usize,
    key: u64,
    value: u64,
    meta: u64,
) -> Result<PPtr> {
    if idx >= list.cap || list.recovering {
        return Err(Error::corrupted(crate::layout::ENGINE, "append beyond the head FO"));
    }
    let loc = PPtr::from_raw(list.head().raw() + FO_HEADER + idx as u64 * ENTRY_SIZE);
    // SAFETY: the head of a producer's (non-recovering) list was allocated by `alloc_fo` with
    // `list.cap` entries, which checked that the whole block lies in the pool
    // (`Fo::resolve_new`); `idx < list.cap`, and entries are 32-byte aligned in a 64-byte
    // aligned block. Only this producer writes the head's unpublished entries.
    let e = unsafe { pool.get_unchecked::<FoEntry>(loc) };
    e.key.store(key, Ordering::Relaxed);
    e.value.store(value, Ordering::Relaxed);
    // ORDERING: Release; key and value are visible before the meta word that validates them
    // (and, being in the same line, never durable without them being written first).
    e.meta.store(meta, Ordering::Release);
    // PERSIST: DLP 1 of Fig. 4a — the operation is durable; this is its durability point.
    // (No FO `count` is kept: recovery finds the valid entries by their meta words, and a
    // count store would dirty the header line on every append.)
    pool.persist_obj(e);
    // ORDERING: Release; pairs with the consumer's Acquire: the durable entry is visible.
    list.head_used.store(idx + 1, Ordering::Release);
    list.produced.fetch_add(1, Ordering::Relaxed);
    Ok(loc)
}

/// Marks the entry at `loc` dead and persists the mark.
pub fn mark_dead(pool: &Pool, loc: PPtr) -> Result<()> {
    let e = pool.get::<FoEntry>(loc)?;
    let m = e.meta.load(Ordering::Acquire);
    e.meta.store(m | DEAD, Ordering::Release);
    // PERSIST: the entry is never replayed by a recovery (it was applied or superseded).
    pool.persist_obj(&e.meta);
    Ok(())
}

/// Moves the list's `applied` watermark up to `seq` and persists it: every entry before `seq` is
/// processed (applied to the tree, whose writes are durable, or superseded and DEAD). One flush
/// per evaluation instead of one DEAD mark per applied entry. Called by the list's one consumer.
///
/// Never moves it back: after a crash between an evaluation's watermark and its unlinks, a
/// recovered list's first evaluation restarts at the tail and may end below the watermark;
/// lowering it would make entries live again that were applied and may have been superseded
/// since from another list (`tests/interleavings.rs`, `the_watermark_never_moves_back`).
pub fn set_watermark(pool: &Pool, desc: &Desc, seq: u64) {
    // ORDERING: Relaxed; only this list's consumer writes the watermark.
    if seq <= desc.applied.load(Ordering::Relaxed) {
        return;
    }
    desc.applied.store(seq, Ordering::Release);
    // PERSIST: the entries below `seq` are never replayed after a crash.
    pool.persist_obj(&desc.applied);
}

/// Unlinks the tail FO `fo` (fully processed; `newer` is its `prev`, non-null) and frees it.
pub fn unlink_tail(pool: &Pool, nsm: &Nsm, desc: &Desc, fo: PPtr, newer: PPtr) -> Result<()> {
    desc.tail.store(newer.raw(), Ordering::Release);
    // PERSIST: the FO is unreachable before its block can be reused.
    pool.persist_obj(&desc.tail);
    // SAFETY: `fo` was allocated by this NSM as an FO, is now unreachable from PM, and (module
    // docs) no thread can still read it: its entries are all processed.
    unsafe { nsm.free(fo)? };
    Ok(())
}

/// Frees the last FO of a drained recovering list and its directory slot.
pub fn retire_list(pool: &Pool, nsm: &Nsm, desc: &Desc, fo: PPtr) -> Result<()> {
    desc.tail.store(0, Ordering::Release);
    // PERSIST: the list is gone before its FO is reused.
    pool.persist_obj(&desc.tail);
    // SAFETY: as in `unlink_tail`; a recovering list has no producer.
    unsafe { nsm.free(fo)? };
    Ok(())
}
