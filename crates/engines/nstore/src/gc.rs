//! Garbage collection (papers/nstore.txt §III-F).
//!
//! One GC thread per node (configurable) reclaims that node's sealed files whose garbage share
//! exceeds `gc_threshold`. For every valid entry `e` of such a file, under `e`'s key lock:
//!
//! 1. **Invalidate history**: follow `h_addr` from `e` to older entries of the key until the
//!    invalid h_addr, an entry already `inv`, or an address whose file no longer exists; then mark
//!    them `inv` *oldest first*, persisting each mark before the next. (Oldest first: a crash in
//!    the middle leaves a valid prefix of the chain that the next walk, which stops at the first
//!    `inv`, still reaches.)
//! 2. If `e` is the key's current entry (the index names it), append a copy to the active file of
//!    its cluster on this node with a new version and `h_addr = e`, and point the index at it.
//!    Other entries (superseded ones, delete entries) are dropped.
//!
//! Then the file is unlinked from the file table and queued; its pages are freed once every
//! reader that might hold an address in it has unpinned its epoch, and only after every file
//! queued before it (a FIFO: durable frees follow retire order by construction). A free first
//! invalidates the file's header durably, so pages handed out again never revive it
//! (`nlog::free_file_extent`). `close()` frees the whole queue before it writes the snapshot.
//!
//! **Why this never resurrects a key** (docs/design.md, "NStore", GC): recovery keeps a key's
//! highest-version valid entry. An entry disappears only when its file is freed, after step 1
//! made every older entry reachable from it durably `inv`; entries not reachable from it were
//! cut off by an earlier free, which did the same for them. So when a delete entry goes, no
//! older entry of its key is valid any more, and when a live entry goes, its copy — newer, and
//! durable before the index moved — outranks every older one.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use numakv_index::Result;
use numakv_pmem::alloc::epoch;
use numakv_pmem::{PPtr, PoolError};

use crate::layout::{self, decode_meta, Op, VAddr, OP_MASK};
use crate::nlog::{LogFile, Need};
use crate::Inner;

/// The GC thread `idx` of `per_node` on `node`: collects until the store shuts down.
pub(crate) fn run(inner: &Inner, node: usize, idx: usize, per_node: usize) {
    numakv_numa::set_current_node(node);
    loop {
        {
            let mut woken = inner.wake.0.lock();
            if !*woken {
                inner.wake.1.wait_for(&mut woken, inner.opts.gc_interval);
            }
        }
        // ORDERING: Acquire; pairs with the Release store in NStore::shutdown.
        if inner.stop.load(Ordering::Acquire) {
            return;
        }
        // Deferred frees of reclaimed files run only when some thread pins or flushes the
        // epoch; writers never pin, so in a write-only workload nobody else would: advance and
        // collect here, every pass.
        epoch::pin().flush();
        drain_retired(inner);
        // An error (e.g. out of space for the rewrites, or the pool crashed) leaves its file as
        // it was (every step is crash-safe on its own; `collect` counted it) and the next pass
        // tries again.
        let _ = collect(inner, node, idx, per_node);
        // The pass's PM lines (rewrites, invalidations, frees) go into the thread's published
        // totals, where a benchmark's counted phase finds them (docs/design.md §11).
        numakv_pmem::account::op_split();
    }
}

/// Whether GC should reclaim `f` now: sealed, no reservation in flight, garbage share above
/// the threshold, not taken by another pass.
pub(crate) fn eligible(inner: &Inner, f: &LogFile) -> bool {
    // ORDERING: Acquire on `sealed` and `pending`; pair with the Release stores in
    // Nlog::reserve and Nlog::write: every reserved entry of the file is complete.
    f.sealed.load(Ordering::Acquire)
        && f.pending.load(Ordering::Acquire) == 0
        && f.dead_share() > inner.opts.gc_threshold
        && !f.claimed.load(Ordering::Acquire)
}

/// How long GC passes must find an active file unchanged before it counts as idle.
pub(crate) const IDLE_TIME: std::time::Duration = std::time::Duration::from_secs(1);

/// Milliseconds since the first call in this process, plus 1 (so never 0).
pub(crate) fn clock_ms() -> u64 {
    static T0: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    T0.get_or_init(std::time::Instant::now).elapsed().as_millis() as u64 + 1
}

/// Seals `f` when it is an active file that no write reached for [`IDLE_TIME`] (as seen by the
/// passes over it) and whose garbage share is above the threshold, so that the pass (and
/// later ones) can reclaim it. The paper reclaims full files only; without this, the garbage in
/// the active files of idle clusters — up to clusters × 2 kinds × `log_file_size` per node —
/// stayed for good. The cluster's next write allocates a new file of the first file's size.
/// (Time, not a number of passes: with a 1 ms `gc_interval` a few passes are no idleness, and
/// sealing busy files churns files and retires for nothing.)
fn seal_if_idle(inner: &Inner, f: &LogFile) {
    // ORDERING: Acquire; pairs with the Release stores of `sealed` and `tail` in Nlog.
    if f.sealed.load(Ordering::Acquire) {
        return;
    }
    let tail = f.tail.load(Ordering::Acquire);
    let now = clock_ms();
    // ORDERING: Relaxed: a heuristic of the GC passes over this file (one at a time per file:
    // a file belongs to one GC thread's share, and `collect_garbage` only races it benignly).
    if f.seen_tail.swap(tail, Ordering::Relaxed) != tail {
        f.idle_since.store(0, Ordering::Relaxed);
        return;
    }
    let since = f.idle_since.load(Ordering::Relaxed);
    if since == 0 {
        f.idle_since.store(now, Ordering::Relaxed);
        return;
    }
    if now - since >= IDLE_TIME.as_millis() as u64 && f.dead_share() > inner.opts.gc_threshold {
        inner.nlog.seal_if_active(f);
    }
}

/// One pass over `node`'s files (those with `id % per_node == idx`); returns files reclaimed.
/// A file whose reclaim fails (no space for its rewrites, a bad address) is left for a later
/// pass and the pass goes on with the next file — one such file must not keep the node's other
/// files, 100 % garbage ones among them (which need no rewrite space), from being reclaimed.
/// The pass returns the first error only when it reclaimed nothing.
pub(crate) fn collect(inner: &Inner, node: usize, idx: usize, per_node: usize) -> Result<u64> {
    let mut reclaimed = 0;
    let mut failed = None;
    for f in inner.nlog.files_of(node) {
        if inner.stop.load(Ordering::Acquire) {
            break;
        }
        if f.info.id as usize % per_node.max(1) != idx {
            continue;
        }
        seal_if_idle(inner, &f);
        if !eligible(inner, &f) {
            continue;
        }
        // Not while a `check()` runs (it holds the gate exclusively).
        let _gate = inner.gc_gate.read();
        // ORDERING: AcqRel; exactly one pass wins the file.
        if f.claimed.swap(true, Ordering::AcqRel) {
            continue;
        }
        inner.counters.gc_busy.fetch_add(1, Ordering::AcqRel);
        let r = reclaim(inner, &f);
        inner.counters.gc_busy.fetch_sub(1, Ordering::AcqRel);
        match r {
            Ok(true) => reclaimed += 1,
            // Stopped early (shutdown): the file stays; the next session reclaims it.
            Ok(false) => f.claimed.store(false, Ordering::Release),
            Err(e) => {
                // Every step is crash-safe on its own, so a later pass may retry the file.
                f.claimed.store(false, Ordering::Release);
                inner.counters.gc_errors.fetch_add(1, Ordering::Relaxed);
                failed.get_or_insert(e);
            }
        }
    }
    match failed {
        Some(e) if reclaimed == 0 => Err(e),
        _ => Ok(reclaimed),
    }
}

/// Walks `key`'s history from the entry with `version` whose parent is `h`, and marks it `inv`,
/// oldest first, each mark durable before the next. Returns how many were marked.
fn invalidate_history(inner: &Inner, key: u64, version: u64, mut h: u64) -> Result<u64> {
    let mut chain = Vec::new();
    let mut newer = version;
    while h != 0 {
        let va = VAddr(h);
        let Some(e) = inner.nlog.locate(va)? else { break };
        let Some((op, k, v, parent)) = layout::read_entry(e, va.file()) else { break };
        if op == Op::Inv || k != key || v >= newer {
            break;
        }
        chain.push(&e.meta);
        newer = v;
        h = parent;
    }
    mark_inv(inner, &chain);
    Ok(chain.len() as u64)
}

/// [`invalidate_history`] for a variable-length key (its history is in variable-length files).
fn invalidate_history_var(inner: &Inner, key: &[u8], version: u64, mut h: u64) -> Result<u64> {
    let mut chain = Vec::new();
    let mut newer = version;
    while h != 0 {
        let va = VAddr(h);
        let Some(e) = inner.nlog.locate_var(va)? else { break };
        let Some((op, k, _)) = e.read(va.file()) else { break };
        let v = e.head.version.load(Ordering::Acquire);
        if op == Op::Inv || k != key || v >= newer {
            break;
        }
        chain.push(&e.head.meta);
        newer = v;
        h = e.head.h_addr.load(Ordering::Acquire);
    }
    mark_inv(inner, &chain);
    Ok(chain.len() as u64)
}

/// Marks the entries whose meta words are `chain` (newest first) `inv`, oldest first.
fn mark_inv(inner: &Inner, chain: &[&numakv_pmem::PmU64]) {
    for meta in chain.iter().rev() {
        let m = meta.load(Ordering::Acquire);
        meta.store(m & !OP_MASK, Ordering::Release);
        // PERSIST: this entry is invalid before any newer one of the chain is marked, and
        // before the file whose entry superseded it can be freed.
        inner.pool.persist_obj(*meta);
    }
}

/// Reclaims `f`: returns false when it stopped early (shutdown); the file then stays.
fn reclaim(inner: &Inner, f: &Arc<LogFile>) -> Result<bool> {
    if f.info.var {
        return reclaim_var(inner, f);
    }
    let node = f.info.node;
    let tail = f.tail.load(Ordering::Acquire);
    // Everything reserved in `f` is below `tail` from here on: `f` is sealed, and a sealed file
    // is never written again (issue 34: a write after this read was lost with the file).
    numakv_pmem::pause_point!("nstore.gc.tail_read");
    for slot in 0..tail {
        if inner.stop.load(Ordering::Acquire) {
            return Ok(false);
        }
        let _guard = epoch::pin();
        let e = f.entry(&inner.pool, slot)?;
        if !decode_meta(e.meta.load(Ordering::Acquire), f.info.id).written {
            continue; // torn before a crash: never was an entry
        }
        let key = e.key.load(Ordering::Acquire);
        let _key = inner.lock_key(key);
        // Re-read under the lock: another node's GC may have marked it as history meanwhile.
        let Some((op, k, version, h_addr)) = layout::read_entry(e, f.info.id) else { continue };
        if op == Op::Inv || k != key {
            continue;
        }
        let marked = invalidate_history(inner, key, version, h_addr)?;
        inner.counters.gc_invalidated.fetch_add(marked, Ordering::Relaxed);
        let va = f.vaddr(slot);
        if op != Op::Del && inner.index.get(key) == Some(va) {
            let value = e.value.load(Ordering::Acquire);
            let cluster = inner.nlog.cluster_of(crate::hash(key));
            let (nf, s) = inner.nlog.reserve(node, cluster, Need::Gc)?;
            // A file being reclaimed is sealed, and a sealed file is never active.
            debug_assert!(!Arc::ptr_eq(&nf, f), "GC reserved in the file it reclaims");
            let v = inner.nlog.next_version(cluster);
            let new = inner.nlog.write(&nf, s, Op::Ins, v, va.0, key, value)?;
            inner.index.set(key, new);
            // The original is garbage from now on, as after any update: a reclaim that stops
            // later (out of space, shutdown) leaves the file's count exact, as `check()` and a
            // rescan after reopen count it.
            f.dead.fetch_add(1, Ordering::Relaxed);
            inner.counters.gc_rewritten.fetch_add(1, Ordering::Relaxed);
            if numakv_pmem::fail_point!("nstore.gc.rewritten") {
                // As if the next rewrite found no space: the reclaim stops here.
                return Err(PoolError::OutOfSpace { node, requested: 0 }.into());
            }
        }
    }
    retire(inner, f);
    Ok(true)
}

/// [`reclaim`] for a file of variable-length entries: the same steps, entry by entry, stepping
/// by the entries' durable size words.
fn reclaim_var(inner: &Inner, f: &Arc<LogFile>) -> Result<bool> {
    let node = f.info.node;
    let tail = f.tail.load(Ordering::Acquire);
    // Everything reserved in `f` is below `tail` from here on: `f` is sealed, and a sealed file
    // is never written again (issue 34: a write after this read was lost with the file).
    numakv_pmem::pause_point!("nstore.gc.tail_read");
    let mut off = 0;
    while off < tail {
        if inner.stop.load(Ordering::Acquire) {
            return Ok(false);
        }
        let _guard = epoch::pin();
        let Some(words) = layout::decode_var_size(f.var_size_at(&inner.pool, off)?, f.info.id)
        else {
            break; // nothing was reserved from here on
        };
        let e = f.var_entry(&inner.pool, off, words)?;
        let va = f.var_vaddr(off, words);
        off += words;
        let Some((_, key, _)) = e.read(f.info.id) else { continue }; // torn before a crash
        let h = crate::hash_bytes(&key);
        let _key = inner.lock_hash(h);
        let Some((op, k, value)) = e.read(f.info.id) else { continue };
        if op == Op::Inv || k != key {
            continue;
        }
        let version = e.head.version.load(Ordering::Acquire);
        let h_addr = e.head.h_addr.load(Ordering::Acquire);
        let marked = invalidate_history_var(inner, &key, version, h_addr)?;
        inner.counters.gc_invalidated.fetch_add(marked, Ordering::Relaxed);
        if op != Op::Del && inner.bindex.get(&key) == Some(va) {
            let cluster = inner.nlog.cluster_of(h);
            let (nf, s) = inner.nlog.reserve_var(node, cluster, words, Need::Gc)?;
            debug_assert!(!Arc::ptr_eq(&nf, f), "GC reserved in the file it reclaims");
            let v = inner.nlog.next_version(cluster);
            let new = inner.nlog.write_var(&nf, s, Op::Ins, v, va.0, &key, &value)?;
            inner.bindex.set(&key, new);
            // The original is garbage from now on (as in `reclaim`).
            f.dead.fetch_add(words, Ordering::Relaxed);
            inner.counters.gc_rewritten.fetch_add(1, Ordering::Relaxed);
            if numakv_pmem::fail_point!("nstore.gc.rewritten") {
                return Err(PoolError::OutOfSpace { node, requested: u64::from(words) * 8 }.into());
            }
        }
    }
    retire(inner, f);
    Ok(true)
}

/// A file GC retired: unlinked from the file table, its pages freed once `grace` is set (every
/// reader pinned at the retire has unpinned) and every file retired before it is freed.
#[derive(Debug)]
pub(crate) struct Retired {
    base: PPtr,
    grace: Arc<AtomicBool>,
}

/// Unlinks a reclaimed file and queues it to be freed after the epoch grace period, in retire
/// order ([`drain_retired`]).
fn retire(inner: &Inner, f: &Arc<LogFile>) {
    let grace = Arc::new(AtomicBool::new(false));
    {
        // Queued before it is unlinked, under the queue's lock: the order of the queue is the
        // order of the unlinks, which is the order in which reclaims stopped seeing the files.
        let mut q = inner.retired.lock();
        inner.nlog.unlink(f);
        q.push_back(Retired { base: f.base, grace: Arc::clone(&grace) });
    }
    let guard = epoch::pin();
    // A reader that read an address of this file before the index moved may still be reading
    // it: the pages may go only after every thread pinned now has unpinned.
    // ORDERING: Release; pairs with the Acquire in drain_retired.
    guard.defer(move || grace.store(true, Ordering::Release));
    guard.flush();
    drop(guard);
    inner.counters.gc_files.fetch_add(1, Ordering::Relaxed);
    drain_retired(inner);
}

/// Frees retired files from the front of the queue while their grace period has passed: a
/// file is freed only after every file retired before it (docs/design.md, "NStore", GC: a
/// reclaim that walked a history chain into an already retired file marked nothing there, so
/// that file must be durably gone first, or a crash could revive what the later file deleted).
pub(crate) fn drain_retired(inner: &Inner) {
    let mut q = inner.retired.lock();
    // ORDERING: Acquire; pairs with the Release store of the deferred function in `retire`.
    while q.front().is_some_and(|r| r.grace.load(Ordering::Acquire)) {
        if !free_front(inner, &mut q) {
            return;
        }
    }
}

/// Frees every retired file, in order, without waiting for grace periods: only when no reader
/// can exist (`close()`, after the background threads stopped, with the handle consumed).
pub(crate) fn free_all_retired(inner: &Inner) -> Result<()> {
    let mut q = inner.retired.lock();
    while !q.is_empty() {
        if !free_front(inner, &mut q) {
            return Err(layout::corrupted("a retired log file could not be freed"));
        }
    }
    Ok(())
}

/// Frees the front of `q`; false when the free failed (e.g. the pool crashed): the file stays
/// queued, and so do those behind it — recovery finds them all and a later GC reclaims them.
fn free_front(inner: &Inner, q: &mut VecDeque<Retired>) -> bool {
    let Some(r) = q.front() else { return true };
    // The header is invalidated durably before the free (`free_file_extent`): a crash after the
    // invalidation and before the free leaves an extent that recovery frees as an orphan — the
    // same outcome as the free, which is what the retire order (above) is about.
    if crate::nlog::free_file_extent(&inner.pool, r.base).is_err() {
        return false;
    }
    q.pop_front();
    true
}

#[cfg(test)]
mod tests {
    use numakv_index::{Engine, Index};
    use numakv_pmem::{CrashOptions, OpenConfig, PersistMode, Pool, PoolConfig, SimMode};

    use super::*;
    use crate::{NStore, NStoreOptions};

    /// File A holds `ins k`, file D (newer) `del k`. GC reclaims A (dropping the superseded
    /// `ins k` without marking it) and then D (whose history walk stops at A, already
    /// unlinked). If D's pages were freed durably while A's are not, a crash would bring `ins k`
    /// back. The queue frees in retire order: even with D's grace period over and A's not, D
    /// stays until A goes, and a power failure then loses nothing and revives nothing.
    #[test]
    fn a_delete_file_is_never_freed_before_an_older_retired_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store");
        let mut cfg = PoolConfig::new(NStore::engine_id(), 8 << 20);
        cfg.page_size = 4096;
        cfg.mode = PersistMode::Adr;
        cfg.sim = SimMode::Shadow;
        let pool = Pool::create(&path, cfg).unwrap();
        // One cluster of one-page files: 100 entries each.
        let opts = NStoreOptions {
            clusters: 1,
            log_file_size: 4096,
            gc_threads_per_node: 0,
            ..Default::default()
        };
        let s = NStore::create(pool.clone(), &opts).unwrap();
        for k in 1..=100 {
            s.insert(k, k).unwrap(); // file A (id 1), full
        }
        for k in 1..=60 {
            s.remove(k).unwrap(); // file D (id 2): 60 deletes...
        }
        for k in 101..=141 {
            s.insert(k, k).unwrap(); // ...and 40 inserts; 141 seals D
        }
        let (a, d) = (s.inner.nlog.file(0, 1).unwrap(), s.inner.nlog.file(0, 2).unwrap());
        assert_eq!((a.info.cluster, d.info.cluster), (0, 0));
        let pinned = epoch::pin(); // no grace period passes from here on
        assert_eq!(s.collect_garbage().unwrap(), 2);
        {
            let q = s.inner.retired.lock();
            let order: Vec<PPtr> = q.iter().map(|r| r.base).collect();
            assert_eq!(order, vec![a.base, d.base], "retire order");
            // D's readers are gone (as if), A's are not.
            q[1].grace.store(true, Ordering::Release);
        }
        drain_retired(&s.inner);
        let allocated = |p: PPtr| pool.extents(0).unwrap().iter().any(|x| x.ptr == p);
        let kept = (allocated(a.base), allocated(d.base));
        pool.crash(CrashOptions::STRICT).unwrap();
        drop(pinned);
        drop((a, d, s, pool));
        let mut oc = OpenConfig::new(NStore::engine_id());
        oc.sim = SimMode::Shadow;
        let (s, _) = NStore::open(Pool::open(&path, oc).unwrap(), &opts).unwrap();
        for k in 1..=60 {
            assert_eq!(s.get(k).unwrap(), None, "deleted key {k} came back");
        }
        for k in 61..=141 {
            assert_eq!(s.get(k).unwrap(), Some(k));
        }
        assert_eq!(s.check().unwrap().entries, 81);
        assert_eq!(kept, (true, true), "D was freed before A");
    }
}
