//! The concurrent, scan and crash oracles under chaos schedules (`NUMAKV_CHAOS`, a fixed seed
//! by default) with tiny future objects, so that producers, hand-offs and evaluation meet;
//! coverage gates (docs/design.md §12.3).

use std::time::Duration;

use numakv_f3tree::{Evaluation, F3Tree, F3TreeOptions};
use numakv_index::testkit::{chaos_on, Kit};

fn kit(gates: &[&'static str]) -> Kit<F3Tree> {
    chaos_on(0xF3);
    let opts = F3TreeOptions {
        fo_entries: 4,
        count_threshold: 6,
        time_threshold: Duration::from_millis(1),
        evaluation: Evaluation::NodeBatched { batch: 5 },
        ..F3TreeOptions::default()
    };
    let mut kit = Kit::new(opts);
    kit.gates = gates.to_vec();
    kit
}

#[test]
fn concurrent_shared_chaos() {
    kit(&["evaluations", "entries_applied", "fos_freed"]).concurrent_shared().unwrap();
}

#[test]
fn scans_chaos() {
    kit(&[]).scans().unwrap();
}

#[test]
fn crash_shadow_chaos() {
    kit(&["evaluations", "entries_applied"]).crash_shadow().unwrap();
}
