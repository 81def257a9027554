//! The concurrent, scan and crash oracles under chaos schedules (`NUMAKV_CHAOS`, a fixed seed
//! by default) with the switch thread on a tiny hot set and a 1 ms period, so that the
//! shared-key and crash oracles meet switches with a previous NAL; coverage gates
//! (docs/design.md §12.3).

use std::time::Duration;

use numakv_fastfair::FastFair;
use numakv_index::testkit::{chaos_on, Kit};
use numakv_nap::{Nap, NapOptions};

fn kit(gates: &[&'static str]) -> Kit<Nap<FastFair>> {
    chaos_on(35);
    let opts = NapOptions {
        hot: 8,
        sample: 1,
        check_period: Duration::from_millis(1),
        switch_threshold: 0.0,
        sketch_width: 4096,
        record_buffer: 64,
        detect_uniform: false,
        min_count: 1,
        stale: Duration::from_millis(5),
        ..NapOptions::default()
    };
    let mut kit = Kit::new(opts);
    kit.gates = gates.to_vec();
    kit
}

#[test]
fn concurrent_shared_chaos() {
    kit(&["nap_switches", "nap_switches_with_previous"]).concurrent_shared().unwrap();
}

#[test]
fn scans_chaos() {
    kit(&[]).scans().unwrap();
}

#[test]
fn crash_shadow_chaos() {
    kit(&["nap_switches", "nap_switches_with_previous"]).crash_shadow().unwrap();
}
