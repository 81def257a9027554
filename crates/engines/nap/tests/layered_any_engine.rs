//! Nap is a black box over any engine (papers/nap.txt §3): Nap over NOBtree, NStore and F3-tree,
//! with the hot set moving, through the kit's differential model (ADR and eADR), its concurrent
//! linearizability check and ADR power failures with recovery. (Nap<FastFair> and Nap<NbTree>
//! run the whole kit in `conformance.rs` and `conformance_nbtree.rs`.)

mod common;

use numakv_f3tree::F3Tree;
use numakv_index::pmem::PersistMode;
use numakv_index::testkit::Kit;
use numakv_nap::{Inner, Nap, NapOptions};
use numakv_nobtree::Nobtree;
use numakv_nstore::{NStore, NStoreOptions};

fn kit_run<I: Inner>(inner: I::Options) {
    let kit =
        || Kit::<Nap<I>>::new(NapOptions { inner: inner.clone(), ..common::moving_options() });
    kit().differential(PersistMode::Adr).unwrap();
    kit().differential(PersistMode::Eadr).unwrap();
    kit().concurrent_shared().unwrap();
    kit().crash_shadow().unwrap();
}

#[test]
fn nap_over_nobtree() {
    kit_run::<Nobtree>(Default::default());
}

#[test]
fn nap_over_nstore() {
    // Small log files and few clusters (as NStore's own kit): the kit's pools are small.
    let inner = NStoreOptions {
        clusters: 8,
        log_file_size: 256 << 10,
        gc_interval: std::time::Duration::from_millis(1),
        ..Default::default()
    };
    kit_run::<NStore>(inner);
}

#[test]
fn nap_over_f3tree() {
    kit_run::<F3Tree>(Default::default());
}
