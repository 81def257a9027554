//! The background GC threads reclaim space on their own: after two keys in three are
//! overwritten, a threshold below the garbage share leaves the engine holding less PM than a
//! threshold above it (which reclaims nothing), with every value intact.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use numakv_index::Index;
use numakv_nstore::NStoreOptions;
use numakv_pmem::{PersistMode, SimMode};

fn run(threshold: f64) -> (u64, u64) {
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
    // Let GC settle: until the reclaimed count stops moving for a while (at most 10 s), driving
    // the epoch from here too so that deferred frees run.
    let mut last = (u64::MAX, Instant::now());
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(10) && last.1.elapsed() < Duration::from_millis(300) {
        numakv_pmem::alloc::epoch::pin().flush();
        let files = s.stats().counter("gc_files_reclaimed").unwrap_or(0);
        if files != last.0 {
            last = (files, Instant::now());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let after = s.stats();
    common::verify(&s, &model, &format!("threshold {threshold}"));
    (after.pm_bytes(), after.counter("gc_files_reclaimed").unwrap_or(0))
}

#[test]
fn background_gc_reclaims_only_past_the_threshold() {
    let (kept, none) = run(0.9);
    assert_eq!(none, 0, "threshold 0.9 reclaimed files at a 1/3 garbage share");
    let (reclaimed, files) = run(0.3);
    assert!(
        files > 0 && reclaimed < kept,
        "threshold 0.3: {files} files, {reclaimed} vs {kept} bytes"
    );
}
