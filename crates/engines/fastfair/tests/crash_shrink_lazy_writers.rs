//! A crash in the middle of a delete-heavy run that takes the tree down (internal merges, the
//! height dropping, root shrinks), then a lazy open while writers keep deleting — emptying the
//! tree, so that roots shrink again while NSM's collection is still pending and the background
//! pass walks levels whose first node dies — then inserting (splits, new roots) and deleting
//! again, with a scanner running throughout. Every writer's results are exact; after the pass,
//! a clean close and another open, the reachable blocks equal the allocated ones and no block is
//! on a free list twice (no leak, no double free).

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};

use common::{
    check_contents, create, model_apply, reopen, resolve, scrambled, tree_apply, verify_recovered,
    vk, Op, Rng,
};
use numakv_index::{Engine, Index};
use numakv_pmem::alloc::epoch;
use numakv_pmem::{CrashOptions, PersistMode, SimMode};

const NS: usize = 256;
const KEYS: u64 = 2_000;
const WORKERS: u64 = 2;

/// Removes every key of `mine` (in a scrambled order), checking each result.
fn drain(t: &dyn Index, mine: &mut BTreeMap<u64, u64>, seed: u64) {
    let mut keys: Vec<u64> = mine.keys().copied().collect();
    let mut rng = Rng(seed);
    for i in (1..keys.len()).rev() {
        keys.swap(i, rng.below(i as u64 + 1) as usize);
    }
    for k in keys {
        assert!(t.remove(k).unwrap(), "remove {k}");
        mine.remove(&k);
        assert_eq!(t.get(k).unwrap(), None, "get {k} after its remove");
    }
}

/// Inserts `n` keys of worker `w` (`≡ w mod WORKERS`), then removes about half of what it holds.
fn refill(t: &dyn Index, w: u64, mine: &mut BTreeMap<u64, u64>, n: u64, seed: u64) {
    let mut rng = Rng(seed);
    for _ in 0..n {
        let k = (scrambled(rng.below(KEYS * 4)) / WORKERS).max(1) * WORKERS + w;
        let fresh = !mine.contains_key(&k);
        assert_eq!(t.insert(k, vk(k)).unwrap(), fresh, "insert {k}");
        mine.entry(k).or_insert(vk(k));
    }
    let keys: Vec<u64> = mine.keys().copied().collect();
    for k in keys {
        if rng.below(2) == 0 {
            assert!(t.remove(k).unwrap(), "remove {k}");
            mine.remove(&k);
        } else {
            assert_eq!(t.get(k).unwrap(), mine.get(&k).copied(), "get {k}");
        }
    }
}

#[test]
fn crash_in_a_shrinking_tree_then_lazy_open_under_deleting_writers() {
    let rounds = 12 * numakv_pmem::crash::test_scale() as u64;
    let scans = AtomicU64::new(0);
    let mut shrinks_after = 0;
    let mut heights = Vec::new();
    for round in 0..rounds {
        let d = common::scratch();
        let t = create(d.path(), PersistMode::Adr, SimMode::Shadow, NS);
        let mut rng = Rng(round * 31 + 5);
        let mut model = BTreeMap::new();
        for i in 0..KEYS {
            let op = Op::Insert(scrambled(i), vk(scrambled(i)));
            tree_apply(&t, &model, op);
            model_apply(&mut model, op);
        }
        let tall = t.stats().counter("height").unwrap();
        assert!(tall >= 3, "height {tall}");
        // Remove in a scrambled order; the crash is armed once only `left` keys remain, to
        // fire a few fences later: late rounds crash while the last levels collapse.
        let left = [400, 120, 40, 12, 5, 2][round as usize % 6];
        let mut order: Vec<u64> = model.keys().copied().collect();
        for i in (1..order.len()).rev() {
            order.swap(i, rng.below(i as u64 + 1) as usize);
        }
        let pool = Arc::clone(Engine::pool(&t));
        let copts = if (round + round / 6) % 2 == 0 {
            CrashOptions::STRICT
        } else {
            CrashOptions::random(round + 1)
        };
        let mut pending = None;
        let mut armed = false;
        let mut ops = order.into_iter().map(Op::Remove).collect::<Vec<_>>().into_iter();
        while !pool.has_crashed() {
            if !armed && model.len() as u64 <= left {
                pool.crash_after_fences(1 + rng.below(12), copts).unwrap();
                armed = true;
            }
            // Past the last remove (the crash not fired yet): insert again, which splits.
            let op = ops.next().unwrap_or_else(|| {
                let k = scrambled(rng.below(KEYS));
                Op::Insert(k, vk(k))
            });
            tree_apply(&t, &model, op);
            if pool.has_crashed() {
                pending = Some(op);
                break;
            }
            model_apply(&mut model, op);
        }
        heights.push((tall, t.stats().counter("height").unwrap()));
        drop(t);
        drop(pool);

        // Pinned from before the open until the writers have emptied the tree: the collection
        // waits for this pin, so the drains (merges at every level, root shrinks, retiring
        // nodes of the crashed session) run while it is pending.
        let hold = epoch::pin();
        let (tree, rep) = reopen(d.path(), SimMode::Shadow);
        assert!(!rep.was_clean);
        assert!(rep.counters.contains(&("deferred", 1)));
        resolve(&tree, &mut model, pending);
        check_contents(&tree, &model, None);

        let mut parts: Vec<BTreeMap<u64, u64>> = (0..WORKERS)
            .map(|w| model.iter().filter(|e| e.0 % WORKERS == w).map(|(&k, &v)| (k, v)).collect())
            .collect();
        let done = AtomicBool::new(false);
        let phase = Barrier::new(WORKERS as usize + 1);
        let (t, phase, scans, stop) = (&tree, &phase, &scans, &done);
        std::thread::scope(|s| {
            let workers: Vec<_> = parts
                .iter_mut()
                .enumerate()
                .map(|(w, mine)| {
                    let w = w as u64;
                    s.spawn(move || {
                        drain(t, mine, round * 100 + w + 1);
                        assert!(t.recovery_pending(), "collected under a pinned thread");
                        phase.wait();
                        refill(t, w, mine, 600, round * 100 + w + 51);
                        drain(t, mine, round * 100 + w + 71);
                        refill(t, w, mine, 300, round * 100 + w + 91);
                    })
                })
                .collect();
            s.spawn(move || {
                let mut out = Vec::new();
                // ORDERING: Relaxed; `done` only ends the loop.
                while !stop.load(Ordering::Relaxed) {
                    out.clear();
                    t.scan(0, usize::MAX, &mut out).unwrap();
                    assert!(out.windows(2).all(|w| w[0].0 < w[1].0), "scan not ascending");
                    assert!(out.iter().all(|&(k, v)| v == vk(k)), "a key with another's value");
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
        check_contents(&tree, &model, None);
        let r = tree.check().unwrap(); // waits for the background pass
        assert!(r.reachable_blocks <= r.allocated_blocks, "{r:?}");
        let bg = tree.wait_recovery().unwrap().expect("a lazy open's report");
        let stats = tree.stats();
        shrinks_after += stats.counter("root_shrinks").unwrap()
            + bg.counters.iter().find(|c| c.0 == "roots_shrunk").map_or(0, |c| c.1);
        assert!(stats.counter("internal_merges").unwrap() > 0, "round {round}: no internal merge");

        // Retired nodes may still await their grace period: after a clean close, the next
        // recovery's collection is exact.
        tree.close().unwrap();
        let (tree, rep) = reopen(d.path(), SimMode::Shadow);
        assert!(rep.was_clean);
        verify_recovered(&tree, &model, None);
        tree.close().unwrap();
    }
    eprintln!(
        "heights before/at the crash: {heights:?}; root shrinks after the crash: {shrinks_after}"
    );
    assert!(heights.iter().any(|&(a, b)| b < a), "no crash fell after the height dropped");
    assert!(shrinks_after >= rounds, "too few root shrinks during lazy recovery");
    assert!(scans.load(Ordering::Relaxed) > 0);
}
