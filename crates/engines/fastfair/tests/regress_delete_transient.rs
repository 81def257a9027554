//! Regression (original: deletes that do not tolerate transient duplicates): while a writer
//! deletes and re-inserts neighbours (left and right shifts, direction switches, merges and
//! splits), readers must always find the stable keys with their own values and never see a
//! deleted key with a wrong value; and a crash at any point of a run of deletes recovers.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use common::{crash_round, scaled, vk, Op, Rng};
use numakv_index::Index;
use numakv_pmem::PersistMode;

#[test]
fn readers_during_delete_bursts() {
    let t = Arc::new(common::volatile(512));
    const SPACE: u64 = 6000;
    for k in 1..SPACE {
        t.insert(k, vk(k)).unwrap();
    }
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        {
            let t = Arc::clone(&t);
            let done = &done;
            s.spawn(move || {
                let mut rng = Rng(3);
                for _ in 0..scaled(40) {
                    // Delete a run of churn keys (left shifts, merges), then re-insert it.
                    let lo = 1 + rng.below(SPACE - 600);
                    let run = || (lo..lo + 600).filter(|&k| k % 16 != 0);
                    for k in run() {
                        t.remove(k).unwrap();
                    }
                    for k in run() {
                        t.insert(k, vk(k)).unwrap();
                    }
                }
                done.store(true, Ordering::Release);
            });
        }
        for r in 0..2 {
            let t = Arc::clone(&t);
            let done = &done;
            s.spawn(move || {
                let mut rng = Rng(11 + r);
                let mut n = 0u64;
                while !done.load(Ordering::Acquire) || n < 1000 {
                    let k = 1 + rng.below(SPACE - 1);
                    match t.get(k).unwrap() {
                        Some(v) => assert_eq!(v, vk(k), "key {k} paired with a foreign value"),
                        None => assert!(k % 16 != 0, "stable key {k} missed"),
                    }
                    n += 1;
                }
            });
        }
    });
    assert_eq!(t.check().unwrap().entries, SPACE - 1);
    assert!(t.stats().counter("merges").unwrap() > 0);
}

#[test]
fn crash_during_deletes() {
    let pre: Vec<Op> = (1..=200u64).map(|k| Op::Insert(k, vk(k))).collect();
    let mut rng = Rng(5);
    let ops: Vec<Op> = (0..80).map(|_| Op::Remove(1 + rng.below(200))).collect();
    let (reps, _) = common::sweep_fences(3, 0, |fence, copts| {
        crash_round(PersistMode::Adr, 256, &pre, &ops, fence, copts)
    });
    assert!(reps.len() > 20, "{} rounds", reps.len());
    assert!(common::counter_sum(&reps, "slots_repaired") > 0, "no crash left a transient slot");
}

/// One big node (4096 bytes, 254 entries): every delete of a small key shifts ~200 entries left
/// under readers looking for the large keys, every re-insert shifts them right again — the
/// window where a reader scanning in the wrong direction would overtake a moving key.
#[test]
fn readers_inside_one_long_shifting_node() {
    let t = Arc::new(common::volatile(4096));
    for k in 1..=220u64 {
        t.insert(k, vk(k)).unwrap();
    }
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        {
            let t = Arc::clone(&t);
            let done = &done;
            s.spawn(move || {
                for _ in 0..scaled(300) {
                    for k in 1..=20u64 {
                        t.remove(k).unwrap();
                    }
                    for k in (1..=20u64).rev() {
                        t.insert(k, vk(k)).unwrap();
                    }
                }
                done.store(true, Ordering::Release);
            });
        }
        let t = Arc::clone(&t);
        let done = &done;
        s.spawn(move || {
            let mut rng = Rng(17);
            while !done.load(Ordering::Acquire) {
                let k = 21 + rng.below(200);
                assert_eq!(t.get(k).unwrap(), Some(vk(k)), "stable key {k} missed in a shift");
            }
        });
    });
    assert_eq!(t.check().unwrap().entries, 220);
    assert_eq!(t.stats().counter("splits").unwrap(), 0, "the test needs a single leaf");
}
