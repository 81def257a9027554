//! Blind adversarial review of NBTree's SMO windows (review-nbtree): forced interleavings, each
//! kept only because it failed on the code it was written against (see each test's doc).
//!
//! Like `tests/interleavings.rs`, each test holds the failpoint registry (`Scenario`) from its
//! first line; threads that must park get names and the points are armed per thread.

use std::sync::Arc;

use numakv_index::{Engine, Index};
use numakv_nbtree::{testing, NbTree, NbTreeOptions};
use numakv_pmem::failpoint::{spawn_named, Scenario};
use numakv_pmem::{CrashOptions, OpenConfig, PersistMode, Pool, PoolConfig, SimMode};

/// A tree of 4-slot leaves in a shadow pool in `dir` (crash simulation), in `mode`.
fn shadow_tree(dir: &std::path::Path, mode: PersistMode) -> Arc<NbTree> {
    let mut c = PoolConfig::new(NbTree::engine_id(), 32 << 20);
    c.mode = mode;
    c.sim = SimMode::Shadow;
    let pool = Pool::create(dir, c).unwrap();
    let opts = NbTreeOptions { leaf_slots: 4, ..Default::default() };
    Arc::new(NbTree::create(pool, &opts).unwrap())
}

/// Recovers the store in `dir` after a simulated crash.
fn reopen(dir: &std::path::Path) -> NbTree {
    let mut c = OpenConfig::new(NbTree::engine_id());
    c.sim = SimMode::Shadow;
    let pool = Pool::open(dir, c).unwrap();
    let opts = NbTreeOptions { leaf_slots: 4, ..Default::default() };
    let (t, rep) = NbTree::open(pool, &opts).unwrap();
    assert!(!rep.was_clean);
    t
}

/// The sibling of issue 33's defect 3 through `remove` instead of `get`: a delete D of a
/// sealed slot removed key 20 in the copy and is parked before mirroring the removal into the
/// old leaf — the only durable leaf until the SMO's PM link (the SMO is parked in its sync
/// phase). A second `remove(20)` then completes with `false` ("absent": the copy decides).
/// A crash there must not bring 20 back: D never completed, so after recovery nothing
/// justifies the absence the completed remove reported. `get` mirrors the removal before
/// returning `None` (`mirror_absence`); the redirected delete that finds nothing in the copy
/// does not.
#[test]
fn an_absence_a_remove_reported_from_a_copy_is_durable() {
    let sc = Scenario::setup();
    let mut back = Vec::new();
    for mode in [PersistMode::Eadr, PersistMode::Adr] {
        let d = tempfile::tempdir().unwrap();
        let t = shadow_tree(d.path(), mode);
        for k in [10, 20, 30, 40] {
            assert!(t.insert(k, k).unwrap());
        }
        let sealed = sc.pause_thread("nbtree.smo.sealed", "smo");
        let redirected = sc.pause_thread("nbtree.delete.redirected", "deleter");
        let s = {
            let t = Arc::clone(&t);
            spawn_named("smo", move || t.insert(50, 50))
        };
        sealed.wait_parked(); // copy published, old leaf sealed, sync pass not run
        let del = {
            let t = Arc::clone(&t);
            spawn_named("deleter", move || t.remove(20))
        };
        redirected.wait_parked(); // 20 gone from the copy, still in the old leaf
        assert!(!t.remove(20).unwrap(), "{mode:?}: the copy decides: 20 is absent");
        t.pool().crash(CrashOptions::STRICT).unwrap();
        redirected.release();
        sealed.release();
        let _ = (del.join().unwrap(), s.join().unwrap());
        drop(t);
        let t = reopen(d.path());
        // Both modes are run before failing, so the report names each one that loses it.
        if let Some(v) = t.get(20).unwrap() {
            back.push(format!("{mode:?}: get(20) = {v}"));
        }
        for k in [10, 30, 40] {
            assert_eq!(t.get(k).unwrap(), Some(k));
        }
        t.check().unwrap();
        drop((sealed, redirected));
    }
    assert!(
        back.is_empty(),
        "a key a completed remove reported absent is back after the crash: {back:?}"
    );
}

/// `check()` blind spot: it bounds a leaf's claim counter `num` from above (the slot count)
/// but not from below. In a leaf whose `num` is below its highest committed slot, the next
/// insert claims that committed slot: it stores its value over the live entry's, and then —
/// finding its own (now same-fingerprint) committed slot pending — spins forever in its
/// duplicate check. `testing::set_leaf_claims` stands in for whatever defect (recovery, a
/// wrapped counter) leaves the counter there; the check must name the state.
#[test]
fn check_sees_a_claim_counter_below_the_committed_slots() {
    let pool = Pool::volatile(PoolConfig::new(NbTree::engine_id(), 64 << 20)).unwrap();
    let opts = NbTreeOptions { leaf_slots: 4, ..Default::default() };
    let t = NbTree::create(pool, &opts).unwrap();
    assert!(t.insert(10, 1).unwrap()); // slot 0
    assert!(t.insert(20, 2).unwrap()); // slot 1
    t.check().unwrap();
    testing::set_leaf_claims(&t, 10, 1); // slot 1 is committed, but would be claimed again
    assert!(
        t.check().is_err(),
        "check() passed a leaf whose claim counter (1) is below its committed slots (0, 1)"
    );
}

/// Windows that held (regression): the same redirected-delete window as
/// [`an_absence_a_remove_reported_from_a_copy_is_durable`], crossed by the other operations
/// that can report on key 20 there — an update (reports absent), a scan (omits 20), an insert
/// (reports inserted) and a read-modify-write (reports absent) — then a crash (both modes).
/// Each is durable today: the update and the insert help the SMO through its PM link before
/// they act on the copy, the scan helps it before reading the copy, and `update_with` reads
/// through `get`'s path, which mirrors the absence. A change that let any of them act on the
/// copy before the PM link (or skip the mirror) would make this fail.
#[test]
fn other_operations_in_a_redirected_delete_window_are_durable() {
    let sc = Scenario::setup();
    for mode in [PersistMode::Eadr, PersistMode::Adr] {
        for op in ["update", "scan", "insert", "update_with"] {
            let d = tempfile::tempdir().unwrap();
            let t = shadow_tree(d.path(), mode);
            for k in [10, 20, 30, 40] {
                assert!(t.insert(k, k).unwrap());
            }
            let sealed = sc.pause_thread("nbtree.smo.sealed", "smo");
            let redirected = sc.pause_thread("nbtree.delete.redirected", "deleter");
            let s = {
                let t = Arc::clone(&t);
                spawn_named("smo", move || t.insert(50, 50))
            };
            sealed.wait_parked();
            let del = {
                let t = Arc::clone(&t);
                spawn_named("deleter", move || t.remove(20))
            };
            redirected.wait_parked(); // 20 gone from the copy, still in the old leaf
            let want = match op {
                "update" => {
                    assert!(!t.update(20, 99).unwrap(), "{mode:?}: update sees 20 absent");
                    None
                }
                "scan" => {
                    let mut out = Vec::new();
                    t.scan(1, 10, &mut out).unwrap();
                    assert!(out.iter().all(|e| e.0 != 20), "{mode:?}: scan sees 20 absent");
                    None
                }
                "insert" => {
                    assert!(t.insert(20, 77).unwrap(), "{mode:?}: insert sees 20 absent");
                    Some(77)
                }
                _ => {
                    let r = t.update_with(20, &mut |v| Ok(Some(v + 1))).unwrap();
                    assert_eq!(r, None, "{mode:?}: update_with sees 20 absent");
                    None
                }
            };
            t.pool().crash(CrashOptions::STRICT).unwrap();
            redirected.release();
            sealed.release();
            let _ = (del.join().unwrap(), s.join().unwrap());
            drop(t);
            let t = reopen(d.path());
            assert_eq!(t.get(20).unwrap(), want, "{mode:?} {op}: what it reported was undone");
            for k in [10, 30, 40] {
                assert_eq!(t.get(k).unwrap(), Some(k));
            }
            t.check().unwrap();
            drop((sealed, redirected));
        }
    }
}
