//! A crash at every step of the byte layer's writes (cells rewritten in place, leaves rewritten,
//! split and emptied, paths rebuilt) with three writers on shared keys of the same prefixes,
//! over FAST&FAIR through the codec ([`Codec`]: four keys per 8-byte prefix, tiny trees); ADR
//! (crash at each fence) and eADR (crash before each PM store). See
//! `numakv_index::testkit::steps` and docs/design.md §12.3.

use numakv_bytes::testkit::Codec;
use numakv_fastfair::FastFair;
use numakv_index::testkit::steps::{History, StepScenario, Writers};
use numakv_index::testkit::{Kit, Verdict};
use numakv_pmem::PersistMode;

type E = Codec<FastFair>;

fn kit() -> Kit<E> {
    let mut kit = Kit::new(Default::default());
    kit.capacity_per_node = 16 << 20;
    kit
}

/// One key per prefix (`4, 8, …`): each prefix's root is a cell.
fn setup(e: &E, h: &History) -> Verdict {
    for k in (4..=h.keys()).step_by(4) {
        h.preload(e, k, k << 4)?;
    }
    Ok(())
}

fn run(e: &E, h: &History, crashed: &(dyn Fn() -> bool + Sync)) -> Verdict {
    Writers { threads: 3, ops: 40, keys: 1..=h.keys(), nodes: 2, seed: 0x5eed_b17e }
        .run(e, h, crashed)
}

fn scenario() -> StepScenario<'static, E> {
    StepScenario {
        name: "bytes cells and leaf rewrites, 3 writers on shared prefixes",
        keys: 32,
        setup: &setup,
        run: &run,
        gates: &["bytes_cells_rewritten", "bytes_leaf_splits"],
        max_points: 200,
    }
}

#[test]
fn writes_every_fence_adr() {
    kit().step_crash(&scenario(), PersistMode::Adr).unwrap();
}

#[test]
fn writes_every_store_eadr() {
    kit().step_crash(&scenario(), PersistMode::Eadr).unwrap();
}
