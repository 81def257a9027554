//! Four threads on two NUMA nodes on one shared key space: inserts, upserts, removes, gets and
//! scans while leaves split and merge, subindex roots split into the upper replicas, the upper
//! layer rebuilds on its thread (low threshold) and the coordinator migrates hot nodes (low hot
//! threshold); at height 3 also inner merges and inner-node and root migrations.
//! Every value read names its key, scans ascend strictly, and the final tree checks and agrees
//! with point reads.

mod common;

use std::sync::Arc;

use common::{check_values_name_keys, scaled, vk, volatile, Rng};
use numakv_index::Index;
use numakv_nobtree::{MigrationOptions, NobtreeOptions};

#[test]
fn mixed_ops_shared_keys_with_smos_rebuilds_and_migrations() {
    stress(2, &["splits", "merges", "subindex_splits"]);
}

/// Height 3: inner nodes merge and inner nodes and subindex roots migrate while the rest runs
/// (a bulk delete phase at the end thins the inner level).
#[test]
fn height3_inner_merges_and_inner_migrations_under_load() {
    stress(3, &["splits", "merges", "inner_merges", "subindex_splits", "migrations"]);
}

fn stress(height: u32, want: &[&str]) {
    let opts = NobtreeOptions {
        height,
        rebuild_threshold: 0.02,
        rebuild_min_ops: 100,
        migration: MigrationOptions { sample_every: 3, hot_threshold: 3, ..Default::default() },
        ..Default::default()
    };
    let t = Arc::new(volatile(&opts));
    const SPACE: u64 = 30_000;
    std::thread::scope(|s| {
        for th in 0..4u64 {
            let t = Arc::clone(&t);
            s.spawn(move || {
                numakv_pmem::numa::set_current_node((th % 2) as usize);
                let mut rng = Rng(0xfeed + th);
                let mut out = Vec::new();
                for i in 0..scaled(50_000) as u64 {
                    // Half the time a thread-local hot range (migration candidates).
                    let k = if i % 2 == 0 {
                        1 + th * 500 + rng.below(200)
                    } else {
                        1 + rng.below(SPACE)
                    };
                    match rng.below(12) {
                        0..=2 => {
                            t.insert(k, vk(k)).unwrap();
                        }
                        3 => t.upsert(k, vk(k)).unwrap(),
                        4..=5 => {
                            t.remove(k).unwrap();
                        }
                        6 => {
                            out.clear();
                            t.scan(k, 30, &mut out).unwrap();
                            for w in out.windows(2) {
                                assert!(w[0].0 < w[1].0, "scan order {w:?}");
                            }
                            for &(kk, v) in &out {
                                assert!(kk >= k);
                                assert_eq!(v, vk(kk), "scan value of {kk}");
                            }
                        }
                        _ => {
                            if let Some(v) = t.get(k).unwrap() {
                                assert_eq!(v, vk(k), "get {k}");
                            }
                        }
                    }
                }
            });
        }
    });
    if height > 2 {
        // Thin everything out concurrently: leaf merges cascade into inner merges.
        std::thread::scope(|s| {
            for th in 0..4u64 {
                let t = Arc::clone(&t);
                s.spawn(move || {
                    numakv_pmem::numa::set_current_node((th % 2) as usize);
                    for k in (1..=SPACE).filter(|k| k % 4 == th && k % 17 != 0) {
                        t.remove(k).unwrap();
                    }
                });
            }
        });
    }
    t.drain_migrations();
    t.drain_rebuilds();
    for (k, v) in check_values_name_keys(&t) {
        assert_eq!(t.get(k).unwrap(), Some(v));
    }
    let st = t.stats();
    eprintln!("{:?}", st.counters);
    for &c in want {
        assert!(st.counter(c).unwrap() > 0, "no {c}: {:?}", st.counters);
    }
}
