//! The global-lock switch mode (the contrast of papers/nap.txt §6.5, Fig. 15): while a switch
//! runs no operation completes, whereas the three-phase switch keeps operations running; and
//! the global-lock mode keeps every value (the kit's shared-key concurrency test and the
//! differential test with the switch thread churning).

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use numakv_fastfair::FastFair;
use numakv_index::pmem::PersistMode;
use numakv_index::testkit::Kit;
use numakv_index::{Engine, Index};
use numakv_nap::{phase, Nap, NapOptions, PhaseHook, SwitchMode};
use numakv_pmem::{numa, Pool, PoolConfig};

type N = Nap<FastFair>;

/// A 2-node volatile Nap<FastFair> holding keys 1..=1000, with NAL 1..=100 installed.
fn loaded(opts: &NapOptions<numakv_fastfair::FastFairOptions>) -> N {
    let mut cfg = PoolConfig::new(N::engine_id(), 32 << 20);
    cfg.nodes = 2;
    let e = N::create(Pool::volatile(cfg).unwrap(), opts).unwrap();
    for k in 1..=1_000u64 {
        e.insert(k, k).unwrap();
    }
    e.switch_to(&(1..=100).collect::<Vec<_>>()).unwrap();
    e
}

/// Operations completed during the flush proper (issue 36: the measured sleep used to sit
/// before grace period 1, with nothing written in the old NAL, and only keys outside both NALs
/// were read). The hook sleeps 60 ms at the second `FLUSH` entry of the measured switch — after
/// grace period 1, right before the old NAL's 100 written entries go into the raw index (in the
/// global-lock mode the same point, with operations blocked). A thread meanwhile counts, by
/// class: reads of keys only in the old NAL (`pre`'s values), reads and writes of keys of the
/// new NAL (writable after grace period 1), reads of keys in neither.
fn ops_during_flush(mode: SwitchMode) -> [u64; 3] {
    let done = Arc::new([AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)]);
    let during = Arc::new(Mutex::new(None::<[u64; 3]>));
    // Armed only for the measured switch (the setup switch enters the flush phase too).
    let armed = Arc::new(AtomicU64::new(0));
    let snap = |d: &[AtomicU64; 3]| [0, 1, 2].map(|i| d[i].load(Ordering::SeqCst));
    let hook = {
        let (done, during, armed) = (Arc::clone(&done), Arc::clone(&during), Arc::clone(&armed));
        PhaseHook(Some(Arc::new(move |p| {
            // 1: armed; the first FLUSH entry is before grace period 1, the second before the
            // flush of the old NAL.
            if p == phase::FLUSH && armed.load(Ordering::SeqCst) > 0 {
                if armed.fetch_add(1, Ordering::SeqCst) != 2 {
                    return;
                }
                let before = snap(&done);
                std::thread::sleep(Duration::from_millis(60));
                let after = snap(&done);
                *during.lock().unwrap() = Some([0, 1, 2].map(|i| after[i] - before[i]));
            }
        })))
    };
    let opts = NapOptions { switch_mode: mode, phase_hook: hook, ..common::manual_options() };
    let e = loaded(&opts);
    // The old NAL's entries are written: its flush has 100 raw-index writes to make.
    for k in 1..=100u64 {
        e.upsert(k, k + 1000).unwrap();
    }
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let (e, stop, done) = (&e, &stop, &done);
        s.spawn(move || {
            numa::set_current_node(1);
            let mut k = 0u64;
            while !stop.load(Ordering::Relaxed) {
                k = k % 1_000 + 1;
                let class = match k {
                    1..=100 => {
                        assert_eq!(e.get(k).unwrap(), Some(k + 1000), "old NAL key {k}");
                        0
                    }
                    101..=200 => {
                        e.upsert(k, k).unwrap();
                        assert_eq!(e.get(k).unwrap(), Some(k), "new NAL key {k}");
                        1
                    }
                    _ => {
                        assert_eq!(e.get(k).unwrap(), Some(k));
                        2
                    }
                };
                done[class].fetch_add(1, Ordering::SeqCst);
            }
        });
        while done[2].load(Ordering::SeqCst) < 1_000 {
            std::thread::yield_now();
        }
        // Old NAL 1..=100 is flushed during this switch (phase 2 runs the hook).
        armed.store(1, Ordering::SeqCst);
        let r = e.switch_to(&(101..=200).collect::<Vec<_>>()).unwrap();
        assert_eq!(r.flushed, 100, "{r:?}");
        stop.store(true, Ordering::Relaxed);
    });
    let n = during.lock().unwrap().expect("the switch never reached the flush of the old NAL");
    e.check().unwrap();
    n
}

#[test]
fn global_lock_blocks_every_operation_during_a_switch() {
    // At most the one operation that returned just before the switch blocked and counted late.
    let n = ops_during_flush(SwitchMode::GlobalLock);
    assert!(
        n.iter().sum::<u64>() <= 1,
        "{n:?} operations completed while a global-lock switch ran"
    );
}

#[test]
fn three_phase_switch_keeps_operations_running() {
    let n = ops_during_flush(SwitchMode::ThreePhase);
    eprintln!(
        "during 60 ms of a three-phase flush: old-NAL reads, new-NAL writes+reads, others: {n:?}"
    );
    assert!(
        n.iter().all(|&c| c >= 10),
        "operations completed in 60 ms of a three-phase flush (old NAL, new NAL, neither): {n:?}"
    );
}

fn churning_global() -> NapOptions<numakv_fastfair::FastFairOptions> {
    NapOptions { switch_mode: SwitchMode::GlobalLock, ..common::moving_options() }
}

#[test]
fn global_lock_mode_passes_the_differential_and_shared_kit() {
    Kit::<N>::new(churning_global()).differential(PersistMode::Adr).unwrap();
    Kit::<N>::new(churning_global()).concurrent_shared().unwrap();
}

/// `stats()` does not wait for a running switch: it reports the NALs as the last switch left
/// them (a monitoring caller once stood still for a whole switch).
#[test]
fn stats_do_not_wait_for_a_running_switch() {
    let (entered, leave) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
    let armed = Arc::new(AtomicBool::new(false));
    let hook = {
        let (entered, leave, armed) =
            (Arc::clone(&entered), Arc::clone(&leave), Arc::clone(&armed));
        PhaseHook(Some(Arc::new(move |p| {
            if p == phase::FLUSH && armed.load(Ordering::SeqCst) {
                entered.store(true, Ordering::SeqCst);
                while !leave.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        })))
    };
    let opts = NapOptions { phase_hook: hook, ..common::manual_options() };
    let e = loaded(&opts);
    let keys = |e: &N| e.stats().counters.iter().find(|c| c.0 == "nap_nal_keys").unwrap().1;
    assert_eq!(keys(&e), 100);
    armed.store(true, Ordering::SeqCst);
    std::thread::scope(|s| {
        let switching = s.spawn(|| e.switch_to(&(101..=300).collect::<Vec<_>>()).unwrap());
        while !entered.load(Ordering::SeqCst) {
            std::thread::yield_now();
        }
        // The switch sits in its flush phase, holding the switch lock, until `leave`.
        let (tx, rx) = std::sync::mpsc::channel();
        let e = &e;
        s.spawn(move || tx.send(keys(e)).unwrap());
        let during = rx.recv_timeout(Duration::from_secs(5));
        leave.store(true, Ordering::SeqCst);
        switching.join().unwrap();
        assert_eq!(during, Ok(100), "stats during the switch: the NALs the last switch left");
    });
    assert_eq!(keys(&e), 200, "after the switch: the new NAL only");
    e.check().unwrap();
}

/// Issue 36: a panic that unwinds through a switch (here the phase hook, standing for a
/// raw-engine panic in the flush) left the global lock's `blocked` flag set: every operation
/// after it waited for good. Now the flag is cleared on the way out, and a previous NAL left
/// installed counts as a stalled switch (its blocked writers get an error, the switch thread
/// or the next switch finishes it).
#[test]
fn a_panic_in_a_switch_does_not_leave_operations_blocked() {
    for mode in [SwitchMode::GlobalLock, SwitchMode::ThreePhase] {
        let armed = Arc::new(AtomicU64::new(0));
        let hook = {
            let armed = Arc::clone(&armed);
            PhaseHook(Some(Arc::new(move |p| {
                // The second FLUSH entry of the armed switch: right before the flush.
                if p == phase::FLUSH && armed.load(Ordering::SeqCst) > 0 {
                    assert!(armed.fetch_add(1, Ordering::SeqCst) != 2, "injected switch panic");
                }
            })))
        };
        let opts = NapOptions { switch_mode: mode, phase_hook: hook, ..common::manual_options() };
        let e = loaded(&opts);
        e.upsert(5, 50).unwrap();
        armed.store(1, Ordering::SeqCst);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            e.switch_to(&(101..=200).collect::<Vec<_>>())
        }));
        assert!(r.is_err(), "{mode:?}: the hook did not panic");
        armed.store(0, Ordering::SeqCst);
        // Operations go on: a lookup, a write outside both NALs; a write of a key only in the
        // previous NAL (1..=100) fails with the stall's error rather than waiting forever.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::scope(|s| {
            let e = &e;
            s.spawn(move || {
                let got = e.get(5).unwrap();
                e.upsert(500, 1).unwrap();
                let pre_only = e.upsert(6, 60);
                let _ = tx.send((got, pre_only.is_err()));
            });
            let r = rx.recv_timeout(Duration::from_secs(10));
            if r.is_err() {
                // Free the stuck thread before failing, so the scope ends.
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    e.switch_to(&[]).ok()
                }));
            }
            let (got, pre_only_failed) = r
                .unwrap_or_else(|_| panic!("{mode:?}: operations blocked after a switch panicked"));
            assert_eq!(got, Some(50), "{mode:?}");
            assert!(pre_only_failed, "{mode:?}: a write of a pre-only key did not fail");
        });
        // The next switch finishes the interrupted one.
        e.switch_to(&[]).unwrap();
        assert_eq!(e.get(5).unwrap(), Some(50));
        e.upsert(6, 60).unwrap();
        e.check().unwrap();
    }
}
