//! Merges of leaves and of inner nodes below the subindex roots (log-free, through the shadow
//! sibling pointer and the `sib_ver` flip), cascading upwards; the tree checks and holds
//! exactly the remaining keys, at every height threshold that has inner nodes.

mod common;

use common::{quiet, vk, volatile};
use numakv_index::Index;
use numakv_nobtree::NobtreeOptions;

fn counter(t: &numakv_nobtree::Nobtree, name: &str) -> u64 {
    t.stats().counter(name).unwrap_or_else(|| panic!("no counter {name}"))
}

#[test]
fn inner_nodes_merge_and_cascade() {
    for height in [3u32, 4] {
        let t = volatile(&NobtreeOptions { height, ..quiet() });
        let n = 6000u64;
        for k in 1..=n {
            assert!(t.insert(k, vk(k)).unwrap());
        }
        let mut left: Vec<u64> = Vec::new();
        for k in 1..=n {
            if k % 23 == 0 {
                left.push(k);
            } else {
                assert!(t.remove(k).unwrap(), "height {height}: remove {k}");
            }
        }
        assert!(counter(&t, "merges") > 0, "height {height}: no merge");
        assert!(counter(&t, "inner_merges") > 0, "height {height}: no inner node merged");
        let r = t.check().unwrap_or_else(|e| panic!("height {height}: {e}"));
        assert_eq!(r.entries, left.len() as u64);
        let mut out = Vec::new();
        t.scan(1, usize::MAX, &mut out).unwrap();
        assert_eq!(out.iter().map(|e| e.0).collect::<Vec<_>>(), left, "height {height}");
        for &k in &left {
            assert_eq!(t.get(k).unwrap(), Some(vk(k)));
        }
        // The merged tree keeps working: refill, split again, check.
        for k in 1..=n {
            t.upsert(k, k).unwrap();
        }
        t.check().unwrap();
        assert_eq!(t.get(n / 2).unwrap(), Some(n / 2));
    }
}

#[test]
fn concurrent_deletes_with_inner_merges() {
    let t = volatile(&NobtreeOptions { height: 3, ..quiet() });
    let n = 20_000u64;
    for k in 1..=n {
        t.insert(k, vk(k)).unwrap();
    }
    std::thread::scope(|s| {
        for th in 0..4u64 {
            let t = &t;
            s.spawn(move || {
                numakv_pmem::numa::set_current_node((th % 2) as usize);
                for k in (1..=n).filter(|k| k % 4 == th && k % 31 != 0) {
                    assert!(t.remove(k).unwrap());
                }
            });
        }
        // A reader checks the keys that stay, throughout.
        let t = &t;
        s.spawn(move || {
            for _ in 0..3 {
                for k in (31..=n).step_by(31) {
                    assert_eq!(t.get(k).unwrap(), Some(vk(k)), "kept key {k} lost");
                }
            }
        });
    });
    assert!(counter(&t, "inner_merges") > 0, "no inner node merged");
    let r = t.check().unwrap();
    assert_eq!(r.entries, n / 31);
}
