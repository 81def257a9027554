//! Open with recovery (papers/f3tree.txt §4.3 last paragraph, §4.5).
//!
//! 1. Validate the format word and the directory; open NSM with [`Nsm::recover_deferred`]:
//!    every existing NSM extent is frozen (none of its blocks is handed out, new blocks come
//!    from new pages) — O(extents), no reachability walk.
//! 2. Walk every list from its tail along `prev` (the backward traversal of Fig. 4b: an FO
//!    linked by a persisted `prev` is reached even if the head hint was not updated).
//! 3. Read every FO's valid entries (the prefix of non-zero meta words). Live ones (not DEAD,
//!    and at or above their list's `applied` watermark) are, per key, at most one — or two in
//!    the window where a writer persisted a new entry but not yet the DEAD mark of the one it
//!    superseded: the higher version wins and the others are marked DEAD now, so they can never
//!    be replayed after the winner is applied and freed. Every shard's version counter restarts
//!    above the highest version seen.
//! 4. The winners go into a new hash table, still pointing into the pre-crash FOs, which become
//!    *recovering* lists: evaluate threads checkpoint them like any list and then free them,
//!    while the application — with new PTFOs and the new table — resumes at once (it sees the
//!    pre-crash pending keys through the table). Lists without live entries are freed here.
//! 5. The global tree is opened lazily ([`FastFair::open_deferred_with`]): `open` returns
//!    without walking it. Its background pass walks the tree while the engine serves
//!    operations, hands that walk plus the directory and the kept lists' FOs to
//!    [`Nsm::collect`] — an FO allocated but not linked, or unlinked but not freed, at the crash
//!    is reclaimed then — and repairs what a crash left in the tree. The FOs follow the deferred
//!    protocol: they were reached at open, before any thread ran, and an FO unlinked later is
//!    freed at once, which NSM holds back for the sweep.
//!
//! Cost of `open`: the directory, every FO still linked (bounded by the FO limit per list) and
//! the NSM extents; not the tree.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use numakv_fastfair::FastFair;
use numakv_index::{Error, RecoveryReport, Result};
use numakv_pmem::alloc::nsm::Nsm;
use numakv_pmem::alloc::PmAllocator;
use numakv_pmem::{PPtr, Pool};

use crate::layout::{self, Fo, DEAD, ENGINE, TOMB, VERSION_MASK};
use crate::pending::{Pending, PendingTable};
use crate::ptfo::{self, List};
use crate::{new_inner, F3TreeOptions, Inner};

/// A list found in the directory: its slot, node and FOs from tail to head.
struct Found {
    slot: usize,
    node: usize,
    fos: Vec<PPtr>,
    /// The list's `applied` watermark.
    applied: u64,
}

/// The FOs of the list whose tail is `tail`, oldest first.
pub(crate) fn walk_list(pool: &Pool, tail: PPtr, seen: &mut HashSet<PPtr>) -> Result<Vec<PPtr>> {
    let mut out = Vec::new();
    let mut p = tail;
    while !p.is_null() {
        if !seen.insert(p) {
            return Err(Error::corrupted(ENGINE, format!("list links: FO {p} reached twice")));
        }
        let fo = Fo::resolve(pool, p)?;
        out.push(p);
        p = fo.prev();
    }
    Ok(out)
}

/// The directory pointer of a store, validated.
pub(crate) fn directory_ptr(pool: &Pool) -> Result<PPtr> {
    let meta = pool.root(layout::SLOT_META)?.load(Ordering::Acquire);
    if meta != layout::meta_word() {
        return Err(Error::corrupted(
            ENGINE,
            format!("format word {meta:#x} is not f3tree format {}", layout::FORMAT_VERSION),
        ));
    }
    let dir = PPtr::from_raw(pool.root(layout::SLOT_DIR)?.load(Ordering::Acquire));
    layout::directory(pool, dir)?;
    Ok(dir)
}

pub(crate) fn open(pool: Arc<Pool>, opts: &F3TreeOptions) -> Result<(Arc<Inner>, RecoveryReport)> {
    let t0 = Instant::now();
    // Step 1.
    let dir_p = directory_ptr(&pool)?;
    let dir = layout::directory(&pool, dir_p)?;
    let tree_opts = opts.tree_options();
    let nsm = Nsm::recover_deferred(Arc::clone(&pool), opts.nsm_mode())?;
    // Step 2.
    let mut seen = HashSet::new();
    let mut found = Vec::new();
    for (slot, d) in dir.iter().enumerate() {
        let tail = PPtr::from_raw(d.tail.load(Ordering::Acquire));
        if tail.is_null() {
            continue;
        }
        let fos = walk_list(&pool, tail, &mut seen)?;
        let node = (d.node.load(Ordering::Relaxed) as usize).min(pool.nodes() - 1);
        let applied = d.applied.load(Ordering::Acquire);
        found.push(Found { slot, node, fos, applied });
    }

    // Step 3: live entries, the winner per key.
    let mut winners: HashMap<u64, (Pending, usize)> = HashMap::new();
    let mut losers: Vec<PPtr> = Vec::new();
    let mut max_version = 0u64;
    let mut live_per_list = Vec::with_capacity(found.len());
    let mut valid_in_head = Vec::with_capacity(found.len());
    let mut entries_total = 0u64;
    for (li, f) in found.iter().enumerate() {
        let mut live = 0u64;
        let mut valid = 0usize;
        for &fp in &f.fos {
            let fo = Fo::resolve(&pool, fp)?;
            valid = 0;
            for i in 0..fo.cap {
                let e = fo.entry(&pool, i);
                let meta = e.meta.load(Ordering::Acquire);
                if meta == 0 {
                    break;
                }
                valid += 1;
                entries_total += 1;
                let version = meta & VERSION_MASK;
                max_version = max_version.max(version);
                // Processed: DEAD, or below the list's watermark (applied to the tree, or
                // superseded, before the evaluator's last durable batch).
                if meta & DEAD != 0 || fo.seq(i) < f.applied {
                    continue;
                }
                live += 1;
                let key = e.key.load(Ordering::Relaxed);
                numakv_index::check_key(key).map_err(|_| {
                    Error::corrupted(ENGINE, format!("entry keys: FO {fp} entry {i} has key {key}"))
                })?;
                let loc = fo.entry_ptr(i);
                let value = (meta & TOMB == 0).then(|| e.value.load(Ordering::Relaxed));
                let cand = Pending { version, loc, value, applying: false };
                match winners.get(&key).map(|w| w.0) {
                    Some(w) if w.version == version => {
                        return Err(Error::corrupted(
                            ENGINE,
                            format!("entry versions: key {key} has two live entries of version {version}"),
                        ));
                    }
                    Some(w) if w.version > version => losers.push(loc),
                    Some(w) => {
                        losers.push(w.loc);
                        winners.insert(key, (cand, li));
                    }
                    None => {
                        winners.insert(key, (cand, li));
                    }
                }
            }
        }
        live_per_list.push(live);
        valid_in_head.push(valid);
    }
    for &loc in &losers {
        ptfo::mark_dead(&pool, loc)?;
    }
    // The FOs of lists kept below, and the directory: NSM's collection keeps them. (FOs of
    // lists freed below are not listed: their frees during the pending collection are held
    // back and done by the sweep.)
    let mut extra = vec![dir_p];
    // Lists holding a winner are recovered; the others (only dead entries, or losers) are
    // freed now.
    let mut winners_in: HashMap<usize, u64> = HashMap::new();
    for &(_, li) in winners.values() {
        *winners_in.entry(li).or_default() += 1;
    }
    let mut lists = Vec::new();
    let mut used = Vec::new();
    let mut freed_lists = 0u64;
    for (i, f) in found.iter().enumerate() {
        let desc = &dir[f.slot];
        if winners_in.get(&i).copied().unwrap_or(0) == 0 {
            desc.tail.store(0, Ordering::Release);
            // PERSIST: the list is gone before its FOs can be reused.
            pool.persist_obj(&desc.tail);
            for &fp in &f.fos {
                // SAFETY: the FO was allocated by NSM (recovery marked it reachable), is now
                // unreachable, and no thread runs yet.
                unsafe { nsm.free(fp)? };
            }
            freed_lists += 1;
            continue;
        }
        let (tail, head) = (f.fos[0], f.fos[f.fos.len() - 1]);
        extra.extend(f.fos.iter().copied());
        used.push(f.slot);
        lists.push(Arc::new(List::new(
            f.slot,
            f.node,
            true,
            opts.fo_entries,
            tail,
            head,
            valid_in_head[i],
            f.fos.len(),
            live_per_list[i],
        )));
    }
    // Step 5: the tree, lazily: its background pass walks it while the engine serves
    // operations, collects NSM over that walk plus `extra`, and repairs what a crash left.
    let (tree, trep) =
        FastFair::open_deferred_with(Arc::clone(&pool), Arc::clone(&nsm), &tree_opts, extra)?;
    let table = PendingTable::new(max_version + 1);
    let pending = winners.len() as u64;
    for (k, (p, _)) in winners {
        table.lock(k).map.insert(k, p);
    }
    let recovering = lists.len() as u64;
    let was_clean = pool.was_clean();
    let inner = new_inner(pool, nsm, tree, dir_p, table, opts, lists, &used);
    let mut counters = vec![
        ("lists_recovering", recovering),
        ("lists_freed", freed_lists),
        ("fo_entries_found", entries_total),
        ("pending_keys", pending),
        ("superseded_marked", losers.len() as u64),
    ];
    counters.extend(trep.counters.iter().map(|&(n, v)| (n, v)));
    Ok((inner, RecoveryReport { was_clean, elapsed: t0.elapsed(), counters }))
}
