//! Crashes during migrations (§III-D): at every k-th persistence point while leaves — and, in the
//! `inner` sweeps, level-1 inner nodes and subindex roots — are being copied and re-linked, in ADR shadow mode (strict and random eviction) and eADR shadow mode.
//! After recovery every key is present with its value, `check()` passes with no leak (the copy
//! or the original is collected), and some rounds crashed with the log armed (`migration_redone`).

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use common::{counter_sum, create, quiet, reopen, verify, vk};
use numakv_index::{Engine, Index, RecoveryReport};
use numakv_nobtree::NobtreeOptions;
use numakv_pmem::alloc::nsm::NsmMode;
use numakv_pmem::{CrashOptions, PersistMode, SimMode};

/// Which nodes a round migrates: leaves (height 2), or inner nodes of level 1 and subindex
/// roots of level 2 (height 3).
#[derive(Clone, Copy, PartialEq)]
enum What {
    Leaves,
    Inner,
}

fn migrate(t: &numakv_nobtree::Nobtree, what: What, i: u64, k: u64, target: usize) -> bool {
    match what {
        What::Leaves => t.migrate_leaf_of(k, target).unwrap_or(false),
        // Alternate inner nodes and subindex roots.
        What::Inner => t.migrate_node_of(k, 1 + (i % 2) as u32, target).unwrap_or(false),
    }
}

fn round_of(
    what: What,
    mode: PersistMode,
    fence: u64,
    copts: CrashOptions,
) -> Option<RecoveryReport> {
    let height = if what == What::Inner { 3 } else { 2 };
    let opts = NobtreeOptions { height, nsm_mode: NsmMode::Node(0), ..quiet() };
    let d = tempfile::tempdir().unwrap();
    let t = create(d.path(), mode, SimMode::Shadow, &opts);
    let mut model = BTreeMap::new();
    for k in 1..=1500u64 {
        t.insert(k * 5, vk(k)).unwrap();
        model.insert(k * 5, vk(k));
    }
    let pool = Arc::clone(t.pool());
    pool.crash_after_fences(fence, copts).unwrap();
    // Inner nodes cover ~50 leaves: fewer, wider-spaced migrations (the sweep crashes at every
    // one of their fences).
    let stride = if what == What::Inner { 1100 } else { 150 };
    for (i, k) in (100..=7500u64).step_by(stride).enumerate() {
        let _ = migrate(&t, what, i as u64, k, 1);
        if pool.has_crashed() {
            break;
        }
    }
    if !pool.has_crashed() {
        pool.cancel_crash();
        return None;
    }
    drop(t);
    drop(pool);
    let (t, rep) = reopen(d.path(), SimMode::Shadow, &opts);
    verify(&t, &model, None, true);
    // Keeps working: more migrations and writes.
    let mut moved = 0;
    for (i, k) in (100..=7500u64).step_by(300).enumerate() {
        moved += u64::from(migrate(&t, what, i as u64, k, 1));
    }
    assert!(moved > 0 || what == What::Leaves, "no migration after recovery");
    for k in 1..=300u64 {
        t.upsert(k * 5 + 2, k).unwrap();
        model.insert(k * 5 + 2, k);
    }
    verify(&t, &model, None, false);
    Some(rep)
}

fn sweep(mode: PersistMode, step: u64) -> Vec<RecoveryReport> {
    sweep_of(What::Leaves, mode, step)
}

fn sweep_of(what: What, mode: PersistMode, step: u64) -> Vec<RecoveryReport> {
    let mut reps = Vec::new();
    let mut fence = 1;
    while let Some(r) = round_of(what, mode, fence, CrashOptions::STRICT) {
        reps.push(r);
        reps.extend(round_of(what, mode, fence, CrashOptions::random(fence * 31)));
        fence += step;
    }
    reps
}

#[test]
fn adr_crash_during_inner_and_root_migration() {
    // Every fence of the migrations of level-1 inner nodes and level-2 subindex roots (the
    // latter's parent is the upper layer: the log holds only the previous sibling).
    // The same migrations without a crash move nodes of both levels.
    let t = common::volatile(&NobtreeOptions { height: 3, nsm_mode: NsmMode::Node(0), ..quiet() });
    for k in 1..=1500u64 {
        t.insert(k * 5, vk(k)).unwrap();
    }
    let mut per_level = [0u32; 3];
    for (i, k) in (100..=7500u64).step_by(1100).enumerate() {
        if migrate(&t, What::Inner, i as u64, k, 1) {
            per_level[1 + i % 2] += 1;
        }
    }
    assert!(per_level[1] > 0 && per_level[2] > 0, "migrated per level: {per_level:?}");
    let reps = sweep_of(What::Inner, PersistMode::Adr, 1);
    assert!(reps.len() > 24, "only {} crash points", reps.len());
    assert!(counter_sum(&reps, "migration_redone") > 0, "no crash hit an armed log");
    eprintln!(
        "adr inner/root: {} rounds, migration_redone {}",
        reps.len(),
        counter_sum(&reps, "migration_redone")
    );
}

#[test]
fn eadr_crash_during_inner_and_root_migration() {
    let reps = sweep_of(What::Inner, PersistMode::Eadr, 3);
    assert!(reps.len() > 12, "only {} crash points", reps.len());
    assert!(counter_sum(&reps, "migration_redone") > 0, "no crash hit an armed log");
}

#[test]
fn adr_crash_during_migration() {
    let reps = sweep(PersistMode::Adr, 5);
    assert!(reps.len() > 24, "only {} crash points", reps.len());
    assert!(counter_sum(&reps, "migration_redone") > 0, "no crash hit an armed log");
    eprintln!(
        "adr: {} rounds, migration_redone {}",
        reps.len(),
        counter_sum(&reps, "migration_redone")
    );
}

#[test]
fn eadr_crash_during_migration() {
    let reps = sweep(PersistMode::Eadr, 9);
    assert!(reps.len() > 12, "only {} crash points", reps.len());
    assert!(counter_sum(&reps, "migration_redone") > 0, "no crash hit an armed log");
}
