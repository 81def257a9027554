//! `check()`: the structural fsck of NStore (run while nothing mutates the store).
//!
//! - every key of the volatile index (u64 keys and variable-length keys) names a valid
//!   `ins`/`upd` entry of its own key in an existing file of its kind, within the file's
//!   written slots;
//! - every file's header is valid and names its node; every file is in the table of its node;
//! - the written part of a file is what recovery would read and nothing more: a variable-length
//!   file's size words step from word 0 exactly to its tail, and beyond its tail a file is zero
//!   (every meta word of a fixed-size file; every word of a variable-length file) — new files
//!   are zeroed, so anything else there is stale or forged bytes that recovery would take for
//!   entries (issue 34);
//! - garbage accounting: each file's garbage count plus its live entries (words, for a
//!   variable-length file) is exactly what was reserved in it;
//! - the PM the engine owns (page-heap extents with `OWNER_ENGINE`) is exactly the node meta
//!   pages plus the files of the table: no leak, nothing reachable that is not allocated.
//!
//! GC reclaims are held off for the whole check (`Inner::gc_gate`), and the deferred frees of
//! files retired before it are let run first.

use std::sync::atomic::Ordering;

use numakv_index::{CheckReport, Result};
use numakv_pmem::alloc::epoch;

use crate::layout::{self, FileHeader, FileInfo, Op, AUX_LOG, AUX_META, OWNER_ENGINE};
use crate::Inner;

pub(crate) fn check(inner: &Inner) -> Result<CheckReport> {
    // No reclaim runs from here on (in-flight ones finish first): the background GC threads
    // would otherwise move keys and retire files under the check, whose scan then names files
    // gone by the time it looks them up (seen as "names no file" at NUMAKV_TEST_SCALE=4).
    let _gate = inner.gc_gate.write();
    // Files retired just before are freed after their grace period; let those frees run so the
    // leak accounting below sees the pages of live files only. Not pinned here (it would wait
    // for itself).
    let pool = &inner.pool;
    let want = inner.nlog.all_files().len() as u64 + pool.nodes() as u64;
    numakv_pmem::alloc::settle_deferred_frees(want, std::time::Duration::from_secs(1), || {
        crate::gc::drain_retired(inner);
        (0..pool.nodes())
            .filter_map(|n| pool.extents(n).ok())
            .flatten()
            .filter(|x| x.owner == OWNER_ENGINE)
            .count() as u64
    });
    let _guard = epoch::pin();
    let mut pairs = Vec::new();
    inner.index.scan(1, usize::MAX, &mut pairs);
    for &(key, va) in &pairs {
        let Some(f) = inner.nlog.file(va.node(), va.file()) else {
            return Err(layout::corrupted(format!("key {key}: address {:#x} names no file", va.0)));
        };
        if f.info.var || va.slot() >= f.tail.load(Ordering::Acquire) {
            return Err(layout::corrupted(format!(
                "key {key}: slot beyond its file's tail or in a variable-length file"
            )));
        }
        let e = f.entry(pool, va.slot())?;
        match layout::read_entry(e, f.info.id) {
            Some((Op::Ins | Op::Upd, k, _, _)) if k == key => {}
            other => {
                return Err(layout::corrupted(format!(
                    "key {key}: current entry {:#x} is {other:?}",
                    va.0
                )))
            }
        }
    }
    let bytes_pairs = inner.bindex.pairs();
    for (key, va) in &bytes_pairs {
        let Some(f) = inner.nlog.file(va.node(), va.file()) else {
            return Err(layout::corrupted(format!("bytes key: address {:#x} names no file", va.0)));
        };
        if !f.info.var || va.slot() + va.words() > f.tail.load(Ordering::Acquire) {
            return Err(layout::corrupted(format!(
                "bytes key: address {:#x} outside its file's entries",
                va.0
            )));
        }
        let e = f.var_entry(pool, va.slot(), va.words())?;
        match e.read(f.info.id) {
            Some((Op::Ins | Op::Upd, k, _)) if &k == key => {}
            other => {
                return Err(layout::corrupted(format!(
                    "bytes key: current entry {:#x} is {:?}",
                    va.0,
                    other.map(|o| o.0)
                )))
            }
        }
    }
    let files = inner.nlog.all_files();
    for f in &files {
        let h: &FileHeader = pool.get(f.base)?;
        let info =
            FileInfo::read(h).map_err(|e| layout::corrupted(format!("file {}: {e}", f.info.id)))?;
        if info != f.info {
            return Err(layout::corrupted(format!("file {}: header changed", f.info.id)));
        }
    }
    for f in &files {
        beyond_tail(inner, f)?;
    }
    accounting(&files, &pairs, &bytes_pairs)?;
    let mut allocated = 0u64;
    let mut metas = 0u64;
    for node in 0..pool.nodes() {
        for x in pool.extents(node)? {
            if x.owner != OWNER_ENGINE {
                continue;
            }
            allocated += 1;
            if x.aux == AUX_META {
                metas += 1;
            } else if x.aux != AUX_LOG {
                return Err(layout::corrupted(format!(
                    "node {node}: engine extent with unknown kind {} at {}",
                    x.aux, x.ptr
                )));
            }
        }
    }
    if metas != pool.nodes() as u64 {
        return Err(layout::corrupted(format!(
            "{metas} node meta pages for {} nodes",
            pool.nodes()
        )));
    }
    Ok(CheckReport {
        entries: (pairs.len() + bytes_pairs.len()) as u64,
        reachable_blocks: files.len() as u64 + metas,
        allocated_blocks: allocated,
    })
}

/// Garbage accounting: every file's `dead` is exactly its reserved slots (words) minus those
/// of the entries the indexes name. No GC reclaim runs meanwhile (`check` holds the gate), so
/// no rewrite is in flight with its copy reserved before the index names it.
fn accounting(
    files: &[std::sync::Arc<crate::nlog::LogFile>],
    pairs: &[(u64, crate::layout::VAddr)],
    bytes_pairs: &[(Vec<u8>, crate::layout::VAddr)],
) -> Result<()> {
    let mut live: std::collections::HashMap<(usize, u32), u64> = std::collections::HashMap::new();
    for (va, w) in pairs.iter().map(|p| (p.1, 1)).chain(bytes_pairs.iter().map(|p| (p.1, 0))) {
        let weight = if w == 1 { 1 } else { u64::from(va.words()) };
        *live.entry((va.node(), va.file())).or_default() += weight;
    }
    for f in files {
        let tail = u64::from(f.tail.load(Ordering::Acquire));
        let dead = u64::from(f.dead.load(Ordering::Acquire));
        let l = live.get(&(f.info.node, f.info.id)).copied().unwrap_or(0);
        if dead + l != tail {
            return Err(layout::corrupted(format!(
                "node {} file {}: {dead} garbage + {l} live != {tail} reserved",
                f.info.node, f.info.id
            )));
        }
    }
    Ok(())
}

/// The part of `f` beyond its tail holds nothing recovery could read as an entry, and a
/// variable-length file's size words step exactly to its tail.
fn beyond_tail(inner: &Inner, f: &crate::nlog::LogFile) -> Result<()> {
    let pool = &inner.pool;
    let tail = f.tail.load(Ordering::Acquire);
    let (node, id) = (f.info.node, f.info.id);
    if !f.info.var {
        for slot in tail..f.slots {
            let m = f.entry(pool, slot)?.meta.load(Ordering::Acquire);
            if m != 0 {
                return Err(layout::corrupted(format!(
                    "node {node} file {id}: slot {slot} beyond its tail {tail} holds meta word \
                     {m:#x} (stale or forged bytes in a log file)"
                )));
            }
        }
        return Ok(());
    }
    let mut off = 0;
    while off < tail {
        let Some(words) = layout::decode_var_size(f.var_size_at(pool, off)?, id) else {
            return Err(layout::corrupted(format!(
                "node {node} file {id}: no entry size at word {off}, below its tail {tail}"
            )));
        };
        off += words;
    }
    if off != tail {
        return Err(layout::corrupted(format!(
            "node {node} file {id}: entries end at word {off}, its tail is {tail}"
        )));
    }
    let base = f.base.add(layout::FILE_HEADER).ok_or_else(|| layout::corrupted("overflow"))?;
    for w in tail..f.slots {
        let p = base.add(u64::from(w) * 8).ok_or_else(|| layout::corrupted("overflow"))?;
        let v = pool.get::<numakv_pmem::PmU64>(p)?.load(Ordering::Acquire);
        if v != 0 {
            return Err(layout::corrupted(format!(
                "node {node} file {id}: word {w} beyond its tail {tail} is {v:#x} (stale or \
                 forged bytes in a log file)"
            )));
        }
    }
    Ok(())
}
