//! A crash at every step of F3-tree's evaluation (§III: producers append to per-thread future
//! objects, per-node evaluate threads apply them to the tree) with three writers on shared keys,
//! the run ending when evaluation has drained; ADR (crash at each fence) and eADR (crash before
//! each PM store). Tiny future objects so that FOs fill, chain and are freed. See
//! `numakv_index::testkit::steps` and docs/design.md §12.3.

use std::time::Duration;

use numakv_f3tree::{Evaluation, F3Tree, F3TreeOptions};
use numakv_index::testkit::steps::{preload_every, History, StepScenario, Writers};
use numakv_index::testkit::{Kit, Verdict, Violation};
use numakv_pmem::PersistMode;

fn kit() -> Kit<F3Tree> {
    kit_with(true)
}

fn kit_with(hash_lookups: bool) -> Kit<F3Tree> {
    let opts = F3TreeOptions {
        hash_lookups,
        fo_entries: 4,
        count_threshold: 6,
        time_threshold: Duration::from_millis(1),
        evaluation: Evaluation::NodeBatched { batch: 5 },
        ..F3TreeOptions::default()
    };
    let mut kit = Kit::new(opts);
    kit.capacity_per_node = 16 << 20;
    kit
}

fn setup(e: &F3Tree, h: &History) -> Verdict {
    preload_every(e, h, 2)?;
    ensure_drained(e)
}

fn ensure_drained(e: &F3Tree) -> Verdict {
    if e.wait_drained(Duration::from_secs(30)) {
        Ok(())
    } else {
        Err(Violation("evaluation did not drain within 30 s".into()))
    }
}

fn run(e: &F3Tree, h: &History, crashed: &(dyn Fn() -> bool + Sync)) -> Verdict {
    Writers { threads: 3, ops: 40, keys: 1..=h.keys(), nodes: 2, seed: 0x5eed_00f3 }
        .run(e, h, crashed)?;
    if crashed() {
        return Ok(());
    }
    // Evaluation of what the writers left is part of the steps; a crash stops it.
    while !crashed() && !e.wait_drained(Duration::from_millis(20)) {}
    Ok(())
}

fn scenario() -> StepScenario<'static, F3Tree> {
    StepScenario {
        name: "f3tree evaluation, 3 writers on shared keys",
        keys: 48,
        setup: &setup,
        run: &run,
        gates: &["evaluations", "entries_applied", "fos_freed"],
        max_points: 200,
    }
}

#[test]
fn evaluation_every_fence_adr() {
    kit().step_crash(&scenario(), PersistMode::Adr).unwrap();
}

#[test]
fn evaluation_every_store_eadr() {
    kit().step_crash(&scenario(), PersistMode::Eadr).unwrap();
}

// The same with No-Hash lookups (papers/f3tree.txt: reads walk the PTFO lists instead of the
// DRAM hash table). On the code before issue 35's fix these fail: after recovery a No-Hash get
// returns a value an acknowledged later write superseded (found by this kit at the first run,
// e.g. "crash point 217 of 296: key 41: recovered Some(5a00000007800029), which no durable
// linearization explains (… writes [effect@invoke..response] [None@83..Some(84),
// Some(5a00000007800029)@120..Some(121), None@159..Some(160)] …)"). Ignored until that fix
// lands; run with `--ignored`.

#[test]
#[ignore = "finds issue 35's No-Hash read of a superseded value after reopen until it is fixed"]
fn evaluation_no_hash_every_fence_adr() {
    kit_with(false).step_crash(&scenario(), PersistMode::Adr).unwrap();
}

#[test]
#[ignore = "finds issue 35's No-Hash read of a superseded value after reopen until it is fixed"]
fn evaluation_no_hash_every_store_eadr() {
    kit_with(false).step_crash(&scenario(), PersistMode::Eadr).unwrap();
}
