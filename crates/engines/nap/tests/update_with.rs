//! `Index::update_with` through Nap (issue 36): forwarded to the raw engine's for keys outside
//! the NALs (FAST&FAIR's: one descent under its leaf lock, where the default took a `get` and an
//! `upsert`, two descents), and done under the GV entry's write lock for keys of the current
//! NAL; it waits like a write for a NAL not yet writable or a key only in the previous NAL.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};

use numakv_fastfair::FastFair;
use numakv_index::testkit::scenario::check_update_with_semantics;
use numakv_index::{Engine, Index};
use numakv_nap::Nap;
use numakv_pmem::{Pool, PoolConfig};

type N = Nap<FastFair>;

fn nap() -> N {
    let mut cfg = PoolConfig::new(N::engine_id(), 64 << 20);
    cfg.nodes = 2;
    N::create(Pool::volatile(cfg).expect("pool"), &common::manual_options()).expect("create")
}

#[test]
fn semantics_outside_and_inside_the_nal() {
    check_update_with_semantics(&nap());
    // The same with the keys it touches (20, 21, 40) and others in the NAL, lazily resolved.
    let e = nap();
    e.switch_to(&[2, 20, 21, 40, 100]).expect("switch");
    check_update_with_semantics(&e);
    assert_eq!(e.hot_keys(), vec![2, 20, 21, 40, 100]);
}

/// Three threads increment one key through `update_with` while a side thread moves the key
/// in and out of the NAL (and others with it). No increment may be lost: the default
/// (`get` then `upsert`, no exclusion) loses them; the forwarded one excludes the key's other
/// writers in whichever place holds the key, and a switch waits for it (grace period 1).
#[test]
fn increments_are_not_lost_across_switches() {
    let e = nap();
    e.upsert(5_000, 0).expect("upsert");
    let per = 5_000u64;
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let (e, stop) = (&e, &stop);
        s.spawn(move || {
            let sets: [&[u64]; 4] = [&[5_000], &[], &[7, 5_000, 9_000], &[7]];
            let mut i = 0;
            // ORDERING: Relaxed; only ends the loop.
            while !stop.load(Ordering::Relaxed) {
                e.switch_to(sets[i % sets.len()]).expect("switch");
                i += 1;
            }
        });
        let workers: Vec<_> = (0..3)
            .map(|_| {
                s.spawn(move || {
                    for _ in 0..per {
                        e.update_with(5_000, &mut |v| Ok(Some(v + 1))).expect("update_with");
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().expect("worker");
        }
        stop.store(true, Ordering::Relaxed);
    });
    assert_eq!(e.get(5_000).expect("get"), Some(3 * per));
    e.check().expect("check");
}
