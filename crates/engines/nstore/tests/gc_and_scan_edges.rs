//! Edges of GC and scans found by reading (issue 34): a file whose reclaim fails does not stop
//! GC for the rest of its node; idle active files are sealed and collected; a scan window with
//! a key that GC moved and a writer then deleted is filled from the keys after it.

mod common;

use std::collections::BTreeMap;

use numakv_index::Index;
use numakv_nstore::NStoreOptions;
use numakv_pmem::failpoint::Scenario;
use numakv_pmem::{PersistMode, SimMode};

/// One cluster of one-page files (100 fixed slots), one node's worth of writes.
fn opts() -> NStoreOptions {
    NStoreOptions { clusters: 1, log_file_size: 4096, gc_threads_per_node: 0, ..common::opts() }
}

/// File 1: keys 1..=100, 60 of them updated later (60 % garbage, 40 live entries to rewrite).
/// File 2: 100 upserts of key 500, all superseded (100 % garbage, nothing to rewrite).
#[test]
fn a_file_whose_reclaim_fails_does_not_stop_gc_of_the_next() {
    let dir = tempfile::tempdir().unwrap();
    let s = common::create(dir.path(), PersistMode::Eadr, SimMode::Direct, &opts());
    numakv_numa::set_current_node(0);
    let mut model = BTreeMap::new();
    for k in 1..=100 {
        s.insert(k, k).unwrap();
        model.insert(k, k);
    }
    for v in 0..=100 {
        s.upsert(500, v).unwrap();
    }
    model.insert(500, 100);
    for k in 1..=60 {
        s.update(k, k + 1000).unwrap();
        model.insert(k, k + 1000);
    }
    {
        let sc = Scenario::setup();
        let fail = sc.fail("nstore.gc.rewritten", Some(1));
        let n = s.collect_garbage().expect("the pass goes on after the failed file");
        assert_eq!(fail.hits(), 1);
        assert_eq!(n, 1, "the all-garbage file after the failed one is reclaimed");
    }
    assert_eq!(s.stats().counter("gc_errors"), Some(1));
    common::verify(&s, &model, "after the pass");
    assert!(s.collect_garbage().unwrap() >= 1, "the failed file is retried");
    common::verify(&s, &model, "after the retry");
}

/// The active file of a cluster nobody writes any more, mostly garbage, is sealed once GC
/// passes found it unchanged for a second (`gc::IDLE_TIME`), and reclaimed; a file written
/// between the passes is not.
#[test]
fn an_idle_active_file_with_garbage_is_sealed_and_collected() {
    let o = NStoreOptions { clusters: 1, log_file_size: 16 << 10, ..opts() };
    let dir = tempfile::tempdir().unwrap();
    let s = common::create(dir.path(), PersistMode::Eadr, SimMode::Direct, &o);
    numakv_numa::set_current_node(0);
    let mut model = BTreeMap::new();
    for round in 0..4 {
        for k in 1..=50 {
            s.upsert(k, k * 10 + round).unwrap();
            model.insert(k, k * 10 + round);
        }
    }
    // 200 of 408 slots written, 150 superseded: above the threshold, not full.
    let reclaimed = || s.stats().counter("gc_files_reclaimed").unwrap_or(0);
    let t0 = std::time::Instant::now();
    let mut pass = 0;
    while t0.elapsed() < std::time::Duration::from_millis(1500) {
        assert_eq!(s.collect_garbage().unwrap(), 0, "pass {pass}");
        s.upsert(1, pass).unwrap(); // busy: never idle
        model.insert(1, pass);
        pass += 1;
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(reclaimed(), 0, "a file being written was collected");
    let before = s.stats().pm_bytes();
    let t0 = std::time::Instant::now();
    while reclaimed() == 0 {
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(60),
            "an idle file with 75 % garbage was never collected"
        );
        s.collect_garbage().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(t0.elapsed() >= std::time::Duration::from_secs(1), "sealed before it was idle");
    assert!(s.stats().pm_bytes() < before, "nothing freed");
    common::verify(&s, &model, "after the idle file was collected");
    s.upsert(7, 7).unwrap(); // the cluster gets a new active file
    model.insert(7, 7);
    common::verify(&s, &model, "after a write to the cluster");
}

/// A scan read its window of addresses (pause point `nstore.scan.listed`); GC moves key 5's
/// file and key 5 is deleted: the window has a hole, filled from key 11 on.
#[test]
fn a_scan_window_with_a_moved_then_deleted_key_is_filled() {
    let dir = tempfile::tempdir().unwrap();
    let s = common::create(dir.path(), PersistMode::Eadr, SimMode::Direct, &opts());
    numakv_numa::set_current_node(0);
    for k in 1..=100 {
        s.insert(k, k).unwrap();
    }
    for k in 20..=101 {
        s.upsert(k, k + 1).unwrap(); // file 1 is 81 % garbage, sealed
    }
    let sc = Scenario::setup();
    let pause = sc.pause("nstore.scan.listed");
    let out = std::thread::scope(|t| {
        let scan = t.spawn(|| {
            numakv_numa::set_current_node(0);
            let mut out = Vec::new();
            s.scan(1, 10, &mut out).unwrap();
            out
        });
        pause.wait_parked();
        assert!(s.collect_garbage().unwrap() >= 1, "file 1 reclaimed");
        assert!(s.remove(5).unwrap());
        pause.release();
        scan.join().unwrap()
    });
    let want: Vec<(u64, u64)> = (1..=11).filter(|&k| k != 5).map(|k| (k, k)).collect();
    assert_eq!(out, want, "a short or wrong batch");
}
