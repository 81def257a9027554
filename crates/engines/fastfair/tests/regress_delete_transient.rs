//! Regression (original: deletes that do not tolerate transient duplicates): while a writer
//! deletes and re-inserts neighbours (left and right shifts, direction switches, merges and
//! splits), readers must always find the stable keys with their own values and never see a
//! deleted key with a wrong value; and a crash at any point of a run of deletes recovers.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use common::{crash_round, scaled, vk, Op, Rng};
use numakv_index::Index;
use numakv_pmem::{CrashOptions, PersistMode};

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
    let mut reps = Vec::new();
    let mut fence = 1;
    while let Some(r) = crash_round(PersistMode::Adr, 256, &pre, &ops, fence, CrashOptions::STRICT)
    {
        reps.push(r);
        reps.extend(crash_round(
            PersistMode::Adr,
            256,
            &pre,
            &ops,
            fence,
            CrashOptions::random(fence),
        ));
        fence += 3;
    }
    assert!(reps.len() > 20, "{} rounds", reps.len());
    assert!(common::counter_sum(&reps, "slots_repaired") > 0, "no crash left a transient slot");
}
