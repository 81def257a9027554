//! Crashes at every k-th persistence point of an insert-heavy workload on a small-height tree
//! (leaf splits, inner splits, subindex root splits, root growth) in ADR shadow mode, strict and
//! with random survival/eviction, and in eADR shadow mode. After recovery the tree holds every
//! acknowledged operation and the interrupted one wholly or not at all, passes `check()` with
//! no leak, and keeps working. The sweep must hit the split windows: a flip without its trim
//! (`nodes_trimmed`) and a commit without its parent insert (`orphans_linked`).

mod common;

use common::{counter_sum, crash_round, quiet, random_op, sweep_fences, sweep_step, Op, Rng};
use numakv_nobtree::NobtreeOptions;
use numakv_pmem::PersistMode;

fn workload(seed: u64) -> (Vec<Op>, Vec<Op>) {
    let mut rng = Rng(seed);
    let pre: Vec<Op> = (0..150).map(|_| random_op(&mut rng, 600, 9)).collect();
    let mut ops: Vec<Op> = (0..250).map(|_| random_op(&mut rng, 600, 8)).collect();
    ops.extend((0..100).map(|_| random_op(&mut rng, 600, 3)));
    (pre, ops)
}

fn sweep(
    mode: PersistMode,
    opts: &NobtreeOptions,
    step: u64,
    seed: u64,
) -> Vec<numakv_index::RecoveryReport> {
    let (pre, ops) = workload(seed);
    sweep_fences(sweep_step(step), seed, |fence, copts| {
        crash_round(mode, opts, &pre, &ops, fence, copts)
    })
    .0
}

#[test]
fn adr_every_kth_fence_height3() {
    let opts = NobtreeOptions { height: 3, ..quiet() };
    let reps = sweep(PersistMode::Adr, &opts, 2, 0x5b17);
    assert!(reps.len() > 40, "only {} crash points", reps.len());
    for c in ["nodes_trimmed", "orphans_linked"] {
        assert!(counter_sum(&reps, c) > 0, "no crash exercised {c}");
    }
    eprintln!(
        "adr: {} rounds, nodes_trimmed {}, orphans_linked {}, nsm_free_blocks {}",
        reps.len(),
        counter_sum(&reps, "nodes_trimmed"),
        counter_sum(&reps, "orphans_linked"),
        counter_sum(&reps, "nsm_free_blocks")
    );
}

#[test]
fn adr_every_kth_fence_height1() {
    // Every leaf is a subindex root: each split inserts into the upper replicas.
    let opts = NobtreeOptions { height: 1, ..quiet() };
    let reps = sweep(PersistMode::Adr, &opts, 5, 0x5b18);
    assert!(reps.len() > 10, "only {} crash points", reps.len());
}

#[test]
fn eadr_every_kth_fence() {
    let reps = sweep(PersistMode::Eadr, &quiet(), 6, 0xeadd);
    assert!(reps.len() > 10, "only {} crash points", reps.len());
}
