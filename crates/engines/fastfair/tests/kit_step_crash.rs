//! A crash at every step of FAST&FAIR's splits and merges (256-byte nodes) with three writers on
//! shared keys of the same and neighbouring leaves, in ADR (crash at each fence) and eADR
//! (crash before each PM store); see `numakv_index::testkit::steps`, docs/design.md §12.3.

use numakv_fastfair::{FastFair, FastFairOptions};
use numakv_index::testkit::steps::{preload_every, History, StepScenario, Writers};
use numakv_index::testkit::{Kit, Verdict};
use numakv_pmem::PersistMode;

fn kit() -> Kit<FastFair> {
    let mut kit = Kit::new(FastFairOptions { node_size: 256, ..Default::default() });
    kit.capacity_per_node = 16 << 20;
    kit
}

fn setup(e: &FastFair, h: &History) -> Verdict {
    preload_every(e, h, 3)
}

fn run(e: &FastFair, h: &History, crashed: &(dyn Fn() -> bool + Sync)) -> Verdict {
    Writers { threads: 3, ops: 80, keys: 1..=h.keys(), nodes: 2, seed: 0x5eed_00ff }
        .run(e, h, crashed)
}

fn scenario() -> StepScenario<'static, FastFair> {
    StepScenario {
        name: "fastfair split/merge, 3 writers on shared keys",
        keys: 96,
        setup: &setup,
        run: &run,
        gates: &["splits"],
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
