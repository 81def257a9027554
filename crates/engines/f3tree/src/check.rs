//! `check()`: the structural fsck, run with the evaluate threads paused (the gate) and no
//! concurrent writers.
//!
//! Invariants (names as they appear in errors; docs/design.md "F3-tree"):
//! - the global tree passes FAST&FAIR's own check;
//! - `directory`: every used directory slot is a list the engine serves, and every served list
//!   has its slot;
//! - `list links`: along a list from the tail, every FO is an FO, each FO's `next` is the FO
//!   before it, the last one is the engine's head;
//! - `entry prefix`: an FO's valid entries (non-zero meta) are a prefix of its slots, and every
//!   FO but the head is full;
//! - `list links` also: each FO's `base` continues its older FO's sequence numbers;
//! - `pending entries`: the live entries (not DEAD, at or above their list's `applied`
//!   watermark) are exactly the ones the hash table names,
//!   with the table's key and version — one per pending key;
//! - `reachable allocated`: NSM's allocated blocks are exactly the tree's nodes, the directory
//!   and the FOs (after the epoch grace period of blocks freed by evaluation has passed).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use numakv_index::{CheckReport, Error, Index, Result};
use numakv_pmem::alloc::epoch;
use numakv_pmem::PPtr;

use crate::layout::{self, Fo, DEAD, ENGINE, VERSION_MASK};
use crate::recovery::walk_list;
use crate::Inner;

fn bad(what: impl Into<String>) -> Error {
    Error::corrupted(ENGINE, what)
}

pub(crate) fn check(inner: &Inner) -> Result<CheckReport> {
    // A lazy open's background pass (tree walk, NSM collection, repairs) must be over: until
    // then NSM counts every block of the pre-open extents as allocated. Waited for before the
    // gate: the pass waits for an epoch grace period, which evaluators in the gate could delay.
    inner.tree.wait_recovery()?;
    let _gate = inner.gate.write();
    if let Some(e) = inner.eval_error.lock().clone() {
        return Err(bad(format!("evaluation: an evaluate thread failed: {e}")));
    }
    let pool = &inner.pool;
    let tree = inner.tree.check()?;
    let dir = layout::directory(pool, inner.dir)?;
    let lists = inner.lists.read();
    // A drained recovered list is retired (its slot freed, possibly reused) before evaluators
    // drop it from the served lists: it is no longer part of the structure.
    let lists: Vec<_> = lists.iter().filter(|l| !l.retired.load(Ordering::Relaxed)).collect();
    let by_slot: HashMap<usize, _> = lists.iter().map(|l| (l.slot, *l)).collect();
    let mut seen = HashSet::new();
    let mut fos = 0u64;
    let mut live: HashMap<PPtr, (u64, u64)> = HashMap::new();
    for (slot, d) in dir.iter().enumerate() {
        let tail = PPtr::from_raw(d.tail.load(Ordering::Acquire));
        if tail.is_null() {
            if by_slot.contains_key(&slot) {
                return Err(bad(format!("directory: list {slot} is served but its slot is free")));
            }
            continue;
        }
        let Some(l) = by_slot.get(&slot) else {
            return Err(bad(format!("directory: slot {slot} holds a list nobody serves")));
        };
        let chain = walk_list(pool, tail, &mut seen)?;
        fos += chain.len() as u64;
        let head = chain[chain.len() - 1];
        if head != l.head() {
            return Err(bad(format!(
                "list links: list {slot} ends at {head}, head is {}",
                l.head()
            )));
        }
        let applied = d.applied.load(Ordering::Acquire);
        for (i, &p) in chain.iter().enumerate() {
            let fo = Fo::resolve(pool, p)?;
            if i > 0 {
                let older = Fo::resolve(pool, chain[i - 1])?;
                if fo.seq(0) != older.seq(older.cap) {
                    return Err(bad(format!(
                        "list links: FO {p}'s base does not follow its older FO's entries"
                    )));
                }
            }
            if i > 0 && fo.next() != chain[i - 1] {
                return Err(bad(format!("list links: FO {p}'s next is not {}", chain[i - 1])));
            }
            let mut valid = fo.cap;
            for j in 0..fo.cap {
                let e = fo.entry(pool, j);
                let meta = e.meta.load(Ordering::Acquire);
                if meta == 0 {
                    valid = valid.min(j);
                    continue;
                }
                if j > valid {
                    return Err(bad(format!(
                        "entry prefix: FO {p} slot {j} follows an empty slot"
                    )));
                }
                if meta & DEAD == 0 && fo.seq(j) >= applied {
                    live.insert(
                        fo.entry_ptr(j),
                        (e.key.load(Ordering::Relaxed), meta & VERSION_MASK),
                    );
                }
            }
            if p != head && valid != fo.cap {
                return Err(bad(format!("entry prefix: FO {p} is not the head but not full")));
            }
        }
    }
    if fos != lists.iter().map(|l| l.fos.load(Ordering::Relaxed) as u64).sum::<u64>() {
        return Err(bad("list links: the FO counts disagree with the lists"));
    }
    // Every pending key names a live entry of its key and version; nothing else is live.
    let mut named = 0usize;
    let mut entries = tree.entries as i64;
    for s in 0..crate::pending::SHARDS {
        let shard = inner.table.lock_shard(s);
        for (&k, p) in &shard.map {
            match live.get(&p.loc) {
                Some(&(key, v)) if key == k && v == p.version => named += 1,
                other => {
                    return Err(bad(format!(
                        "pending entries: key {k} names entry {} (version {}), found {other:?}",
                        p.loc, p.version
                    )))
                }
            }
            let in_tree = inner.tree.get(k)?.is_some();
            match (p.value.is_some(), in_tree) {
                (true, false) => entries += 1,
                (false, true) => entries -= 1,
                _ => {}
            }
        }
    }
    if named != live.len() {
        return Err(bad(format!(
            "pending entries: {} live entries in FOs, {named} named by the table",
            live.len()
        )));
    }
    let reachable = tree.reachable_blocks + 1 + fos;
    // Blocks the tree retired (merges during evaluation) wait for their epoch grace period.
    let t0 = Instant::now();
    let mut allocated = inner.nsm.allocated_blocks().len() as u64;
    while allocated != reachable && t0.elapsed() < Duration::from_secs(5) {
        epoch::pin().flush();
        std::thread::sleep(Duration::from_millis(1));
        allocated = inner.nsm.allocated_blocks().len() as u64;
    }
    Ok(CheckReport {
        entries: entries.max(0) as u64,
        reachable_blocks: reachable,
        allocated_blocks: allocated,
    })
}
