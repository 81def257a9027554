//! The upper layer at work: subindex root splits go into every replica, full leaves send them
//! to the temporary list, the walk along the root list triggers rebuilds, and the structure
//! (every replica identical, every top-level node named) checks throughout; every thread reads
//! its own node's replica, so the upper layer adds no remote PM reads.

mod common;

use common::{quiet, vk, volatile, Rng};
use numakv_index::Index;
use numakv_nobtree::NobtreeOptions;
use numakv_pmem::account;
use numakv_pmem::alloc::nsm::NsmMode;

fn counter(t: &numakv_nobtree::Nobtree, name: &str) -> u64 {
    t.stats().counter(name).unwrap_or_else(|| panic!("no counter {name}"))
}

#[test]
fn random_inserts_fill_and_rebuild() {
    let opts = NobtreeOptions { rebuild_threshold: 0.05, rebuild_min_ops: 200, ..quiet() };
    let t = volatile(&opts);
    let mut rng = Rng(0x1234);
    let mut keys = Vec::new();
    for _ in 0..40_000 {
        let k = 1 + rng.below(1 << 40);
        if t.insert(k, vk(k)).unwrap() {
            keys.push(k);
        }
    }
    t.drain_rebuilds();
    assert!(counter(&t, "subindex_splits") > 100);
    assert!(counter(&t, "upper_insert_failed") > 0, "no upper leaf ever filled");
    assert!(counter(&t, "upper_rebuilds") > 0, "the walk never triggered a rebuild");
    assert!(
        counter(&t, "upper_rebuild_requests") >= counter(&t, "upper_rebuilds"),
        "rebuilds ran without the background thread taking a request"
    );
    let r = t.check().unwrap();
    assert_eq!(r.entries, keys.len() as u64);
    for &k in keys.iter().step_by(7) {
        assert_eq!(t.get(k).unwrap(), Some(vk(k)));
    }
    // A forced rebuild empties the temporary list and keeps everything reachable.
    t.rebuild_upper().unwrap();
    assert_eq!(counter(&t, "upper_temp_list"), 0);
    t.check().unwrap();
}

#[test]
fn sequential_inserts_every_height() {
    for height in 1..=4 {
        let t = volatile(&NobtreeOptions { height, ..quiet() });
        for k in 1..=5000u64 {
            assert!(t.insert(k, vk(k)).unwrap());
        }
        for k in (1..=5000u64).rev().step_by(3) {
            assert!(t.remove(k).unwrap());
        }
        // Sparse leaves merge (log-free, through the shadow sibling pointer).
        for k in (1..=4000u64).filter(|k| k % 5 != 0 && (5000 - k) % 3 != 0) {
            assert!(t.remove(k).unwrap(), "height {height}: remove {k}");
        }
        if height > 1 {
            assert!(counter(&t, "merges") > 0, "height {height}: no merge");
        }
        t.check().unwrap_or_else(|e| panic!("height {height}: {e}"));
        let mut out = Vec::new();
        t.scan(1, usize::MAX, &mut out).unwrap();
        let want: Vec<u64> =
            (1..=5000u64).filter(|k| (5000 - k) % 3 != 0 && (*k > 4000 || k % 5 == 0)).collect();
        assert_eq!(out.iter().map(|e| e.0).collect::<Vec<_>>(), want, "height {height}");
    }
}

#[test]
fn upper_layer_reads_are_local() {
    if !account::COMPILED {
        return;
    }
    // Bottom nodes all on node `n` and the thread on node `n`: every remote line a lookup
    // could read would be the upper layer's — there must be none, on either node.
    for n in 0..2 {
        let t = volatile(&NobtreeOptions { nsm_mode: NsmMode::Node(n), ..quiet() });
        numakv_pmem::numa::set_current_node(n);
        for k in 1..=20_000u64 {
            t.insert(k * 7, k).unwrap();
        }
        account::set_enabled(true);
        let before = account::thread_stats();
        for k in 1..=2000u64 {
            assert_eq!(t.get(k * 7).unwrap(), Some(k));
            account::op_end();
        }
        let d = account::thread_stats().since(&before);
        account::set_enabled(false);
        numakv_pmem::numa::set_current_node(0);
        assert!(d.reads_local > 2000, "{d:?}");
        assert_eq!(d.reads_remote, 0, "node {n}: lookups read remote lines: {d:?}");
    }
}

#[test]
fn background_rebuild_keeps_readers_right() {
    // Inserting threads only request rebuilds; the rebuild thread swaps replicas while other
    // threads keep reading keys inserted before: every read must find its key throughout.
    use std::sync::atomic::{AtomicBool, Ordering};
    let opts =
        NobtreeOptions { height: 1, rebuild_threshold: 0.02, rebuild_min_ops: 100, ..quiet() };
    let t = volatile(&opts);
    let base: Vec<u64> = (1..=3000u64).map(|k| k * 1_000_003).collect();
    for &k in &base {
        t.insert(k, vk(k)).unwrap();
    }
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        for r in 0..2usize {
            let (t, base, stop) = (&t, &base, &stop);
            s.spawn(move || {
                numakv_pmem::numa::set_current_node(r);
                let mut i = r;
                while !stop.load(Ordering::Relaxed) {
                    let k = base[i % base.len()];
                    assert_eq!(t.get(k).unwrap(), Some(vk(k)), "key {k} lost during a rebuild");
                    i += 7;
                }
            });
        }
        let mut rng = Rng(0x77);
        for _ in 0..30_000 {
            let k = 1 + rng.below(1 << 40);
            let _ = t.insert(k, vk(k)).unwrap();
        }
        stop.store(true, Ordering::Relaxed);
    });
    t.drain_rebuilds();
    assert!(counter(&t, "upper_rebuilds") > 0, "no rebuild ran");
    assert!(counter(&t, "upper_rebuild_requests") > 0, "the rebuild thread took no request");
    t.check().unwrap();

    // Inline mode: the same workload rebuilds on the inserting thread, no requests.
    let t = volatile(&NobtreeOptions { background_rebuild: false, ..opts });
    let mut rng = Rng(0x77);
    for _ in 0..30_000 {
        let k = 1 + rng.below(1 << 40);
        let _ = t.insert(k, vk(k)).unwrap();
    }
    assert!(counter(&t, "upper_rebuilds") > 0, "no inline rebuild ran");
    assert_eq!(counter(&t, "upper_rebuild_requests"), 0);
    t.check().unwrap();
}
