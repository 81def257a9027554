//! The concurrent, scan and crash oracles under chaos schedules (`NUMAKV_CHAOS`, a fixed seed
//! by default), on 4-slot leaves with `smo_yield` so that SMOs meet concurrent writers in each
//! phase, with coverage gates (docs/design.md §12.3).

use numakv_index::testkit::{chaos_on, Kit};
use numakv_nbtree::{NbTree, NbTreeOptions};

fn kit(gates: &[&'static str]) -> Kit<NbTree> {
    chaos_on(33);
    let opts = NbTreeOptions { leaf_slots: 4, smo_yield: true, ..Default::default() };
    let mut kit = Kit::new(opts);
    kit.gates = gates.to_vec();
    kit
}

#[test]
fn concurrent_shared_chaos() {
    kit(&["smos", "smo_helps"]).concurrent_shared().unwrap();
}

#[test]
fn scans_chaos() {
    kit(&[]).scans().unwrap();
}

#[test]
fn crash_shadow_chaos() {
    kit(&["smos"]).crash_shadow().unwrap();
}
