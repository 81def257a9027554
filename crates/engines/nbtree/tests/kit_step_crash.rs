//! A crash at every step of NBTree's SMO (copy, sync and link phases) with three writers on
//! shared keys of the same and neighbouring leaves (4-slot leaves: an SMO every few inserts),
//! in ADR (crash at each fence) and eADR (crash before each PM store); see
//! `numakv_index::testkit::steps` and docs/design.md §12.3.

use numakv_index::testkit::steps::{preload_every, History, StepScenario, Writers};
use numakv_index::testkit::{Kit, Verdict};
use numakv_nbtree::{NbTree, NbTreeOptions};
use numakv_pmem::PersistMode;

fn kit() -> Kit<NbTree> {
    let mut kit = Kit::new(NbTreeOptions { leaf_slots: 4, ..Default::default() });
    kit.capacity_per_node = 32 << 20;
    kit
}

fn setup(e: &NbTree, h: &History) -> Verdict {
    preload_every(e, h, 2)
}

fn run(e: &NbTree, h: &History, crashed: &(dyn Fn() -> bool + Sync)) -> Verdict {
    Writers { threads: 3, ops: 40, keys: 1..=h.keys(), nodes: 2, seed: 0x5eed_0033 }
        .run(e, h, crashed)
}

fn scenario() -> StepScenario<'static, NbTree> {
    StepScenario {
        name: "nbtree smo, 3 writers on shared keys",
        keys: 32,
        setup: &setup,
        run: &run,
        gates: &["smos"],
        max_points: 200,
    }
}

#[test]
fn smo_every_fence_adr() {
    kit().step_crash(&scenario(), PersistMode::Adr).unwrap();
}

#[test]
fn smo_every_store_eadr() {
    kit().step_crash(&scenario(), PersistMode::Eadr).unwrap();
}
