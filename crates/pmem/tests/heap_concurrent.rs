//! The page heap under concurrency and under crashes: live extents never overlap, the volatile
//! index always matches the descriptor table, usage adds up, and after a crash at any fence every
//! acknowledged allocation and free is durable while the operation in flight is all-or-nothing.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use numakv_pmem::heap::{Extent, OWNER_ENGINE};
use numakv_pmem::{
    CrashOptions, EngineId, OpenConfig, PPtr, PmU64, Pool, PoolConfig, PoolError, SimMode,
};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const CAP: u64 = 4 << 20;
const PAGE: u64 = 64 << 10;
const NODES: usize = 2;

fn engine() -> EngineId {
    EngineId::new("heaptest", 1)
}

fn config(sim: SimMode) -> PoolConfig {
    let mut c = PoolConfig::new(engine(), CAP);
    c.nodes = NODES;
    c.page_size = PAGE;
    c.sim = sim;
    c
}

/// A live extent as the test thread that owns it knows it.
#[derive(Clone, Copy, Debug)]
struct Live {
    ptr: PPtr,
    pages: u64,
    stamp: u64,
}

fn stamp_words<'a>(pool: &'a Pool, e: &Live) -> [&'a PmU64; 2] {
    let last = e.ptr.add(e.pages * PAGE - 8).unwrap();
    [pool.get(e.ptr).unwrap(), pool.get(last).unwrap()]
}

/// One worker: random allocations and frees on random nodes. Every extent's first and last word
/// carry a stamp unique to (thread, allocation); an overlapping extent handed to anyone would
/// overwrite a stamp, which the free checks. Returns the extents still live at the end.
fn worker(pool: &Pool, thread: u64, iters: usize) -> Vec<(usize, Live)> {
    let mut rng = SmallRng::seed_from_u64(0xC0FFEE + thread);
    let mut live: Vec<(usize, Live)> = Vec::new();
    let mut out_of_space = 0;
    for i in 0..iters {
        let free = !live.is_empty() && (rng.gen_bool(0.45) || live.len() > 12);
        if free {
            let (node, e) = live.swap_remove(rng.gen_range(0..live.len()));
            for w in stamp_words(pool, &e) {
                assert_eq!(w.load(Ordering::Acquire), e.stamp, "extent {e:?} was overwritten");
            }
            pool.free_pages(e.ptr).unwrap();
            let _ = node;
        } else {
            let node = rng.gen_range(0..NODES);
            let pages = rng.gen_range(1..=6u64);
            match pool.alloc_pages(node, pages, OWNER_ENGINE + thread as u8, i as u16) {
                Ok(ptr) => {
                    assert_eq!(ptr.node(), node);
                    let info = pool.page_info(ptr).expect("page_info of a live extent");
                    assert_eq!((info.extent, info.owner), (ptr, OWNER_ENGINE + thread as u8));
                    let e = Live { ptr, pages, stamp: (thread << 48) | i as u64 };
                    for w in stamp_words(pool, &e) {
                        w.store(e.stamp, Ordering::Release);
                    }
                    live.push((node, e));
                }
                Err(PoolError::OutOfSpace { node: n, .. }) => {
                    assert_eq!(n, node);
                    out_of_space += 1;
                }
                Err(e) => panic!("alloc: {e}"),
            }
        }
    }
    assert!(out_of_space < iters / 2, "heap too small for the test: {out_of_space} failures");
    for (_, e) in &live {
        for w in stamp_words(pool, e) {
            assert_eq!(w.load(Ordering::Acquire), e.stamp, "extent {e:?} was overwritten");
        }
    }
    live
}

fn check_against(pool: &Pool, live: &[(usize, Live)]) {
    for node in 0..NODES {
        pool.check_heap(node).unwrap();
        let mut mine: Vec<(PPtr, u64)> =
            live.iter().filter(|(n, _)| *n == node).map(|(_, e)| (e.ptr, e.pages)).collect();
        mine.sort();
        let theirs: Vec<(PPtr, u64)> =
            pool.extents(node).unwrap().iter().map(|e| (e.ptr, e.pages)).collect();
        assert_eq!(mine, theirs, "node {node}: live extents differ from the heap's");
        // No overlap among live extents (sorted by address).
        for w in theirs.windows(2) {
            assert!(w[0].0.offset() + w[0].1 * PAGE <= w[1].0.offset(), "overlap: {w:?}");
        }
        let used: u64 = mine.iter().map(|(_, p)| p).sum();
        let (u, total) = pool.heap_usage(node).unwrap();
        assert_eq!(u, used, "node {node}: used pages");
        assert!(u <= total);
        assert_eq!(pool.used_bytes(node).unwrap(), used * PAGE);
    }
}

#[test]
fn two_threads_allocate_and_free_concurrently() {
    let d = tempfile::tempdir().unwrap();
    let pool = Pool::create(d.path(), config(SimMode::Direct)).unwrap();
    let mut all = Vec::new();
    for round in 0..3 * numakv_pmem::crash::test_scale() as u64 {
        let lives: Vec<Vec<(usize, Live)>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..2u64)
                .map(|t| {
                    let pool = &pool;
                    s.spawn(move || worker(pool, round * 2 + t, 3000))
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for l in lives {
            all.extend(l);
        }
        check_against(&pool, &all);
        // Free half of what survived the round, from this thread.
        let keep = all.split_off(all.len() / 2);
        for (_, e) in &all {
            pool.free_pages(e.ptr).unwrap();
        }
        all = keep;
        check_against(&pool, &all);
    }
    pool.close().unwrap();
    drop(pool);
    let pool = Pool::open(d.path(), OpenConfig::new(engine())).unwrap();
    check_against(&pool, &all);
    for (_, e) in &all {
        for w in stamp_words(&pool, e) {
            assert_eq!(w.load(Ordering::Acquire), e.stamp);
        }
    }
}

/// The model of one node's heap: extent head → (pages, aux).
type Model = BTreeMap<(usize, u64), (u64, u16)>;

fn heap_state(pool: &Pool) -> Model {
    let mut m = Model::new();
    for node in 0..NODES {
        for Extent { ptr, pages, aux, .. } in pool.extents(node).unwrap() {
            m.insert((node, ptr.offset()), (pages, aux));
        }
    }
    m
}

#[derive(Clone, Copy, Debug)]
enum Op {
    Alloc { node: usize, pages: u64, aux: u16 },
    Free { node: usize, off: u64 },
}

fn open_shadow(dir: &Path) -> Arc<Pool> {
    let mut c = OpenConfig::new(engine());
    c.sim = SimMode::Shadow;
    Pool::open(dir, c).unwrap()
}

#[test]
fn crashes_at_random_fences_keep_acknowledged_operations() {
    let d = tempfile::tempdir().unwrap();
    Pool::create(d.path(), config(SimMode::Shadow)).unwrap().close().unwrap();
    let mut rng = SmallRng::seed_from_u64(42);
    let mut model = Model::new();
    let mut fired = 0;
    let mut pending_seen = [0usize; 2];
    for round in 0..40 * numakv_pmem::crash::test_scale() as u64 {
        let pool = open_shadow(d.path());
        assert!(pool.was_clean(), "round {round}: the previous session was closed");
        for node in 0..NODES {
            pool.check_heap(node).unwrap();
        }
        assert_eq!(heap_state(&pool), model, "round {round}: heap after a clean reopen");
        let k = rng.gen_range(1..=60u64);
        let seed = rng.gen();
        let opts = if round % 2 == 0 { CrashOptions::random(seed) } else { CrashOptions::STRICT };
        pool.crash_after_fences(k, opts).unwrap();
        // (state before, state after) of the operation during which the crash fired.
        let mut pending: Option<(Model, Model, Op)> = None;
        let mut acked = model.clone();
        for _ in 0..100 {
            let crashed_before = pool.has_crashed();
            let op = if !acked.is_empty() && (acked.len() > 30 || rng.gen_bool(0.4)) {
                let i = rng.gen_range(0..acked.len());
                let (&(node, off), _) = acked.iter().nth(i).unwrap();
                Op::Free { node, off }
            } else {
                let node = rng.gen_range(0..NODES);
                Op::Alloc { node, pages: rng.gen_range(1..=5), aux: rng.gen() }
            };
            if crashed_before {
                // After the crash point the image is frozen: allocations are refused, frees
                // change only the abandoned working state. Neither may reach the image.
                match op {
                    Op::Alloc { node, pages, aux } => assert!(matches!(
                        pool.alloc_pages(node, pages, OWNER_ENGINE, aux),
                        Err(PoolError::InvalidArgument(_))
                    )),
                    Op::Free { node, off } => {
                        let _ = pool.free_pages(PPtr::new(node, off).unwrap());
                    }
                }
                continue;
            }
            let before = acked.clone();
            match op {
                Op::Alloc { node, pages, aux } => {
                    match pool.alloc_pages(node, pages, OWNER_ENGINE, aux) {
                        Ok(p) => {
                            assert_eq!(p.node(), node);
                            assert!(acked.insert((node, p.offset()), (pages, aux)).is_none());
                        }
                        Err(PoolError::OutOfSpace { .. }) => {}
                        Err(e) => panic!("alloc: {e}"),
                    }
                }
                Op::Free { node, off } => {
                    pool.free_pages(PPtr::new(node, off).unwrap()).unwrap();
                    acked.remove(&(node, off));
                }
            }
            if pool.has_crashed() {
                pending = Some((before.clone(), acked.clone(), op));
                acked = before;
            }
        }
        if pool.has_crashed() {
            fired += 1;
        } else {
            pool.crash(opts).unwrap();
        }
        drop(pool);

        let pool = open_shadow(d.path());
        assert!(!pool.was_clean());
        for node in 0..NODES {
            pool.check_heap(node).unwrap();
        }
        let got = heap_state(&pool);
        match pending {
            None => assert_eq!(got, acked, "round {round}: acknowledged operations"),
            Some((before, after, op)) => {
                assert!(
                    got == before || got == after,
                    "round {round}: pending {op:?} is not all-or-nothing:\n got {got:?}\n \
                     before {before:?}\n after {after:?}"
                );
                pending_seen[usize::from(got == after)] += 1;
            }
        }
        model = got;
        pool.close().unwrap();
    }
    assert!(fired >= 20, "scheduled crashes fired in only {fired} of 40 rounds");
    // The pending operation's fence is its commit point: seen as done at least once.
    assert!(pending_seen[1] > 0, "pending outcomes (undone, done): {pending_seen:?}");
}
