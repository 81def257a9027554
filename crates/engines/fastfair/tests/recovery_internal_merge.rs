//! Crashes (ADR shadow power failures, strict and with random survival and eviction; eADR)
//! inside internal-node merges and root shrinks: at every persistence point of a remove whose
//! cascade merges two internal nodes, of a remove that empties and shrinks the root, and at
//! every k-th persistence point of a delete-heavy run that takes a tree from height 4 to 1.
//! Recovery rolls an interrupted merge back (the left node's range cut back, the right node
//! re-linked if it had lost its separator) or finds it complete, shrinks a root the crash left
//! without entries, holds every acknowledged operation and the interrupted one wholly or not
//! at all, checks without leaks and keeps working.

mod common;

use common::{crash_round, sweep_fences, sweep_step, vk, Op, Rng};
use numakv_index::{Index, RecoveryReport};
use numakv_pmem::PersistMode;

const NS: usize = 256;

/// Applies `pre` to a volatile tree, then removes `candidates` one by one until a remove raises
/// `counter`; returns the ops before that remove, the remove, and the number of nodes before it.
fn find_trigger(pre: &[Op], candidates: &[u64], counter: &str) -> (Vec<Op>, Op, u64) {
    let t = common::volatile(NS);
    let mut model = std::collections::BTreeMap::new();
    for &op in pre {
        common::tree_apply(&t, &model, op);
        common::model_apply(&mut model, op);
    }
    let mut all = pre.to_vec();
    for &k in candidates {
        let nodes = t.check().unwrap().reachable_blocks;
        let before = t.stats().counter(counter).unwrap();
        t.remove(k).unwrap();
        if t.stats().counter(counter).unwrap() > before {
            return (all, Op::Remove(k), nodes);
        }
        all.push(Op::Remove(k));
    }
    panic!("no remove raised {counter}");
}

/// Crashes at every fence of `ops` after `pre`, strict and with random survival; the reports.
fn every_fence(pre: &[Op], ops: &[Op]) -> Vec<RecoveryReport> {
    sweep_fences(1, 0, |fence, copts| crash_round(PersistMode::Adr, NS, pre, ops, fence, copts)).0
}

fn counter(r: &RecoveryReport, name: &str) -> u64 {
    r.counters.iter().find(|c| c.0 == name).map_or(0, |c| c.1)
}

#[test]
fn crash_inside_an_internal_merge() {
    // Height 3 (256-byte nodes), then ascending removes until one merges internal nodes.
    let pre: Vec<Op> = (1..=400u64).map(|k| Op::Insert(k, vk(k))).collect();
    let (pre, op, nodes) = find_trigger(&pre, &(1..=400).collect::<Vec<_>>(), "internal_merges");
    let reps = every_fence(&pre, &[op]);
    assert!(reps.len() >= 16, "the remove took only {} crash rounds", reps.len());
    // A leaf merge and an internal merge each free one node: a recovered tree with one node
    // less than before crashed after the leaf merge; if it also fixed a range, the crash fell
    // inside the internal merge and recovery rolled it back.
    let inside = reps
        .iter()
        .filter(|r| counter(r, "nodes") == nodes - 1 && counter(r, "ranges_fixed") > 0)
        .count();
    eprintln!("internal merge: {} rounds, {inside} inside the internal merge", reps.len());
    assert!(inside > 0, "no crash fell inside the internal merge ({nodes} nodes before)");
    assert!(common::counter_sum(&reps, "orphans_linked") > 0, "no rollback re-linked a node");
}

#[test]
fn crash_inside_a_root_shrink() {
    // A root over two leaves: removes merge the leaves, which leaves the root without entries.
    let cap = numakv_fastfair::layout::slots(NS) as u64 - 1;
    let pre: Vec<Op> = (1..=cap + 1).map(|k| Op::Insert(k * 10, vk(k))).collect();
    let candidates: Vec<u64> = (1..=cap + 1).map(|k| k * 10).collect();
    let (pre, op, nodes) = find_trigger(&pre, &candidates, "root_shrinks");
    assert_eq!(nodes, 3, "the scenario needs a root over two leaves");
    let reps = every_fence(&pre, &[op]);
    assert!(reps.len() >= 8, "the remove took only {} crash rounds", reps.len());
    assert!(
        reps.iter().any(|r| counter(r, "roots_shrunk") > 0),
        "no crash left the root empty: {:?}",
        reps.iter().map(|r| &r.counters).collect::<Vec<_>>()
    );
}

/// Deeper: the shrink of a root whose child is internal, found in a taller tree.
#[test]
fn crash_inside_an_internal_root_shrink() {
    let pre: Vec<Op> = (1..=150u64).map(|k| Op::Insert(k, vk(k))).collect();
    let mut rng = Rng(9);
    let mut cand: Vec<u64> = (1..=150).collect();
    for i in (1..cand.len()).rev() {
        cand.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let t = common::volatile(NS);
    for &op in &pre {
        common::tree_apply(&t, &Default::default(), op);
    }
    assert!(t.stats().counter("height").unwrap() >= 3);
    let (pre, op, _) = find_trigger(&pre, &cand, "root_shrinks");
    let reps = every_fence(&pre, &[op]);
    assert!(reps.len() >= 10, "the remove took only {} crash rounds", reps.len());
    assert!(reps.iter().any(|r| counter(r, "roots_shrunk") > 0), "no crash left the root empty");
}

fn delete_heavy(mode: PersistMode, step: u64, seed: u64) -> Vec<RecoveryReport> {
    let mut rng = Rng(seed);
    let mut keys: Vec<u64> = (1..=500).collect();
    for i in (1..keys.len()).rev() {
        keys.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let pre: Vec<Op> = keys.iter().map(|&k| Op::Insert(k, vk(k))).collect();
    for i in (1..keys.len()).rev() {
        keys.swap(i, rng.below(i as u64 + 1) as usize);
    }
    // Remove 490 keys, with an insert or update now and then.
    let mut ops = Vec::new();
    for (i, &k) in keys.iter().take(490).enumerate() {
        ops.push(Op::Remove(k));
        if i % 23 == 0 {
            let j = keys[490 + i % 10];
            ops.push(if i % 2 == 0 { Op::Update(j, i as u64) } else { Op::Upsert(k, 0) });
        }
    }
    sweep_fences(sweep_step(step), seed, |fence, copts| {
        crash_round(mode, NS, &pre, &ops, fence, copts)
    })
    .0
}

#[test]
fn adr_delete_heavy_every_kth_fence() {
    let reps = delete_heavy(PersistMode::Adr, 5, 0xde1e7e);
    assert!(reps.len() > 100, "only {} crash points", reps.len());
    eprintln!(
        "adr delete-heavy: {} rounds, ranges_fixed {}, orphans_linked {}, roots_shrunk {}",
        reps.len(),
        common::counter_sum(&reps, "ranges_fixed"),
        common::counter_sum(&reps, "orphans_linked"),
        common::counter_sum(&reps, "roots_shrunk")
    );
    for c in ["slots_repaired", "ranges_fixed", "orphans_linked"] {
        assert!(common::counter_sum(&reps, c) > 0, "no crash exercised {c}");
    }
}

#[test]
fn eadr_delete_heavy_every_kth_fence() {
    let reps = delete_heavy(PersistMode::Eadr, 11, 0xeade1);
    assert!(reps.len() > 40, "only {} crash points", reps.len());
}
