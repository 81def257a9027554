//! SMOs constantly in flight: 2- and 3-slot leaves over a small key range, so nearly every
//! insert splits or compacts a leaf, while other threads insert, upsert, update, delete, get and
//! scan the same leaves. Every result must fit a per-key linearization
//! (`numakv_index::testkit::linearize`), `check()` must pass afterwards, and the run must have
//! exercised the SMO machinery (SMOs, sync-on-write or sync-on-read, cooperative help).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};

use numakv_index::testkit::linearize::{check_history, Event, Op, Outcome};
use numakv_index::{Engine, Index};
use numakv_nbtree::{NbTree, NbTreeOptions, Variant};
use numakv_pmem::{PersistMode, Pool, PoolConfig};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const THREADS: usize = 4;
/// Operations per thread and run, times `NUMAKV_TEST_SCALE` (e.g. 50 for a long soak).
const OPS: usize = 4_000;

fn run(slots: usize, keys: u64, variant: Variant, mode: PersistMode, seed: u64) {
    run_shape(slots, keys, variant, false, mode, seed)
}

fn run_shape(
    slots: usize,
    keys: u64,
    variant: Variant,
    coupled: bool,
    mode: PersistMode,
    seed: u64,
) {
    let mut cfg = PoolConfig::new(NbTree::engine_id(), 64 << 20);
    cfg.mode = mode;
    let pool = Pool::volatile(cfg).unwrap();
    let opts = NbTreeOptions {
        leaf_slots: slots,
        variant,
        coupled,
        smo_yield: true,
        ..Default::default()
    };
    let t = Arc::new(NbTree::create(pool, &opts).unwrap());
    let tick = Arc::new(AtomicU64::new(0));
    let start = Arc::new(Barrier::new(THREADS));
    let handles: Vec<_> = (0..THREADS)
        .map(|th| {
            let t = Arc::clone(&t);
            let tick = Arc::clone(&tick);
            let start = Arc::clone(&start);
            std::thread::spawn(move || {
                start.wait();
                let mut rng = SmallRng::seed_from_u64(seed ^ ((th as u64 + 1) * 0x9E37));
                let ops = numakv_index::testkit::scenario::scaled(OPS);
                let mut events = Vec::with_capacity(ops * 2);
                for seq in 0..ops as u64 {
                    let k = rng.gen_range(1..=keys);
                    // Unique values; every other one with both reserved high bits set.
                    let hi = if seq % 2 == 0 { 0xC000_0000_0000_0000 } else { 0 };
                    let v = hi | ((th as u64) << 40) | seq;
                    let inv = tick.fetch_add(1, Ordering::SeqCst);
                    let (op, out) = match rng.gen_range(0..12) {
                        0..=3 => (Op::Insert(v), Outcome::Bool(t.insert(k, v).unwrap())),
                        4 => {
                            t.upsert(k, v).unwrap();
                            (Op::Upsert(v), Outcome::Unit)
                        }
                        5..=6 => (Op::Update(v), Outcome::Bool(t.update(k, v).unwrap())),
                        7..=8 => (Op::Remove, Outcome::Bool(t.remove(k).unwrap())),
                        9..=10 => (Op::Get, Outcome::Value(t.get(k).unwrap())),
                        _ => {
                            let mut out = Vec::new();
                            let max = rng.gen_range(1..8);
                            t.scan(k, max, &mut out).unwrap();
                            let resp = tick.fetch_add(1, Ordering::SeqCst);
                            assert!(out.windows(2).all(|w| w[0].0 < w[1].0), "scan order {out:?}");
                            let end = if out.len() == max { out.last().unwrap().0 } else { keys };
                            let seen: BTreeMap<u64, u64> = out.iter().copied().collect();
                            for key in k..=end {
                                let o = Outcome::Value(seen.get(&key).copied());
                                events.push((key, Event::new(th, Op::Observe, o, inv, resp)));
                            }
                            continue;
                        }
                    };
                    let resp = tick.fetch_add(1, Ordering::SeqCst);
                    events.push((k, Event::new(th, op, out, inv, resp)));
                }
                events
            })
        })
        .collect();
    let mut events = Vec::new();
    for h in handles {
        events.extend(h.join().unwrap());
    }
    let mut fin = BTreeMap::new();
    for k in 1..=keys {
        if let Some(v) = t.get(k).unwrap() {
            fin.insert(k, v);
        }
    }
    check_history(&BTreeMap::new(), events, &fin, 1..=keys)
        .unwrap_or_else(|e| panic!("slots {slots} {variant:?} {mode} seed {seed}: {e}"));
    t.check().unwrap();
    let mut out = Vec::new();
    t.scan(1, usize::MAX, &mut out).unwrap();
    assert_eq!(out, fin.into_iter().collect::<Vec<_>>());
    let s = t.stats();
    let c = |n| s.counter(n).unwrap();
    assert!(c("smos") > 100, "too few SMOs: {:?}", s.counters);
    assert!(c("sync_on_write") + c("sync_on_read") + c("smo_helps") > 0, "{:?}", s.counters);
    if keys > 64 {
        assert!(c("inner_splits") > 0, "{:?}", s.counters);
    }
    eprintln!("slots {slots} {variant:?} {mode}: {:?}", s.counters);
}

fn seed() -> u64 {
    std::env::var("NUMAKV_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(rand::random)
}

#[test]
fn smo_stress_tiny_leaves_eadr() {
    let s = seed();
    run(2, 32, Variant::LockFree, PersistMode::Eadr, s);
    run(3, 32, Variant::LockFree, PersistMode::Eadr, s);
}

#[test]
fn smo_stress_tiny_leaves_adr() {
    run(3, 32, Variant::LockFree, PersistMode::Adr, seed());
}

#[test]
fn smo_stress_variants() {
    let s = seed();
    run(3, 32, Variant::W, PersistMode::Eadr, s);
    run(3, 32, Variant::WR, PersistMode::Eadr, s);
}

#[test]
fn smo_stress_inner_splits() {
    // Enough 2-slot leaves for inner nodes (64 separators) and the root to split under load.
    run(2, 1_500, Variant::LockFree, PersistMode::Eadr, seed());
}

#[test]
fn smo_stress_coupled() {
    run_shape(3, 32, Variant::LockFree, true, PersistMode::Eadr, seed());
}
