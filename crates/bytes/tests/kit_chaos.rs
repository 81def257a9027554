//! The shared kit's concurrent, scan and crash oracles over the byte layer (FAST&FAIR through
//! the codec) under chaos schedules (`NUMAKV_CHAOS`, a fixed seed by default), with coverage
//! gates on cells rewritten in place and leaf splits (docs/design.md §12.3).

use numakv_bytes::testkit::Codec;
use numakv_fastfair::FastFair;
use numakv_index::testkit::{chaos_on, Kit};

fn kit(gates: &[&'static str]) -> Kit<Codec<FastFair>> {
    chaos_on(0xB7);
    let mut kit = Kit::new(Default::default());
    kit.gates = gates.to_vec();
    kit
}

#[test]
fn concurrent_shared_chaos() {
    kit(&["bytes_cells_rewritten", "bytes_leaf_splits"]).concurrent_shared().unwrap();
}

#[test]
fn scans_chaos() {
    kit(&[]).scans().unwrap();
}

#[test]
fn crash_shadow_chaos() {
    kit(&["bytes_cells_rewritten", "bytes_leaf_splits"]).crash_shadow().unwrap();
}
