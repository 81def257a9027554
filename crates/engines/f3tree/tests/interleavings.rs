//! Forced interleavings of issue 21's two F3-tree bugs (docs/design.md §12): each test parks a
//! thread at a named point so the window is crossed every time, and each failed on the code
//! before its fix.
//!
//! Each test holds the failpoint registry (`Scenario`) from its first line: points are global
//! to the process, so the tests of this file run one at a time.

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use numakv_f3tree::{Evaluators, F3Tree, F3TreeOptions};
use numakv_index::{Engine, Error, Index};
use numakv_pmem::failpoint::{spawn_named, Scenario};
use numakv_pmem::{OpenConfig, Pool, PoolConfig};

fn counter(t: &F3Tree, name: &str) -> u64 {
    t.stats().counter(name).unwrap_or(0)
}

/// Polls `cond` for up to 20 s (a schedule that never gets there is a broken test).
fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !cond() {
        assert!(t0.elapsed() < Duration::from_secs(20), "timed out waiting for {what}");
        thread::sleep(Duration::from_millis(1));
    }
}

fn is_evaluator() -> bool {
    thread::current().name().is_some_and(|n| n.starts_with("f3-eval"))
}

/// `fo_limit = 1` deadlocked: a list always keeps its head FO, so a producer whose one FO is full
/// waited for a free that never came. The limit is now refused below 2.
#[test]
fn fo_limit_below_two_is_refused() {
    let _sc = Scenario::setup();
    for limit in [0, 1] {
        let pool = Pool::volatile(PoolConfig::new(F3Tree::engine_id(), 8 << 20)).unwrap();
        let opts = F3TreeOptions { fo_limit: Some(limit), ..F3TreeOptions::default() };
        match F3Tree::create(pool, &opts) {
            Err(Error::InvalidOptions(why)) => assert!(why.contains("fo_limit"), "{why}"),
            Err(e) => panic!("fo_limit {limit}: wrong error {e}"),
            Ok(t) => {
                // Before the fix: accepted, and the ninth write of a 4-entry-FO list hung.
                drop(t);
                panic!("fo_limit {limit} was accepted");
            }
        }
    }
}

/// At the FO limit the producer waits for the evaluators and resumes once they free an FO: the
/// evaluators are parked at the start of every evaluation while a producer fills two 4-entry
/// FOs; its ninth write must wait (it cannot link a third FO); released, the evaluators free the
/// tail FO and the producer completes.
#[test]
fn producers_wait_at_the_fo_limit_and_resume() {
    let sc = Scenario::setup();
    let pool = Pool::volatile(PoolConfig::new(F3Tree::engine_id(), 8 << 20)).unwrap();
    let opts = F3TreeOptions {
        fo_entries: 4,
        fo_limit: Some(2),
        count_threshold: 1,
        time_threshold: Duration::from_micros(10),
        ..F3TreeOptions::default()
    };
    let t = Arc::new(F3Tree::create(pool, &opts).unwrap());
    let held = sc.pause_when("f3tree.evaluate.drain", is_evaluator);
    let producer = {
        let t = Arc::clone(&t);
        spawn_named("producer", move || {
            for k in 1..=20u64 {
                t.upsert(k, k * 3).unwrap();
            }
        })
    };
    held.wait_parked();
    wait_for("the producer to wait at the limit", || counter(&t, "producer_waits") >= 1);
    thread::sleep(Duration::from_millis(30));
    assert!(!producer.is_finished(), "the producer went past the FO limit");
    assert_eq!(counter(&t, "fos"), 2, "the limit bounds the list to two FOs");
    assert_eq!(counter(&t, "pending_keys"), 8, "two full FOs and no more");
    held.release();
    producer.join().unwrap();
    for k in 1..=20u64 {
        assert_eq!(t.get(k).unwrap(), Some(k * 3), "key {k}");
    }
    assert!(t.wait_drained(Duration::from_secs(20)));
    assert!(counter(&t, "fos_freed") >= 4, "the evaluators freed FOs to let the producer on");
    t.check().unwrap();
    Arc::try_unwrap(t).unwrap().close().unwrap();
}

/// A "No Hash" lookup walked `cursor.fo` of every list it had listed — including a recovered list
/// that an evaluator retired meanwhile, whose last FO was freed and reused as a tree node: the
/// lookup read a tree node as an FO and failed with a corruption error (or, reused as another
/// list's FO, read entries that are not the list's). Retired lists are now skipped.
///
/// The FO is sized like a tree node (14 entries: 64 + 14·32 = 512 bytes) and there is a single
/// evaluator, so the block the evaluator frees when it retires the list is the next one it takes
/// for a tree split.
#[test]
fn no_hash_lookups_skip_retired_lists() {
    let sc = Scenario::setup();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    let mut cfg = PoolConfig::new(F3Tree::engine_id(), 16 << 20);
    cfg.nodes = 1;
    let base = F3TreeOptions {
        fo_entries: 14,
        evaluators: Evaluators::PerNode(1),
        hash_lookups: false,
        ..F3TreeOptions::default()
    };
    // Session 1: 10 keys stay pending (evaluators never due), then a crash (drop, no close).
    {
        let held = F3TreeOptions {
            count_threshold: u64::MAX,
            time_threshold: Duration::from_secs(3600),
            ..base.clone()
        };
        let t = F3Tree::create(Pool::create(&path, cfg).unwrap(), &held).unwrap();
        for k in 1..=10u64 {
            t.upsert(k, k).unwrap();
        }
        drop(t);
    }
    // Session 2: the 10 keys are in a recovering list, which the evaluator drains and retires.
    let reader_at = sc.pause_thread("f3tree.search_ptfos.listed", "reader");
    let pool = Pool::open(&path, OpenConfig::new(F3Tree::engine_id())).unwrap();
    let (t, _) = F3Tree::open(pool, &base).unwrap();
    let t = Arc::new(t);
    let reader = {
        let t = Arc::clone(&t);
        spawn_named("reader", move || t.get(5))
    };
    reader_at.wait_parked(); // the reader has listed the recovering list
    wait_for("the recovered list to be retired", || {
        counter(&t, "lists") == 0 && counter(&t, "pending_keys") == 0
    });
    // New keys: the evaluator splits the tree's only leaf, taking the retired FO's block.
    for k in 100..400u64 {
        t.upsert(k, k).unwrap();
    }
    assert!(t.wait_drained(Duration::from_secs(20)));
    reader_at.release();
    let got = reader.join().unwrap();
    assert_eq!(got.unwrap(), Some(5), "the lookup read the retired list's freed FO");
    t.check().unwrap();
    Arc::try_unwrap(t).unwrap().close().unwrap();
}

/// Evaluators write the tree outside the shard lock, so two of them could write one key's
/// versions out of order: evaluator A is inside its tree write of version 1 (parked), a producer
/// supersedes the key with version 2 in another list, whose evaluator B must not write version 2
/// before A's version 1 lands — else A's late write would leave the tree with the old value
/// after the key left the table (a lost update). The key's `applying` flag, inherited by the
/// superseding entry, holds B back until A is done.
#[test]
fn tree_writes_of_one_key_land_in_version_order() {
    let sc = Scenario::setup();
    let mut cfg = PoolConfig::new(F3Tree::engine_id(), 16 << 20);
    cfg.nodes = 1;
    let opts = F3TreeOptions {
        evaluators: Evaluators::PerNode(2),
        count_threshold: 1,
        time_threshold: Duration::from_micros(10),
        ..F3TreeOptions::default()
    };
    let t = Arc::new(F3Tree::create(Pool::volatile(cfg).unwrap(), &opts).unwrap());
    // The first list created goes to evaluator 0, the second to evaluator 1.
    let a_writing = sc.pause_thread("f3tree.evaluate.applying", "f3-eval-0-0");
    // Each producer stays alive until the end: a thread id (and so a list) is reused only
    // after its thread exits.
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let done_rx = Arc::new(std::sync::Mutex::new(done_rx));
    let mut producers = Vec::new();
    let mut write = |name: &str, v: u64| {
        let (t, done) = (Arc::clone(&t), Arc::clone(&done_rx));
        let (wrote_tx, wrote_rx) = std::sync::mpsc::channel();
        producers.push(spawn_named(name, move || {
            t.upsert(42, v).unwrap();
            wrote_tx.send(()).unwrap();
            let _ = done.lock().unwrap().recv();
        }));
        wrote_rx.recv().unwrap();
    };
    write("p1", 1);
    a_writing.wait_parked(); // A has flagged key 42 and is about to write version 1
    write("p2", 2);
    wait_for("evaluator 1 to wait for the key (or write it)", || {
        counter(&t, "apply_waits") >= 1 || t.tree().get(42).unwrap().is_some()
    });
    assert_eq!(t.tree().get(42).unwrap(), None, "version 2 was written while 1 was in flight");
    assert_eq!(t.get(42).unwrap(), Some(2));
    a_writing.release();
    assert!(t.wait_drained(Duration::from_secs(20)));
    assert_eq!(t.tree().get(42).unwrap(), Some(2), "the tree ends with an older version");
    assert_eq!(t.get(42).unwrap(), Some(2));
    t.check().unwrap();
    drop(done_tx);
    for p in producers {
        p.join().unwrap();
    }
    Arc::try_unwrap(t).unwrap().close().unwrap();
}

/// `open` returns after the directory, the FOs and NSM's extents, without walking the tree: the
/// tree's background pass (walk, NSM collection, repairs) is parked before it starts, and the
/// reopened store already serves reads of tree keys and of pre-crash pending keys, and writes.
/// Before, `open` walked and repaired the whole tree (`FastFair::reachable` + `open_with`).
#[test]
fn open_returns_before_the_tree_is_walked() {
    let sc = Scenario::setup();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    let mut cfg = PoolConfig::new(F3Tree::engine_id(), 32 << 20);
    cfg.nodes = 2;
    {
        let t =
            F3Tree::create(Pool::create(&path, cfg).unwrap(), &F3TreeOptions::default()).unwrap();
        for k in 1..=3000u64 {
            t.upsert(k, k).unwrap();
        }
        assert!(t.wait_drained(Duration::from_secs(20)));
        t.close().unwrap();
    }
    // Session 2 leaves writes pending and crashes.
    {
        let held = F3TreeOptions {
            count_threshold: u64::MAX,
            time_threshold: Duration::from_secs(3600),
            ..F3TreeOptions::default()
        };
        let pool = Pool::open(&path, OpenConfig::new(F3Tree::engine_id())).unwrap();
        let (t, _) = F3Tree::open(pool, &held).unwrap();
        t.wait_recovery().unwrap();
        for k in 1..=50u64 {
            t.upsert(k, k + 1_000_000).unwrap();
        }
        drop(t);
    }
    let pass = sc.pause_thread("fastfair.recovery.background", "fastfair-recovery");
    let pool = Pool::open(&path, OpenConfig::new(F3Tree::engine_id())).unwrap();
    let (t, report) = F3Tree::open(pool, &F3TreeOptions::default()).unwrap();
    pass.wait_parked();
    assert!(t.recovery_pending(), "open returned with the tree's recovery still to do");
    let rc = |name: &str| report.counters.iter().find(|c| c.0 == name).map(|c| c.1);
    assert_eq!(rc("deferred"), Some(1), "{report:?}");
    assert_eq!(rc("pending_keys"), Some(50), "{report:?}");
    assert_eq!(t.get(7).unwrap(), Some(1_000_007), "a pre-crash pending write");
    assert_eq!(t.get(2999).unwrap(), Some(2999), "a tree key");
    assert!(t.insert(5000, 5).unwrap());
    pass.release();
    t.wait_recovery().unwrap().expect("a report of the background pass");
    assert!(t.wait_drained(Duration::from_secs(20)));
    assert_eq!(t.tree().get(7).unwrap(), Some(1_000_007));
    t.check().unwrap();
    t.close().unwrap();
}

/// The watermark never moves back. A crash between an evaluation's watermark and its unlinks
/// leaves processed FOs linked; after the reopen the list's first evaluation starts at the tail
/// and, batch-capped, can end *below* the watermark. Persisting that position lowered the
/// watermark, making an entry live again that had been applied and then superseded by a newer
/// version applied from another list: after the next crash it was replayed over the newer value.
///
/// Session 1: list A holds keys 1..12 (4-entry FOs a, b, c; batches of 5): its first evaluation
/// processes seq 0..4 (unlinks a), its second seq 5..9 and parks before unlinking b, with key 10
/// (seq 9, in c) applied and out of the table. List B then writes key 10 = 2 and is evaluated;
/// crash. Session 2: A recovers with watermark 10; its first batch is seq 4..8 (ends at 9); crash
/// right after it persists its watermark. Session 3: key 10 must still be 2.
#[test]
fn the_watermark_never_moves_back() {
    let sc = Scenario::setup();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    let mut cfg = PoolConfig::new(F3Tree::engine_id(), 16 << 20);
    cfg.nodes = 1;
    cfg.sim = numakv_pmem::SimMode::Shadow;
    let opts = F3TreeOptions {
        fo_entries: 4,
        evaluators: Evaluators::PerNode(2),
        evaluation: numakv_f3tree::Evaluation::NodeBatched { batch: 5 },
        count_threshold: 5,
        time_threshold: Duration::from_secs(3600),
        ..F3TreeOptions::default()
    };
    // Session 1.
    {
        let pool = Pool::create(&path, cfg).unwrap();
        let t = Arc::new(F3Tree::create(Arc::clone(&pool), &opts).unwrap());
        let hits = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let h = Arc::clone(&hits);
        // List A (created first, by this thread) is evaluator 0's: park its second unlink.
        let a_unlinking = sc.pause_when("f3tree.evaluate.unlinking", move || {
            thread::current().name() == Some("f3-eval-0-0")
                && h.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 1
        });
        for k in 1..=12u64 {
            t.upsert(k, 1).unwrap();
        }
        a_unlinking.wait_parked();
        assert_eq!(t.tree().get(10).unwrap(), Some(1));
        assert_eq!(t.pending_keys(), 2, "keys 11 and 12 wait in list A");
        let b = {
            let t = Arc::clone(&t);
            spawn_named("p2", move || {
                t.upsert(10, 2).unwrap();
                for k in 100..104u64 {
                    t.upsert(k, 1).unwrap();
                }
            })
        };
        b.join().unwrap();
        wait_for("list B's evaluation", || t.tree().get(103).unwrap().is_some());
        wait_for("key 10 to leave the table", || t.pending_keys() == 2);
        assert_eq!(t.tree().get(10).unwrap(), Some(2));
        pool.crash(numakv_pmem::CrashOptions::STRICT).unwrap();
        a_unlinking.release();
        drop(t);
    }
    // Session 2: crash right after the recovered list's first watermark.
    {
        let mut oc = OpenConfig::new(F3Tree::engine_id());
        oc.sim = numakv_pmem::SimMode::Shadow;
        let pool = Pool::open(&path, oc).unwrap();
        // Weak: the scenario keeps the callback until it ends, the pool must go with session 2.
        let crash_pool = Arc::downgrade(&pool);
        let crashed = sc.call("f3tree.evaluate.watermarked", move || {
            if let Some(p) = crash_pool.upgrade() {
                let _ = p.crash(numakv_pmem::CrashOptions::STRICT);
            }
        });
        let (t, _) = F3Tree::open(pool, &opts).unwrap();
        wait_for("the recovered list's first evaluation", || crashed.hits() >= 1);
        drop(t);
    }
    // Session 3.
    let pool = Pool::open(&path, OpenConfig::new(F3Tree::engine_id())).unwrap();
    let (t, _) = F3Tree::open(pool, &opts).unwrap();
    assert_eq!(t.get(10).unwrap(), Some(2), "an applied, superseded entry was replayed");
    assert_eq!(t.get(12).unwrap(), Some(1));
    assert!(t.wait_drained(Duration::from_secs(20)));
    t.check().unwrap();
    t.close().unwrap();
}
