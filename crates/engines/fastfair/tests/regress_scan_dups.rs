//! Regression (original: range scans returning duplicated or unsorted keys under concurrency):
//! scanners run while writers shift, split and merge the same leaves. Every scan must be
//! strictly ascending, pair every key with its own value, and contain every stable key of the
//! range it covered.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use common::{scaled, vk, Rng};
use numakv_index::Index;

#[test]
fn scans_under_shifts_splits_and_merges() {
    let t = Arc::new(common::volatile(256));
    const SPACE: u64 = 4000;
    for k in (8..SPACE).step_by(8) {
        t.insert(k, vk(k)).unwrap();
    }
    let done = AtomicBool::new(false);
    let scans = std::sync::atomic::AtomicU64::new(0);
    std::thread::scope(|s| {
        for w in 0..2u64 {
            let t = Arc::clone(&t);
            let done = &done;
            s.spawn(move || {
                let mut rng = Rng(0x5eed + w);
                for _ in 0..scaled(60_000) {
                    let k = 1 + rng.below(SPACE);
                    if k % 8 == 0 {
                        continue;
                    }
                    // Bursts in one region so that leaves fill, split, drain and merge.
                    if rng.below(2) == 0 {
                        t.insert(k, vk(k)).unwrap();
                    } else {
                        t.remove(k).unwrap();
                    }
                }
                done.store(true, Ordering::Release);
            });
        }
        for r in 0..2u64 {
            let t = Arc::clone(&t);
            let (done, scans) = (&done, &scans);
            s.spawn(move || {
                let mut rng = Rng(0xca11 + r);
                let mut out = Vec::new();
                while !done.load(Ordering::Acquire) {
                    let start = rng.below(SPACE);
                    let max = 1 + rng.below(300) as usize;
                    out.clear();
                    let n = t.scan(start, max, &mut out).unwrap();
                    assert_eq!(n, out.len());
                    assert!(n <= max);
                    for w in out.windows(2) {
                        assert!(w[0].0 < w[1].0, "duplicate or unsorted keys: {w:?}");
                    }
                    for &(k, v) in &out {
                        assert!(k >= start && v == vk(k), "bad pair ({k}, {v:#x}) from {start}");
                    }
                    let end = if n == max { out[n - 1].0 } else { SPACE };
                    let mut want = start.div_ceil(8).max(1) * 8;
                    let mut it = out.iter().filter(|e| e.0 % 8 == 0);
                    while want <= end && want < SPACE {
                        assert_eq!(it.next().map(|e| e.0), Some(want), "stable key missing");
                        want += 8;
                    }
                    scans.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
    });
    assert!(scans.load(Ordering::Relaxed) > 10);
    t.check().unwrap();
    let st = t.stats();
    assert!(st.counter("splits").unwrap() > 0 && st.counter("merges").unwrap() > 0, "{st:?}");
}
