//! Forced schedules of Nap's switch (pause points listed in the crate docs).

mod common;

use std::sync::Arc;

use numakv_fastfair::FastFair;
use numakv_index::{Engine, Index};
use numakv_nap::{phase, Nap};
use numakv_pmem::failpoint::{Pause, Scenario};
use numakv_pmem::{Pool, PoolConfig};

type N = Nap<FastFair>;

/// Waits until a switch has published its NAL and waits for grace period 1; on a timeout the
/// parked thread is released first, so the failing test does not hang on its scope.
fn wait_for_grace_period_1(e: &N, pause: &Pause) {
    let t0 = std::time::Instant::now();
    while e.switch_phase() != phase::FLUSH {
        if t0.elapsed().as_secs() >= 20 {
            pause.release();
            panic!("the switch never reached its grace period");
        }
        std::thread::yield_now();
    }
}

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
        wait_for_grace_period_1(e, &pause);
        // Not yet acknowledged: either value is right here.
        let early = e.get(5);
        pause.release(); // before asserting: a failure must not strand the parked writer
        let early = early.expect("get");
        assert!(matches!(early, Some(1) | Some(2)), "get during the switch: {early:?}");
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

/// docs/design.md "Nap", our addition: writes into a new NAL wait for its first grace period.
/// A type-① writer (its snapshot predates the NAL) is parked just before inserting a key into the
/// raw index while a switch installs a NAL over that key. A type-② insert of the same key must
/// wait until the parked insert is done and then see it (return `false`): had it written the NAL
/// at once, both inserts would return `true` and the raw one would be lost.
#[test]
fn a_write_into_a_new_nal_waits_for_a_writer_that_has_not_seen_it() {
    let sc = Scenario::setup();
    let e = N::create(pool(), &common::manual_options()).expect("create");
    let pause = sc.pause_thread("nap.write.raw_routed", "old-snapshot");
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|t| {
        let e = &e;
        let first = std::thread::Builder::new()
            .name("old-snapshot".into())
            .spawn_scoped(t, move || e.insert(9, 1).expect("first insert"))
            .expect("spawn");
        pause.wait_parked();
        let switch = t.spawn(move || e.switch_to(&[9]).expect("switch"));
        wait_for_grace_period_1(e, &pause);
        let done = &done;
        let second = t.spawn(move || {
            let r = e.insert(9, 2).expect("second insert");
            done.store(true, std::sync::atomic::Ordering::SeqCst);
            r
        });
        std::thread::sleep(std::time::Duration::from_millis(50));
        let finished_early = done.load(std::sync::atomic::Ordering::SeqCst);
        // Released before asserting: a failed assertion must not leave the scope waiting for a
        // parked thread.
        pause.release();
        assert!(
            !finished_early,
            "an insert into the new NAL finished while a writer that has not seen it was parked"
        );
        assert!(first.join().expect("first"), "the first insert found the key present");
        assert!(!second.join().expect("second"), "both inserts of key 9 returned true");
        switch.join().expect("switch thread");
    });
    assert_eq!(e.get(9).expect("get"), Some(1));
    e.switch_to(&[]).expect("switch back");
    assert_eq!(e.get(9).expect("get"), Some(1));
    e.check().expect("check");
}
