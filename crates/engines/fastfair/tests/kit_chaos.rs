//! The concurrent, scan and crash oracles under chaos schedules (`NUMAKV_CHAOS`, a fixed seed
//! by default) on 256-byte nodes, with coverage gates (docs/design.md §12.3).

use numakv_fastfair::{FastFair, FastFairOptions};
use numakv_index::testkit::{chaos_on, Kit};

fn kit(gates: &[&'static str]) -> Kit<FastFair> {
    chaos_on(0xFF);
    let mut kit = Kit::new(FastFairOptions { node_size: 256, ..Default::default() });
    kit.gates = gates.to_vec();
    kit
}

#[test]
fn concurrent_shared_chaos() {
    kit(&["splits", "merges"]).concurrent_shared().unwrap();
}

#[test]
fn scans_chaos() {
    kit(&[]).scans().unwrap();
}

#[test]
fn crash_shadow_chaos() {
    kit(&["splits", "root_splits"]).crash_shadow().unwrap();
}
