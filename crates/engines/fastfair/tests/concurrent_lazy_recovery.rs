//! Operations from several threads while the background recovery of a lazy open walks the
//! tree and collects NSM's garbage: inserts that split nodes (allocating from new pages),
//! removes that merge nodes (retiring nodes that were allocated before the crash, some before
//! the walk reached them), gets and scans. Every thread's results are exact, and after a clean
//! close and another open the reachable blocks equal the allocated ones and no block is on a
//! free list twice (no leak, no double free).

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Barrier;

use common::{crashed_store, reopen, resolve, scrambled, verify_recovered, Rng};
use numakv_index::{Engine, Index};
use numakv_pmem::alloc::epoch;
use numakv_pmem::SimMode;

const WORKERS: u64 = 3;

/// Worker `w`'s operations on the keys `≡ w (mod WORKERS)` of `mine`, checked against it.
fn work(t: &dyn Index, w: u64, mine: &mut BTreeMap<u64, u64>, ops: u64, seed: u64) {
    let mut rng = Rng(seed);
    for i in 0..ops {
        let k = scrambled(rng.below(12_000)) / WORKERS * WORKERS + w;
        let v = rng.next();
        match rng.below(10) {
            0..=3 => assert_eq!(t.remove(k).unwrap(), mine.remove(&k).is_some(), "remove {k}"),
            4..=6 => {
                let fresh = !mine.contains_key(&k);
                assert_eq!(t.insert(k, v).unwrap(), fresh, "insert {k}");
                mine.entry(k).or_insert(v);
            }
            7 => {
                t.upsert(k, v).unwrap();
                mine.insert(k, v);
            }
            8 => {
                let present = mine.contains_key(&k);
                assert_eq!(t.update(k, v).unwrap(), present, "update {k}");
                if present {
                    mine.insert(k, v);
                }
            }
            _ => assert_eq!(t.get(k).unwrap(), mine.get(&k).copied(), "get {k} (op {i})"),
        }
    }
}

#[test]
fn operations_run_while_the_background_recovery_collects() {
    let scans = AtomicU64::new(0);
    for round in 0..3u64 {
        let d = common::scratch();
        let (mut model, pending) = crashed_store(d.path(), 256, 7 + round, 12_000);
        // Pinned from before the open until the workers' first phase is over: the collection
        // waits for every pin older than its start (each unlink it must know of is announced
        // before an unpin), so that phase certainly runs while the collection is pending.
        let hold = epoch::pin();
        let (tree, rep) = reopen(d.path(), SimMode::Shadow);
        assert!(rep.counters.contains(&("deferred", 1)));
        resolve(&tree, &mut model, pending);

        let mut parts: Vec<BTreeMap<u64, u64>> = (0..WORKERS)
            .map(|w| model.iter().filter(|e| e.0 % WORKERS == w).map(|(&k, &v)| (k, v)).collect())
            .collect();
        let done = AtomicBool::new(false);
        let phase = Barrier::new(WORKERS as usize + 1);
        let t = &tree;
        let phase = &phase;
        std::thread::scope(|s| {
            let workers: Vec<_> = parts
                .iter_mut()
                .enumerate()
                .map(|(w, mine)| {
                    let w = w as u64;
                    s.spawn(move || {
                        work(t, w, mine, 1_500, round * 100 + w + 1);
                        assert!(t.recovery_pending(), "collected under a pinned thread");
                        phase.wait();
                        work(t, w, mine, 1_500, round * 100 + w + 51);
                    })
                })
                .collect();
            s.spawn(|| {
                let mut out = Vec::new();
                // ORDERING: Relaxed; `done` only ends the loop.
                while !done.load(Ordering::Relaxed) {
                    out.clear();
                    t.scan(0, usize::MAX, &mut out).unwrap();
                    assert!(out.windows(2).all(|w| w[0].0 < w[1].0), "scan not ascending");
                    scans.fetch_add(1, Ordering::Relaxed);
                }
            });
            phase.wait();
            drop(hold);
            let results: Vec<_> = workers.into_iter().map(|h| h.join()).collect();
            done.store(true, Ordering::Relaxed); // before a worker's panic propagates
            for r in results {
                if let Err(panic) = r {
                    std::panic::resume_unwind(panic);
                }
            }
        });
        let model: BTreeMap<u64, u64> = parts.into_iter().flatten().collect();
        common::check_contents(&tree, &model, None);
        let r = tree.check().unwrap(); // waits for the background pass
        assert!(r.reachable_blocks <= r.allocated_blocks, "{r:?}");
        let stats = tree.stats();
        assert!(stats.counter("merges").unwrap() > 0 && stats.counter("splits").unwrap() > 0);

        // Merged-away nodes may still await their grace period: after a clean close, the next
        // recovery's collection is exact.
        tree.close().unwrap();
        let (tree, rep) = reopen(d.path(), SimMode::Shadow);
        assert!(rep.was_clean);
        verify_recovered(&tree, &model, None);
        tree.close().unwrap();
    }
    assert!(scans.load(Ordering::Relaxed) > 0);
}
