//! Crashes during migrations (§III-D): at every k-th persistence point while leaves are being
//! copied and re-linked, in ADR shadow mode (strict and random eviction) and eADR shadow mode.
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

fn round(mode: PersistMode, fence: u64, copts: CrashOptions) -> Option<RecoveryReport> {
    let opts = NobtreeOptions { nsm_mode: NsmMode::Node(0), ..quiet() };
    let d = tempfile::tempdir().unwrap();
    let t = create(d.path(), mode, SimMode::Shadow, &opts);
    let mut model = BTreeMap::new();
    for k in 1..=1500u64 {
        t.insert(k * 5, vk(k)).unwrap();
        model.insert(k * 5, vk(k));
    }
    let pool = Arc::clone(t.pool());
    pool.crash_after_fences(fence, copts).unwrap();
    for k in (100..=7500u64).step_by(150) {
        let _ = t.migrate_leaf_of(k, 1);
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
    for k in (100..=7500u64).step_by(300) {
        let _ = t.migrate_leaf_of(k, 1).unwrap();
    }
    for k in 1..=300u64 {
        t.upsert(k * 5 + 2, k).unwrap();
        model.insert(k * 5 + 2, k);
    }
    verify(&t, &model, None, false);
    Some(rep)
}

fn sweep(mode: PersistMode, step: u64) -> Vec<RecoveryReport> {
    let mut reps = Vec::new();
    let mut fence = 1;
    while let Some(r) = round(mode, fence, CrashOptions::STRICT) {
        reps.push(r);
        reps.extend(round(mode, fence, CrashOptions::random(fence * 31)));
        fence += step;
    }
    reps
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
