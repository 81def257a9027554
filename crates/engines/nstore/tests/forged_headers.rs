//! The neighbours of the review's forged-header window (`tests/review_blind.rs`): a new log
//! file's extent is allocated (durably) and its header is not yet written
//! (`nstore.new_file.allocated`), and a crash comes. Whatever the extent's first bytes are —
//! a forged header with the best checksum a client can compute (crc32, or anything else not
//! keyed with the node's secret), for a fixed-size or a variable-length file, with the next id
//! or one above the id mark, followed by entries stamped with it; or the stale bytes of a freed
//! clean-shutdown snapshot — recovery must not read them as a file, must free the extent (no
//! leak), and the store must open with exactly its acknowledged writes. Also: `check()` tells a
//! header not keyed with the secret, and a store of the previous format (meta page "NSTMETA1")
//! is refused with a clear error.

mod common;

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use numakv_index::{Engine, Error, Index};
use numakv_nstore::layout::{
    meta_word, var_meta_word, var_size_word, FileHeader, NodeMeta, Op, AUX_LOG, AUX_META,
    AUX_SNAPSHOT, FILE_MAGIC, GEOMETRY_FIXED, GEOMETRY_VAR, META_MAGIC_V1, OWNER_ENGINE,
};
use numakv_nstore::{NStore, NStoreOptions};
use numakv_pmem::failpoint::Scenario;
use numakv_pmem::{CrashOptions, PPtr, PersistMode, PmU64, Pool, SimMode};

/// Extents of node 0 of kind `aux`: base offset → pages.
fn extents(pool: &Pool, aux: u16) -> BTreeSet<(u64, u64)> {
    pool.extents(0)
        .unwrap()
        .iter()
        .filter(|x| x.owner == OWNER_ENGINE && x.aux == aux)
        .map(|x| (x.ptr.raw(), x.pages))
        .collect()
}

/// Writes the words `ws` from `p` on, and persists them.
fn plant(pool: &Pool, p: PPtr, ws: &[u64]) {
    for (i, &w) in ws.iter().enumerate() {
        let word: &PmU64 = pool.get(PPtr::from_raw(p.raw() + 8 * i as u64)).unwrap();
        word.store(w, Ordering::Release);
        pool.persist_obj(word);
    }
}

/// A header as the previous format wrote it: crc32 of the six words (a client can compute it).
fn crc_header(id: u32, cluster: u32, size: u64, geometry: u64) -> Vec<u64> {
    let w = [FILE_MAGIC, u64::from(id), 0, u64::from(cluster), size, geometry];
    let mut h = crc32fast::Hasher::new();
    for x in &w {
        h.update(&x.to_le_bytes());
    }
    let mut all = w.to_vec();
    all.push(u64::from(h.finalize()));
    all.push(0);
    all
}

/// Forged file contents for a file of `size` bytes with id `id`: a crc32 header, then entries
/// stamped with `id` saying key 1 → 666 and key 424242 → 777 (fixed-size), or byte key "k" →
/// "forged" (variable-length).
fn forged_file(id: u32, size: u64, var: bool) -> Vec<u64> {
    if var {
        let mut ws = crc_header(id, 0, size, GEOMETRY_VAR);
        let words = 4 + 1 + 1;
        ws.extend([var_meta_word(Op::Ins, 1, 6, id), 1 << 40, 0, var_size_word(words, id)]);
        ws.push(u64::from(b'k'));
        ws.push(u64::from_le_bytes(*b"forged\0\0"));
        ws
    } else {
        let mut ws = crc_header(id, 0, size, GEOMETRY_FIXED);
        ws.extend([meta_word(Op::Upd, id), 1 << 40, 0, 1, 666]);
        ws.extend([meta_word(Op::Ins, id), 1 << 40, 0, 424_242, 777]);
        ws
    }
}

fn opts() -> NStoreOptions {
    NStoreOptions {
        clusters: 1,
        log_file_size: 64 << 10,
        gc_threads_per_node: 0,
        recovery_threads: 1,
        cache: numakv_nstore::CacheMode::Off,
        ..Default::default()
    }
}

/// In each mode, for a fixed-size and a variable-length new file, and for a forged id equal to
/// the id the file gets, one above it, and one far above the node's id mark: a forged
/// (crc32-checked) header and entries at the start of the new extent, then the power fails
/// before the engine writes its header. The store opens, holds exactly the acknowledged writes,
/// freed the extent (`orphan_extents_freed` 1, `check()` finds no leak).
#[test]
fn any_bytes_at_a_new_extents_start_never_validate_as_a_file() {
    for mode in [PersistMode::Adr, PersistMode::Eadr] {
        for var in [false, true] {
            for forged_id in [Some(0), Some(1), Some(5000), None] {
                let ctx = format!("{mode:?} var {var} forged id {forged_id:?}");
                // Held for the whole round: a point armed by another test of this binary would
                // otherwise meet this round's file allocations (and the reverse).
                let sc = Scenario::setup();
                let dir = tempfile::tempdir().unwrap();
                let path = dir.path().join("store");
                let o = opts();
                let s = common::create(&path, mode, SimMode::Shadow, &o);
                let pool = Arc::clone(s.pool());
                // One file of each kind, acknowledged.
                s.upsert(1, 1).unwrap();
                s.put_bytes(b"a", b"acked").unwrap();
                let before = extents(&pool, AUX_LOG);
                let crash = {
                    let pool = Arc::clone(&pool);
                    let once = std::sync::atomic::AtomicBool::new(false);
                    sc.call("nstore.new_file.allocated", move || {
                        if once.swap(true, Ordering::SeqCst) {
                            return; // a write after the power failure: nothing is durable
                        }
                        let now = extents(&pool, AUX_LOG);
                        let new: Vec<_> = now.difference(&before).copied().collect();
                        assert_eq!(new.len(), 1, "one new extent: {new:?}");
                        let (base, pages) = new[0];
                        // Ids are per node and sequential: the new file's id is 3 here; a
                        // forged id of 0 stands for "the id the file is about to get".
                        if let Some(d) = forged_id {
                            let id = if d == 0 { 3 } else { 3 + d };
                            let ws = forged_file(id, pages * pool.page_size(), var);
                            plant(&pool, PPtr::from_raw(base), &ws);
                        }
                        pool.crash(CrashOptions::STRICT).unwrap();
                    })
                };
                // Force a new file of the kind: seal the active one by collecting it.
                let _ = if var {
                    fill_until_new_file(&s, |i| {
                        s.put_bytes(format!("f{i}").as_bytes(), &[7; 600]).map(drop)
                    })
                } else {
                    fill_until_new_file(&s, |i| s.upsert(100 + i, i).map(drop))
                };
                assert!(crash.hits() >= 1, "{ctx}: no new file reached the point");
                drop(crash);
                drop(sc);
                drop(s);
                drop(pool);
                let (s, _, c) = common::open(&path, SimMode::Shadow, &o);
                assert_eq!(common::counter(&c, "orphan_extents_freed"), 1, "{ctx}: {c:?}");
                assert_eq!(s.get(1).unwrap(), Some(1), "{ctx}: acknowledged upsert(1, 1)");
                assert_eq!(s.get(424_242).unwrap(), None, "{ctx}: a key never written");
                assert_eq!(s.get_bytes(b"a").unwrap(), Some(b"acked".to_vec()), "{ctx}");
                assert_eq!(s.get_bytes(b"k").unwrap(), None, "{ctx}: a key never written");
                let r = s.check().unwrap();
                assert_eq!(r.reachable_blocks, r.allocated_blocks, "{ctx}: leak {r:?}");
            }
        }
    }
}

/// Writes with `put(i)` until the store creates a file (or the pool crashes, which makes the
/// write fail); bounded.
fn fill_until_new_file(s: &NStore, put: impl Fn(u64) -> Result<(), Error>) -> Option<Error> {
    let c = s.stats().counter("files_created").unwrap_or(0);
    for i in 0..100_000 {
        if let Err(e) = put(i) {
            return Some(e);
        }
        if s.stats().counter("files_created").unwrap_or(0) > c {
            return None;
        }
    }
    panic!("no new file after 100000 writes");
}

/// The snapshot neighbour: a clean close writes the index (byte keys verbatim) into a snapshot
/// extent; the next open loads it and frees it without zeroing. New files then take its pages;
/// a crash between such a file's allocation and its header leaves snapshot bytes — client key
/// bytes shaped as crc32 file headers, at every 8-byte phase — where the header belongs. The
/// store opens with its acknowledged writes and frees the extent. (Where the page boundary falls
/// in the key bytes decides whether a forged header lies exactly there; the keyed checksum
/// makes that irrelevant, and `any_bytes_at_a_new_extents_start_never_validate_as_a_file`
/// plants one deterministically.)
#[test]
fn a_new_file_over_a_freed_snapshot_crashing_before_its_header_is_freed() {
    for mode in [PersistMode::Adr, PersistMode::Eadr] {
        let sc = Scenario::setup(); // serial with the other tests' armed points
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store");
        let o = opts();
        let s = common::create(&path, mode, SimMode::Shadow, &o);
        // Byte keys full of forged headers (fixed-size, ids 1..=8) at every 8-byte phase mod 64,
        // enough of them for a snapshot of more than one file's pages.
        let mut keys = Vec::new();
        for phase in 0..8u64 {
            let mut ws = vec![0u64; phase as usize];
            for id in 1..=8u32 {
                ws.extend(forged_file(id, 16 << 12, false)[..8].iter().copied());
            }
            let key: Vec<u8> = ws.iter().flat_map(|w| w.to_le_bytes()).collect();
            for n in 0..32u8 {
                let mut k = key.clone();
                k.push(n);
                s.put_bytes(&k, b"v").unwrap();
                keys.push(k);
            }
        }
        s.upsert(1, 1).unwrap();
        s.close().unwrap();
        let pool = {
            let mut oc = numakv_pmem::OpenConfig::new(NStore::engine_id());
            oc.sim = SimMode::Shadow;
            Pool::open(&path, oc).unwrap()
        };
        let snap = extents(&pool, AUX_SNAPSHOT);
        assert_eq!(snap.len(), 1, "{mode:?}: one snapshot extent");
        let (sbase, spages) = *snap.iter().next().unwrap();
        let send = sbase + spages * pool.page_size();
        let (s, rep) = NStore::open(Arc::clone(&pool), &o).unwrap();
        assert_eq!(common::counter(&rep.counters, "from_snapshot"), 1, "{mode:?}: {rep:?}");
        assert!(extents(&pool, AUX_SNAPSHOT).is_empty(), "{mode:?}: snapshot freed at open");
        // Crash in the first new file that starts inside the freed snapshot extent.
        let before = std::sync::Mutex::new(extents(&pool, AUX_LOG));
        let crashed = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let crash = {
            let pool = Arc::clone(&pool);
            let crashed = Arc::clone(&crashed);
            sc.call("nstore.new_file.allocated", move || {
                let now = extents(&pool, AUX_LOG);
                let mut b = before.lock().unwrap();
                let hit = now.difference(&b).any(|&(p, _)| p > sbase && p < send);
                *b = now;
                if hit && !crashed.swap(true, Ordering::SeqCst) {
                    pool.crash(CrashOptions::STRICT).unwrap();
                }
            })
        };
        let mut model = Vec::new();
        for i in 1u64.. {
            assert!(i < 200_000, "{mode:?}: no new file started inside the snapshot's pages");
            let r = s.upsert(1000 + i, i);
            if crashed.load(Ordering::SeqCst) {
                break; // this write's file never got its header: the power failed
            }
            r.unwrap();
            model.push((1000 + i, i));
        }
        drop(crash);
        drop(sc);
        drop(s);
        drop(pool);
        let (s, _, c) = common::open(&path, SimMode::Shadow, &o);
        assert_eq!(common::counter(&c, "orphan_extents_freed"), 1, "{mode:?}: {c:?}");
        assert_eq!(s.get(1).unwrap(), Some(1), "{mode:?}");
        for &(k, v) in &model {
            assert_eq!(s.get(k).unwrap(), Some(v), "{mode:?}: acknowledged upsert({k}, {v})");
        }
        for k in &keys {
            assert_eq!(s.get_bytes(k).unwrap(), Some(b"v".to_vec()), "{mode:?}");
        }
        let r = s.check().unwrap();
        assert_eq!(r.reachable_blocks, r.allocated_blocks, "{mode:?}: leak {r:?}");
    }
}

/// `check()` tells a file header that is well formed but not keyed with the node's secret (what
/// a crc32 forgery, or a header of the previous format, looks like), though it names the very
/// file the table holds.
#[test]
fn check_reports_a_header_not_keyed_with_the_secret() {
    let _serial = Scenario::setup(); // no other test's armed point meets this one's writes
    let dir = tempfile::tempdir().unwrap();
    let o = opts();
    let s = common::create(&dir.path().join("store"), PersistMode::Adr, SimMode::Direct, &o);
    s.upsert(1, 1).unwrap();
    s.check().unwrap();
    let pool = Arc::clone(s.pool());
    let logs = extents(&pool, AUX_LOG);
    assert_eq!(logs.len(), 1);
    let (base, pages) = *logs.iter().next().unwrap();
    let h: &FileHeader = pool.get(PPtr::from_raw(base)).unwrap();
    let id = h.file_id.load(Ordering::Acquire) as u32;
    plant(
        &pool,
        PPtr::from_raw(base),
        &crc_header(id, 0, pages * pool.page_size(), GEOMETRY_FIXED),
    );
    let e = s.check().unwrap_err().to_string();
    assert!(e.contains("checksum mismatch"), "{e}");
}

/// A store whose meta pages say "NSTMETA1" (the format before keyed headers) is refused with
/// `Unsupported`, naming the format, not opened with forgeable headers or called corrupted.
#[test]
fn a_store_of_the_previous_format_is_refused_with_a_clear_error() {
    let _serial = Scenario::setup(); // no other test's armed point meets this one's writes
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    let o = opts();
    let s = common::create(&path, PersistMode::Adr, SimMode::Shadow, &o);
    s.upsert(1, 1).unwrap();
    let pool = Arc::clone(s.pool());
    for node in 0..pool.nodes() {
        for x in pool.extents(node).unwrap().iter().filter(|x| x.aux == AUX_META) {
            let m: &NodeMeta = pool.get(x.ptr).unwrap();
            m.magic.store(META_MAGIC_V1, Ordering::Release);
            pool.persist_obj(&m.magic);
        }
    }
    drop(s);
    drop(pool);
    let mut oc = numakv_pmem::OpenConfig::new(NStore::engine_id());
    oc.sim = SimMode::Shadow;
    match NStore::open(Pool::open(&path, oc).unwrap(), &o) {
        Err(Error::Unsupported(m)) => assert!(m.contains("NSTMETA1"), "{m}"),
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("a previous-format store opened"),
    }
}
