//! Calloc (papers/nbtree.txt §III-C): ring-first reuse, concurrency, exhaustion, crash
//! consistency of SMOs under ADR and eADR shadow crashes, corrupted metadata, per-node pools.

use std::collections::HashSet;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use numakv_pmem::alloc::calloc::{Calloc, CallocConfig};
use numakv_pmem::alloc::{epoch, PmAllocator};
use numakv_pmem::heap::OWNER_ENGINE;
use numakv_pmem::{
    account, node_path, CrashOptions, EngineId, OpenConfig, PPtr, PersistMode, PmU64, Pool,
    PoolConfig, PoolError, SimMode,
};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// Tests that retire blocks through the (process-global) crossbeam collector take this lock.
///
/// A deferred free of one test's allocator may otherwise run on another test's thread while
/// that allocator is alive, which makes it a concurrent writer of a pool that is being crashed.
/// A simulated crash is not an instantaneous snapshot with respect to threads still writing the
/// pool (docs/design.md §5), so crash rounds must have no such writers.
static EPOCH_USERS: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    EPOCH_USERS.lock().unwrap_or_else(|e| e.into_inner())
}

fn engine() -> EngineId {
    EngineId::new("calloc-test", 1)
}

fn pool_cfg(mode: PersistMode, sim: SimMode, capacity: u64) -> PoolConfig {
    let mut c = PoolConfig::new(engine(), capacity);
    c.nodes = 2;
    c.page_size = 64 << 10;
    c.mode = mode;
    c.sim = sim;
    c
}

/// 64 blocks of 256 B per chunk.
fn small(chunks: u64, ring: u64, slots: usize) -> CallocConfig {
    CallocConfig {
        block_size: 256,
        chunk_size: 16 << 10,
        chunks_per_node: chunks,
        max_threads: 64,
        ring_capacity: ring,
        log_slots: slots,
    }
}

fn word(pool: &Pool, p: PPtr, off: u64) -> &PmU64 {
    pool.get(p.add(off).unwrap()).unwrap()
}

#[test]
fn ring_absorbs_frees_fifo_and_overflow_clears_bits() {
    let dir = tempfile::tempdir().unwrap();
    let pool =
        Pool::create(dir.path(), pool_cfg(PersistMode::Adr, SimMode::Direct, 1 << 20)).unwrap();
    let (c, _root) = Calloc::create(Arc::clone(&pool), small(4, 4, 2)).unwrap();
    numakv_numa::set_current_node(0);
    let b: Vec<PPtr> = (0..6).map(|_| c.alloc(256).unwrap()).collect();
    for w in b.windows(2) {
        assert_eq!(w[1].offset(), w[0].offset() + 256, "a chunk is handed out in order");
    }
    assert!(b.iter().all(|&p| p.node() == 0 && c.bit_is_set(p).unwrap()));
    assert!(matches!(c.alloc(257), Err(PoolError::InvalidArgument(_))));
    let s0 = c.stats();
    assert_eq!((s0.bitmap_sets, s0.chunks_taken), (6, 1));

    account::set_enabled(true);
    account::op_discard();
    let before = account::thread_stats();
    // SAFETY: b[0] came from this allocator and nobody uses it.
    unsafe { c.free(b[0]).unwrap() };
    account::op_end();
    let free_op = account::thread_stats().since(&before);
    account::set_enabled(false);
    // A ring-absorbed free writes the ring's entry line and its head/tail line, never the
    // bitmap: exactly two lines, two persists. (Nothing is counted with accounting compiled out.)
    if account::COMPILED {
        assert_eq!(free_op.writes(), 2, "{free_op:?}");
        assert_eq!((free_op.flushes, free_op.fences), (2, 2), "{free_op:?}");
    } else {
        assert_eq!(free_op, account::AccessStats::default());
    }
    assert!(c.bit_is_set(b[0]).unwrap(), "the ring keeps the bit set");
    // SAFETY: as above.
    unsafe { c.free(b[1]).unwrap() };
    let allocated: HashSet<PPtr> = c.allocated_blocks().into_iter().collect();
    assert!(!allocated.contains(&b[0]) && !allocated.contains(&b[1]));
    assert_eq!(allocated.len(), 4);

    // FIFO reuse from the ring's head, without touching the bitmap.
    assert_eq!(c.alloc(1).unwrap(), b[0]);
    assert_eq!(c.alloc(1).unwrap(), b[1]);
    let s1 = c.stats();
    assert_eq!((s1.ring_hits, s1.ring_pushes, s1.bitmap_sets, s1.bitmap_clears), (2, 2, 6, 0));

    // Four frees fill the ring; the fifth clears its bit and goes to the free list.
    for &p in &b[..5] {
        // SAFETY: all live and unused.
        unsafe { c.free(p).unwrap() };
    }
    assert!(b[..4].iter().all(|&p| c.bit_is_set(p).unwrap()));
    assert!(!c.bit_is_set(b[4]).unwrap(), "overflow free clears the bit");
    assert_eq!(c.stats().bitmap_clears, 1);
    assert_eq!(c.stats().nodes[0].ring_blocks, 4);
    assert_eq!(c.allocated_blocks(), vec![b[5]]);
    // The ring is consumed first, then the free list (which now holds b[4] on top).
    let again: Vec<PPtr> = (0..5).map(|_| c.alloc(1).unwrap()).collect();
    assert_eq!(again, vec![b[0], b[1], b[2], b[3], b[4]]);
    assert!(c.bit_is_set(b[4]).unwrap());
}

#[test]
fn concurrent_alloc_free_and_smos_never_share_a_block() {
    let _serial = serial();
    let pool = Pool::volatile(pool_cfg(PersistMode::Adr, SimMode::Direct, 4 << 20)).unwrap();
    let (c, _) = Calloc::create(Arc::clone(&pool), small(24, 8, 4)).unwrap();
    let live: Arc<Mutex<HashSet<PPtr>>> = Arc::default();
    let handoff: Arc<Mutex<Vec<(PPtr, u64)>>> = Arc::default();
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let (c, live, handoff) = (Arc::clone(&c), Arc::clone(&live), Arc::clone(&handoff));
            std::thread::spawn(move || {
                numakv_numa::set_current_node(t as usize % 2);
                let pool = Arc::clone(c.pool());
                let mut rng = SmallRng::seed_from_u64(t);
                let mut mine: Vec<(PPtr, u64)> = Vec::new();
                let take = |p: PPtr, tag: u64, mine: &mut Vec<(PPtr, u64)>| {
                    assert!(live.lock().unwrap().insert(p), "{p} handed out twice");
                    pool.get::<PmU64>(p).unwrap().store(tag, Ordering::Relaxed);
                    mine.push((p, tag));
                };
                let give = |p: PPtr, tag: u64| {
                    assert_eq!(pool.get::<PmU64>(p).unwrap().load(Ordering::Relaxed), tag);
                    assert!(live.lock().unwrap().remove(&p));
                };
                for i in 0..3000u64 {
                    let tag = t << 32 | i;
                    match rng.gen_range(0..10) {
                        0..=3 => match c.alloc(100) {
                            Ok(p) => take(p, tag, &mut mine),
                            Err(PoolError::OutOfSpace { .. }) => {}
                            Err(e) => panic!("{e}"),
                        },
                        4..=5 if !mine.is_empty() => {
                            let (p, tg) = mine.swap_remove(rng.gen_range(0..mine.len()));
                            give(p, tg);
                            // SAFETY: removed from every set; nobody reads it.
                            unsafe { c.free(p).unwrap() };
                        }
                        6 if !mine.is_empty() => {
                            let x = mine.swap_remove(rng.gen_range(0..mine.len()));
                            handoff.lock().unwrap().push(x);
                        }
                        7 => {
                            let x = handoff.lock().unwrap().pop();
                            if let Some((p, tg)) = x {
                                give(p, tg);
                                // SAFETY: as above; freed by another thread than allocated it.
                                unsafe { c.free(p).unwrap() };
                            }
                        }
                        _ if !mine.is_empty() => {
                            let idx = rng.gen_range(0..mine.len());
                            let (old, tg) = mine[idx];
                            let smo = match c.smo_begin(&[old], 2) {
                                Ok(s) => s,
                                Err(PoolError::OutOfSpace { .. }) => continue,
                                Err(e) => panic!("{e}"),
                            };
                            mine.swap_remove(idx);
                            give(old, tg);
                            for (k, &n) in smo.new_blocks().iter().enumerate() {
                                take(n, tag | (k as u64) << 31, &mut mine);
                            }
                            let guard = epoch::pin();
                            // SAFETY: `old` is unlinked (out of every set) and freed only here.
                            unsafe { smo.commit(&guard) };
                        }
                        _ => {}
                    }
                }
                for (p, tg) in mine {
                    give(p, tg);
                    // SAFETY: as above.
                    unsafe { c.free(p).unwrap() };
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    for (p, tg) in handoff.lock().unwrap().drain(..) {
        assert_eq!(pool.get::<PmU64>(p).unwrap().load(Ordering::Relaxed), tg);
        // SAFETY: as above.
        unsafe { c.free(p).unwrap() };
    }
    // Deferred frees of the SMOs' old blocks run after grace periods.
    for _ in 0..10_000 {
        if c.allocated_blocks().is_empty() {
            break;
        }
        epoch::pin().flush();
    }
    assert_eq!(c.allocated_blocks(), Vec::<PPtr>::new());
}

#[test]
fn chunk_exhaustion_is_out_of_space_and_recoverable_by_frees() {
    let pool = Pool::volatile(pool_cfg(PersistMode::Eadr, SimMode::Direct, 1 << 20)).unwrap();
    let (c, _) = Calloc::create(Arc::clone(&pool), small(2, 4, 2)).unwrap();
    let mut got = Vec::new();
    let err = loop {
        match c.alloc_on(0) {
            Ok(p) => got.push(p),
            Err(e) => break e,
        }
    };
    assert!(matches!(err, PoolError::OutOfSpace { node: 0, .. }), "{err}");
    assert_eq!(got.len(), 128);
    assert_eq!(got.iter().collect::<HashSet<_>>().len(), 128);
    assert!(matches!(c.smo_begin(&[], 1), Err(PoolError::OutOfSpace { .. })));
    assert!(c.alloc_on(1).is_ok(), "node 1 has its own pool");
    // SAFETY: unused blocks of this allocator.
    unsafe { c.free(got[7]).unwrap() };
    assert_eq!(c.alloc_on(0).unwrap(), got[7]);
    for &p in &got {
        // SAFETY: as above.
        unsafe { c.free(p).unwrap() };
    }
    // The failed smo_begin gave its slot back: both slots are usable.
    let s1 = c.smo_begin(&[], 1).unwrap();
    let s2 = c.smo_begin(&[], 1).unwrap();
    s1.abort();
    s2.abort();
    let mut again = 0;
    while c.alloc_on(0).is_ok() {
        again += 1;
    }
    assert_eq!(again, 128);
}

// ---------------------------------------------------------------------------------------------
// Crash consistency
// ---------------------------------------------------------------------------------------------

const SLOTS: u64 = 48;

/// The test's "engine": SLOTS persistent words in an engine extent, each a linked block or 0.
struct Engine {
    pool: Arc<Pool>,
    ext: PPtr,
    mirror: Vec<PPtr>,
}

impl Engine {
    fn set(&mut self, i: usize, p: PPtr) {
        let w = word(&self.pool, self.ext, 8 * i as u64);
        w.store(p.raw(), Ordering::Release);
        self.pool.persist_obj(w); // PERSIST: the link is the engine's commit point.
        self.mirror[i] = p;
    }
    fn free_slot(&self, rng: &mut SmallRng) -> Option<usize> {
        let v: Vec<usize> = (0..self.mirror.len()).filter(|&i| self.mirror[i].is_null()).collect();
        (!v.is_empty()).then(|| v[rng.gen_range(0..v.len())])
    }
    fn live_slot(&self, rng: &mut SmallRng, not: Option<usize>) -> Option<usize> {
        let v: Vec<usize> = (0..self.mirror.len())
            .filter(|&i| !self.mirror[i].is_null() && Some(i) != not)
            .collect();
        (!v.is_empty()).then(|| v[rng.gen_range(0..v.len())])
    }
}

/// One random operation; returns true when it was a plain (unlogged) alloc or free.
fn step(c: &Arc<Calloc>, e: &mut Engine, rng: &mut SmallRng) -> bool {
    numakv_numa::set_current_node(rng.gen_range(0..2));
    let guard = epoch::pin();
    match rng.gen_range(0..9) {
        0 | 1 => {
            let Some(i) = e.free_slot(rng) else { return false };
            let Ok(smo) = c.smo_begin(&[], 1) else { return false };
            e.set(i, smo.new_blocks()[0]);
            // SAFETY: no old blocks.
            unsafe { smo.commit(&guard) };
        }
        2 => {
            let (Some(i), Some(j)) = (e.live_slot(rng, None), e.free_slot(rng)) else {
                return false;
            };
            let Ok(smo) = c.smo_begin(&[e.mirror[i]], 2) else { return false };
            e.set(i, smo.new_blocks()[0]);
            e.set(j, smo.new_blocks()[1]);
            // SAFETY: the old block is unlinked; the test has no concurrent readers.
            unsafe { smo.commit(&guard) };
        }
        3 => {
            let Some(i) = e.live_slot(rng, None) else { return false };
            let Some(j) = e.live_slot(rng, Some(i)) else { return false };
            let Ok(smo) = c.smo_begin(&[e.mirror[i], e.mirror[j]], 1) else { return false };
            e.set(i, smo.new_blocks()[0]);
            e.set(j, PPtr::NULL);
            // SAFETY: as above.
            unsafe { smo.commit(&guard) };
        }
        4 => {
            let Some(i) = e.live_slot(rng, None) else { return false };
            let Ok(smo) = c.smo_begin(&[e.mirror[i]], 0) else { return false };
            e.set(i, PPtr::NULL);
            // SAFETY: as above.
            unsafe { smo.commit(&guard) };
        }
        5 => {
            if let Ok(smo) = c.smo_begin(&[], 2) {
                smo.abort();
            }
        }
        6 => {
            let Some(i) = e.free_slot(rng) else { return false };
            let Ok(p) = c.alloc(256) else { return true };
            e.set(i, p);
            return true;
        }
        7 => {
            let Some(i) = e.live_slot(rng, None) else { return false };
            let p = e.mirror[i];
            e.set(i, PPtr::NULL);
            // SAFETY: unlinked, no readers.
            unsafe { c.free(p).unwrap() };
            return true;
        }
        _ => {
            drop(guard);
            epoch::pin().flush();
        }
    }
    false
}

/// Opens the store, waiting while a deferred free that upgraded its weak allocator handle on
/// another thread (the epoch collector is global) still holds the old pool for a moment.
fn open_retrying(dir: &Path, oc: OpenConfig) -> Arc<Pool> {
    for _ in 0..2000 {
        match Pool::open(dir, oc.clone()) {
            Err(PoolError::Locked { .. }) => {
                std::thread::sleep(std::time::Duration::from_millis(1))
            }
            r => return r.unwrap(),
        }
    }
    panic!("store stays locked: something still holds the crashed pool");
}

/// Runs a random workload, crashes at the `k`-th fence, recovers and checks that exactly the
/// reachable blocks are allocated. Returns whether the scheduled crash fired during the workload.
fn crash_round(mode: PersistMode, k: u64, seed: u64) -> bool {
    let dir = tempfile::tempdir().unwrap();
    let pool = Pool::create(dir.path(), pool_cfg(mode, SimMode::Shadow, 1 << 20)).unwrap();
    let (c, root) = Calloc::create(Arc::clone(&pool), small(4, 4, 2)).unwrap();
    let ext = pool.alloc_pages(0, 1, OWNER_ENGINE, 0).unwrap();
    for i in 0..SLOTS {
        word(&pool, ext, 8 * i).store(0, Ordering::Relaxed);
        pool.flush_obj(word(&pool, ext, 8 * i));
    }
    pool.root(0).unwrap().store(root.raw(), Ordering::Release);
    pool.root(1).unwrap().store(ext.raw(), Ordering::Release);
    pool.flush_obj(pool.root(0).unwrap());
    pool.persist_obj(pool.root(1).unwrap());
    let mut e = Engine { pool: Arc::clone(&pool), ext, mirror: vec![PPtr::NULL; SLOTS as usize] };
    let mut rng = SmallRng::seed_from_u64(seed);
    for _ in 0..12 {
        step(&c, &mut e, &mut rng);
    }
    pool.crash_after_fences(k, CrashOptions::random(seed)).unwrap();
    let mut plain_at_crash = false;
    for _ in 0..40 {
        let plain = step(&c, &mut e, &mut rng);
        if pool.has_crashed() {
            plain_at_crash = plain;
            break;
        }
    }
    let fired = pool.has_crashed();
    if !fired {
        pool.cancel_crash();
        pool.crash(CrashOptions::random(seed)).unwrap();
    }
    drop((c, e, pool));

    let mut oc = OpenConfig::new(engine());
    oc.sim = SimMode::Shadow;
    let pool = open_retrying(dir.path(), oc);
    assert!(!pool.was_clean());
    let root = PPtr::from_raw(pool.root(0).unwrap().load(Ordering::Acquire));
    let ext = PPtr::from_raw(pool.root(1).unwrap().load(Ordering::Acquire));
    let reachable: HashSet<PPtr> = (0..SLOTS)
        .map(|i| PPtr::from_raw(word(&pool, ext, 8 * i).load(Ordering::Acquire)))
        .filter(|p| !p.is_null())
        .collect();
    let (c, rec) = Calloc::open(Arc::clone(&pool), root, |p| reachable.contains(&p))
        .unwrap_or_else(|err| panic!("k={k} seed={seed}: recovery failed: {err}"));
    let allocated: HashSet<PPtr> = c.allocated_blocks().into_iter().collect();
    let ctx = format!("{mode} k={k} seed={seed} fired={fired} plain={plain_at_crash} {rec:?}");
    let missing: Vec<_> = reachable.difference(&allocated).collect();
    assert!(missing.is_empty(), "{ctx}: reachable but not allocated: {missing:?}");
    let leaked: Vec<_> = allocated.difference(&reachable).collect();
    // Only an unlogged plain alloc/free in flight at the crash may leak, and only its one block.
    let allowed = if plain_at_crash { 1 } else { 0 };
    assert!(leaked.len() <= allowed, "{ctx}: leaked {leaked:?}");
    // Further allocations never hand out a reachable (or an already handed-out) block.
    let mut seen = HashSet::new();
    for node in 0..2 {
        while let Ok(p) = c.alloc_on(node) {
            assert!(!allocated.contains(&p), "{ctx}: {p} allocated twice");
            assert!(seen.insert(p), "{ctx}: {p} returned twice");
        }
    }
    // Blocks left in other threads' rings (a deferred free may have run on any thread) are free
    // but reserved for those threads.
    let in_rings: u64 = c.stats().nodes.iter().map(|n| n.ring_blocks).sum();
    assert_eq!(
        seen.len() as u64 + allocated.len() as u64 + in_rings,
        2 * 4 * 64,
        "{ctx}: every block accounted for"
    );
    fired
}

#[test]
fn crash_adr_shadow_smos_leave_no_leak_and_no_double_allocation() {
    let _serial = serial();
    let mut fired = 0;
    for k in 1..=100 * numakv_pmem::crash::test_scale() as u64 {
        fired += u64::from(crash_round(PersistMode::Adr, k, k * 7919 + 1));
    }
    assert!(fired > 50, "most scheduled crashes must hit the workload ({fired})");
}

#[test]
fn crash_eadr_shadow_smos_leave_no_leak_and_no_double_allocation() {
    let _serial = serial();
    let mut fired = 0;
    for k in 1..=50 * numakv_pmem::crash::test_scale() as u64 {
        fired += u64::from(crash_round(PersistMode::Eadr, k, k * 104_729 + 3));
    }
    assert!(fired > 25, "most scheduled crashes must hit the workload ({fired})");
}

#[test]
fn clean_close_reopens_and_recovers_an_unfinished_commit() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let pool =
        Pool::create(dir.path(), pool_cfg(PersistMode::Adr, SimMode::Direct, 1 << 20)).unwrap();
    let (c, root) = Calloc::create(Arc::clone(&pool), small(4, 4, 2)).unwrap();
    numakv_numa::set_current_node(0);
    let blocks: Vec<PPtr> = (0..10).map(|_| c.alloc(8).unwrap()).collect();
    for &p in &blocks[..3] {
        // SAFETY: unused blocks of this allocator.
        unsafe { c.free(p).unwrap() };
    }
    let guard = epoch::pin();
    let smo = c.smo_begin(&[blocks[3]], 1).unwrap();
    let fresh = smo.new_blocks()[0];
    // SAFETY: blocks[3] is "unlinked"; the still-pinned guard keeps the free from running.
    unsafe { smo.commit(&guard) };
    drop(c);
    drop(guard);
    pool.close().unwrap();
    drop(pool);

    let pool = Pool::open(dir.path(), OpenConfig::new(engine())).unwrap();
    assert!(pool.was_clean());
    let mut live: HashSet<PPtr> = blocks[4..].iter().copied().collect();
    live.insert(fresh);
    let (c, rec) = Calloc::open(Arc::clone(&pool), root, |p| live.contains(&p)).unwrap();
    assert_eq!(rec.blocks_recovered, 1, "{rec:?}");
    // The SMO's new block came from the ring's head, leaving two there.
    assert_eq!(fresh, blocks[0]);
    assert_eq!(rec.ring_blocks, 2, "{rec:?}");
    assert_eq!(rec.log_slots_replayed, 1, "{rec:?}");
    let allocated: HashSet<PPtr> = c.allocated_blocks().into_iter().collect();
    assert_eq!(allocated, live);
    let p = c.alloc(8).unwrap();
    assert!(!live.contains(&p));
}

// ---------------------------------------------------------------------------------------------
// Bad input
// ---------------------------------------------------------------------------------------------

fn patch(dir: &Path, node: usize, off: u64, bytes: &[u8]) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().write(true).open(node_path(dir, node)).unwrap();
    f.write_all_at(bytes, off).unwrap();
}

#[test]
fn corrupted_metadata_is_an_error_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let pool =
        Pool::create(dir.path(), pool_cfg(PersistMode::Adr, SimMode::Direct, 1 << 20)).unwrap();
    let (c, root) = Calloc::create(Arc::clone(&pool), small(4, 4, 2)).unwrap();
    let a = c.alloc_on(1).unwrap();
    // SAFETY: unused block.
    unsafe { c.free(a).unwrap() };
    let bases: Vec<PPtr> = (0..2)
        .map(|n| PPtr::from_raw(word(&pool, root, 64 + 8 * n).load(Ordering::Acquire)))
        .collect();
    let rings_off = word(&pool, bases[0], 72).load(Ordering::Acquire);
    let logs_off = word(&pool, bases[0], 80).load(Ordering::Acquire);
    let chunks_off = word(&pool, bases[0], 88).load(Ordering::Acquire);
    drop(c);
    pool.close().unwrap();
    drop(pool);
    let pristine: Vec<Vec<u8>> =
        (0..2).map(|n| std::fs::read(node_path(dir.path(), n)).unwrap()).collect();
    let restore = || {
        for (n, b) in pristine.iter().enumerate() {
            std::fs::write(node_path(dir.path(), n), b).unwrap();
        }
    };
    let open = |root: PPtr| {
        let pool = Pool::open(dir.path(), OpenConfig::new(engine())).unwrap();
        Calloc::open(pool, root, |_| false).map(|(c, _)| {
            // Whatever recovery accepted must be usable without panicking.
            let _ = c.allocated_blocks();
            let _ = c.stats();
            for n in 0..2 {
                let _ = c.alloc_on(n);
            }
        })
    };
    assert!(open(root).is_ok(), "the pristine store opens");
    let corrupted = |r: &Result<(), PoolError>| matches!(r, Err(PoolError::Corrupted { .. }));

    let cases: Vec<(&str, usize, u64, Vec<u8>)> = vec![
        ("directory magic", 0, root.offset(), b"XALLOCDR".to_vec()),
        ("directory node count", 0, root.offset() + 16, 7u64.to_le_bytes().to_vec()),
        ("directory pool pointer", 0, root.offset() + 72, 4096u64.to_le_bytes().to_vec()),
        ("node 1 block size", 1, bases[1].offset() + 16, 512u64.to_le_bytes().to_vec()),
        ("node 0 pool magic", 0, bases[0].offset(), [0u8; 8].to_vec()),
        ("node 1 ring tail", 1, bases[1].offset() + rings_off + 8, 99u64.to_le_bytes().to_vec()),
        ("node 0 log state", 0, bases[0].offset() + logs_off, 0xdeadu64.to_le_bytes().to_vec()),
        ("node 0 bitmap past alloc_num", 0, bases[0].offset() + 192 + 8, [0xff].to_vec()),
    ];
    for (what, node, off, bytes) in cases {
        restore();
        patch(dir.path(), node, off, &bytes);
        let r = open(root);
        assert!(corrupted(&r), "{what}: {r:?}");
    }
    restore();
    assert!(open(PPtr::NULL).is_err(), "null root");
    assert!(open(bases[0]).is_err(), "a pool extent is not a directory");

    // Random byte flips anywhere in Calloc's metadata: Ok or Err, never a panic.
    let mut rng = SmallRng::seed_from_u64(42);
    for _ in 0..150 {
        restore();
        let node = rng.gen_range(0..2);
        let off = if rng.gen_bool(0.2) {
            root.offset() + rng.gen_range(0..80)
        } else {
            bases[node].offset() + rng.gen_range(0..chunks_off)
        };
        let fnode = if off >= root.offset() && off < root.offset() + 4096 { 0 } else { node };
        patch(dir.path(), fnode, off, &[rng.gen()]);
        let _ = open(root);
    }
}

// ---------------------------------------------------------------------------------------------
// NUMA placement
// ---------------------------------------------------------------------------------------------

#[test]
fn per_node_pools_follow_the_requested_and_current_node() {
    let pool = Pool::volatile(pool_cfg(PersistMode::Adr, SimMode::Direct, 1 << 20)).unwrap();
    let (c, _) = Calloc::create(Arc::clone(&pool), small(2, 4, 2)).unwrap();
    assert_eq!(c.alloc_on(1).unwrap().node(), 1);
    assert_eq!(c.alloc_on(0).unwrap().node(), 0);
    assert!(matches!(c.alloc_on(2), Err(PoolError::InvalidArgument(_))));
    numakv_numa::set_current_node(1);
    assert_eq!(c.alloc(64).unwrap().node(), 1);
    let smo = c.smo_begin(&[], 2).unwrap();
    assert!(smo.new_blocks().iter().all(|p| p.node() == 1));
    smo.abort();
    numakv_numa::set_current_node(0);
    assert_eq!(c.alloc(64).unwrap().node(), 0);
    let stats = c.stats();
    assert_eq!(stats.nodes.len(), 2);
    assert_eq!((stats.nodes[0].chunks_handed_out, stats.nodes[1].chunks_handed_out), (1, 1));
    assert_eq!(stats.nodes[1].allocated_blocks, 2);
}
