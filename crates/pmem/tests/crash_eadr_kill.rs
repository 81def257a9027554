//! eADR crash semantics through a real SIGKILL: an unflushed store made by a killed process is
//! still in the store when it is reopened (the persistence domain includes the caches), and the
//! store is recognised as not cleanly closed.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::Duration;

use numakv_pmem::crash::{child_role, KillHarness, KillOutcome, SideFile};
use numakv_pmem::heap::OWNER_ENGINE;
use numakv_pmem::{EngineId, OpenConfig, PPtr, PersistMode, PmU64, Pool, PoolConfig};

fn engine() -> EngineId {
    EngineId::new("eadr-kill-test", 1)
}

/// Child: count upwards in a PM word without ever flushing; after each store, acknowledge the
/// value in the side file. Loops until killed.
fn child(dir: PathBuf) {
    let pool = Pool::open(&dir, OpenConfig::new(engine())).expect("child opens the store");
    let side = SideFile::open(&dir.join("side")).expect("side file");
    let word = PPtr::from_raw(pool.root(0).unwrap().load(Ordering::Acquire));
    let word: &PmU64 = pool.get(word).expect("counter word");
    let ack = side.word(0).unwrap();
    let start = word.load(Ordering::Acquire);
    for i in start + 1.. {
        word.store(i, Ordering::Release); // no flush: eADR makes it durable when visible
        ack.store(i, Ordering::Release);
    }
}

#[test]
fn crash_eadr_kill_keeps_unflushed_stores() {
    if let Some(arg) = child_role() {
        child(PathBuf::from(arg));
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("store");
    let mut cfg = PoolConfig::new(engine(), 2 << 20);
    cfg.mode = PersistMode::Eadr;
    cfg.page_size = 64 << 10;
    {
        let pool = Pool::create(&dir, cfg).unwrap();
        let page = pool.alloc_pages(0, 1, OWNER_ENGINE, 0).unwrap();
        pool.root(0).unwrap().store(page.raw(), Ordering::Release);
        pool.close().unwrap();
    }
    let side = SideFile::create(&dir.join("side"), 1).unwrap();
    let harness = KillHarness::new("crash_eadr_kill_keeps_unflushed_stores");
    for round in 0..3 * numakv_pmem::crash::test_scale() {
        let before = side.word(0).unwrap().load(Ordering::Acquire);
        let outcome = harness
            .run_until(
                dir.to_str().unwrap(),
                || side.word(0).unwrap().load(Ordering::Acquire) > before + 1000,
                Duration::from_millis(5),
                Duration::from_secs(20),
            )
            .unwrap();
        assert!(
            matches!(outcome, KillOutcome::Killed(_)),
            "round {round}: child ended early: {outcome:?}"
        );
        let acked = side.word(0).unwrap().load(Ordering::Acquire);
        assert!(acked > before, "round {round}: child made no progress");
        let pool = Pool::open(&dir, OpenConfig::new(engine())).unwrap();
        assert!(!pool.was_clean(), "a killed store must not look cleanly closed");
        let word = PPtr::from_raw(pool.root(0).unwrap().load(Ordering::Acquire));
        let value = pool.get::<PmU64>(word).unwrap().load(Ordering::Acquire);
        // The store of i precedes the acknowledgement of i, so at least `acked` is there; at
        // most one store beyond the last acknowledgement can be present.
        assert!(
            value == acked || value == acked + 1,
            "round {round}: value {value}, acked {acked}"
        );
        // Continue counting from the recovered value in the next round.
        side.word(0).unwrap().store(value, Ordering::Release);
        pool.close().unwrap();
    }
}
