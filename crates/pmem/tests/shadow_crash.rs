//! ADR shadow mode: what a simulated power failure keeps and loses.
//!
//! ADR: a store is durable only once its line was flushed and the flushing thread fenced; a
//! flushed-but-unfenced line may or may not have made it; an unflushed dirty line survives only if
//! the cache happened to evict it. eADR: every store survives. A clean close keeps everything.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};

use numakv_pmem::heap::OWNER_ENGINE;
use numakv_pmem::{
    CrashOptions, EngineId, OpenConfig, PPtr, PersistMode, PmU64, Pool, PoolConfig, PoolError,
    SimMode,
};

const CAP: u64 = 2 << 20;
const PAGE: u64 = 64 << 10;

fn engine() -> EngineId {
    EngineId::new("shadowtest", 1)
}

fn create(dir: &Path, mode: PersistMode) -> Arc<Pool> {
    let mut c = PoolConfig::new(engine(), CAP);
    c.nodes = 2;
    c.page_size = PAGE;
    c.mode = mode;
    c.sim = SimMode::Shadow;
    let pool = Pool::create(dir, c).unwrap();
    assert!(pool.is_shadow());
    assert_eq!(pool.mode(), mode);
    pool
}

fn open(dir: &Path) -> Arc<Pool> {
    let mut c = OpenConfig::new(engine());
    c.sim = SimMode::Shadow;
    let pool = Pool::open(dir, c).unwrap();
    assert!(pool.is_shadow());
    pool
}

/// A store with one persisted one-page extent per node, recorded in root slots 0 and 1, each
/// page's first word persisted as 0. Returns the pool (still open) and the two pages.
fn setup(dir: &Path, mode: PersistMode) -> (Arc<Pool>, [PPtr; 2]) {
    let pool = create(dir, mode);
    let mut pages = [PPtr::NULL; 2];
    for (node, page) in pages.iter_mut().enumerate() {
        *page = pool.alloc_pages(node, 1, OWNER_ENGINE, 0).unwrap();
        let w: &PmU64 = pool.get(*page).unwrap();
        w.store(0, Ordering::Release);
        pool.persist_obj(w);
        let root = pool.root(node).unwrap();
        root.store(page.raw(), Ordering::Release);
        pool.persist_obj(root);
    }
    (pool, pages)
}

fn word(pool: &Pool, p: PPtr) -> &PmU64 {
    pool.get(p).unwrap()
}

fn root_page(pool: &Pool, slot: usize) -> PPtr {
    PPtr::from_raw(pool.root(slot).unwrap().load(Ordering::Acquire))
}

#[test]
fn unflushed_store_is_lost_after_strict_crash() {
    let d = tempfile::tempdir().unwrap();
    let (pool, pages) = setup(d.path(), PersistMode::Adr);
    for p in pages {
        word(&pool, p).store(0x1111, Ordering::Release);
    }
    pool.root(5).unwrap().store(0x5555, Ordering::Release);
    // The working memory sees the stores until the crash.
    assert_eq!(word(&pool, pages[1]).load(Ordering::Acquire), 0x1111);
    let report = pool.crash(CrashOptions::STRICT).unwrap();
    assert!(report.dirty_lost >= 3, "{report:?}");
    assert_eq!(report.dirty_evicted, 0);
    assert_eq!(report.pending_applied + report.pending_dropped, 0);
    assert!(pool.has_crashed());
    assert_eq!(pool.crash_count(), 1);
    // A second crash is a no-op.
    assert_eq!(pool.crash(CrashOptions::STRICT).unwrap(), Default::default());
    drop(pool);

    let pool = open(d.path());
    assert!(!pool.was_clean());
    assert_eq!(root_page(&pool, 0), pages[0], "the persisted root survives");
    assert_eq!(root_page(&pool, 1), pages[1]);
    for p in pages {
        assert_eq!(word(&pool, p).load(Ordering::Acquire), 0, "unflushed store survived");
    }
    assert_eq!(pool.root(5).unwrap().load(Ordering::Acquire), 0);
    pool.close().unwrap();
}

#[test]
fn flushed_and_fenced_store_survives() {
    let d = tempfile::tempdir().unwrap();
    let (pool, pages) = setup(d.path(), PersistMode::Adr);
    for (i, p) in pages.iter().enumerate() {
        let w = word(&pool, *p);
        w.store(0x2222 + i as u64, Ordering::Release);
        pool.persist_obj(w);
    }
    // A multi-line range, flushed as one and fenced once.
    let b = pool.bytes(pages[0].add(100).unwrap(), 300).unwrap();
    // SAFETY: single-threaded test; nobody else touches the page.
    assert!(unsafe { b.fill(0, 300, 0xab) });
    pool.flush(b.as_ptr(), b.len());
    pool.fence();
    let report = pool.crash(CrashOptions::STRICT).unwrap();
    assert_eq!(report.dirty_lost, 0, "{report:?}");
    drop(pool);

    let pool = open(d.path());
    for (i, p) in pages.iter().enumerate() {
        assert_eq!(word(&pool, *p).load(Ordering::Acquire), 0x2222 + i as u64);
    }
    let mut buf = [0u8; 302];
    let b = pool.bytes(pages[0].add(99).unwrap(), 302).unwrap();
    // SAFETY: as above.
    assert!(unsafe { b.read(0, &mut buf) });
    assert_eq!(buf[0], 0);
    assert!(buf[1..301].iter().all(|&x| x == 0xab));
    assert_eq!(buf[301], 0);
}

/// Opens the store, persists 0, stores `v` and flushes it without a fence, crashes with `opts`.
/// Returns whether `v` survived the crash.
fn unfenced_round(dir: &Path, page: PPtr, v: u64, opts: CrashOptions) -> bool {
    let pool = open(dir);
    let w = word(&pool, page);
    assert_eq!(w.load(Ordering::Acquire), 0);
    w.store(v, Ordering::Release);
    pool.flush_obj(w);
    let report = pool.crash(opts).unwrap();
    assert_eq!(report.pending_applied + report.pending_dropped, 1, "{report:?}");
    drop(pool);
    let pool = open(dir);
    let w = word(&pool, page);
    let got = w.load(Ordering::Acquire);
    assert!(got == 0 || got == v, "torn or foreign value {got:#x}");
    assert_eq!(got == v, report.pending_applied == 1, "{report:?}");
    // Reset to 0 durably for the next round.
    w.store(0, Ordering::Release);
    pool.persist_obj(w);
    pool.close().unwrap();
    got == v
}

#[test]
fn flushed_but_unfenced_store_may_or_may_not_survive() {
    let d = tempfile::tempdir().unwrap();
    let (pool, pages) = setup(d.path(), PersistMode::Adr);
    pool.close().unwrap();
    drop(pool);
    let page = pages[1];
    let seeds = 0..64u64;
    let half = CrashOptions { pending_survival: 0.5, dirty_eviction: 0.0, seed: 0 };
    let survived = seeds
        .clone()
        .filter(|&seed| unfenced_round(d.path(), page, 1000 + seed, CrashOptions { seed, ..half }))
        .count();
    assert!(survived > 0 && survived < 64, "survival 0.5: {survived}/64 survived");
    // The same seed replays the same outcome.
    let replay = seeds
        .clone()
        .take(8)
        .map(|seed| unfenced_round(d.path(), page, 7, CrashOptions { seed, ..half }))
        .collect::<Vec<_>>();
    let replay2 = seeds
        .clone()
        .take(8)
        .map(|seed| unfenced_round(d.path(), page, 9, CrashOptions { seed, ..half }))
        .collect::<Vec<_>>();
    assert_eq!(replay, replay2);
    for seed in seeds.clone().take(16) {
        let never = CrashOptions { pending_survival: 0.0, ..CrashOptions { seed, ..half } };
        assert!(!unfenced_round(d.path(), page, 5, never), "survival 0.0, seed {seed}");
        let always = CrashOptions { pending_survival: 1.0, ..CrashOptions { seed, ..half } };
        assert!(unfenced_round(d.path(), page, 6, always), "survival 1.0, seed {seed}");
    }
}

#[test]
fn dirty_eviction_keeps_unflushed_stores() {
    let d = tempfile::tempdir().unwrap();
    let (pool, pages) = setup(d.path(), PersistMode::Adr);
    for (i, p) in pages.iter().enumerate() {
        word(&pool, *p).store(0x3333 + i as u64, Ordering::Release);
    }
    pool.root(7).unwrap().store(77, Ordering::Release);
    let opts = CrashOptions { pending_survival: 0.0, dirty_eviction: 1.0, seed: 3 };
    let report = pool.crash(opts).unwrap();
    assert!(report.dirty_evicted >= 3 && report.dirty_lost == 0, "{report:?}");
    drop(pool);
    let pool = open(d.path());
    for (i, p) in pages.iter().enumerate() {
        assert_eq!(word(&pool, *p).load(Ordering::Acquire), 0x3333 + i as u64);
    }
    assert_eq!(pool.root(7).unwrap().load(Ordering::Acquire), 77);
}

#[test]
fn crash_after_fences_freezes_at_the_kth_fence() {
    let d = tempfile::tempdir().unwrap();
    let (pool, _) = setup(d.path(), PersistMode::Adr);
    pool.close().unwrap();
    drop(pool);
    for (k, survival) in (0..=12u64).flat_map(|k| [(k, 0.0), (k, 1.0)]) {
        let pool = open(d.path());
        // Opening issued its own fences; the schedule counts from now.
        let r = pool.root(9).unwrap();
        assert_eq!(r.load(Ordering::Acquire), 0, "k={k}");
        let opts = CrashOptions { pending_survival: survival, ..CrashOptions::STRICT };
        pool.crash_after_fences(k, opts).unwrap();
        assert_eq!(pool.has_crashed(), k == 0);
        for i in 1..=10u64 {
            r.store(i, Ordering::Release);
            pool.persist_obj(r);
            assert_eq!(pool.has_crashed(), i >= k, "k={k} i={i}");
        }
        if k > 10 {
            pool.crash(CrashOptions::STRICT).unwrap();
        }
        assert_eq!(pool.crash_count(), 1);
        drop(pool);
        let pool = open(d.path());
        assert!(!pool.was_clean());
        let r = pool.root(9).unwrap();
        // The crash fires during the k-th fence: the k-th value was flushed but its fence did
        // not complete, so it survives exactly when pending lines do.
        let expected = match k {
            0 => 0,
            1..=10 if survival == 0.0 => k - 1,
            _ => k.min(10),
        };
        assert_eq!(
            r.load(Ordering::Acquire),
            expected,
            "crash during fence {k}, survival {survival}"
        );
        r.store(0, Ordering::Release);
        pool.persist_obj(r);
        pool.close().unwrap();
    }
    // A cancelled schedule never fires.
    let pool = open(d.path());
    pool.crash_after_fences(2, CrashOptions::STRICT).unwrap();
    pool.cancel_crash();
    for _ in 0..5 {
        pool.fence();
    }
    assert!(!pool.has_crashed());
    pool.close().unwrap();
}

#[test]
fn eadr_shadow_keeps_unflushed_stores() {
    let d = tempfile::tempdir().unwrap();
    let (pool, pages) = setup(d.path(), PersistMode::Eadr);
    for (i, p) in pages.iter().enumerate() {
        word(&pool, *p).store(0x4444 + i as u64, Ordering::Release);
    }
    pool.root(3).unwrap().store(33, Ordering::Release);
    let report = pool.crash(CrashOptions::STRICT).unwrap();
    assert_eq!(report.dirty_lost, 0, "{report:?}");
    drop(pool);
    let pool = open(d.path());
    assert_eq!(pool.mode(), PersistMode::Eadr);
    assert!(!pool.was_clean());
    for (i, p) in pages.iter().enumerate() {
        assert_eq!(word(&pool, *p).load(Ordering::Acquire), 0x4444 + i as u64);
    }
    assert_eq!(pool.root(3).unwrap().load(Ordering::Acquire), 33);

    // Scheduled crashes count fences in eADR too; everything stored before the k-th fence stays.
    let r = pool.root(4).unwrap();
    pool.crash_after_fences(3, CrashOptions::STRICT).unwrap();
    for i in 1..=6u64 {
        r.store(i, Ordering::Release);
        pool.fence();
    }
    assert!(pool.has_crashed());
    drop(pool);
    let pool = open(d.path());
    assert_eq!(pool.root(4).unwrap().load(Ordering::Acquire), 3);
}

#[test]
fn clean_close_keeps_everything_and_crash_is_unclean() {
    let d = tempfile::tempdir().unwrap();
    let (pool, pages) = setup(d.path(), PersistMode::Adr);
    assert!(!pool.was_clean(), "a new store was not closed cleanly before");
    for (i, p) in pages.iter().enumerate() {
        word(&pool, *p).store(0x5050 + i as u64, Ordering::Release);
    }
    // Flushed, unfenced: also written back by close.
    let r = pool.root(6).unwrap();
    r.store(66, Ordering::Release);
    pool.flush_obj(r);
    pool.close().unwrap();
    pool.close().unwrap(); // idempotent
    drop(pool);

    let pool = open(d.path());
    assert!(pool.was_clean());
    for (i, p) in pages.iter().enumerate() {
        assert_eq!(word(&pool, *p).load(Ordering::Acquire), 0x5050 + i as u64);
    }
    assert_eq!(pool.root(6).unwrap().load(Ordering::Acquire), 66);
    pool.crash(CrashOptions::STRICT).unwrap();
    assert!(matches!(pool.close(), Err(PoolError::InvalidArgument(_))), "close after crash");
    drop(pool);

    let pool = open(d.path());
    assert!(!pool.was_clean(), "a crashed session must not read as clean");
    // The crashed session's "open" marking was durable, so this holds with any crash options.
    pool.crash(CrashOptions { pending_survival: 1.0, dirty_eviction: 1.0, seed: 1 }).unwrap();
    drop(pool);
    let pool = open(d.path());
    assert!(!pool.was_clean());
    pool.close().unwrap();
    drop(pool);
    assert!(open(d.path()).was_clean());
}

#[test]
fn generation_increments_per_open() {
    let d = tempfile::tempdir().unwrap();
    let pool = create(d.path(), PersistMode::Adr);
    assert_eq!(pool.generation(), 1);
    pool.close().unwrap();
    drop(pool);
    let pool = open(d.path());
    assert_eq!(pool.generation(), 2);
    pool.crash(CrashOptions::STRICT).unwrap();
    drop(pool);
    let pool = open(d.path());
    assert_eq!(pool.generation(), 3, "the generation persisted at open survives a crash");
    drop(pool); // dropped without close: like a crash with only fenced lines
    let pool = Pool::open(d.path(), OpenConfig::new(engine())).unwrap();
    assert!(!pool.is_shadow());
    assert!(!pool.was_clean());
    assert_eq!(pool.generation(), 4);
    pool.close().unwrap();
    drop(pool);
    assert_eq!(open(d.path()).generation(), 5);
}

#[test]
fn heap_allocations_survive_and_post_crash_frees_are_undone() {
    let d = tempfile::tempdir().unwrap();
    let (pool, pages) = setup(d.path(), PersistMode::Adr);
    let a = pool.alloc_pages(0, 3, OWNER_ENGINE, 42).unwrap();
    let b = pool.alloc_pages(1, 2, OWNER_ENGINE, 43).unwrap();
    let c = pool.alloc_pages(1, 1, OWNER_ENGINE, 44).unwrap();
    pool.free_pages(c).unwrap(); // before the crash: durable
    pool.crash(CrashOptions::STRICT).unwrap();
    // After the crash point nothing reaches the image.
    assert!(pool.alloc_pages(0, 1, OWNER_ENGINE, 0).is_err(), "alloc after a crash");
    let _ = pool.free_pages(a);
    let _ = pool.free_pages(pages[1]);
    drop(pool);

    let pool = open(d.path());
    for n in 0..2 {
        pool.check_heap(n).unwrap();
    }
    let e0 = pool.extents(0).unwrap();
    let e1 = pool.extents(1).unwrap();
    assert_eq!(e0.len(), 2, "{e0:?}");
    assert_eq!(e1.len(), 2, "{e1:?}");
    assert!(e0.iter().any(|e| e.ptr == pages[0] && e.pages == 1));
    assert!(e0.iter().any(|e| e.ptr == a && e.pages == 3 && e.aux == 42), "{e0:?}");
    assert!(e1.iter().any(|e| e.ptr == pages[1] && e.pages == 1), "post-crash free undone");
    assert!(e1.iter().any(|e| e.ptr == b && e.pages == 2 && e.aux == 43));
    assert!(e1.iter().all(|e| e.ptr != c), "pre-crash free is durable");
    assert_eq!(pool.heap_usage(0).unwrap().0, 4);
    assert_eq!(pool.heap_usage(1).unwrap().0, 3);
    assert_eq!(pool.page_info(a.add(2 * PAGE + 5).unwrap()).unwrap().extent, a);
}

/// ADR promises that a line this thread flushed and fenced is durable, whatever other threads do
/// to the same line afterwards, as long as they only write *other* words. Thread A flushes line L
/// (holding its word w1) but fences late; meanwhile thread B writes w2 in the same line and
/// persists it (flush + fence). A's later fence must not roll w2 back in the durable image.
#[test]
fn persists_of_different_words_in_one_line_from_two_threads() {
    let d = tempfile::tempdir().unwrap();
    let (pool, pages) = setup(d.path(), PersistMode::Adr);
    let w1 = pages[0];
    let w2 = pages[0].add(8).unwrap(); // same 64-byte line
    let (to_b, from_a) = mpsc::channel::<()>();
    let (to_a, from_b) = mpsc::channel::<()>();
    std::thread::scope(|s| {
        let pool = &pool;
        s.spawn(move || {
            let w = word(pool, w1);
            w.store(1, Ordering::Release);
            pool.flush_obj(w);
            to_b.send(()).unwrap();
            from_b.recv().unwrap();
            pool.fence();
            to_b.send(()).unwrap();
        });
        from_a.recv().unwrap();
        let w = word(pool, w2);
        w.store(2, Ordering::Release);
        pool.persist_obj(w); // w2 = 2 is durable from here on
        to_a.send(()).unwrap();
        from_a.recv().unwrap();
    });
    pool.crash(CrashOptions::STRICT).unwrap();
    drop(pool);
    let pool = open(d.path());
    assert_eq!(word(&pool, w1).load(Ordering::Acquire), 1, "A's flushed+fenced word");
    assert_eq!(
        word(&pool, w2).load(Ordering::Acquire),
        2,
        "B's flushed+fenced word was rolled back by A's later fence of an older copy of the line"
    );
}

/// A persist from a thread-local destructor that runs after the thread's dense id was torn
/// down (crossbeam-epoch runs deferred frees from its handle's destructor as a thread exits)
/// must not panic: a panic there aborts the whole process. Its lines still become durable.
#[test]
fn a_persist_from_a_late_thread_local_destructor_works() {
    struct LatePersist(Option<(Arc<Pool>, PPtr)>);
    impl Drop for LatePersist {
        fn drop(&mut self) {
            if let Some((pool, p)) = self.0.take() {
                let w: &PmU64 = pool.get(p).unwrap();
                w.store(77, Ordering::Release);
                pool.persist_obj(w);
            }
        }
    }
    thread_local! {
        static LATE: std::cell::RefCell<LatePersist> =
            const { std::cell::RefCell::new(LatePersist(None)) };
    }
    let dir = tempfile::tempdir().unwrap();
    let (pool, pages) = setup(dir.path(), PersistMode::Adr);
    let (p2, page) = (Arc::clone(&pool), pages[0]);
    std::thread::spawn(move || {
        // Registered first, so destroyed after the dense id (destructors run in reverse).
        LATE.with(|l| l.borrow_mut().0 = Some((p2, page)));
        assert!(numakv_pmem::numa::try_tid().is_ok());
    })
    .join()
    .unwrap();
    let w: &PmU64 = pool.get(pages[0]).unwrap();
    assert_eq!(w.load(Ordering::Acquire), 77);
    pool.crash(CrashOptions::STRICT).unwrap();
    drop(pool);
    let pool = open(dir.path());
    let w: &PmU64 = pool.get(pages[0]).unwrap();
    assert_eq!(w.load(Ordering::Acquire), 77, "the late persist reached the image");
}
