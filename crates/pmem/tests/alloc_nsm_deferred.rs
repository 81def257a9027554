//! NSM's deferred recovery (docs/design.md §9, "Deferred recovery"): open freezes the extents
//! that exist, the engine keeps allocating and freeing, and a later `collect` sweeps the frozen
//! extents — never freeing a reachable block, never freeing a block twice, and safe to crash in.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use numakv_pmem::alloc::nsm::{Nsm, NsmMode};
use numakv_pmem::alloc::PmAllocator;
use numakv_pmem::{CrashOptions, EngineId, OpenConfig, PPtr, Pool, PoolConfig, PoolError, SimMode};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const PAGE: u64 = 64 << 10;

fn engine() -> EngineId {
    EngineId::new("nsm-deferred-test", 1)
}

fn config(sim: SimMode) -> PoolConfig {
    let mut cfg = PoolConfig::new(engine(), 8 << 20);
    cfg.nodes = 2;
    cfg.page_size = PAGE;
    cfg.sim = sim;
    cfg
}

fn reopen(dir: &Path) -> Arc<Pool> {
    Pool::open(dir, OpenConfig { engine: engine(), sim: SimMode::Shadow, topology: None }).unwrap()
}

/// Frees `p`, a block the test allocated (or recovered) from `nsm` and no longer uses.
fn free(nsm: &Nsm, p: PPtr) -> Result<(), PoolError> {
    // SAFETY: NSM validates `p` and rejects non-blocks without touching memory; the tests free
    // each block they own once (a deliberate double free is checked to be refused).
    unsafe { nsm.free(p) }
}

/// A cancel flag nobody sets.
static NO_CANCEL: AtomicBool = AtomicBool::new(false);

/// A store whose NSM holds a mix of small and large blocks, a random third of them reachable,
/// closed by a crash (the free lists are lost). Returns the reachable set.
fn crashed_store(dir: &Path, seed: u64) -> BTreeSet<PPtr> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let pool = Pool::create(dir, config(SimMode::Shadow)).unwrap();
    let nsm = Nsm::new(Arc::clone(&pool), NsmMode::RoundRobin).unwrap();
    let mut reachable = BTreeSet::new();
    for i in 0..800 {
        let size = if i % 97 == 0 { 2 * PAGE as usize } else { [64, 256, 512, 1000][i % 4] };
        let p = nsm.alloc(size).unwrap();
        if rng.gen_bool(0.33) {
            reachable.insert(p);
        }
    }
    pool.crash(CrashOptions::STRICT).unwrap();
    reachable
}

#[test]
fn deferred_collection_keeps_reachable_blocks_and_later_allocations() {
    for seed in 0..3 {
        let dir = tempfile::tempdir().unwrap();
        let reachable = crashed_store(dir.path(), seed);
        let pool = reopen(dir.path());
        let nsm = Nsm::recover_deferred(Arc::clone(&pool), NsmMode::RoundRobin).unwrap();
        assert!(nsm.collection_pending());
        let frozen: BTreeSet<PPtr> = nsm.allocated_blocks().into_iter().collect();
        assert!(frozen.is_superset(&reachable) && frozen.len() > reachable.len());

        // While pending, nothing frozen is handed out.
        let new: Vec<PPtr> = (0..300).map(|i| nsm.alloc([64, 256, 3000][i % 3]).unwrap()).collect();
        assert!(new.iter().all(|p| !frozen.contains(p)), "a frozen block was handed out");

        // A large block the walk reached and that died (extent freed) before the sweep is no
        // error: only pointers into frozen extents must be blocks.
        let gone = nsm.alloc(2 * PAGE as usize).unwrap();
        free(&nsm, gone).unwrap();
        let walked = reachable.iter().copied().chain([gone]);
        let report = nsm.collect(walked, &NO_CANCEL).unwrap().unwrap();
        assert!(!nsm.collection_pending());
        assert_eq!(report.blocks_reachable, reachable.len() as u64);
        assert!(report.pages_freed + report.blocks_free + report.large_freed > 0, "{report:?}");
        let mut want: BTreeSet<PPtr> = reachable.clone();
        want.extend(new.iter().copied());
        assert_eq!(nsm.allocated_blocks().into_iter().collect::<BTreeSet<_>>(), want);
        for node in 0..2 {
            pool.check_heap(node).unwrap();
        }

        // Collected blocks are reused; reachable and live ones never.
        for p in &new {
            free(&nsm, *p).unwrap();
        }
        assert_eq!(nsm.allocated_blocks().into_iter().collect::<BTreeSet<_>>(), reachable);
        let mut seen = BTreeSet::new();
        for i in 0..2000 {
            let p = nsm.alloc([64, 256, 512, 1000][i % 4]).unwrap();
            assert!(!reachable.contains(&p) && seen.insert(p), "block {p} handed out twice");
        }
    }
}

#[test]
fn frees_and_retires_during_a_collection_free_each_block_once() {
    let dir = tempfile::tempdir().unwrap();
    let reachable = crashed_store(dir.path(), 7);
    let pool = reopen(dir.path());
    let nsm = Nsm::recover_deferred(Arc::clone(&pool), NsmMode::RoundRobin).unwrap();
    let r: Vec<PPtr> = reachable.iter().copied().take(6).collect();

    // r0: unlinked and freed during the collection, reached by the walk before it died.
    nsm.retiring(r[0]);
    free(&nsm, r[0]).unwrap();
    // r1: unlinked and freed during the collection, not reached by the walk.
    nsm.retiring(r[1]);
    free(&nsm, r[1]).unwrap();
    // r2: unlinked during the collection, not reached, its free runs after the sweep.
    nsm.retiring(r[2]);
    // r3: unlinked during the collection, reached, its free runs after the sweep.
    nsm.retiring(r[3]);
    // r4: freed without retire (the engine knew nobody could reach it), not reached.
    free(&nsm, r[4]).unwrap();
    // A second free of a frozen block is refused, not recorded twice.
    assert!(matches!(free(&nsm, r[0]), Err(PoolError::BadPointer { .. })));
    nsm.check_free_lists().unwrap();

    let walked = reachable.iter().copied().filter(|p| ![r[1], r[2], r[4]].contains(p));
    nsm.collect(walked, &NO_CANCEL).unwrap().unwrap();
    free(&nsm, r[2]).unwrap();
    free(&nsm, r[3]).unwrap();

    let mut live = reachable.clone();
    for p in &r[..5] {
        live.remove(p);
    }
    assert_eq!(nsm.allocated_blocks().into_iter().collect::<BTreeSet<_>>(), live);
    // Each of r0..r4 is free exactly once: allocation hands each out at most once.
    let mut seen = BTreeSet::new();
    for i in 0..3000 {
        let p = nsm.alloc([64, 256, 512, 1000][i % 4]).unwrap();
        assert!(!live.contains(&p) && seen.insert(p), "block {p} handed out twice");
    }
    for p in &r[..5] {
        if pool.page_info(*p).unwrap().aux != numakv_pmem::alloc::nsm::LARGE {
            assert!(seen.contains(p), "{p} was never freed");
        }
    }
    nsm.check_free_lists().unwrap();
}

#[test]
fn check_free_lists_reports_a_double_free() {
    let pool = Pool::volatile(config(SimMode::Direct)).unwrap();
    let nsm = Nsm::new(pool, NsmMode::Node(0)).unwrap();
    let blocks: Vec<PPtr> = (0..10).map(|_| nsm.alloc(256).unwrap()).collect();
    free(&nsm, blocks[3]).unwrap();
    nsm.check_free_lists().unwrap();
    // NSM cannot refuse a second free of a small block (no per-block metadata), but the check
    // finds it before the block is handed out twice.
    free(&nsm, blocks[3]).unwrap();
    let err = nsm.check_free_lists().unwrap_err();
    assert!(err.to_string().contains("double free"), "{err}");
}

#[test]
fn a_bad_reachable_pointer_or_a_cancel_leaves_the_collection_pending() {
    let dir = tempfile::tempdir().unwrap();
    let reachable = crashed_store(dir.path(), 3);
    let pool = reopen(dir.path());
    let nsm = Nsm::recover_deferred(Arc::clone(&pool), NsmMode::RoundRobin).unwrap();
    let before = nsm.allocated_blocks();
    let bad = reachable.first().unwrap().add(8).unwrap();
    let got = nsm.collect(reachable.iter().copied().chain([bad]), &NO_CANCEL);
    assert!(matches!(got, Err(PoolError::Corrupted { .. })), "{got:?}");
    assert!(nsm.collection_pending());
    assert_eq!(nsm.allocated_blocks(), before);

    let cancel = AtomicBool::new(true);
    let guard = numakv_pmem::alloc::epoch::pin(); // another thread is pinned: the wait would block
    let other = std::thread::scope(|s| {
        s.spawn(|| nsm.collect(reachable.iter().copied(), &cancel).unwrap()).join().unwrap()
    });
    drop(guard);
    assert!(other.is_none());
    assert!(nsm.collection_pending());
    assert_eq!(nsm.allocated_blocks(), before);
    assert!(nsm.collect(reachable.iter().copied(), &NO_CANCEL).unwrap().is_some());
    assert!(matches!(
        nsm.collect(reachable.iter().copied(), &NO_CANCEL),
        Err(PoolError::InvalidArgument(_))
    ));
}

#[test]
fn allocations_and_frees_racing_a_collection_are_exact() {
    for round in 0..4u64 {
        let dir = tempfile::tempdir().unwrap();
        let reachable = crashed_store(dir.path(), 100 + round);
        let pool = reopen(dir.path());
        let nsm = Nsm::recover_deferred(Arc::clone(&pool), NsmMode::RoundRobin).unwrap();
        let all: Vec<PPtr> = reachable.iter().copied().collect();
        // Workers churn new blocks and retire+free disjoint slices of the frozen reachable
        // blocks while the collection runs; the collector "walked" before they started.
        let (dying, kept) = all.split_at(all.len() / 3);
        let kept: BTreeSet<PPtr> = kept.iter().copied().collect();
        let results: Vec<Vec<PPtr>> = std::thread::scope(|s| {
            let workers: Vec<_> = dying
                .chunks(dying.len().div_ceil(3))
                .enumerate()
                .map(|(w, mine)| {
                    let nsm = &nsm;
                    s.spawn(move || {
                        let mut rng = SmallRng::seed_from_u64(round * 10 + w as u64);
                        let mut live = Vec::new();
                        for (i, &p) in mine.iter().enumerate() {
                            let guard = numakv_pmem::alloc::epoch::pin();
                            for _ in 0..20 {
                                if rng.gen_bool(0.6) || live.is_empty() {
                                    live.push(nsm.alloc([64, 256, 512][i % 3]).unwrap());
                                } else {
                                    let at = rng.gen_range(0..live.len());
                                    free(nsm, live.swap_remove(at)).unwrap();
                                }
                            }
                            // SAFETY: `p` is a block of `nsm` this worker alone retires, once.
                            unsafe { numakv_pmem::alloc::retire(nsm, &guard, p) };
                        }
                        live
                    })
                })
                .collect();
            nsm.collect(all.iter().copied(), &NO_CANCEL).unwrap().unwrap();
            workers.into_iter().map(|h| h.join().unwrap()).collect()
        });
        // Let every deferred free run.
        assert!(numakv_pmem::alloc::wait_for_unpin(&NO_CANCEL));
        for _ in 0..64 {
            numakv_pmem::alloc::epoch::pin().flush();
        }
        let mut want = kept.clone();
        for live in &results {
            for p in live {
                assert!(want.insert(*p), "block {p} handed out twice");
            }
        }
        let got: BTreeSet<PPtr> = nsm.allocated_blocks().into_iter().collect();
        assert!(got.is_superset(&want), "a live block was collected");
        // Deferred frees may still sit in other threads' bags; what remains must be theirs.
        let extra: Vec<&PPtr> = got.difference(&want).collect();
        assert!(extra.iter().all(|p| dying.contains(p)), "leaked {extra:?}");
        for node in 0..2 {
            pool.check_heap(node).unwrap();
        }
    }
}

#[test]
fn a_crash_during_the_sweep_leaves_a_store_the_next_open_collects() {
    for k in 1..=4u64 {
        let dir = tempfile::tempdir().unwrap();
        let reachable = crashed_store(dir.path(), 40 + k);
        let pool = reopen(dir.path());
        let nsm = Nsm::recover_deferred(Arc::clone(&pool), NsmMode::RoundRobin).unwrap();
        // The sweep persists one descriptor per page it frees: crash at the k-th.
        pool.crash_after_fences(k, CrashOptions::random(k)).unwrap();
        // After the power failure the sweep's next page free reports the crashed pool.
        let got = nsm.collect(reachable.iter().copied(), &NO_CANCEL);
        assert!(pool.has_crashed(), "the sweep freed fewer than {k} pages");
        assert!(matches!(got, Err(PoolError::InvalidArgument(_))), "{got:?}");
        drop(nsm);
        drop(pool);

        let pool = reopen(dir.path());
        let nsm = Nsm::recover_deferred(Arc::clone(&pool), NsmMode::RoundRobin).unwrap();
        nsm.collect(reachable.iter().copied(), &NO_CANCEL).unwrap().unwrap();
        assert_eq!(nsm.allocated_blocks().into_iter().collect::<BTreeSet<_>>(), reachable);
        for node in 0..2 {
            pool.check_heap(node).unwrap();
        }
    }
}
