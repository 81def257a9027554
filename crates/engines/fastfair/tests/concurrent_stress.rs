//! Four threads on one shared key space, mixed operations and scans; every value read names
//! its key, scans ascend strictly, and the final structure checks and agrees with point reads.

mod common;

use std::sync::Arc;

use common::{scaled, Rng};
use numakv_index::Index;

/// Value written by thread `th` for key `k`, sequence `i`: the key in the high bits.
fn val(k: u64, th: u64, i: u64) -> u64 {
    (k << 24) | (th << 20) | (i & 0xf_ffff)
}

#[test]
fn mixed_ops_shared_keys() {
    let t = Arc::new(common::volatile(512));
    const SPACE: u64 = 5000;
    std::thread::scope(|s| {
        for th in 0..4u64 {
            let t = Arc::clone(&t);
            s.spawn(move || {
                let mut rng = Rng(0xabc + th);
                let mut out = Vec::new();
                for i in 0..scaled(40_000) as u64 {
                    let k = 1 + rng.below(SPACE);
                    match rng.below(10) {
                        0 | 1 => {
                            t.insert(k, val(k, th, i)).unwrap();
                        }
                        2 => t.upsert(k, val(k, th, i)).unwrap(),
                        3 => {
                            t.update(k, val(k, th, i)).unwrap();
                        }
                        4 | 5 => {
                            t.remove(k).unwrap();
                        }
                        6 | 7 => {
                            if let Some(v) = t.get(k).unwrap() {
                                assert_eq!(v >> 24, k, "key {k} read a foreign value");
                            }
                        }
                        _ => {
                            out.clear();
                            t.scan(k, 1 + rng.below(64) as usize, &mut out).unwrap();
                            for w in out.windows(2) {
                                assert!(w[0].0 < w[1].0);
                            }
                            assert!(out.iter().all(|&(a, v)| a >= k && v >> 24 == a));
                        }
                    }
                }
            });
        }
    });
    let r = t.check().unwrap();
    let all = common::contents(&*t);
    assert_eq!(r.entries, all.len() as u64);
    for (k, v) in all {
        assert_eq!(t.get(k).unwrap(), Some(v));
    }
}
