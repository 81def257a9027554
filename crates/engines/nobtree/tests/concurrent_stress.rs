//! Four threads on two NUMA nodes on one shared key space: inserts, upserts, removes, gets and
//! scans while leaves split and merge, subindex roots split into the upper replicas, the upper
//! layer rebuilds on its thread (low threshold) and the coordinator migrates hot nodes (low hot
//! threshold); at height 3 also inner merges and inner-node and root migrations.
//! Exact oracle ([`common::Owner`]): each thread owns the keys `≡ th (mod 4)`, interleaved with
//! the others' (so they share every leaf), writes versioned values and checks every result
//! against its own model — a lost insert, update or delete during a split, merge or migration
//! fails the next read of that key; the final tree equals the union of the models.

mod common;

use std::sync::Arc;

use common::{check_owners, scaled, volatile, Owner, Rng};
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
    let owners: Vec<Owner> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..4u64)
            .map(|th| {
                let t = Arc::clone(&t);
                s.spawn(move || {
                    numakv_pmem::numa::set_current_node((th % 2) as usize);
                    let mut o = Owner::new(th, 4);
                    let mut rng = Rng(0xfeed + th);
                    let mut out = Vec::new();
                    for i in 0..scaled(50_000) as u64 {
                        // Half the time a per-thread hot range (migration candidates).
                        let k = if i % 2 == 0 {
                            1 + th * 2000 + rng.below(800)
                        } else {
                            1 + rng.below(SPACE)
                        };
                        o.random_op(&*t, &mut rng, k, &mut out);
                    }
                    o
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let owners: Vec<Owner> = if height > 2 {
        // Thin everything out concurrently: leaf merges cascade into inner merges.
        std::thread::scope(|s| {
            let hs: Vec<_> = owners
                .into_iter()
                .map(|mut o| {
                    let t = Arc::clone(&t);
                    s.spawn(move || {
                        numakv_pmem::numa::set_current_node((o.th % 2) as usize);
                        let keys: Vec<u64> =
                            o.model.keys().copied().filter(|k| k % 17 != 0).collect();
                        for k in keys {
                            o.remove(&*t, k);
                        }
                        o
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        })
    } else {
        owners
    };
    t.drain_migrations();
    t.drain_rebuilds();
    check_owners(&t, &owners);
    let st = t.stats();
    eprintln!("{:?}", st.counters);
    for &c in want {
        assert!(st.counter(c).unwrap() > 0, "no {c}: {:?}", st.counters);
    }
}
