//! The crash oracle with hot sets that move (issue 36): ADR shadow crash rounds (strict and
//! random eviction) while a writer applies random operations on 200 keys, the background
//! thread follows the moving top 8 and a side thread switches to random key sets. After
//! recovery the contents equal the model (the operation cut by the crash wholly applied or
//! absent), `check()` passes with no leak, and the store keeps working. Coverage at scale 1,
//! from Nap's counters before each crash: at least 3 switches with a previous NAL installed,
//! summed over the rounds.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use common::moving_options;
use numakv_fastfair::FastFair;
use numakv_index::testkit::scenario::{keep_working, random_op, run_to_crash, verify, Rng};
use numakv_index::{Engine, Index};
use numakv_nap::Nap;
use numakv_pmem::crash::test_scale;
use numakv_pmem::{CrashOptions, OpenConfig, PersistMode, Pool, PoolConfig, SimMode};

type N = Nap<FastFair>;

const KEYS: u64 = 200;

/// One round crashing at the `fence`-th fence: the switches with a previous NAL before the
/// crash, or `None` when the ops finished first.
fn round(fence: u64, copts: CrashOptions, seed: u64) -> Option<u64> {
    let d = tempfile::tempdir().unwrap();
    let mut cfg = PoolConfig::new(N::engine_id(), 32 << 20);
    cfg.nodes = 2;
    cfg.mode = PersistMode::Adr;
    cfg.sim = SimMode::Shadow;
    let opts = moving_options();
    let e = N::create(Pool::create(d.path(), cfg).unwrap(), &opts).unwrap();
    let mut model = BTreeMap::new();
    for k in (1..=KEYS).step_by(2) {
        e.insert(k, k).unwrap();
        model.insert(k, k);
    }
    let pool = Arc::clone(e.pool());
    let mut rng = Rng(seed | 1);
    let ops: Vec<_> = (0..20_000).map(|_| random_op(&mut rng, KEYS, 6)).collect();
    let stop = AtomicBool::new(false);
    let pending = std::thread::scope(|s| {
        let (e, stop) = (&e, &stop);
        s.spawn(move || {
            numakv_pmem::numa::set_current_node(1);
            let mut rng = Rng(seed.rotate_left(23) | 1);
            // ORDERING: Acquire; pairs with the Release after the writer's phase.
            while !stop.load(Ordering::Acquire) {
                let n = rng.below(17);
                let set: Vec<u64> = (0..n).map(|_| rng.below(KEYS) + 1).collect();
                // After the crash a switch may fail or do nothing durable; either is fine.
                let _ = e.switch_to(&set);
            }
        });
        let p = run_to_crash(e, &pool, fence, copts, &mut model, ops.iter().copied());
        stop.store(true, Ordering::Release);
        p
    });
    let with_pre =
        e.stats().counters.iter().find(|c| c.0 == "nap_switches_with_previous").unwrap().1;
    if !pool.has_crashed() {
        return None;
    }
    drop(e);
    drop(pool);
    let mut oc = OpenConfig::new(N::engine_id());
    oc.sim = SimMode::Shadow;
    let (e, rep) = N::open(Pool::open(d.path(), oc).unwrap(), &opts).unwrap();
    assert!(!rep.was_clean);
    verify(&e, &model, pending, true);
    keep_working(&e, fence * 7 + 1, 300, KEYS, 6);
    Some(with_pre)
}

#[test]
fn crashes_while_hot_sets_move() {
    let rounds = 3 * test_scale() as u64;
    let (mut crashed, mut with_pre) = (0, 0);
    for i in 0..rounds {
        let fence = 500 + i * 2_500;
        for copts in [CrashOptions::STRICT, CrashOptions::random(i * 31 + 7)] {
            if let Some(w) = round(fence, copts, 0x5eed ^ (i << 8) ^ fence) {
                crashed += 1;
                with_pre += w;
            }
        }
    }
    let line =
        format!("{crashed} crashed rounds, {with_pre} switches with a previous NAL before them");
    eprintln!("{line}");
    assert!(crashed >= rounds, "{line}");
    assert!(with_pre >= 3, "{line}");
}
