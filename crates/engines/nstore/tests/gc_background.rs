//! The background GC threads reclaim space on their own: after most keys are overwritten, the
//! PM the engine holds shrinks below what the load took, with every value intact; with a
//! threshold above the garbage share, nothing is reclaimed.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use numakv_index::Index;
use numakv_nstore::NStoreOptions;
use numakv_pmem::{PersistMode, SimMode};

fn run(threshold: f64) -> (u64, u64, u64) {
    let o = NStoreOptions {
        gc_threads_per_node: 1,
        gc_threshold: threshold,
        gc_interval: Duration::from_millis(5),
        ..common::opts()
    };
    let dir = tempfile::tempdir().unwrap();
    let s = common::create(dir.path(), PersistMode::Eadr, SimMode::Direct, &o);
    let n = 20_000u64;
    let mut model = BTreeMap::new();
    for k in 1..=n {
        numakv_numa::set_current_node((k % 2) as usize);
        s.insert(k, k).unwrap();
        model.insert(k, k);
    }
    // Two keys in three, spread over every file of both nodes (keys were loaded in order, odd
    // keys on node 1).
    for k in (1..=n).filter(|k| k % 3 != 0) {
        numakv_numa::set_current_node((k % 2) as usize);
        s.update(k, k + 1).unwrap();
        model.insert(k, k + 1);
    }
    numakv_numa::set_current_node(0);
    let peak = s.stats().pm_bytes();
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(5) {
        if s.stats().counter("gc_files_reclaimed").unwrap_or(0) > 0 && threshold < 0.5 {
            std::thread::sleep(Duration::from_millis(200));
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let after = s.stats();
    common::verify(&s, &model, &format!("threshold {threshold}"));
    (peak, after.pm_bytes(), after.counter("gc_files_reclaimed").unwrap_or(0))
}

#[test]
fn background_gc_reclaims_only_past_the_threshold() {
    let (peak, after, files) = run(0.3);
    assert!(files > 0 && after < peak, "threshold 0.3: {files} files, {peak} → {after} bytes");
    let (peak, after, files) = run(0.9);
    assert!(files == 0 && after == peak, "threshold 0.9: {files} files, {peak} → {after} bytes");
}
