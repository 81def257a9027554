//! The neighbours of the review's forged-header window (`tests/review_blind.rs`): a new log
//! file's extent is allocated (durably) and its header is not yet written
//! (`nstore.new_file.allocated`), and a crash comes. Whatever the extent's first bytes are —
//! a forged header with the best checksum a client can compute (crc32, or anything else not
//! keyed with the node's secret), for a fixed-size or a variable-length file, with the next id
//! or one above the id mark, followed by entries stamped with it; or a client's byte key, shaped
//! the same way, in the stale bytes of a freed clean-shutdown snapshot — recovery must not read them as a file, must free the extent (no
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
/// extent; the next open loads it and frees it without zeroing. New files then take its pages.
/// A first run (no crash) finds the first new file that starts strictly inside the freed
/// snapshot and which key's bytes lie at its start (every key word is a marker naming its key
/// and word); the second run, identical but for those words of that key — now a crc32 file
/// header with the id that file gets, and two entries stamped with it — crashes between that
/// file's allocation and its header. The store must open with its acknowledged writes, free the
/// extent (`orphan_extents_freed` 1), and hold no forged key.
#[test]
fn a_header_shaped_key_in_a_freed_snapshot_never_validates_as_a_file() {
    for mode in [PersistMode::Adr, PersistMode::Eadr] {
        let dry = snapshot_schedule(mode, None);
        let Found::Dry { key, word, id, pages } = dry else { unreachable!() };
        let Found::Crashed = snapshot_schedule(mode, Some((key, word, id, pages))) else {
            unreachable!()
        };
    }
}

enum Found {
    /// The first run: key `key`'s word `word` lies at the start of the file, which got id `id`
    /// and has `pages` pages.
    Dry { key: usize, word: usize, id: u32, pages: u64 },
    /// The second run crashed there, reopened and checked.
    Crashed,
}

const SNAP_KEYS: usize = 64;
const KEY_WORDS: usize = 250;
const MARK: u64 = 0xF0F0 << 48;

/// The schedule of the snapshot test; `plant`: (key, word, id, pages) of the forgery.
fn snapshot_schedule(mode: PersistMode, plant: Option<(usize, usize, u32, u64)>) -> Found {
    let sc = Scenario::setup(); // serial with the other tests' armed points
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    let o = opts();
    let s = common::create(&path, mode, SimMode::Shadow, &o);
    let mut keys = Vec::new();
    for i in 0..SNAP_KEYS {
        // Word 0: the index, big-endian (the snapshot lists keys in byte order); then markers.
        let mut ws: Vec<u64> = vec![u64::from_le_bytes((i as u64).to_be_bytes())];
        ws.extend((1..KEY_WORDS).map(|j| MARK | (i as u64) << 16 | j as u64));
        if let Some((k, w, id, pages)) = plant {
            if k == i {
                let f = forged_file(id, pages * 4096, false);
                ws[w..w + f.len()].copy_from_slice(&f);
            }
        }
        let key: Vec<u8> = ws.iter().flat_map(|w| w.to_le_bytes()).collect();
        s.put_bytes(&key, b"v").unwrap();
        keys.push(key);
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
    // The first new file that starts strictly inside the freed snapshot extent: its start and
    // pages, and the word there (still the snapshot's: the point precedes the zeroing).
    let before = std::sync::Mutex::new(extents(&pool, AUX_LOG));
    let hit = Arc::new(std::sync::Mutex::new(None::<(u64, u64, u64)>));
    let crash = {
        let pool = Arc::clone(&pool);
        let hit = Arc::clone(&hit);
        sc.call("nstore.new_file.allocated", move || {
            let now = extents(&pool, AUX_LOG);
            let mut b = before.lock().unwrap();
            let new = now.difference(&b).find(|&&(p, _)| p > sbase && p < send).copied();
            *b = now;
            let mut h = hit.lock().unwrap();
            if let (Some((p, pages)), None) = (new, *h) {
                let w: &PmU64 = pool.get(PPtr::from_raw(p)).unwrap();
                *h = Some((p, pages, w.load(Ordering::Acquire)));
                if plant.is_some() {
                    pool.crash(CrashOptions::STRICT).unwrap();
                }
            }
        })
    };
    let mut model = Vec::new();
    for i in 1u64.. {
        assert!(i < 200_000, "{mode:?}: no new file started inside the snapshot's pages");
        let r = s.upsert(1000 + i, i);
        if plant.is_some() && hit.lock().unwrap().is_some() {
            break; // this write's file never got its header: the power failed
        }
        r.unwrap();
        model.push((1000 + i, i));
        if hit.lock().unwrap().is_some() {
            break;
        }
    }
    drop(crash);
    let (p, pages, w) = hit.lock().unwrap().unwrap();
    if plant.is_none() {
        // The dry run: which key word lies at the file's start, and the file's id.
        assert_eq!(w >> 48, MARK >> 48, "{mode:?}: the file starts at a key's marker words");
        let (key, word) = (((w >> 16) & 0xffff) as usize, (w & 0xffff) as usize);
        assert!(word + 18 <= KEY_WORDS, "{mode:?}: the forgery would not fit key {key}");
        let h: &PmU64 = pool.get(PPtr::from_raw(p + 8)).unwrap();
        let id = h.load(Ordering::Acquire) as u32;
        return Found::Dry { key, word, id, pages };
    }
    assert_eq!(w, FILE_MAGIC, "{mode:?}: the planted header lies at the new file's start");
    drop(sc);
    drop(s);
    drop(pool);
    let (s, _, c) = common::open(&path, SimMode::Shadow, &o);
    assert_eq!(common::counter(&c, "orphan_extents_freed"), 1, "{mode:?}: {c:?}");
    assert_eq!(s.get(1).unwrap(), Some(1), "{mode:?}: acknowledged upsert(1, 1)");
    assert_eq!(s.get(424_242).unwrap(), None, "{mode:?}: a key never written");
    for &(k, v) in &model {
        assert_eq!(s.get(k).unwrap(), Some(v), "{mode:?}: acknowledged upsert({k}, {v})");
    }
    for k in &keys {
        assert_eq!(s.get_bytes(k).unwrap(), Some(b"v".to_vec()), "{mode:?}");
    }
    let r = s.check().unwrap();
    assert_eq!(r.reachable_blocks, r.allocated_blocks, "{mode:?}: leak {r:?}");
    Found::Crashed
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
