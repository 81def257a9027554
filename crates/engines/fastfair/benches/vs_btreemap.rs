//! Single-thread point operations: FAST&FAIR (ADR and eADR, a pool in /dev/shm, accounting off)
//! side by side with `RwLock<BTreeMap>` in DRAM, in one run, so the ratio shows the cost of
//! persistence and of the PM layout. Read the ratios, not the absolute times (shared machine).
//!
//! `cargo bench -p numakv-fastfair --bench vs_btreemap`

use std::collections::BTreeMap;
use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use numakv_fastfair::{FastFair, FastFairOptions};
use numakv_index::{Engine, Index};
use numakv_pmem::{PersistMode, Pool, PoolConfig};
use parking_lot::RwLock;

/// Keys preloaded before the measured operations.
const PRELOAD: u64 = 1 << 20;
/// Operations per measured batch.
const BATCH: u64 = 10_000;

fn scramble(i: u64) -> u64 {
    // A bijection on u64 (odd multiplier), shifted away from the reserved keys.
    i.wrapping_mul(0x9E37_79B9_7F4A_7C15) % (u64::MAX - 2) + 1
}

/// `RwLock<BTreeMap>` behind the same trait, the DRAM peer a user would otherwise pick.
#[derive(Default)]
struct LockedBTree(RwLock<BTreeMap<u64, u64>>);

impl LockedBTree {
    fn insert(&self, k: u64, v: u64) -> bool {
        let mut m = self.0.write();
        if m.contains_key(&k) {
            return false;
        }
        m.insert(k, v);
        true
    }
    fn get(&self, k: u64) -> Option<u64> {
        self.0.read().get(&k).copied()
    }
}

fn fastfair(mode: PersistMode) -> (tempfile::TempDir, FastFair) {
    let dir =
        tempfile::Builder::new().tempdir_in("/dev/shm").or_else(|_| tempfile::tempdir()).unwrap();
    let mut cfg = PoolConfig::new(FastFair::engine_id(), 2 << 30);
    cfg.mode = mode;
    let pool = Pool::create(&dir.path().join("store"), cfg).unwrap();
    let tree = FastFair::create(pool, &FastFairOptions::default()).unwrap();
    for i in 0..PRELOAD {
        tree.insert(scramble(i), i).unwrap();
    }
    (dir, tree)
}

fn point_ops(c: &mut Criterion) {
    numakv_pmem::account::set_enabled(false);
    let adr = fastfair(PersistMode::Adr);
    let eadr = fastfair(PersistMode::Eadr);
    let btree = LockedBTree::default();
    for i in 0..PRELOAD {
        btree.insert(scramble(i), i);
    }

    let mut g = c.benchmark_group("get_1M");
    g.throughput(Throughput::Elements(BATCH));
    let keys =
        |round: u64| (0..BATCH).map(move |i| scramble((round * 7919 + i * 104_729) % PRELOAD));
    g.bench_function("fastfair_adr", |b| {
        b.iter(|| {
            keys(1).for_each(|k| {
                black_box(adr.1.get(k).unwrap());
            })
        })
    });
    g.bench_function("fastfair_eadr", |b| {
        b.iter(|| {
            keys(1).for_each(|k| {
                black_box(eadr.1.get(k).unwrap());
            })
        })
    });
    g.bench_function("rwlock_btreemap", |b| {
        b.iter(|| {
            keys(1).for_each(|k| {
                black_box(btree.get(k));
            })
        })
    });
    g.finish();

    // Inserts of fresh keys (each batch new ones, then removed again so the size stays ~1M).
    let mut g = c.benchmark_group("insert_1M");
    g.throughput(Throughput::Elements(BATCH));
    let mut next = PRELOAD;
    let mut fresh = move || {
        let start = next;
        next += BATCH;
        (start..start + BATCH).map(scramble).collect::<Vec<u64>>()
    };
    for (name, tree) in [("fastfair_adr", &adr.1), ("fastfair_eadr", &eadr.1)] {
        g.bench_function(name, |b| {
            b.iter_batched(
                &mut fresh,
                |ks| {
                    for &k in &ks {
                        tree.insert(k, k).unwrap();
                    }
                    ks
                },
                BatchSize::PerIteration,
            )
        });
    }
    g.bench_function("rwlock_btreemap", |b| {
        b.iter_batched(
            &mut fresh,
            |ks| {
                for &k in &ks {
                    btree.insert(k, k);
                }
                ks
            },
            BatchSize::PerIteration,
        )
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).warm_up_time(std::time::Duration::from_secs(1)).measurement_time(std::time::Duration::from_secs(4));
    targets = point_ops
}
criterion_main!(benches);
