//! The shared-key linearizability oracle with hot sets that move (issue 36): the kit's
//! `concurrent_shared` with the churning options installed one NAL over all 48 keys and never
//! switched again, so lazy resolution from a previous NAL, writes waiting on it, scans merging
//! it and grace period 2 never met the cross-thread check. Here the hot set is 8 of the keys
//! (the background thread switches every few milliseconds), and a side thread switches to
//! random key sets meanwhile; coverage is asserted from Nap's own counters.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};

use common::{moving_options, shared_keys_linearizable};
use numakv_fastfair::FastFair;
use numakv_index::testkit::scenario::Rng;
use numakv_index::testkit::{seed, Kit};
use numakv_index::{Engine, Index};
use numakv_nap::Nap;
use numakv_pmem::crash::test_scale;
use numakv_pmem::{Pool, PoolConfig};

type N = Nap<FastFair>;

fn counter(e: &N, name: &str) -> u64 {
    e.stats().counters.iter().find(|c| c.0 == name).map(|c| c.1).expect(name)
}

/// The kit's own oracle with the moving hot set (the kit owns the store; the test below
/// asserts the coverage on one it holds).
#[test]
fn kit_concurrent_shared_with_a_moving_hot_set() {
    Kit::<N>::new(moving_options()).concurrent_shared().unwrap();
}

/// 4 threads on shared keys with the background switch thread following the moving top 8 and
/// a side thread switching to random sets of 1–16 keys (empty now and then). At scale 1 at
/// least 3 switches must have run with a previous NAL installed.
#[test]
fn shared_keys_with_moving_hot_sets() {
    let scale = test_scale();
    let keys = 64 * scale as u64;
    let mut cfg = PoolConfig::new(N::engine_id(), 64 << 20);
    cfg.nodes = 2;
    let e = N::create(Pool::volatile(cfg).unwrap(), &moving_options()).unwrap();
    let s = seed();
    let side = |stop: &AtomicBool| {
        let mut rng = Rng(s | 1);
        // ORDERING: Acquire; pairs with the Release that ends the workers' phase.
        while !stop.load(Ordering::Acquire) {
            let n = rng.below(17);
            let set: Vec<u64> = (0..n).map(|_| rng.below(keys) + 1).collect();
            e.switch_to(&set).unwrap();
        }
    };
    shared_keys_linearizable(&e, 2, keys, 4000 * scale, s, side);
    let line = format!(
        "switches {}, with a previous NAL {}, background decisions' errors {}, blocked writes {}",
        counter(&e, "nap_switches"),
        counter(&e, "nap_switches_with_previous"),
        counter(&e, "nap_switch_errors"),
        counter(&e, "nap_blocked_writes"),
    );
    eprintln!("{line}");
    assert!(counter(&e, "nap_switches_with_previous") >= 3, "{line}");
    assert_eq!(counter(&e, "nap_switch_errors"), 0, "{line}");
}
