//! The concurrent, scan and crash oracles under chaos schedules (`NUMAKV_CHAOS`, a fixed seed
//! by default), on 4-slot leaves so that SMOs meet concurrent writers, with coverage gates.

use numakv_index::testkit::{chaos_on, Kit};
use numakv_nbtree::{NbTree, NbTreeOptions};

fn kit() -> Kit<NbTree> {
    chaos_on(33);
    let mut kit = Kit::new(NbTreeOptions { leaf_slots: 4, ..Default::default() });
    kit.gates = vec!["smos"];
    kit
}

#[test]
fn concurrent_shared_chaos() {
    kit().concurrent_shared().unwrap();
}

#[test]
fn scans_chaos() {
    kit().scans().unwrap();
}

#[test]
fn crash_shadow_chaos() {
    kit().crash_shadow().unwrap();
}
