//! The concurrent, scan and crash oracles under chaos schedules (`NUMAKV_CHAOS`, a fixed seed by
//! default) with hair-trigger migration (every access sampled, two samples make a node hot, no
//! remote share needed, no cool-down), so that the shared-key and crash oracles meet
//! migrations of leaves, inner nodes and subindex roots; coverage gates (docs/design.md §12.3).

use numakv_index::testkit::{chaos_on, Kit};
use numakv_nobtree::{Nobtree, NobtreeOptions};

fn kit(gates: &[&'static str]) -> Kit<Nobtree> {
    chaos_on(36);
    let mut opts = NobtreeOptions { height: 2, ..Default::default() };
    opts.migration.sample_every = 1;
    opts.migration.hot_threshold = 2;
    opts.migration.remote_share = 0.0;
    opts.migration.cooldown = 0;
    let mut kit = Kit::new(opts);
    kit.gates = gates.to_vec();
    kit
}

#[test]
fn concurrent_shared_chaos() {
    kit(&["migrations", "leaf_migrations"]).concurrent_shared().unwrap();
}

#[test]
fn scans_chaos() {
    kit(&[]).scans().unwrap();
}

#[test]
fn crash_shadow_chaos() {
    kit(&["migrations", "leaf_migrations", "splits"]).crash_shadow().unwrap();
}
