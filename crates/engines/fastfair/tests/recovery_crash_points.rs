//! Crash at every k-th persistence point of a mixed workload (splits, root splits, merges,
//! shifts both ways) in ADR shadow mode, strict and with random survival/eviction, and in eADR
//! shadow mode; after recovery the tree holds every acknowledged operation, the interrupted one
//! wholly or not at all, passes `check()` without leaks and keeps working.

mod common;

use common::{crash_round_with, random_op, Op, Rng};
use numakv_fastfair::RecoveryMode;
use numakv_pmem::{CrashOptions, PersistMode};

fn workload(seed: u64) -> (Vec<Op>, Vec<Op>) {
    let mut rng = Rng(seed);
    let pre: Vec<Op> = (0..120).map(|_| random_op(&mut rng, 400, 10)).collect();
    let mut ops: Vec<Op> = (0..150).map(|_| random_op(&mut rng, 400, 6)).collect();
    ops.extend((0..150).map(|_| random_op(&mut rng, 400, 2)));
    (pre, ops)
}

/// Crash points every `step` fences; strict crashes recover eagerly, random ones lazily (both
/// modes see both kinds of crash over the sweep, as the offsets differ).
fn sweep(mode: PersistMode, step: u64, seed: u64) -> Vec<numakv_index::RecoveryReport> {
    let (pre, ops) = workload(seed);
    let step = common::sweep_step(step);
    let mut reps = Vec::new();
    let mut fence = 1;
    let round = |fence: u64, copts, rec| crash_round_with(mode, 256, &pre, &ops, fence, copts, rec);
    let modes = [RecoveryMode::Eager, RecoveryMode::Lazy];
    while let Some(r) = round(fence, CrashOptions::STRICT, modes[(fence / step % 2) as usize]) {
        reps.push(r);
        let copts = CrashOptions::random(fence ^ seed);
        reps.extend(round(fence, copts, modes[(fence / step % 2 + 1) as usize % 2]));
        fence += step;
    }
    reps
}

#[test]
fn adr_every_kth_fence() {
    let reps = sweep(PersistMode::Adr, 3, 0xadd1);
    assert!(reps.len() > 40, "only {} crash points", reps.len());
    let lazy = reps.iter().filter(|r| r.counters.iter().any(|c| c.0 == "deferred")).count();
    assert!(lazy > 0 && lazy < reps.len());
    // The sweep hit the interesting windows: interrupted shifts, splits and merges.
    for c in ["slots_repaired", "orphans_linked"] {
        assert!(common::counter_sum(&reps, c) > 0, "no crash exercised {c}");
    }
    eprintln!(
        "adr: {} rounds, slots_repaired {}, ranges_fixed {}, orphans_linked {}, nsm_free_blocks {}",
        reps.len(),
        common::counter_sum(&reps, "slots_repaired"),
        common::counter_sum(&reps, "ranges_fixed"),
        common::counter_sum(&reps, "orphans_linked"),
        common::counter_sum(&reps, "nsm_free_blocks")
    );
}

#[test]
fn eadr_every_kth_fence() {
    let reps = sweep(PersistMode::Eadr, 6, 0xeadd);
    assert!(reps.len() > 10, "only {} crash points", reps.len());
}
