//! Blind adversarial review of NStore (branch review-nstore): each test aims at one window and
//! fails on the code it was written against.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use numakv_index::{Engine, Index};
use numakv_nstore::layout::{meta_word, Op, AUX_LOG, FILE_MAGIC, GEOMETRY_FIXED};
use numakv_nstore::{NStore, NStoreOptions};
use numakv_pmem::failpoint::Scenario;
use numakv_pmem::{CrashOptions, OpenConfig, PersistMode, Pool, PoolConfig, SimMode};

/// A copy of the crate's key hash (splitmix64's finaliser), to aim keys at clusters.
fn hash(key: u64) -> u64 {
    let mut z = key.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A copy of the crate's byte-key hash (FNV-1a, then [`hash`]'s finaliser).
fn hash_bytes(key: &[u8]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for &b in key {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    hash(h)
}

fn cluster_of(h: u64, clusters: u32) -> u32 {
    ((h >> 32) % u64::from(clusters)) as u32
}

/// Log extents of node 0: base offset → pages.
fn log_extents(pool: &Pool) -> BTreeMap<u64, u64> {
    pool.extents(0)
        .unwrap()
        .iter()
        .filter(|x| x.aux == AUX_LOG)
        .map(|x| (x.ptr.raw(), x.pages))
        .collect()
}

fn files_created(s: &NStore) -> u64 {
    s.stats().counter("files_created").unwrap_or(0)
}

/// An 8-byte byte key of cluster 0 (of 2): `tag` then a counter.
fn key0(tag: u8, n: &mut u32) -> Vec<u8> {
    loop {
        *n += 1;
        let k = format!("{}{:07}", tag as char, *n).into_bytes();
        if cluster_of(hash_bytes(&k), 2) == 0 {
            return k;
        }
    }
}

fn le(ws: &[u64]) -> Vec<u8> {
    ws.iter().flat_map(|w| w.to_le_bytes()).collect()
}

/// A header of a fixed-size log file, as `FileInfo::write` lays it out, with its crc32.
fn forged_header(id: u32, cluster: u32, size: u64) -> Vec<u8> {
    let w = [FILE_MAGIC, u64::from(id), 0, u64::from(cluster), size, GEOMETRY_FIXED];
    let mut h = crc32fast::Hasher::new();
    for x in &w {
        h.update(&x.to_le_bytes());
    }
    let mut all = w.to_vec();
    all.push(u64::from(h.finalize()));
    all.push(0);
    le(&all)
}

/// Window: a new log file's extent is allocated (durably) and its header is not written yet
/// (`nstore.new_file.allocated`). Freed pages are reused as they are, and a free invalidates
/// only the header at the start of the freed extent. With 16-page first files and 32-page
/// second files, a first file can start at page 16 of a freed 32-page variable-length file —
/// where a client's byte value lies. A value that holds a well-formed file header (crc32 is
/// not a secret) followed by fixed-size entries stamped with that header's id then validates
/// at open: an acknowledged `upsert(k, 1)` comes back as 666 and a key never written appears.
///
/// Schedule: cluster-0 byte puts fill V1 (16 pages, live) and V2 (32 pages, all deleted later;
/// one value straddles V2's page 16 with the forged header + entries there); V2 is sealed by
/// more puts, its keys deleted, GC frees it; `upsert(K1, 1)` (cluster 0) takes V2's first 16
/// pages; `upsert(K2, 2)` (cluster 1) allocates the next 16 pages — V2's page 16 — and the
/// power fails at `nstore.new_file.allocated`.
#[test]
fn a_forged_header_in_a_byte_value_validates_after_a_crash_in_new_file() {
    let mut failures = Vec::new();
    for mode in [PersistMode::Adr, PersistMode::Eadr] {
        let dir = tempfile::tempdir().unwrap();
        let (path, opts, k1) = forge_then_crash_in_new_file(dir.path(), mode, 60);
        let mut oc = OpenConfig::new(NStore::engine_id());
        oc.sim = SimMode::Shadow;
        let (s, rep) = NStore::open(Pool::open(&path, oc).unwrap(), &opts).unwrap();
        let got1 = s.get(k1).unwrap();
        let ghost = s.get(424_242).unwrap();
        if (got1, ghost) != (Some(1), None) {
            failures.push(format!(
                "{mode:?}: a forged header in a byte value became a log file at open \
                 (acknowledged upsert({k1}, 1) reads {got1:?}, never-written key 424242 reads \
                 {ghost:?}); check() says {:?}; recovery: {rep:?}",
                s.check().map(|r| r.entries)
            ));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// The same schedule with a forged header whose id is above the node's id high-water mark
/// (65 here): open refuses the whole store as corrupted — one client value, put and deleted
/// before a power failure, makes the store unopenable.
#[test]
fn a_forged_header_in_a_byte_value_makes_the_store_unopenable_after_a_crash() {
    let mut failures = Vec::new();
    for mode in [PersistMode::Adr, PersistMode::Eadr] {
        let dir = tempfile::tempdir().unwrap();
        let (path, opts, k1) = forge_then_crash_in_new_file(dir.path(), mode, 1000);
        let mut oc = OpenConfig::new(NStore::engine_id());
        oc.sim = SimMode::Shadow;
        match NStore::open(Pool::open(&path, oc).unwrap(), &opts) {
            Ok((s, _)) => assert_eq!(s.get(k1).unwrap(), Some(1), "{mode:?}"),
            Err(e) => failures.push(format!(
                "{mode:?}: open after the crash fails: {e} (the store held only \
                 acknowledged writes and a deleted byte value)"
            )),
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// The schedule of the two tests above, up to the power failure; returns the pool path, the
/// options and K1 (acknowledged `upsert(K1, 1)`; the forged entries say K1 → 666 and
/// 424242 → 777).
fn forge_then_crash_in_new_file(
    dir: &Path,
    mode: PersistMode,
    forged_id: u32,
) -> (PathBuf, NStoreOptions, u64) {
    {
        // Held for the whole schedule: a point the other test of this binary arms would
        // otherwise meet this schedule's file allocations (and crash the other test's pool).
        let sc = Scenario::setup();
        let path = dir.join("store");
        let mut cfg = PoolConfig::new(NStore::engine_id(), 4 << 20);
        cfg.page_size = 4096;
        cfg.mode = mode;
        cfg.sim = SimMode::Shadow;
        let pool = Pool::create(&path, cfg).unwrap();
        let opts = NStoreOptions {
            clusters: 2,
            log_file_size: 128 << 10, // first files 16 pages, then 32
            gc_threads_per_node: 0,
            recovery_threads: 1,
            cache: numakv_nstore::CacheMode::Off,
            ..Default::default()
        };
        let s = NStore::create(pool.clone(), &opts).unwrap();
        let k1 = (1u64..).find(|&k| cluster_of(hash(k), 2) == 0).unwrap();
        let k2 = (1u64..).find(|&k| cluster_of(hash(k), 2) == 1).unwrap();
        let mut n = 0u32;
        let mut garbage: Vec<Vec<u8>> = Vec::new();
        // V1: live keys, until a put creates V2 (that put is V2's first entry).
        let v1_created = {
            let k = key0(b'L', &mut n);
            s.put_bytes(&k, &[1; 1000]).unwrap();
            files_created(&s)
        };
        assert_eq!(v1_created, 1);
        let v1 = log_extents(&pool);
        let mut pos; // byte offset of the next entry in V2
        loop {
            let k = key0(b'L', &mut n);
            s.put_bytes(&k, &[1; 1000]).unwrap();
            if files_created(&s) > v1_created {
                garbage.push(k); // V2's first entry: garbage
                pos = 64 + 40 + 1000;
                break;
            }
        }
        let v2_map: Vec<(u64, u64)> =
            log_extents(&pool).into_iter().filter(|(p, _)| !v1.contains_key(p)).collect();
        assert_eq!(v2_map.len(), 1, "{mode:?}");
        let (v2, v2_pages) = v2_map[0];
        assert_eq!(v2_pages, 32, "{mode:?}: V2 is a 32-page file");
        // Fillers so that the next entry's value starts 8 bytes before V2's page 16.
        let target = 16 * 4096 - 8 - 40; // head + 8-byte key before the value
        while pos < target {
            let r = target - pos;
            let l = if r <= 40 + 2000 {
                r - 40
            } else if r - 2040 >= 40 {
                2000
            } else {
                1000
            };
            let k = key0(b'G', &mut n);
            s.put_bytes(&k, &vec![0; l as usize]).unwrap();
            garbage.push(k);
            pos += 40 + l;
        }
        assert_eq!(pos, target, "{mode:?}");
        let mut value = vec![0u8; 8];
        value.extend(forged_header(forged_id, 0, 16 * 4096));
        value.extend(le(&[meta_word(Op::Upd, forged_id), 1 << 40, 0, k1, 666]));
        value.extend(le(&[meta_word(Op::Ins, forged_id), 1 << 40, 0, 424_242, 777]));
        value.resize(2000, 0);
        let fk = key0(b'F', &mut n);
        s.put_bytes(&fk, &value).unwrap();
        garbage.push(fk);
        // Seal V2 with more garbage.
        let c = files_created(&s);
        while files_created(&s) == c {
            let k = key0(b'G', &mut n);
            s.put_bytes(&k, &[0; 1000]).unwrap();
            garbage.push(k);
        }
        for k in &garbage {
            assert!(s.delete_bytes(k).unwrap());
        }
        assert!(s.gc_quiesce(std::time::Duration::from_secs(30)).unwrap(), "{mode:?}: GC");
        assert!(!log_extents(&pool).contains_key(&v2), "{mode:?}: GC freed V2");
        // K1's first fixed file takes V2's first 16 pages.
        s.upsert(k1, 1).unwrap();
        assert_eq!(log_extents(&pool).get(&v2), Some(&16), "{mode:?}: K1's file reuses V2");
        let crash = {
            let pool = pool.clone();
            sc.call("nstore.new_file.allocated", move || {
                pool.crash(CrashOptions::STRICT).unwrap();
            })
        };
        let _ = s.upsert(k2, 2); // its file (V2's page 16 on) is never written: power fails
        assert!(crash.hits() >= 1, "{mode:?}: K2's new file did not reach the point");
        let second = v2 + 16 * 4096;
        assert_eq!(
            log_extents(&pool).get(&second),
            Some(&16),
            "{mode:?}: K2's file starts at V2's page 16"
        );
        drop(crash);
        drop(sc);
        drop(s);
        drop(pool);
        (path, opts, k1)
    }
}
