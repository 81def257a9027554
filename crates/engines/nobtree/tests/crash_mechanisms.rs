//! The crash oracle with NOBtree's mechanisms running (issue 36): crash rounds in ADR shadow
//! mode (strict and random eviction) while a writer applies random operations, the
//! coordinator migrates on a hair trigger and a side thread migrates random nodes of every
//! level and rebuilds the upper layer. After recovery the contents equal the model (the
//! operation cut by the crash wholly applied or absent), `check()` passes with no leak, and
//! the store keeps working. Coverage at scale 1, from the tree's own counters before each
//! crash: leaf, inner and root migrations and rebuilds, summed over the rounds.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use common::{create, random_op, reopen, run_to_crash, verify, vk, Rng};
use numakv_index::{Engine, Index};
use numakv_nobtree::{MigrationOptions, NobtreeOptions};
use numakv_pmem::crash::test_scale;
use numakv_pmem::{CrashOptions, PersistMode, SimMode};

fn hair_trigger() -> NobtreeOptions {
    NobtreeOptions {
        height: 3,
        rebuild_min_ops: 64,
        rebuild_threshold: 0.05,
        migration: MigrationOptions {
            sample_every: 1,
            hot_threshold: 2,
            remote_share: 0.0,
            cooldown: 0,
            ..Default::default()
        },
        ..Default::default()
    }
}

const KINDS: [&str; 4] = ["migrated_leaves", "migrated_inner", "migrated_roots", "upper_rebuilds"];

/// One round: crash at the `fence`-th fence. Returns the mechanism counters at the crash and
/// the recovery's `migration_redone`, or `None` when the ops finished first.
fn round(fence: u64, copts: CrashOptions, seed: u64) -> Option<([u64; 4], u64)> {
    let opts = hair_trigger();
    let d = tempfile::tempdir().unwrap();
    let t = create(d.path(), PersistMode::Adr, SimMode::Shadow, &opts);
    let mut model = BTreeMap::new();
    for k in 1..=3000u64 {
        t.insert(k * 3, vk(k * 3)).unwrap();
        model.insert(k * 3, vk(k * 3));
    }
    let pool = Arc::clone(t.pool());
    let stop = AtomicBool::new(false);
    let mut rng = Rng(seed | 1);
    let ops: Vec<_> = (0..20_000).map(|_| random_op(&mut rng, 9000, 6)).collect();
    let pending = std::thread::scope(|s| {
        let (t, stop) = (&t, &stop);
        s.spawn(move || {
            numakv_pmem::numa::set_current_node(1);
            let mut rng = Rng(seed.rotate_left(17) | 1);
            let mut i = 0u64;
            // ORDERING: Acquire; pairs with the Release after the writer's phase.
            while !stop.load(Ordering::Acquire) {
                let k = rng.below(9000) + 1;
                // After the crash these fail or do nothing durable; either is fine.
                let _ = t.migrate_node_of(k, rng.below(3) as u32, rng.below(2) as usize);
                i += 1;
                if i % 16 == 0 {
                    let _ = t.rebuild_upper();
                }
            }
        });
        let p = run_to_crash(t, &pool, fence, copts, &mut model, ops.iter().copied());
        stop.store(true, Ordering::Release);
        p
    });
    let st = t.stats();
    let counts = KINDS.map(|n| st.counter(n).unwrap());
    if !pool.has_crashed() {
        return None;
    }
    drop(t);
    drop(pool);
    let (t, rep) = reopen(d.path(), SimMode::Shadow, &opts);
    assert!(!rep.was_clean);
    verify(&t, &model, pending, true);
    common::keep_working(&t, fence * 7 + 1, 300, 9000, 6);
    let redone = rep.counters.iter().find(|c| c.0 == "migration_redone").map_or(0, |c| c.1);
    Some((counts, redone))
}

#[test]
fn crashes_while_every_mechanism_runs() {
    let rounds = 3 * test_scale() as u64;
    let mut sum = [0u64; 4];
    let mut redone = 0;
    let mut crashed = 0;
    for i in 0..rounds {
        // Crash points spread over the writer's phase (its ops alone take ~10 fences each; the
        // migrator and the coordinator add theirs).
        let fence = 2_000 + i * 9_000;
        for copts in [CrashOptions::STRICT, CrashOptions::random(i * 31 + 7)] {
            if let Some((c, r)) = round(fence, copts, 0x9e37_79b9 ^ (i << 8) ^ fence) {
                crashed += 1;
                redone += r;
                for (s, c) in sum.iter_mut().zip(c) {
                    *s += c;
                }
            }
        }
    }
    let line = format!("{crashed} crashed rounds: {KINDS:?} = {sum:?}; migration_redone {redone}");
    eprintln!("{line}");
    assert!(crashed >= rounds, "{line}");
    assert!(sum.iter().all(|&c| c > 0), "a mechanism never ran before a crash: {line}");
}
