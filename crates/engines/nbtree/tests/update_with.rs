//! `Index::update_with` on NBTree: one descent, the write into the leaf the read found (and on
//! through SMOs when that leaf is sealed meanwhile).

use numakv_index::testkit::scenario::check_update_with_semantics;
use numakv_index::{Engine, Index};
use numakv_nbtree::{NbTree, NbTreeOptions, Variant};
use numakv_pmem::{Pool, PoolConfig};

fn tree(slots: usize, variant: Variant) -> NbTree {
    let pool = Pool::volatile(PoolConfig::new(NbTree::engine_id(), 64 << 20)).expect("pool");
    NbTree::create(pool, &NbTreeOptions { leaf_slots: slots, variant, ..Default::default() })
        .expect("create")
}

#[test]
fn replaces_present_keys_only_and_keeps_the_value_on_error() {
    for variant in [Variant::LockFree, Variant::W, Variant::WR] {
        check_update_with_semantics(&tree(7, variant));
    }
}

/// Each thread increments its own counter keys through `update_with` (writers of one key
/// serialised by ownership, as the byte-string layer serialises them) while every thread
/// inserts and deletes keys around them in tiny leaves: the counters' leaves split and merge
/// under the increments (sealed slots, copies, sync-on-write), and no increment is lost. `f`
/// runs exactly once per call.
#[test]
fn increments_across_smos_are_not_lost() {
    for variant in [Variant::LockFree, Variant::W] {
        let t = tree(3, variant);
        let counters: Vec<u64> = (0..3u64).map(|w| 1_000 + w * 1_000).collect();
        for &c in &counters {
            t.upsert(c, 0).expect("upsert");
        }
        let per = 6_000u64;
        std::thread::scope(|s| {
            for w in 0..3u64 {
                let (t, counters) = (&t, &counters);
                s.spawn(move || {
                    for i in 0..per {
                        let c = counters[(i % 3) as usize];
                        // Counter `c` is written by thread `w` only when `c`'s owner is `w`.
                        if c == counters[w as usize] {
                            let mut calls = 0;
                            let old = t
                                .update_with(c, &mut |v| {
                                    calls += 1;
                                    Ok(Some(v + 1))
                                })
                                .expect("update_with");
                            assert!(old.is_some());
                            assert_eq!(calls, 1, "f runs once per call");
                        }
                        // Neighbours of every counter come and go: SMOs of their leaves.
                        let k = c - 400 + (i * 7 + w * 131) % 800;
                        if !counters.contains(&k) {
                            if i % 3 == 2 {
                                t.remove(k).expect("remove");
                            } else {
                                t.upsert(k, i).expect("upsert");
                            }
                        }
                    }
                });
            }
        });
        for &c in &counters {
            assert_eq!(t.get(c).expect("get"), Some(per / 3), "{variant:?}");
        }
        let smos = t.stats().counters.iter().find(|(n, _)| *n == "smos").map(|c| c.1);
        assert!(smos.unwrap_or(0) > 100, "the counters' leaves went through SMOs: {smos:?}");
        t.check().expect("check");
    }
}
