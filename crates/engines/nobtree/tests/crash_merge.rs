//! Crashes at every persistence point inside merges (leaf merges and the inner-node merges they
//! cascade into, height threshold 3), in ADR shadow mode (strict and random eviction) and eADR.
//! The deletes run on a tree whose leaves and inner nodes were thinned to just above the merge
//! trigger, so nearly every delete of the swept phase merges. After recovery the tree holds
//! every acknowledged delete and the interrupted one wholly or not at all, passes `check()` with
//! no leak, and keeps working. The sweep must hit both merge windows: after the separator left
//! the parent (the sibling re-linked: `orphans_linked`) and after the copies were listed but
//! before the flip (`nodes_trimmed`). A second sweep crashes at *every* fence (step 1, any
//! scale) of the deletes whose merges cascade into inner-node merges.

mod common;

use common::{counter_sum, crash_round, quiet, sweep_fences, sweep_step, vk, volatile, Op};
use numakv_index::Index;
use numakv_nobtree::NobtreeOptions;
use numakv_pmem::PersistMode;

const N: u64 = 700;

fn opts() -> NobtreeOptions {
    NobtreeOptions { height: 3, ..quiet() }
}

/// `pre`: sequential inserts, then deletes that leave 3 of every 7 keys (no leaf reaches the
/// trigger of 2); `ops`: deletes of one more key per 7-key run across a key range, taking
/// leaves to 2 records and merging them (and, as separators vanish, inner nodes).
fn workload() -> (Vec<Op>, Vec<Op>) {
    let mut pre: Vec<Op> = (1..=N).map(|k| Op::Insert(k, vk(k))).collect();
    pre.extend((1..=N).filter(|k| k % 7 >= 3).map(Op::Remove));
    // Descending: a parent thinned by the merges below finds its right sibling thinned already,
    // so the inner level merges too.
    let ops: Vec<Op> = (1..=N).rev().filter(|k| k % 7 == 1).take(60).map(Op::Remove).collect();
    (pre, ops)
}

#[test]
fn workload_merges_inner_nodes() {
    // Without a crash, the swept phase merges leaves and inner nodes.
    let (pre, ops) = workload();
    let t = volatile(&opts());
    let mut model = std::collections::BTreeMap::new();
    for op in pre.iter().chain(&ops) {
        common::tree_apply(&t, &model, *op);
        common::model_apply(&mut model, *op);
    }
    let c = |n: &str| t.stats().counter(n).unwrap();
    assert!(c("merges") > 20, "merges {}", c("merges"));
    assert!(c("inner_merges") > 0, "no inner merge in the swept phase");
    eprintln!("swept phase: merges {}, inner merges {}", c("merges"), c("inner_merges"));
    t.check().unwrap();
}

/// The workload split so that `ops` is the first delete whose leaf merge cascades into an
/// inner-node merge (found by a dry run; the second one too when it follows directly), `pre`
/// everything before it.
fn inner_window() -> (Vec<Op>, Vec<Op>) {
    let (mut pre, ops) = workload();
    let t = volatile(&opts());
    let mut model = std::collections::BTreeMap::new();
    for &op in &pre {
        common::tree_apply(&t, &model, op);
        common::model_apply(&mut model, op);
    }
    let mut hits = Vec::new();
    for (i, &op) in ops.iter().enumerate() {
        let before = t.stats().counter("inner_merges").unwrap();
        common::tree_apply(&t, &model, op);
        common::model_apply(&mut model, op);
        if t.stats().counter("inner_merges").unwrap() > before {
            hits.push(i);
        }
    }
    assert!(hits.len() >= 2, "only {} deletes cascade into inner merges", hits.len());
    let (first, second) = (hits[0], hits[1]);
    pre.extend_from_slice(&ops[..first]);
    let window = if second == first + 1 { ops[first..=second].to_vec() } else { vec![ops[first]] };
    (pre, window)
}

fn sweep_ops(
    mode: PersistMode,
    pre: &[Op],
    ops: &[Op],
    step: u64,
    seed: u64,
) -> Vec<numakv_index::RecoveryReport> {
    sweep_fences(step, seed, |fence, copts| crash_round(mode, &opts(), pre, ops, fence, copts)).0
}

#[test]
fn every_fence_of_an_inner_merge() {
    let (pre, ops) = inner_window();
    for mode in [PersistMode::Adr, PersistMode::Eadr] {
        let reps = sweep_ops(mode, &pre, &ops, 1, 0x1a7e);
        // A leaf merge cascading into an inner merge: ≥ 1 (delete) + 5 + 5 fences.
        assert!(reps.len() >= 2 * 10, "{mode:?}: only {} crash points", reps.len());
        assert!(counter_sum(&reps, "orphans_linked") > 0, "{mode:?}: no unlink window");
        if mode == PersistMode::Adr {
            assert!(counter_sum(&reps, "nodes_trimmed") > 0, "{mode:?}: no listed-copy window");
        }
        eprintln!(
            "{mode:?} inner merge: {} rounds over {} deletes, nodes_trimmed {}, orphans_linked {}",
            reps.len(),
            ops.len(),
            counter_sum(&reps, "nodes_trimmed"),
            counter_sum(&reps, "orphans_linked")
        );
    }
}

fn sweep(mode: PersistMode, step: u64, seed: u64) -> Vec<numakv_index::RecoveryReport> {
    let (pre, ops) = workload();
    sweep_ops(mode, &pre, &ops, sweep_step(step), seed)
}

#[test]
fn adr_crash_inside_merges() {
    let reps = sweep(PersistMode::Adr, 1, 0x3e76);
    assert!(reps.len() > 60, "only {} crash points", reps.len());
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
fn eadr_crash_inside_merges() {
    let reps = sweep(PersistMode::Eadr, 2, 0x3e77);
    assert!(reps.len() > 30, "only {} crash points", reps.len());
    assert!(counter_sum(&reps, "orphans_linked") > 0, "no crash between unlink and commit");
}
