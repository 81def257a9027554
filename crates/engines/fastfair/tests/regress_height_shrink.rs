//! Regression (before internal merges: "the tree never loses height"): deleting most keys of a
//! large tree merges internal nodes and shrinks the root, in every deletion order, for small and
//! default nodes; every intermediate tree checks, and a reopened store holds exactly the
//! reachable nodes (the merged-away ones were freed or reclaimed).

mod common;

use std::collections::BTreeMap;

use common::{vk, Rng};
use numakv_fastfair::FastFair;
use numakv_index::{Engine, Index};
use numakv_pmem::{PersistMode, SimMode};

fn counter(t: &FastFair, name: &str) -> u64 {
    t.stats().counter(name).unwrap()
}

fn shuffled(n: u64, seed: u64) -> Vec<u64> {
    let mut keys: Vec<u64> = (1..=n).collect();
    let mut rng = Rng(seed);
    for i in (1..keys.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        keys.swap(i, j);
    }
    keys
}

#[derive(Clone, Copy, Debug)]
enum Order {
    Ascending,
    Descending,
    Random,
}

/// Inserts `n` keys in random order, deletes all but every `keep`-th in `order`, checking the
/// structure along the way; returns the tree and the height it had at its largest.
fn grow_and_shrink(t: &FastFair, n: u64, keep: u64, order: Order) -> (u64, BTreeMap<u64, u64>) {
    let mut model = BTreeMap::new();
    for k in shuffled(n, 7) {
        assert!(t.insert(k, vk(k)).unwrap());
        model.insert(k, vk(k));
    }
    t.check().unwrap();
    let peak = counter(t, "height");
    let mut del: Vec<u64> = (1..=n).filter(|k| k % keep != 0).collect();
    match order {
        Order::Ascending => {}
        Order::Descending => del.reverse(),
        Order::Random => del = shuffled(n, 11).into_iter().filter(|k| k % keep != 0).collect(),
    }
    for (i, &k) in del.iter().enumerate() {
        assert!(t.remove(k).unwrap(), "{order:?}: key {k} missing");
        model.remove(&k);
        if i % 997 == 0 {
            let r = t.check().unwrap();
            assert_eq!(r.entries, model.len() as u64);
        }
    }
    let r = t.check().unwrap();
    assert_eq!(r.entries, model.len() as u64);
    assert_eq!(common::contents(t), model);
    for (k, v) in &model {
        assert_eq!(t.get(*k).unwrap(), Some(*v));
    }
    (peak, model)
}

#[test]
fn deleting_most_keys_shrinks_the_tree() {
    for ns in [256, 512] {
        for order in [Order::Ascending, Order::Descending, Order::Random] {
            let t = common::volatile(ns);
            let n = if ns == 256 { 20_000 } else { 60_000 };
            let (peak, model) = grow_and_shrink(&t, n, 200, order);
            let after = counter(&t, "height");
            assert!(peak >= 4, "{ns}/{order:?}: the tree only grew to height {peak}");
            // 100 (256-byte nodes) or 300 keys (512) fit in two or three levels.
            assert!(
                after < peak && after <= 3,
                "{ns}/{order:?}: height {peak} -> {after} with {} keys left; {:?}",
                model.len(),
                t.stats()
            );
            assert!(counter(&t, "internal_merges") > 0, "{ns}/{order:?}: {:?}", t.stats());
            assert!(counter(&t, "root_shrinks") >= 1, "{ns}/{order:?}: {:?}", t.stats());

            // Deleting the rest leaves a single leaf: every split was undone by a merge.
            for k in model.keys() {
                assert!(t.remove(*k).unwrap());
            }
            let r = t.check().unwrap();
            assert_eq!(r.entries, 0);
            assert_eq!(r.reachable_blocks, 1);
            assert_eq!(counter(&t, "height"), 1, "{ns}/{order:?}: {:?}", t.stats());
            assert_eq!(
                counter(&t, "splits"),
                counter(&t, "merges") + counter(&t, "internal_merges"),
                "{ns}/{order:?}: {:?}",
                t.stats()
            );
            assert_eq!(counter(&t, "root_splits"), counter(&t, "root_shrinks"));
        }
    }
}

/// Grow and shrink repeatedly in one store: the shrunk tree grows again normally, and after a
/// clean close and reopen the allocator holds exactly the reachable nodes.
#[test]
fn grow_shrink_cycles_and_reopen() {
    let d = tempfile::tempdir().unwrap();
    let t = common::create(d.path(), PersistMode::Adr, SimMode::Direct, 256);
    let mut heights = Vec::new();
    for cycle in 0..3u64 {
        let (peak, model) = grow_and_shrink(&t, 6000, 150 + cycle, Order::Random);
        heights.push((peak, counter(&t, "height")));
        for k in model.keys() {
            assert!(t.remove(*k).unwrap());
        }
        assert_eq!(counter(&t, "height"), 1);
    }
    assert!(heights.iter().all(|&(p, a)| p >= 4 && a < p), "{heights:?}");
    // Leave a medium tree behind, shrunk from a larger one.
    let (_, model) = grow_and_shrink(&t, 6000, 40, Order::Random);
    let height = counter(&t, "height");
    t.close().unwrap();
    let (t, rep) = common::reopen(d.path(), SimMode::Direct);
    assert!(rep.was_clean);
    let r = t.check().unwrap();
    assert_eq!(r.reachable_blocks, r.allocated_blocks, "{r:?}");
    assert_eq!(counter(&t, "height"), height);
    assert_eq!(common::contents(&t), model);
}
