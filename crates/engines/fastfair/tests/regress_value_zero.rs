//! Regression (original: value 0 treated as absent, pointer comparison for duplicates): values
//! are arbitrary — 0, u64::MAX, and equal values in neighbouring slots — and must be stored,
//! found, scanned, updated and removed like any other, also while lock-free readers race with
//! shifts of those very slots.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use common::{scaled, Rng};
use numakv_index::Index;

#[test]
fn zero_and_max_values_single_thread() {
    let t = common::volatile(256);
    for k in 1..=500u64 {
        assert!(t.insert(k, if k % 3 == 0 { u64::MAX } else { 0 }).unwrap());
    }
    for k in 1..=500u64 {
        assert_eq!(t.get(k).unwrap(), Some(if k % 3 == 0 { u64::MAX } else { 0 }), "key {k}");
        assert!(!t.insert(k, 7).unwrap(), "key {k} with value 0 looked absent");
    }
    let mut out = Vec::new();
    assert_eq!(t.scan(1, 1000, &mut out).unwrap(), 500);
    assert!(out.iter().all(|&(k, v)| v == if k % 3 == 0 { u64::MAX } else { 0 }));
    assert!(t.update(10, 0).unwrap());
    assert_eq!(t.get(10).unwrap(), Some(0));
    assert!(t.remove(10).unwrap());
    assert_eq!(t.get(10).unwrap(), None);
    assert!(!t.remove(10).unwrap());
    assert_eq!(t.check().unwrap().entries, 499);
}

#[test]
fn readers_see_zero_values_during_shifts() {
    let t = Arc::new(common::volatile(256));
    const SPACE: u64 = 3000;
    // Stable keys: multiples of 4, all with value 0 (equal neighbours everywhere).
    for k in (4..SPACE).step_by(4) {
        t.insert(k, 0).unwrap();
    }
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        {
            let t = Arc::clone(&t);
            let done = &done;
            s.spawn(move || {
                let mut rng = Rng(77);
                for _ in 0..scaled(80_000) {
                    let k = 1 + rng.below(SPACE);
                    if k % 4 == 0 {
                        continue;
                    }
                    if rng.below(2) == 0 {
                        t.upsert(k, 0).unwrap();
                    } else {
                        t.remove(k).unwrap();
                    }
                }
                done.store(true, Ordering::Release);
            });
        }
        for r in 0..2 {
            let t = Arc::clone(&t);
            let done = &done;
            s.spawn(move || {
                let mut rng = Rng(99 + r);
                let mut reads = 0u64;
                while !done.load(Ordering::Acquire) || reads < 1000 {
                    let k = 4 * (1 + rng.below(SPACE / 4 - 1));
                    assert_eq!(t.get(k).unwrap(), Some(0), "stable key {k} with value 0 missed");
                    reads += 1;
                }
            });
        }
    });
    t.check().unwrap();
}
