//! The concurrent, scan and crash oracles under chaos schedules (`NUMAKV_CHAOS`, a fixed seed
//! by default) with small log files and a GC thread per node polling every millisecond, so that
//! GC passes meet the writers; coverage gates (docs/design.md §12.3).

use std::time::Duration;

use numakv_index::testkit::{chaos_on, Kit};
use numakv_nstore::{NStore, NStoreOptions};

fn kit(gates: &[&'static str]) -> Kit<NStore> {
    chaos_on(34);
    let opts = NStoreOptions {
        clusters: 4,
        log_file_size: 16 << 10,
        gc_interval: Duration::from_millis(1),
        ..Default::default()
    };
    let mut kit = Kit::new(opts);
    kit.page_size = 4 << 10;
    kit.gates = gates.to_vec();
    kit
}

#[test]
fn concurrent_shared_chaos() {
    kit(&["files_created"]).concurrent_shared().unwrap();
}

#[test]
fn scans_chaos() {
    kit(&[]).scans().unwrap();
}

#[test]
fn crash_shadow_chaos() {
    kit(&["gc_files_reclaimed"]).crash_shadow().unwrap();
}
