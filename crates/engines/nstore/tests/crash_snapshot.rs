//! The clean-shutdown snapshot: a clean close reopens from it (no log scan); a power failure at
//! any fence of the close — while the snapshot is written, before or after its flag — reopens
//! by scanning the log, with nothing lost; a crash after a snapshot-based open never reuses the
//! stale snapshot.

mod common;

use std::collections::BTreeMap;

use numakv_index::{Engine, Index};
use numakv_pmem::{CrashOptions, PersistMode, SimMode};

#[test]
fn clean_close_reopens_from_the_snapshot_and_a_later_crash_scans() {
    let o = common::opts();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    let s = common::create(&path, PersistMode::Adr, SimMode::Shadow, &o);
    let mut model = common::churn(&s, 2_000);
    s.close().unwrap();
    let (s, _, c) = common::open(&path, SimMode::Shadow, &o);
    assert_eq!(common::counter(&c, "from_snapshot"), 1, "{c:?}");
    assert_eq!(common::counter(&c, "snapshot_keys"), model.len() as u64);
    common::verify(&s, &model, "after a snapshot open");
    for k in 1..=500 {
        s.upsert(k, 7).unwrap();
        model.insert(k, 7);
    }
    let pool = s.pool().clone();
    pool.crash(CrashOptions::STRICT).unwrap();
    drop(s);
    drop(pool);
    let (s, _, c) = common::open(&path, SimMode::Shadow, &o);
    assert_eq!(common::counter(&c, "from_snapshot"), 0, "a stale snapshot was used: {c:?}");
    common::verify(&s, &model, "after a crash that followed a snapshot open");
}

#[test]
fn crash_during_the_shutdown_snapshot() {
    let o = common::opts();
    let mut modes = [0u64; 2];
    for fences in (1..40).chain([60, 100, 200]) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store");
        let s = common::create(&path, PersistMode::Adr, SimMode::Shadow, &o);
        let model: BTreeMap<u64, u64> = common::churn(&s, 1_500);
        let pool = s.pool().clone();
        pool.crash_after_fences(fences, CrashOptions::random(fences)).unwrap();
        let closed = s.close();
        drop(pool);
        let (s, _, c) = common::open(&path, SimMode::Shadow, &o);
        modes[common::counter(&c, "from_snapshot") as usize] += 1;
        if closed.is_err() {
            assert_eq!(common::counter(&c, "from_snapshot"), 0, "{c:?}");
        }
        common::verify(&s, &model, &format!("crash after {fences} fences of close()"));
        s.close().unwrap();
    }
    assert!(modes[0] > 0 && modes[1] > 0, "crashes never/always interrupted the close: {modes:?}");
}

#[test]
fn recovery_threads_agree() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    let o = common::opts();
    let s = common::create(&path, PersistMode::Eadr, SimMode::Direct, &o);
    let model = common::churn(&s, 3_000);
    drop(s); // unclean
    for threads in [1, 2, 4] {
        let o = numakv_nstore::NStoreOptions { recovery_threads: threads, ..common::opts() };
        let (s, _, c) = common::open(&path, SimMode::Direct, &o);
        assert_eq!(common::counter(&c, "recovery_threads"), threads as u64);
        assert_eq!(common::counter(&c, "keys_recovered"), model.len() as u64);
        common::verify(&s, &model, &format!("{threads} recovery threads"));
        drop(s);
    }
}

/// Background GC ran and retired files whose grace period had not passed at close (a pinned
/// reader held it): close frees them before the snapshot, so the next open uses the snapshot
/// instead of finding extra files and scanning the log.
#[test]
fn close_with_background_gc_reopens_from_the_snapshot() {
    let o = numakv_nstore::NStoreOptions {
        gc_threads_per_node: 1,
        gc_threshold: 0.3,
        gc_interval: std::time::Duration::from_millis(1),
        ..common::opts()
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    let s = common::create(&path, PersistMode::Adr, SimMode::Shadow, &o);
    // Hold the epoch: no file retired from now on reaches its grace period before close.
    let pinned = numakv_pmem::alloc::epoch::pin();
    let model = common::churn(&s, 3_000);
    let t0 = std::time::Instant::now();
    while s.stats().counter("gc_files_reclaimed").unwrap_or(0) < 2 {
        assert!(t0.elapsed().as_secs() < 20, "background GC reclaimed nothing");
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    s.close().unwrap();
    drop(pinned);
    let (s, _, c) = common::open(&path, SimMode::Shadow, &o);
    assert_eq!(common::counter(&c, "from_snapshot"), 1, "the open scanned the log: {c:?}");
    common::verify(&s, &model, "after a close with background GC");
}
