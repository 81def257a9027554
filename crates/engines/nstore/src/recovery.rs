//! Open with recovery (papers/nstore.txt §III-G).
//!
//! 1. Read the format word; read and reset the snapshot flag (durably, before anything else can
//!    change the store: a later crash must not find a stale flag).
//! 2. List every node's engine extents — the persistent file table: node meta pages, Nlog files
//!    (header validated; an extent whose header never became durable is freed), snapshot
//!    extents.
//! 3. If the store was closed cleanly and the flag names a snapshot that validates and lists
//!    exactly the files found, load the index, versions, tails and garbage counts from it.
//!    Otherwise rebuild: one scanning thread per group of clusters (clusters partition the keys,
//!    so threads never share a key) reads every slot of every file of its clusters and keeps,
//!    per key, the valid entry with the highest version; a winning delete entry removes the key.
//! 4. Free the snapshot extent(s); reopen the newest non-full file of every (node, cluster) as
//!    its active file, appending after its last written slot; seal the rest.
//!
//! Recovery writes no PM except the flag reset and frees.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use numakv_index::{Error, RecoveryReport, Result};
use numakv_pmem::{PPtr, Pool};

use crate::layout::{
    self, decode_format, decode_meta, FileHeader, FileInfo, NodeMeta, Op, VAddr, AUX_LOG, AUX_META,
    AUX_SNAPSHOT, META_MAGIC, OWNER_ENGINE, SLOT_FORMAT, SLOT_SNAPSHOT,
};
use crate::nlog::{LogFile, Nlog};
use crate::vindex::{SccBytesIndex, SccIndex, VolatileBytesIndex, VolatileIndex};
use crate::{snapshot, Inner, NStore, NStoreOptions};

/// Unwritten slots in a row after which a file has no written slot further on (see
/// `scan_cluster`): reservations wait while a file has this many in flight.
const MAX_GAP: u32 = crate::nlog::MAX_PENDING;

/// What the scan found in one cluster.
#[derive(Debug, Default)]
struct ClusterScan {
    entries: u64,
    keys: u64,
    bytes_keys: u64,
}

/// [`numakv_index::Engine::open`] for NStore.
pub(crate) fn open(pool: Arc<Pool>, opts: &NStoreOptions) -> Result<(NStore, RecoveryReport)> {
    let t0 = Instant::now();
    let fw = pool.root(SLOT_FORMAT)?.load(Ordering::Acquire);
    let (clusters, file_pages) = decode_format(fw).ok_or_else(|| {
        layout::corrupted(format!("format word {fw:#x}: not an nstore (or never initialised)"))
    })?;
    let flag = pool.root(SLOT_SNAPSHOT)?;
    let snap = PPtr::from_raw(flag.load(Ordering::Acquire));
    if !snap.is_null() {
        flag.store(0, Ordering::Release);
        // PERSIST: the flag is reset before the store can change, so a crash from here on is
        // recovered by scanning, never from this (soon stale) snapshot.
        pool.persist_obj(flag);
    }
    let nodes = pool.nodes();
    if nodes > layout::MAX_NODES {
        return Err(layout::corrupted(format!("{nodes} nodes, nstore addresses 64")));
    }

    // Step 2: the file table.
    let mut metas = vec![None; nodes];
    let mut found: Vec<(FileInfo, PPtr)> = Vec::new();
    let mut snapshots = Vec::new();
    let mut orphans = 0u64;
    for (node, meta) in metas.iter_mut().enumerate() {
        for x in pool.extents(node)? {
            if x.owner != OWNER_ENGINE {
                continue;
            }
            match x.aux {
                AUX_META => {
                    let m: &NodeMeta = pool.get(x.ptr)?;
                    if m.magic.load(Ordering::Acquire) != META_MAGIC
                        || m.node.load(Ordering::Acquire) != node as u64
                    {
                        return Err(layout::corrupted(format!("node {node}: bad meta page")));
                    }
                    let hwm = m.id_hwm.load(Ordering::Acquire);
                    let hwm = u32::try_from(hwm)
                        .ok()
                        .filter(|h| (1..=layout::MAX_FILE_ID + 1).contains(h))
                        .ok_or_else(|| layout::corrupted(format!("node {node}: id mark {hwm}")))?;
                    if meta.replace((x.ptr, hwm)).is_some() {
                        return Err(layout::corrupted(format!("node {node}: two meta pages")));
                    }
                }
                AUX_LOG => {
                    let h: &FileHeader = pool.get(x.ptr)?;
                    let size = x.pages * pool.page_size();
                    match FileInfo::read(h) {
                        Ok(i)
                            if i.node == node
                                && i.cluster < clusters
                                && i.size == size
                                && x.pages <= u64::from(file_pages) =>
                        {
                            found.push((i, x.ptr))
                        }
                        // Allocated, but the header never became durable (crash in
                        // Nlog::new_file): no entry can be valid in it. (Its pages may hold the
                        // header of a file freed before; it does not validate, since every free
                        // invalidates the header first, and this free does so too.)
                        _ => {
                            crate::nlog::free_file_extent(&pool, x.ptr)?;
                            orphans += 1;
                        }
                    }
                }
                AUX_SNAPSHOT => snapshots.push(x.ptr),
                other => {
                    return Err(layout::corrupted(format!(
                        "node {node}: engine extent of unknown kind {other}"
                    )))
                }
            }
        }
    }
    let metas: Vec<(PPtr, u32)> = metas
        .into_iter()
        .enumerate()
        .map(|(n, m)| m.ok_or_else(|| layout::corrupted(format!("node {n}: no meta page"))))
        .collect::<Result<_>>()?;
    let mut ids = HashSet::new();
    for (i, _) in &found {
        if i.id >= metas[i.node].1 || !ids.insert((i.node, i.id)) {
            return Err(layout::corrupted(format!(
                "node {}: file id {} duplicated or above the id mark",
                i.node, i.id
            )));
        }
    }

    let mut sopts = opts.clone();
    sopts.clusters = clusters;
    sopts.log_file_size = u64::from(file_pages) * pool.page_size();
    let nlog = Nlog::new(Arc::clone(&pool), clusters, file_pages, metas);
    let files: Vec<Arc<LogFile>> =
        found.iter().map(|&(info, base)| Arc::new(LogFile::new(info, base, 0, true))).collect();
    for f in &files {
        nlog.install(Arc::clone(f), false);
    }
    let index = SccIndex::new();
    let bindex = SccBytesIndex::new();

    // Step 3.
    let loaded = if pool.was_clean() && !snap.is_null() {
        snapshot::load(&pool, snap, clusters).ok().filter(|s| {
            let listed: HashSet<(usize, u32)> = s.files.iter().map(|f| (f.0, f.1)).collect();
            listed.len() == s.files.len() && listed == ids
        })
    } else {
        None
    };
    let mut counters = Vec::new();
    let from_snapshot = loaded.is_some();
    if let Some(s) = loaded {
        for (c, &v) in s.versions.iter().enumerate() {
            nlog.bump_version(c as u32, v);
        }
        for &(node, id, tail, dead) in &s.files {
            if let Some(f) = nlog.file(node, id) {
                f.tail.store(tail.min(f.slots), Ordering::Relaxed);
                f.dead.store(dead, Ordering::Relaxed);
            }
        }
        for &(k, va) in &s.pairs {
            index.set(k, va);
        }
        for (k, va) in &s.bytes_pairs {
            bindex.set(k, *va);
        }
        counters.push(("snapshot_keys", s.pairs.len() as u64));
        counters.push(("snapshot_bytes_keys", s.bytes_pairs.len() as u64));
    } else {
        let threads = match opts.recovery_threads {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        }
        .clamp(1, clusters as usize);
        let scans = rebuild(&nlog, &index, &bindex, &files, clusters, threads)?;
        counters.push(("entries_scanned", scans.entries));
        counters.push(("keys_recovered", scans.keys));
        counters.push(("bytes_keys_recovered", scans.bytes_keys));
        counters.push(("recovery_threads", threads as u64));
    }
    counters.push(("files", files.len() as u64));
    counters.push(("orphan_extents_freed", orphans));
    counters.push(("from_snapshot", u64::from(from_snapshot)));

    // Step 4.
    for p in snapshots {
        pool.free_pages(p)?;
    }
    let mut newest: HashMap<(usize, u32, bool), &Arc<LogFile>> = HashMap::new();
    for f in &files {
        let e = newest.entry((f.info.node, f.info.cluster, f.info.var)).or_insert(f);
        if f.info.id > e.info.id {
            *e = f;
        }
    }
    for f in newest.values() {
        nlog.grow_after(f);
        if f.tail.load(Ordering::Relaxed) < f.slots {
            f.sealed.store(false, Ordering::Release);
            nlog.install(Arc::clone(f), true);
        }
    }
    let store =
        NStore::start(Inner::new(pool.clone(), nlog, Box::new(index), Box::new(bindex), sopts));
    let report = RecoveryReport { was_clean: pool.was_clean(), elapsed: t0.elapsed(), counters };
    Ok((store, report))
}

/// The winner of a key so far: `(version, address, op)`.
type Best = (u64, VAddr, Op);

/// Rebuilds the index from the log with `threads` threads, cluster `c` on thread `c % threads`.
fn rebuild(
    nlog: &Nlog,
    index: &SccIndex,
    bindex: &SccBytesIndex,
    files: &[Arc<LogFile>],
    clusters: u32,
    threads: usize,
) -> Result<ClusterScan> {
    let mut by_cluster: Vec<Vec<&Arc<LogFile>>> = vec![Vec::new(); clusters as usize];
    for f in files {
        by_cluster[f.info.cluster as usize].push(f);
    }
    let by_cluster = &by_cluster;
    let results: Vec<Result<ClusterScan>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                s.spawn(move || {
                    let mut total = ClusterScan::default();
                    for c in (t..clusters as usize).step_by(threads) {
                        let r = scan_cluster(nlog, index, bindex, c as u32, &by_cluster[c])?;
                        total.entries += r.entries;
                        total.keys += r.keys;
                        total.bytes_keys += r.bytes_keys;
                    }
                    Ok(total)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(Error::corrupted(layout::ENGINE, "a recovery thread panicked"))
                })
            })
            .collect()
    });
    let mut total = ClusterScan::default();
    for r in results {
        let r = r?;
        total.entries += r.entries;
        total.keys += r.keys;
        total.bytes_keys += r.bytes_keys;
    }
    Ok(total)
}

fn scan_cluster(
    nlog: &Nlog,
    index: &SccIndex,
    bindex: &SccBytesIndex,
    cluster: u32,
    files: &[&Arc<LogFile>],
) -> Result<ClusterScan> {
    let pool = &nlog.pool;
    let mut best: HashMap<u64, Best> = HashMap::new();
    let mut bbest: HashMap<Vec<u8>, Best> = HashMap::new();
    let mut max_version = 0;
    let mut scan = ClusterScan::default();
    for f in files {
        if f.info.var {
            // Variable-length entries: step by the size words, durable from each reservation
            // on; the first word offset without a size word stamped with this file ends the
            // reserved part (a later reservation could only follow a durable size word).
            let mut off = 0;
            while off < f.slots {
                let Some(words) = layout::decode_var_size(f.var_size_at(pool, off)?, f.info.id)
                else {
                    break;
                };
                if u64::from(off) + u64::from(words) > u64::from(f.slots) {
                    break;
                }
                let e = f.var_entry(pool, off, words)?;
                let va = f.var_vaddr(off, words);
                off += words;
                let Some((op, key, _)) = e.read(f.info.id) else {
                    // Torn: reserved, never valid. Garbage of its file.
                    f.dead.fetch_add(words, Ordering::Relaxed);
                    continue;
                };
                if op == Op::Inv {
                    f.dead.fetch_add(words, Ordering::Relaxed);
                    continue;
                }
                scan.entries += 1;
                let version = e.head.version.load(Ordering::Acquire);
                max_version = max_version.max(version);
                let here = (version, va, op);
                match bbest.get_mut(&key) {
                    None => {
                        bbest.insert(key, here);
                    }
                    Some(b) if b.0 < version => {
                        count_dead(nlog, b.1);
                        *b = here;
                    }
                    Some(_) => {
                        f.dead.fetch_add(words, Ordering::Relaxed);
                    }
                }
            }
            f.tail.store(off, Ordering::Relaxed);
            continue;
        }
        let mut tail = 0;
        for slot in 0..f.slots {
            // Slots are reserved in order and a reservation waits while its file has MAX_GAP
            // in flight (`Nlog::reserve`), so at most MAX_GAP unwritten (torn) slots precede a
            // written one: after more unwritten slots in a row nothing was ever written further
            // on, and the rest of the file — often most of an active file — is skipped.
            if slot - tail > MAX_GAP {
                break;
            }
            let e = f.entry(pool, slot)?;
            let m = decode_meta(e.meta.load(Ordering::Acquire), f.info.id);
            if !m.written {
                continue; // never written in this file, or torn
            }
            // Slots between the previous written one and this were reserved and torn: garbage
            // of this file, as are entries GC marked `inv` (counted when they were superseded,
            // before the crash).
            f.dead.fetch_add(slot - tail, Ordering::Relaxed);
            tail = slot + 1;
            if m.op == Op::Inv {
                f.dead.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            scan.entries += 1;
            let key = e.key.load(Ordering::Acquire);
            let version = e.version.load(Ordering::Acquire);
            max_version = max_version.max(version);
            let here = (version, f.vaddr(slot), m.op);
            match best.get_mut(&key) {
                None => {
                    best.insert(key, here);
                }
                Some(b) if b.0 < version => {
                    count_dead(nlog, b.1);
                    *b = here;
                }
                Some(_) => {
                    f.dead.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        f.tail.store(tail, Ordering::Relaxed);
    }
    for (key, (_, va, op)) in best {
        if op == Op::Del {
            count_dead(nlog, va);
        } else {
            index.set(key, va);
            scan.keys += 1;
        }
    }
    for (key, (_, va, op)) in bbest {
        if op == Op::Del {
            count_dead(nlog, va);
        } else {
            bindex.set(&key, va);
            scan.bytes_keys += 1;
        }
    }
    nlog.bump_version(cluster, max_version + 1);
    Ok(scan)
}

fn count_dead(nlog: &Nlog, va: VAddr) {
    if let Some(f) = nlog.file(va.node(), va.file()) {
        f.dead.fetch_add(f.weight(va), Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use numakv_index::{Engine, Index};
    use numakv_pmem::{CrashOptions, OpenConfig, PersistMode, PoolConfig, SimMode};

    use super::*;

    /// A variable-length entry whose space was reserved (size word durable) but whose body and
    /// meta never were — a writer that lost the power mid-write while a later writer of the
    /// same file finished — is stepped over: the later entry is recovered and the torn one
    /// counts as garbage.
    #[test]
    fn recovery_steps_over_a_torn_variable_length_entry() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store");
        let mut cfg = PoolConfig::new(NStore::engine_id(), 32 << 20);
        cfg.page_size = 4096;
        cfg.mode = PersistMode::Adr;
        cfg.sim = SimMode::Shadow;
        let pool = Pool::create(&path, cfg).unwrap();
        let opts = NStoreOptions {
            clusters: 1,
            log_file_size: 16 << 10,
            gc_threads_per_node: 0,
            ..Default::default()
        };
        let s = NStore::create(pool.clone(), &opts).unwrap();
        s.put_bytes(b"first", b"1").unwrap();
        // A reservation nobody completes.
        let (torn, off) = s.inner.nlog.reserve_var(0, 0, 9, crate::nlog::Need::Put).unwrap();
        s.put_bytes(b"after", b"the torn entry").unwrap();
        let va = s.inner.bindex.get(b"after").unwrap();
        assert_eq!((va.file(), va.slot()), (torn.info.id, off + 9), "same file, right after");
        pool.crash(CrashOptions::STRICT).unwrap();
        drop(torn);
        drop(s);
        drop(pool);
        let mut oc = OpenConfig::new(NStore::engine_id());
        oc.sim = SimMode::Shadow;
        let pool = Pool::open(&path, oc).unwrap();
        let (s, _) = NStore::open(pool, &opts).unwrap();
        assert_eq!(s.get_bytes(b"first").unwrap().as_deref(), Some(&b"1"[..]));
        assert_eq!(s.get_bytes(b"after").unwrap().as_deref(), Some(&b"the torn entry"[..]));
        let f = s.inner.nlog.file(0, va.file()).unwrap();
        assert_eq!(f.dead.load(Ordering::Relaxed), 9, "the torn entry's words are garbage");
        assert_eq!(s.check().unwrap().entries, 2);
    }
}
