//! Concurrent growth and shrinkage on shared keys: writers insert, upsert, update and remove
//! while the tree grows by splits and shrinks again by leaf merges, internal merges and root
//! shrinks (also racing root splits); a reader and a scanner run throughout. Stable keys (never
//! written after the start) must always be found with their own values, by gets and by every
//! scan that covers them; every value read names its key; scans ascend strictly; the final
//! structure checks and agrees with point reads.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};

use common::{scaled, Rng};
use numakv_fastfair::FastFair;
use numakv_index::Index;

/// Value written by thread `th` for key `k`, sequence `i`: the key in the high bits.
fn val(k: u64, th: u64, i: u64) -> u64 {
    (k << 24) | (th << 20) | (i & 0xf_ffff)
}

/// The value of a stable key.
fn stable_val(k: u64) -> u64 {
    (k << 24) | 0xff_ffff
}

/// Gets of random keys: stable keys present with their value, others absent or naming the key.
fn reader(t: &FastFair, space: u64, stable: impl Fn(u64) -> bool, done: &AtomicBool, seed: u64) {
    let mut rng = Rng(seed);
    let mut n = 0u64;
    while !done.load(Ordering::Acquire) || n < 1000 {
        let k = 1 + rng.below(space);
        match t.get(k).unwrap() {
            Some(v) if stable(k) => assert_eq!(v, stable_val(k), "stable key {k}: wrong value"),
            Some(v) => assert_eq!(v >> 24, k, "key {k} read a foreign value {v:#x}"),
            None => assert!(!stable(k), "stable key {k} missed"),
        }
        n += 1;
    }
}

/// Scans from random keys: strictly ascending, values naming their keys, and every stable key
/// of the covered range returned (it is present for the whole scan).
fn scanner(t: &FastFair, space: u64, stable: impl Fn(u64) -> bool, done: &AtomicBool, seed: u64) {
    let mut rng = Rng(seed);
    let mut out = Vec::new();
    let mut n = 0u64;
    while !done.load(Ordering::Acquire) || n < 200 {
        let start = 1 + rng.below(space);
        let max = 1 + rng.below(96) as usize;
        out.clear();
        t.scan(start, max, &mut out).unwrap();
        for w in out.windows(2) {
            assert!(w[0].0 < w[1].0, "scan from {start} not strictly ascending: {w:?}");
        }
        assert!(out.iter().all(|&(k, v)| k >= start && v >> 24 == k), "scan from {start}");
        let end = if out.len() < max { space } else { out.last().unwrap().0 };
        let mut got = out.iter().map(|e| e.0).peekable();
        for k in (start..=end).filter(|&k| stable(k)) {
            while got.next_if(|&g| g < k).is_some() {}
            assert_eq!(got.peek(), Some(&k), "scan from {start} (max {max}) missed stable key {k}");
        }
        n += 1;
    }
}

fn final_check(t: &FastFair, stable: impl Fn(u64) -> bool, space: u64) {
    let r = t.check().unwrap();
    let all = common::contents(t);
    assert_eq!(r.entries, all.len() as u64);
    for (k, v) in &all {
        assert_eq!(t.get(*k).unwrap(), Some(*v));
    }
    for k in (1..=space).filter(|&k| stable(k)) {
        assert_eq!(all.get(&k), Some(&stable_val(k)), "stable key {k} lost");
    }
}

/// Three writers grow the tree over a shared key space, then sweep it with removes (while still
/// inserting a little), six times; internal merges and root shrinks happen under concurrent
/// splits, gets and scans.
#[test]
fn grow_and_shrink_under_readers() {
    const SPACE: u64 = 12_000;
    const WRITERS: u64 = 3;
    let stable = |k: u64| k % 499 == 0;
    let t = Arc::new(common::volatile(256));
    for k in (1..=SPACE).filter(|&k| stable(k)) {
        t.insert(k, stable_val(k)).unwrap();
    }
    let done = AtomicBool::new(false);
    let barrier = Barrier::new(WRITERS as usize);
    let cycles = scaled(6) as u64;
    std::thread::scope(|s| {
        let writers: Vec<_> = (0..WRITERS)
            .map(|th| {
                let (t, barrier) = (Arc::clone(&t), &barrier);
                s.spawn(move || {
                    let mut rng = Rng(0x5eed + th);
                    let mut i = 0u64;
                    for _ in 0..cycles {
                        // Grow: mostly inserts of random shared keys.
                        for _ in 0..8000 {
                            i += 1;
                            let k = 1 + rng.below(SPACE);
                            if stable(k) {
                                continue;
                            }
                            match rng.below(10) {
                                0..=5 => {
                                    t.insert(k, val(k, th, i)).unwrap();
                                }
                                6 => t.upsert(k, val(k, th, i)).unwrap(),
                                7 => {
                                    t.update(k, val(k, th, i)).unwrap();
                                }
                                _ => {
                                    t.remove(k).unwrap();
                                }
                            }
                        }
                        barrier.wait();
                        // Shrink: sweep this writer's residue class with removes, re-inserting
                        // a few random keys behind the sweep.
                        let start = rng.below(SPACE);
                        for j in 0..SPACE {
                            let k = 1 + (start + j) % SPACE;
                            if k % WRITERS != th || stable(k) {
                                continue;
                            }
                            i += 1;
                            t.remove(k).unwrap();
                            if rng.below(200) == 0 {
                                let k = 1 + rng.below(SPACE);
                                if !stable(k) {
                                    t.upsert(k, val(k, th, i)).unwrap();
                                }
                            }
                        }
                        barrier.wait();
                    }
                })
            })
            .collect();
        let (t1, t2, done1, done2) = (Arc::clone(&t), Arc::clone(&t), &done, &done);
        let r = s.spawn(move || reader(&t1, SPACE, stable, done1, 1));
        let sc = s.spawn(move || scanner(&t2, SPACE, stable, done2, 2));
        for w in writers {
            w.join().unwrap();
        }
        done.store(true, Ordering::Release);
        r.join().unwrap();
        sc.join().unwrap();
    });
    final_check(&t, stable, SPACE);
    let st = t.stats();
    eprintln!("{st:?}");
    for c in ["internal_merges", "root_shrinks", "root_splits"] {
        assert!(st.counter(c).unwrap() > 0, "no {c}: {st:?}");
    }
}

/// A tree oscillating around the height at which its root splits and shrinks: four unsynchronized
/// threads each insert their keys and remove them again, so root splits, root shrinks and
/// internal merges race each other, under a reader of the stable keys.
#[test]
fn root_split_and_shrink_race() {
    const SPACE: u64 = 400;
    let stable = |k: u64| k % 50 == 0;
    let t = Arc::new(common::volatile(256));
    for k in (1..=SPACE).filter(|&k| stable(k)) {
        t.insert(k, stable_val(k)).unwrap();
    }
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        let writers: Vec<_> = (0..4u64)
            .map(|th| {
                let t = Arc::clone(&t);
                s.spawn(move || {
                    let mut rng = Rng(0x7007 + th);
                    let mine: Vec<u64> =
                        (1..=SPACE).filter(|&k| k % 4 == th && !stable(k)).collect();
                    for round in 0..scaled(60) as u64 {
                        let off = rng.below(mine.len() as u64) as usize;
                        for j in 0..mine.len() {
                            let k = mine[(off + j) % mine.len()];
                            assert!(t.insert(k, val(k, th, round)).unwrap(), "own key {k}");
                        }
                        for j in 0..mine.len() {
                            let k = mine[(off + j * 7) % mine.len()];
                            assert_eq!(t.get(k).unwrap(), Some(val(k, th, round)), "own key {k}");
                        }
                        for j in 0..mine.len() {
                            let k = mine[(off + j) % mine.len()];
                            assert!(t.remove(k).unwrap(), "own key {k} not removed");
                        }
                    }
                })
            })
            .collect();
        let (t1, t2, done1, done2) = (Arc::clone(&t), Arc::clone(&t), &done, &done);
        let r = s.spawn(move || reader(&t1, SPACE, stable, done1, 3));
        let sc = s.spawn(move || scanner(&t2, SPACE, stable, done2, 4));
        for w in writers {
            w.join().unwrap();
        }
        done.store(true, Ordering::Release);
        r.join().unwrap();
        sc.join().unwrap();
    });
    final_check(&t, stable, SPACE);
    let st = t.stats();
    eprintln!("{st:?}");
    assert_eq!(t.check().unwrap().entries, (1..=SPACE).filter(|&k| stable(k)).count() as u64);
    assert!(st.counter("root_shrinks").unwrap() >= 5, "{st:?}");
    assert!(st.counter("root_splits").unwrap() >= 5, "{st:?}");
}
