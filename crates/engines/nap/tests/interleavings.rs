//! Forced schedules of Nap's switch (pause points listed in the crate docs).

mod common;

use std::sync::Arc;

use numakv_fastfair::FastFair;
use numakv_index::{Engine, Index};
use numakv_nap::{phase, Nap};
use numakv_pmem::failpoint::Scenario;
use numakv_pmem::{Pool, PoolConfig};

type N = Nap<FastFair>;

fn pool() -> Arc<Pool> {
    Pool::volatile(PoolConfig::new(N::engine_id(), 64 << 20)).expect("pool")
}

/// A switch installs the first NAL (no previous one) while a writer whose snapshot still routes
/// the key to the raw index is parked just before its raw write. A lookup of the key in that
/// window finds the new NAL's entry unresolved: it must read through to the raw index, not cache
/// the raw value as final — the parked writer is about to change it. Once the writer returns
/// (its write acknowledged) and the switch is over, lookups return the written value, and the
/// NAL's later writes build on it.
#[test]
fn lookup_during_the_first_grace_period_does_not_cache_a_value_a_raw_write_replaces() {
    let sc = Scenario::setup();
    let e = N::create(pool(), &common::manual_options()).expect("create");
    e.upsert(5, 1).expect("load");
    let pause = sc.pause("nap.write.raw_routed");
    std::thread::scope(|t| {
        let e = &e;
        let writer = t.spawn(move || e.upsert(5, 2).expect("writer upsert"));
        pause.wait_parked();
        let switch = t.spawn(move || e.switch_to(&[5]).expect("switch"));
        // The switch has published the NAL and now waits for the parked writer's operation.
        let t0 = std::time::Instant::now();
        while e.switch_phase() != phase::FLUSH {
            assert!(t0.elapsed().as_secs() < 20, "the switch never reached its grace period");
            std::thread::yield_now();
        }
        // Not yet acknowledged: either value is right here.
        let early = e.get(5).expect("get");
        assert!(matches!(early, Some(1) | Some(2)), "get during the switch: {early:?}");
        pause.release();
        writer.join().expect("writer");
        switch.join().expect("switch thread");
    });
    assert_eq!(e.hot_keys(), vec![5], "key 5 is in the NAL");
    assert_eq!(e.get(5).expect("get"), Some(2), "the acknowledged raw write was lost");
    // A NAL write that reads the value (update: only if present) builds on the right one.
    assert!(e.update(5, 3).expect("update"));
    e.switch_to(&[]).expect("switch back");
    assert_eq!(e.get(5).expect("get"), Some(3));
    e.check().expect("check");
}
