//! Space: a store with the default options takes many distinct keys in a default-sized pool
//! (files start small and double), a capacity that cannot work is refused at create, and a
//! store that ran full recovers once keys are deleted (GC rewrites into its reserve).

mod common;

use std::collections::BTreeMap;

use numakv_index::{Engine, Index};
use numakv_nstore::{NStore, NStoreOptions};
use numakv_pmem::{Pool, PoolConfig};

/// The default store of `numakv create DIR --engine nstore`: 1 GiB per node, 256 KiB pages, the
/// default options (256 clusters, files growing to 8 MiB, background GC).
#[test]
fn a_default_store_takes_100k_distinct_keys_in_proportionate_space() {
    let dir = tempfile::tempdir().unwrap();
    let pool = Pool::create(dir.path(), PoolConfig::new(NStore::engine_id(), 1 << 30)).unwrap();
    let s = NStore::create(pool.clone(), &NStoreOptions::default()).unwrap();
    let n = 100_000u64;
    for k in 1..=n {
        s.insert(k, k * 3).unwrap_or_else(|e| panic!("insert of key {k} failed: {e}"));
    }
    for k in (1..=n).step_by(997) {
        assert_eq!(s.get(k).unwrap(), Some(k * 3));
    }
    let written = n * 40; // entry bytes
    let stats = s.stats();
    let used = pool.used_bytes(0).unwrap();
    // Every cluster's files (first one small, doubling) hold the entries: allocated PM is a
    // small multiple of what was written plus the first files, far from the 1 GiB capacity.
    eprintln!("{n} keys: {used} bytes allocated, {} bytes in use", stats.pm_bytes());
    assert!(stats.pm_bytes() >= written, "{} < {written}", stats.pm_bytes());
    assert!(used < 96 << 20, "{used} bytes allocated for {written} bytes of entries");
    assert_eq!(s.check().unwrap().entries, n);
    s.close().unwrap();
}

#[test]
fn create_refuses_a_capacity_that_cannot_work_and_names_the_minimum() {
    let o = NStoreOptions::default();
    let min = o.min_capacity_per_node(256 << 10);
    let dir = tempfile::tempdir().unwrap();
    let pool =
        Pool::create(dir.path(), PoolConfig::new(NStore::engine_id(), min - (256 << 10))).unwrap();
    let e = NStore::create(pool, &o).unwrap_err().to_string();
    assert!(e.contains(&format!("at least {min} bytes per node")), "{e}");
    let dir = tempfile::tempdir().unwrap();
    let pool = Pool::create(dir.path(), PoolConfig::new(NStore::engine_id(), min)).unwrap();
    let s = NStore::create(pool, &o).expect("the minimum it names works");
    for k in 1..=2_000 {
        s.insert(k, k).unwrap();
    }
}

/// Fills a small store until puts fail for space, deletes keys, lets GC reclaim: puts succeed
/// again, and everything left is intact.
#[test]
fn a_full_store_recovers_after_deletes_and_gc() {
    let o = NStoreOptions {
        clusters: 2,
        log_file_size: 16 << 10,
        gc_threads_per_node: 0,
        ..Default::default()
    };
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = PoolConfig::new(NStore::engine_id(), 1 << 20);
    cfg.page_size = 4 << 10;
    let pool = Pool::create(dir.path(), cfg).unwrap();
    let s = NStore::create(pool, &o).unwrap();
    let mut model = BTreeMap::new();
    let mut k = 0u64;
    let err = loop {
        k += 1;
        match s.insert(k, k) {
            Ok(_) => {
                model.insert(k, k);
            }
            Err(e) => break e,
        }
        assert!(k < 1_000_000, "a 1 MiB store never ran full");
    };
    assert!(err.is_out_of_space(), "{err}");
    let full = model.len() as u64;
    assert!(full > 10_000, "ran full after {full} keys");
    eprintln!("full after {full} keys");
    // Deletes may use part of the reserve: delete the oldest keys (whole files of them).
    let mut deleted = 0;
    for k in 1..=full / 2 {
        match s.remove(k) {
            Ok(true) => {
                model.remove(&k);
                deleted += 1;
            }
            Ok(false) => unreachable!("key {k} was present"),
            Err(e) if e.is_out_of_space() => break,
            Err(e) => panic!("delete {k}: {e}"),
        }
    }
    assert!(deleted > 500, "only {deleted} deletes fit");
    eprintln!("{deleted} deletes fit");
    assert!(s.gc_quiesce(std::time::Duration::from_secs(10)).unwrap(), "GC did not settle");
    assert!(s.stats().counter("gc_files_reclaimed").unwrap_or(0) > 0);
    for k in full + 1..=full + 200 {
        s.insert(k, k).unwrap_or_else(|e| panic!("put after GC: {e}"));
        model.insert(k, k);
    }
    common::verify(&s, &model, "after refill");
}
