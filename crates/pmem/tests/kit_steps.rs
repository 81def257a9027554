//! Crash points on the steps (docs/design.md §12.3): a crash before the n-th PM store
//! ([`WriteWatch`], the eADR step), at the k-th hit of a pause point ([`Scenario::crash_at`]),
//! the fence count ([`Pool::fence_count`]), and chaos schedules taking steps on the accessors.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use numakv_pmem::failpoint::Scenario;
use numakv_pmem::steps::WriteWatch;
use numakv_pmem::{CrashOptions, EngineId, OpenConfig, PersistMode, Pool, PoolConfig, SimMode};

fn engine() -> EngineId {
    EngineId::new("stepstest", 1)
}

fn create(dir: &Path, mode: PersistMode) -> Arc<Pool> {
    let mut c = PoolConfig::new(engine(), 2 << 20);
    c.nodes = 1;
    c.page_size = 64 << 10;
    c.mode = mode;
    c.sim = SimMode::Shadow;
    Pool::create(dir, c).unwrap()
}

fn roots_after_reopen(dir: &Path, n: usize) -> Vec<u64> {
    let mut c = OpenConfig::new(engine());
    c.sim = SimMode::Shadow;
    let pool = Pool::open(dir, c).unwrap();
    (0..n).map(|i| pool.root(i).unwrap().load(Ordering::Acquire)).collect()
}

#[test]
fn an_eadr_crash_before_the_nth_store_keeps_exactly_the_stores_before_it() {
    for n in 1..=4u64 {
        let dir = tempfile::tempdir().unwrap();
        let pool = create(dir.path(), PersistMode::Eadr);
        let watch = WriteWatch::new(&pool, Some(n), CrashOptions::STRICT);
        for i in 0..4 {
            pool.root(i).unwrap().store(10 + i as u64, Ordering::Release);
        }
        assert_eq!(watch.writes(), n, "the watch stops counting at the crash");
        drop(watch);
        assert!(pool.has_crashed());
        drop(pool);
        let want: Vec<u64> = (0..4).map(|i| if i < n - 1 { 10 + i } else { 0 }).collect();
        assert_eq!(roots_after_reopen(dir.path(), 4), want, "crash before store {n}");
    }
}

#[test]
fn a_count_only_watch_counts_the_pools_stores_and_no_others() {
    let dir = tempfile::tempdir().unwrap();
    let pool = create(dir.path(), PersistMode::Eadr);
    let other = tempfile::tempdir().unwrap();
    let other = create(other.path(), PersistMode::Eadr);
    let watch = WriteWatch::new(&pool, None, CrashOptions::STRICT);
    pool.root(0).unwrap().store(1, Ordering::Release);
    let _ = pool.root(1).unwrap().compare_exchange(0, 2, Ordering::AcqRel, Ordering::Acquire);
    other.root(0).unwrap().store(1, Ordering::Release);
    assert_eq!(watch.writes(), 2);
    assert!(!pool.has_crashed());
}

fn step_twice(pool: &Pool) {
    pool.root(0).unwrap().store(1, Ordering::Release);
    pool.persist_obj(pool.root(0).unwrap());
    numakv_pmem::pause_point!("kit.step");
    pool.root(1).unwrap().store(2, Ordering::Release);
    pool.persist_obj(pool.root(1).unwrap());
    numakv_pmem::pause_point!("kit.step");
    pool.root(2).unwrap().store(3, Ordering::Release);
    pool.persist_obj(pool.root(2).unwrap());
}

#[test]
fn a_crash_at_the_kth_hit_of_a_pause_point_and_by_thread() {
    for (k, want) in [(1, vec![1, 0, 0]), (2, vec![1, 2, 0])] {
        let dir = tempfile::tempdir().unwrap();
        let pool = create(dir.path(), PersistMode::Adr);
        let sc = Scenario::setup();
        let armed = sc.crash_at("kit.step", k, None, Arc::clone(&pool), CrashOptions::STRICT);
        step_twice(&pool);
        assert_eq!(armed.hits(), 2);
        drop(armed); // it holds the pool
        drop(sc);
        assert!(pool.has_crashed());
        drop(pool);
        assert_eq!(roots_after_reopen(dir.path(), 3), want, "crash at hit {k}");
    }
    // Only the named thread's hits count.
    let dir = tempfile::tempdir().unwrap();
    let pool = create(dir.path(), PersistMode::Adr);
    let sc = Scenario::setup();
    let _armed =
        sc.crash_at("kit.step", 1, Some("kit-stepper"), Arc::clone(&pool), CrashOptions::STRICT);
    step_twice(&pool);
    assert!(!pool.has_crashed(), "another thread's hit crashed the pool");
    let p = Arc::clone(&pool);
    numakv_pmem::failpoint::spawn_named("kit-stepper", move || step_twice(&p)).join().unwrap();
    assert!(pool.has_crashed());
}

#[test]
fn fences_are_counted_in_both_modes() {
    for mode in [PersistMode::Adr, PersistMode::Eadr] {
        let dir = tempfile::tempdir().unwrap();
        let pool = create(dir.path(), mode);
        let before = pool.fence_count();
        step_twice(&pool);
        assert_eq!(pool.fence_count() - before, 3, "{mode}");
    }
}

#[test]
fn chaos_preempts_accessor_steps_and_names_its_seed() {
    let dir = tempfile::tempdir().unwrap();
    let pool = create(dir.path(), PersistMode::Adr);
    numakv_pmem::chaos::enable(7);
    assert_eq!(numakv_pmem::chaos::note(), " [NUMAKV_CHAOS=7]");
    let (s0, p0) = (numakv_pmem::chaos::steps(), numakv_pmem::chaos::preemptions());
    for i in 0..20_000u64 {
        pool.root(3).unwrap().store(i, Ordering::Relaxed);
    }
    numakv_pmem::chaos::disable();
    let (s1, p1) = (numakv_pmem::chaos::steps(), numakv_pmem::chaos::preemptions());
    assert!(s1 - s0 >= 20_000, "every store is a chaos step ({} steps)", s1 - s0);
    assert!(p1 > p0, "20 000 steps made no preemption");
    assert!(p1 - p0 < (s1 - s0) / 8, "chaos preempts rarely ({} of {})", p1 - p0, s1 - s0);
    assert_eq!(numakv_pmem::chaos::seed(), None);
}
