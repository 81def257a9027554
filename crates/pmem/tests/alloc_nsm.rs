//! NSM (papers/nobtree.txt §III-E): placement modes, concurrent alloc/free, bad input, running
//! out of space, and GC-based recovery after simulated ADR crashes.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use numakv_pmem::alloc::nsm::{Nsm, NsmMode, LARGE};
use numakv_pmem::alloc::PmAllocator;
use numakv_pmem::heap::{OWNER_ENGINE, OWNER_NSM};
use numakv_pmem::{
    CrashOptions, EngineId, OpenConfig, PPtr, PmU64, Pool, PoolConfig, PoolError, SimMode,
};
use parking_lot::Mutex;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const PAGE: u64 = 64 << 10;

fn engine() -> EngineId {
    EngineId::new("nsm-test", 1)
}

fn config(capacity_per_node: u64, sim: SimMode) -> PoolConfig {
    let mut cfg = PoolConfig::new(engine(), capacity_per_node);
    cfg.nodes = 2;
    cfg.page_size = PAGE;
    cfg.sim = sim;
    cfg
}

fn volatile(capacity_per_node: u64) -> Arc<Pool> {
    Pool::volatile(config(capacity_per_node, SimMode::Direct)).unwrap()
}

fn reopen(dir: &Path) -> Arc<Pool> {
    Pool::open(dir, OpenConfig { engine: engine(), sim: SimMode::Shadow, topology: None }).unwrap()
}

/// Frees `p`, which the test allocated from `nsm` and no longer uses.
fn free(nsm: &Nsm, p: PPtr) -> Result<(), PoolError> {
    // SAFETY: NSM validates `p` and rejects non-blocks without touching memory; every caller
    // passes either a live block it owns (freed once) or a deliberately bad pointer.
    unsafe { nsm.free(p) }
}

fn page_of(pool: &Pool, p: PPtr) -> PPtr {
    pool.page_info(p).unwrap().extent
}

fn nsm_pages(pool: &Pool, node: usize) -> Vec<PPtr> {
    pool.extents(node)
        .unwrap()
        .into_iter()
        .filter(|e| e.owner == OWNER_NSM)
        .map(|e| e.ptr)
        .collect()
}

// ---------------------------------------------------------------------------------------------
// 1. Placement
// ---------------------------------------------------------------------------------------------

#[test]
fn modes_place_pages_on_the_right_nodes() {
    // Local: the calling thread's node.
    let nsm = Nsm::new(volatile(4 << 20), NsmMode::Local).unwrap();
    let on1 = std::thread::scope(|s| {
        s.spawn(|| {
            numakv_pmem::numa::set_current_node(1);
            (0..50).map(|_| nsm.alloc(128).unwrap()).collect::<Vec<_>>()
        })
        .join()
        .unwrap()
    });
    assert!(on1.iter().all(|p| p.node() == 1));
    let on0 = std::thread::scope(|s| {
        s.spawn(|| {
            numakv_pmem::numa::set_current_node(0);
            nsm.alloc(128).unwrap()
        })
        .join()
        .unwrap()
    });
    assert_eq!(on0.node(), 0);

    // Node(1): always node 1, whatever the thread's node; alloc_on overrides the mode.
    let pool = volatile(4 << 20);
    let nsm = Nsm::new(Arc::clone(&pool), NsmMode::Node(1)).unwrap();
    numakv_pmem::numa::set_current_node(0);
    for size in [8, 64, 1000, 20000] {
        assert_eq!(nsm.alloc(size).unwrap().node(), 1);
        assert_eq!(nsm.alloc_on(size, Some(0)).unwrap().node(), 0);
        assert_eq!(nsm.alloc_on(size, None).unwrap().node(), 1);
    }
    assert!(matches!(nsm.alloc_on(64, Some(2)), Err(PoolError::InvalidArgument(_))));
    let big = nsm.alloc(100 << 10).unwrap();
    assert_eq!(big.node(), 1);
    let info = pool.page_info(big).unwrap();
    assert_eq!((info.owner, info.aux, info.extent), (OWNER_NSM, LARGE, big));
    assert_eq!(nsm.block_size(100 << 10), 2 * PAGE);

    // RoundRobin: consecutive pages of a class alternate nodes.
    let pool = volatile(4 << 20);
    let nsm = Nsm::new(Arc::clone(&pool), NsmMode::RoundRobin).unwrap();
    let mut pages: Vec<PPtr> = Vec::new();
    for _ in 0..6 * (PAGE / 8192) {
        let p = nsm.alloc(8192).unwrap();
        let page = page_of(&pool, p);
        if pages.last() != Some(&page) {
            pages.push(page);
        }
    }
    let nodes: Vec<usize> = pages.iter().map(|p| p.node()).collect();
    assert_eq!(nodes, [0, 1, 0, 1, 0, 1]);
    // Large extents take their turn too.
    let (a, b) = (nsm.alloc(40 << 10).unwrap(), nsm.alloc(40 << 10).unwrap());
    assert_ne!(a.node(), b.node());
    assert_eq!(nsm.alloc_on(64, Some(1)).unwrap().node(), 1);
}

// ---------------------------------------------------------------------------------------------
// 2. Concurrency
// ---------------------------------------------------------------------------------------------

/// Live blocks of all threads, start → end offset key `(node, offset)`.
type Live = Mutex<BTreeMap<PPtr, u64>>;

fn record_alloc(live: &Live, p: PPtr, len: u64) {
    let mut live = live.lock();
    let end = p.add(len).unwrap();
    if let Some((&q, &qlen)) = live.range(..=p).next_back() {
        assert!(q.node() != p.node() || q.add(qlen).unwrap() <= p, "{p} overlaps live {q}+{qlen}");
    }
    if let Some((&q, _)) = live.range(p..).next() {
        assert!(q.node() != p.node() || q >= end, "{p}+{len} overlaps live {q}");
    }
    live.insert(p, len);
}

#[test]
fn concurrent_alloc_free_never_hands_out_a_block_twice() {
    let pool = volatile(32 << 20);
    let nsm = Nsm::new(Arc::clone(&pool), NsmMode::RoundRobin).unwrap();
    let live: Live = Mutex::new(BTreeMap::new());
    // Blocks one thread hands to the other to free (cross-thread frees).
    let handoff: Mutex<Vec<(PPtr, u64)>> = Mutex::new(Vec::new());
    let sizes = [8usize, 16, 40, 64, 100, 200, 256, 500, 1000, 3000, 5000, 20000, 40000];

    std::thread::scope(|s| {
        for t in 0..2u64 {
            let (nsm, pool, live, handoff) = (&nsm, &pool, &live, &handoff);
            s.spawn(move || {
                numakv_pmem::numa::set_current_node(t as usize);
                let mut rng = SmallRng::seed_from_u64(t);
                let mut mine: Vec<(PPtr, u64)> = Vec::new();
                for i in 0..100_000u64 {
                    if mine.len() < 300 && rng.gen_bool(0.55) {
                        let mut size = sizes[rng.gen_range(0..sizes.len())];
                        if size == 40000 && rng.gen_bool(0.8) {
                            size = 64; // keep large extents rare
                        }
                        let p = if rng.gen_bool(0.2) {
                            nsm.alloc_on(size, Some(rng.gen_range(0..2))).unwrap()
                        } else {
                            nsm.alloc(size).unwrap()
                        };
                        let len = nsm.block_size(size);
                        if size >= 64 {
                            assert_eq!(p.offset() % 64, 0, "{p} for {size}");
                        }
                        record_alloc(live, p, len);
                        let tag = (t << 56) | i;
                        pool.get::<PmU64>(p).unwrap().store(tag, Ordering::Relaxed);
                        let last = p.add(len - 8).unwrap();
                        pool.get::<PmU64>(last).unwrap().store(!tag, Ordering::Relaxed);
                        if rng.gen_bool(0.3) {
                            handoff.lock().push((p, tag));
                        } else {
                            mine.push((p, tag));
                        }
                    } else {
                        let victim = if rng.gen_bool(0.5) { handoff.lock().pop() } else { None };
                        let Some((p, tag)) = victim.or_else(|| {
                            (!mine.is_empty())
                                .then(|| mine.swap_remove(rng.gen_range(0..mine.len())))
                        }) else {
                            continue;
                        };
                        let len = live.lock().remove(&p).expect("freeing a block not live");
                        // A block that overlapped another live block would have been scribbled.
                        assert_eq!(pool.get::<PmU64>(p).unwrap().load(Ordering::Relaxed), tag);
                        let last = p.add(len - 8).unwrap();
                        assert_eq!(pool.get::<PmU64>(last).unwrap().load(Ordering::Relaxed), !tag);
                        free(nsm, p).unwrap();
                    }
                }
                handoff.lock().extend(mine);
            });
        }
    });

    // Quiescent: NSM's view of what is allocated is exactly the test's live set.
    let expected: Vec<PPtr> = live.lock().keys().copied().collect();
    assert_eq!(nsm.allocated_blocks(), expected);
    let bytes: u64 = live.lock().values().sum();
    assert_eq!(nsm.stats().allocated_bytes, bytes);
    let stats = nsm.stats();
    assert!(stats.small_pages[0] > 0 && stats.small_pages[1] > 0, "{stats:?}");

    for (p, _) in handoff.into_inner() {
        live.lock().remove(&p).unwrap();
        free(&nsm, p).unwrap();
    }
    assert!(live.lock().is_empty());
    assert!(nsm.allocated_blocks().is_empty());
    assert_eq!(nsm.stats().allocated_bytes, 0);
    assert_eq!(nsm.stats().large_pages, [0, 0]);
    pool.check_heap(0).unwrap();
    pool.check_heap(1).unwrap();
}

#[test]
fn blocks_freed_by_another_thread_flow_back_through_the_depot() {
    let pool = volatile(8 << 20);
    let nsm = Nsm::new(Arc::clone(&pool), NsmMode::Node(0)).unwrap();
    // Exactly four pages of 64-byte blocks, so this thread's fresh cursor is used up.
    let blocks: Vec<PPtr> = (0..4 * PAGE / 64).map(|_| nsm.alloc(64).unwrap()).collect();
    let pages = pool.heap_usage(0).unwrap().0;
    assert_eq!(pages, 4);
    std::thread::scope(|s| {
        s.spawn(|| blocks.iter().for_each(|&p| free(&nsm, p).unwrap()));
    });
    // The freeing thread keeps fewer than two batches (2 × 256 blocks); the rest went to the
    // depot, so this thread reuses them without taking a page.
    let owned: BTreeSet<PPtr> = blocks.iter().copied().collect();
    let n = blocks.len() - 512;
    let again: BTreeSet<PPtr> = (0..n).map(|_| nsm.alloc(64).unwrap()).collect();
    assert_eq!(again.len(), n);
    assert!(again.is_subset(&owned));
    assert_eq!(pool.heap_usage(0).unwrap().0, pages);
    assert_eq!(nsm.allocated_blocks(), again.into_iter().collect::<Vec<_>>());
}

// ---------------------------------------------------------------------------------------------
// 3. Bad input
// ---------------------------------------------------------------------------------------------

#[test]
fn bad_frees_are_rejected_and_change_nothing() {
    let pool = volatile(4 << 20);
    let nsm = Nsm::new(Arc::clone(&pool), NsmMode::Node(0)).unwrap();
    let a = nsm.alloc(64).unwrap();
    let b = nsm.alloc(300).unwrap();
    let big = nsm.alloc(150 << 10).unwrap();
    let engine_page = pool.alloc_pages(0, 1, OWNER_ENGINE, 0).unwrap();
    let before = nsm.allocated_blocks();
    assert_eq!(before.len(), 3);

    let free_page = PPtr::new(1, pool.page_info(a).unwrap().extent.offset() + 5 * PAGE).unwrap();
    let bad = [
        PPtr::NULL,
        PPtr::new(7, 4096).unwrap(),          // node out of range
        PPtr::new(0, 64).unwrap(),            // pool header
        PPtr::new(0, u64::MAX >> 9).unwrap(), // past the file
        free_page,                            // a page nobody owns
        engine_page,                          // another owner's page
        a.add(8).unwrap(),                    // middle of a block
        b.add(64).unwrap(),                   // 64-aligned but inside a 384-byte block
        big.add(PAGE).unwrap(),               // second page of a large block
        big.add(64).unwrap(),
    ];
    for p in bad {
        assert!(matches!(free(&nsm, p), Err(PoolError::BadPointer { .. })), "{p} accepted");
    }
    // A block at the end of a page whose class does not divide the page: the tail is no block.
    let c = nsm.alloc(1536).unwrap();
    let tail = pool.page_info(c).unwrap().extent.add((PAGE / 1536) * 1536).unwrap();
    assert!(matches!(free(&nsm, tail), Err(PoolError::BadPointer { .. })));

    assert_eq!(nsm.allocated_blocks().len(), 4);
    free(&nsm, big).unwrap();
    assert!(matches!(free(&nsm, big), Err(PoolError::BadPointer { .. })), "double large free");
    for p in [a, b, c] {
        free(&nsm, p).unwrap();
    }
    assert!(nsm.allocated_blocks().is_empty());
    // Still consistent: fresh allocations are distinct and the engine page is untouched.
    let again: BTreeSet<PPtr> = (0..500).map(|_| nsm.alloc(64).unwrap()).collect();
    assert_eq!(again.len(), 500);
    assert_eq!(pool.page_info(engine_page).unwrap().owner, OWNER_ENGINE);
    pool.check_heap(0).unwrap();
}

// ---------------------------------------------------------------------------------------------
// 4. Out of space
// ---------------------------------------------------------------------------------------------

#[test]
fn out_of_space_is_an_error_and_the_allocator_recovers() {
    // Four pages of file: the first holds the header and descriptors, three are heap.
    let pool = volatile(4 * PAGE);
    assert_eq!(pool.heap_usage(0).unwrap(), (0, 3));
    let nsm = Nsm::new(Arc::clone(&pool), NsmMode::Node(0)).unwrap();
    let mut got = Vec::new();
    let err = loop {
        match nsm.alloc(32768) {
            Ok(p) => got.push(p),
            Err(e) => break e,
        }
    };
    assert!(matches!(err, PoolError::OutOfSpace { node: 0, .. }), "{err}");
    assert_eq!(got.len(), 6);
    assert!(matches!(nsm.alloc(16), Err(PoolError::OutOfSpace { .. })));
    assert!(matches!(nsm.alloc(10 * PAGE as usize), Err(PoolError::OutOfSpace { .. })));
    assert_eq!(pool.heap_usage(0).unwrap().0, 3);
    // Node 1 still has room.
    assert_eq!(nsm.alloc_on(16, Some(1)).unwrap().node(), 1);
    // A free makes room again, and the same block comes back.
    free(&nsm, got[3]).unwrap();
    assert_eq!(nsm.alloc(30000).unwrap(), got[3]);

    // Round-robin passes a full node's turn on to the next.
    let rr = Nsm::recover(Arc::clone(&pool), NsmMode::RoundRobin, got.iter().copied()).unwrap().0;
    drop(nsm);
    let more: Vec<PPtr> = (0..4).map(|_| rr.alloc(32768).unwrap()).collect();
    assert!(more.iter().all(|p| p.node() == 1), "{more:?}");
}

// ---------------------------------------------------------------------------------------------
// 5. Crash + GC recovery
// ---------------------------------------------------------------------------------------------

/// What a test expects recovery to keep.
struct Expectation {
    reachable: BTreeSet<PPtr>,
    /// NSM pages (extent starts) that hold a reachable block, per node.
    kept_pages: [BTreeSet<PPtr>; 2],
    /// Pages per node the heap must hold after recovery (kept NSM pages, incl. large extents'
    /// pages, plus engine pages).
    used_pages: [u64; 2],
}

fn expect(pool: &Pool, reachable: &BTreeSet<PPtr>, engine_pages: [u64; 2]) -> Expectation {
    let mut kept_pages = [BTreeSet::new(), BTreeSet::new()];
    let mut used_pages = engine_pages;
    for &p in reachable {
        let info = pool.page_info(p).unwrap();
        if info.aux == LARGE {
            let e = pool.extents(p.node()).unwrap().into_iter().find(|e| e.ptr == p).unwrap();
            used_pages[p.node()] += e.pages;
        } else if kept_pages[p.node()].insert(info.extent) {
            used_pages[p.node()] += 1;
        }
    }
    Expectation { reachable: reachable.clone(), kept_pages, used_pages }
}

/// Checks a recovered NSM against `exp` and then that every free block of the kept pages is
/// reused (exactly those, first) and no reachable block is ever handed out again.
fn check_recovered(pool: &Arc<Pool>, nsm: &Nsm, exp: &Expectation) {
    let reachable: Vec<PPtr> = exp.reachable.iter().copied().collect();
    assert_eq!(nsm.allocated_blocks(), reachable);
    for node in 0..2 {
        assert_eq!(pool.heap_usage(node).unwrap().0, exp.used_pages[node], "node {node}");
        pool.check_heap(node).unwrap();
        for page in nsm_pages(pool, node) {
            let aux = pool.page_info(page).unwrap().aux;
            assert!(aux == LARGE || exp.kept_pages[node].contains(&page), "{page} not collected");
        }
    }
    let small: u64 = exp
        .reachable
        .iter()
        .filter(|&&p| pool.page_info(p).unwrap().aux != LARGE)
        .map(|&p| nsm.size_classes()[usize::from(pool.page_info(p).unwrap().aux)])
        .sum();
    let stats = nsm.stats();
    let large: u64 = stats.large_pages.iter().sum::<u64>() * PAGE;
    assert_eq!(stats.allocated_bytes, small + large);

    // Free blocks of each kept page, grouped by (node, class).
    let mut free: HashMap<(usize, usize), BTreeSet<PPtr>> = HashMap::new();
    for node in 0..2 {
        for &page in &exp.kept_pages[node] {
            let class = usize::from(pool.page_info(page).unwrap().aux);
            let size = nsm.size_classes()[class];
            for i in 0..PAGE / size {
                let b = page.add(i * size).unwrap();
                if !exp.reachable.contains(&b) {
                    free.entry((node, class)).or_default().insert(b);
                }
            }
        }
    }
    for ((node, class), blocks) in free {
        let size = nsm.size_classes()[class] as usize;
        let got: BTreeSet<PPtr> =
            (0..blocks.len()).map(|_| nsm.alloc_on(size, Some(node)).unwrap()).collect();
        assert_eq!(got, blocks, "node {node} class {size}: depot blocks not reused exactly");
        // The kept pages are now full: the next block comes from a new page.
        let next = nsm.alloc_on(size, Some(node)).unwrap();
        assert!(!exp.kept_pages[node].contains(&page_of(pool, next)));
    }
    for size in [16usize, 64, 100, 256, 1000, 3000, 20000] {
        for _ in 0..50 {
            let p = nsm.alloc(size).unwrap();
            assert!(!exp.reachable.contains(&p), "reachable block {p} handed out again");
        }
    }
}

#[test]
fn crash_then_gc_keeps_reachable_blocks_and_reclaims_the_rest() {
    for seed in 0..4u64 {
        let dir = tempfile::tempdir().unwrap();
        let mut rng = SmallRng::seed_from_u64(seed);
        let pool = Pool::create(dir.path(), config(4 << 20, SimMode::Shadow)).unwrap();
        let nsm = Nsm::new(Arc::clone(&pool), NsmMode::RoundRobin).unwrap();
        // An engine extent recovery must leave alone.
        let engine_page = pool.alloc_pages(1, 1, OWNER_ENGINE, 7).unwrap();

        let mut live = Vec::new();
        for i in 0..600 {
            let size = [64, 100, 256, 1000, 3000, 40000][rng.gen_range(0..6)];
            let size = if size == 40000 && rng.gen_bool(0.7) { 200 } else { size };
            live.push(nsm.alloc_on(size, if i % 3 == 0 { None } else { Some(i % 2) }).unwrap());
            if rng.gen_bool(0.2) {
                let victim = live.swap_remove(rng.gen_range(0..live.len()));
                free(&nsm, victim).unwrap();
            }
        }
        // A whole page of 6144-byte blocks (a class used nowhere else), none reachable: GC must
        // return it to the heap.
        let doomed: Vec<PPtr> =
            (0..PAGE / 6144).map(|_| nsm.alloc_on(6144, Some(0)).unwrap()).collect();
        let doomed_page = page_of(&pool, doomed[0]);
        assert!(doomed.iter().all(|&p| page_of(&pool, p) == doomed_page));

        let reachable: BTreeSet<PPtr> =
            live.iter().copied().filter(|_| rng.gen_bool(0.3)).collect();
        let exp = expect(&pool, &reachable, [0, 1]);
        assert!(!exp.kept_pages[0].contains(&doomed_page));

        pool.crash(CrashOptions::random(seed)).unwrap();
        assert!(nsm.alloc(1 << 20).is_err(), "a crashed pool hands out no pages");
        drop(nsm);
        drop(pool);

        let pool = reopen(dir.path());
        assert!(!pool.was_clean());
        // Feed duplicates too: recovery treats `reachable` as a set.
        let feed = reachable.iter().chain(reachable.iter().take(5)).copied();
        let (nsm, report) = Nsm::recover(Arc::clone(&pool), NsmMode::RoundRobin, feed).unwrap();
        assert_eq!(report.blocks_reachable, reachable.len() as u64, "seed {seed}");
        assert!(report.pages_freed >= 1, "{report:?}");
        assert_eq!(report.pages_kept, (exp.kept_pages[0].len() + exp.kept_pages[1].len()) as u64);
        assert!(pool.page_info(doomed_page).is_none());
        assert_eq!(pool.page_info(engine_page).unwrap().owner, OWNER_ENGINE);
        check_recovered(&pool, &nsm, &exp);
    }
}

#[test]
fn crash_during_a_page_refill_is_collected() {
    for k in 1..=3u64 {
        let dir = tempfile::tempdir().unwrap();
        let pool = Pool::create(dir.path(), config(4 << 20, SimMode::Shadow)).unwrap();
        let nsm = Nsm::new(Arc::clone(&pool), NsmMode::Node(0)).unwrap();
        let before: Vec<PPtr> = (0..300).map(|_| nsm.alloc(256).unwrap()).collect();
        let reachable: BTreeSet<PPtr> = before.iter().step_by(7).copied().collect();
        let exp = expect(&pool, &reachable, [0, 0]);

        // Each new class needs a new page: one descriptor persist, one fence, per allocation.
        pool.crash_after_fences(k, CrashOptions::random(k)).unwrap();
        let mut refills = 0;
        for size in [512usize, 768, 1024, 1536, 2048, 3072] {
            if nsm.alloc(size).is_err() {
                break;
            }
            refills += 1;
        }
        assert!(pool.has_crashed());
        assert_eq!(refills, k, "the k-th refill's fence crashes; the next refill fails");
        drop(nsm);
        drop(pool);

        let pool = reopen(dir.path());
        let (nsm, report) =
            Nsm::recover(Arc::clone(&pool), NsmMode::Node(0), reachable.iter().copied()).unwrap();
        // The refill pages that reached the image hold nothing reachable.
        assert!(report.pages_freed >= k - 1 && report.pages_freed <= k, "{report:?}");
        check_recovered(&pool, &nsm, &exp);
    }
}

#[test]
fn clean_shutdown_then_recover_rebuilds_free_lists() {
    let dir = tempfile::tempdir().unwrap();
    let pool = Pool::create(dir.path(), config(4 << 20, SimMode::Shadow)).unwrap();
    let nsm = Nsm::new(Arc::clone(&pool), NsmMode::Local).unwrap();
    let blocks: Vec<PPtr> = (0..200).map(|i| nsm.alloc(64 + i % 500).unwrap()).collect();
    let big = nsm.alloc(3 * PAGE as usize).unwrap();
    let mut reachable: BTreeSet<PPtr> = blocks.iter().step_by(3).copied().collect();
    reachable.insert(big);
    let exp = expect(&pool, &reachable, [0, 0]);
    pool.close().unwrap();
    drop(nsm);
    drop(pool);

    let pool = reopen(dir.path());
    assert!(pool.was_clean());
    let (nsm, report) =
        Nsm::recover(Arc::clone(&pool), NsmMode::Local, reachable.iter().copied()).unwrap();
    assert_eq!((report.large_kept, report.large_freed), (1, 0));
    check_recovered(&pool, &nsm, &exp);
    free(&nsm, big).unwrap();
    assert_eq!(nsm.stats().large_pages, [0, 0]);
}

// ---------------------------------------------------------------------------------------------
// 6. Recovery rejects what is not an NSM block
// ---------------------------------------------------------------------------------------------

#[test]
fn recovery_rejects_reachable_non_blocks_without_modifying_anything() {
    let dir = tempfile::tempdir().unwrap();
    let pool = Pool::create(dir.path(), config(4 << 20, SimMode::Shadow)).unwrap();
    let nsm = Nsm::new(Arc::clone(&pool), NsmMode::Node(1)).unwrap();
    let blocks: Vec<PPtr> = (0..100).map(|_| nsm.alloc(128).unwrap()).collect();
    let big = nsm.alloc(80 << 10).unwrap();
    let engine_page = pool.alloc_pages(0, 1, OWNER_ENGINE, 0).unwrap();
    pool.crash(CrashOptions::STRICT).unwrap();
    drop(nsm);
    drop(pool);

    let pool = reopen(dir.path());
    let extents = |pool: &Pool| [pool.extents(0).unwrap(), pool.extents(1).unwrap()];
    let before = extents(&pool);
    let keep = blocks[10];
    for bad in [
        blocks[3].add(32).unwrap(),
        big.add(PAGE).unwrap(),
        engine_page,
        PPtr::NULL,
        PPtr::new(1, pool.page_info(keep).unwrap().extent.offset() + 9 * PAGE).unwrap(),
    ] {
        let got = Nsm::recover(Arc::clone(&pool), NsmMode::Node(1), [keep, bad]);
        assert!(matches!(got, Err(PoolError::Corrupted { .. })), "{bad}: {got:?}");
        assert_eq!(extents(&pool), before, "{bad}: rejected recovery modified the heap");
    }
    assert!(matches!(
        Nsm::recover(Arc::clone(&pool), NsmMode::Node(2), [keep]),
        Err(PoolError::InvalidArgument(_))
    ));
    // The same pool still recovers with the honest reachable set.
    let (nsm, report) = Nsm::recover(Arc::clone(&pool), NsmMode::Node(1), [keep]).unwrap();
    assert_eq!((report.blocks_reachable, report.pages_kept, report.large_freed), (1, 1, 1));
    assert_eq!(nsm.allocated_blocks(), [keep]);
}
