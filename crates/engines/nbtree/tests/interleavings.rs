//! Forced interleavings: each test parks threads at named points (docs/design.md §12) so that a
//! window a few instructions wide — which random schedules almost never hit — is crossed by
//! another operation every time. One test per race of issue 18 (R1, R2, R3, the `num` wrap) and
//! one for the inner-node readers; each failed on the code before its fix.
//!
//! Each test holds the failpoint registry (`Scenario`) from its first line: an armed failure
//! point fires in every thread of the process. Threads that must park get names; a pause point armed with `pause_thread` stops only them,
//! so the test's own thread (and helpers of an SMO) pass the same point freely.

use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use numakv_index::{Engine, Index};
use numakv_nbtree::{testing, NbTree, NbTreeOptions};
use numakv_pmem::failpoint::{spawn_named, Pause, Scenario, PARK_TIMEOUT};
use numakv_pmem::{CrashOptions, OpenConfig, PersistMode, Pool, PoolConfig, SimMode};

/// A tree of `slots`-entry leaves in a volatile pool.
fn tree(slots: usize) -> Arc<NbTree> {
    tree_shaped(slots, false)
}

/// As [`tree`], with the coupled leaf layout (metadata also in PM) when `coupled`.
fn tree_shaped(slots: usize, coupled: bool) -> Arc<NbTree> {
    let pool = Pool::volatile(PoolConfig::new(NbTree::engine_id(), 64 << 20)).unwrap();
    let opts = NbTreeOptions { leaf_slots: slots, coupled, ..Default::default() };
    Arc::new(NbTree::create(pool, &opts).unwrap())
}

/// R1: an update's value store that is still in the store buffer when it looks for an SMO copy.
///
/// x86-TSO lets a load pass an earlier store to another location; no test can make the
/// hardware do it on demand, so the failure point `nbtree.update.store_buffered` emulates it:
/// the update's value store (and its tag release) stay invisible to other threads until the
/// update has run its sync-on-write and passed `nbtree.update.checked` — as late as TSO may
/// drain them when no fence stands in between. The updater is parked there, having seen no
/// copy; the leaf's SMO then copies the old value. Before the fix of R1 (a plain store outside
/// any BUSY section) the SMO finished without the update and the drained store landed in the
/// retired leaf: acknowledged, lost. Now the store is inside the slot's BUSY section, the
/// seal waits for it, and the sync pass carries it to the copy.
#[test]
fn r1_update_store_buffered_across_the_copy() {
    // First: tests of this file arm points every thread meets, so they run one at a time.
    let sc = Scenario::setup();
    for coupled in [false, true] {
        let t = tree_shaped(4, coupled);
        assert!(t.insert(10, 1).unwrap());
        assert!(t.insert(20, 2).unwrap());
        let buffer = sc.fail("nbtree.update.store_buffered", Some(1));
        let checked = sc.pause_thread("nbtree.update.checked", "updater");
        let copied = sc.pause_thread("nbtree.smo.copied", "smo");
        let (tx, rx) = mpsc::channel::<&str>();
        let once = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let waits = {
            let tx = tx.clone();
            let once = Arc::clone(&once);
            sc.call("nbtree.smo.seal_wait", move || {
                if !once.swap(true, std::sync::atomic::Ordering::Relaxed) {
                    let _ = tx.send("the seal waits for the update");
                }
            })
        };
        let u = {
            let t = Arc::clone(&t);
            spawn_named("updater", move || t.update(10, 111).unwrap())
        };
        checked.wait_parked(); // no copy seen; the store is still buffered
        assert_eq!(buffer.hits(), 1, "the update met the store-buffer point");
        let s = {
            let t = Arc::clone(&t);
            spawn_named("smo", move || {
                // 50 fills the leaf: its SMO runs here.
                let r = [30, 40, 50].iter().all(|&k| t.insert(k, k).unwrap());
                let _ = tx.send("the SMO finished");
                r
            })
        };
        copied.wait_parked(); // the copy holds the old value 1
        copied.release();
        // The SMO either finishes without the update (the race) or waits for its BUSY section.
        let first = rx.recv_timeout(PARK_TIMEOUT).expect("the SMO neither finished nor waited");
        checked.release(); // the store buffer drains
        assert!(u.join().unwrap(), "coupled={coupled}: the update reports success");
        assert!(s.join().unwrap());
        assert_eq!(
            t.get(10).unwrap(),
            Some(111),
            "coupled={coupled}: an acknowledged update lost ({first} first)"
        );
        t.check().unwrap();
        drop((buffer, checked, copied, waits));
    }
}

/// Issue 33, defect 4: the store buffer again, now between two updates. U1's store is visible;
/// parked before its sync-on-write. U2's store is buffered (`nbtree.update.store_buffered`)
/// when it looks for a copy: none yet. The SMO copies U1's value; U1 then syncs it into the
/// copy (tag SYNC); U2's store drains. Before the fix the sync pass synchronised only slots
/// tagged exactly COPY and skipped this one, and nothing ordered U2's store before its load of
/// `copy_ptr` (the paper's `mfence`): U2 was acknowledged and lost.
#[test]
fn store_buffered_update_is_not_lost_to_a_synced_copy() {
    let sc = Scenario::setup();
    let t = tree(4);
    for k in [10, 20, 30] {
        assert!(t.insert(k, k).unwrap());
    }
    let stored = sc.pause_thread("nbtree.update.stored", "u1");
    let u1 = {
        let t = Arc::clone(&t);
        spawn_named("u1", move || t.update(10, 111).unwrap())
    };
    stored.wait_parked(); // U1's value is in the leaf; its sync-on-write has not run
    let buffer = sc.fail("nbtree.update.store_buffered", Some(1));
    let checked = sc.pause_thread("nbtree.update.checked", "u2");
    let u2 = {
        let t = Arc::clone(&t);
        spawn_named("u2", move || t.update(10, 222).unwrap())
    };
    checked.wait_parked(); // U2 saw no copy
    assert_eq!(buffer.hits(), 1);
    let copied = sc.pause_thread("nbtree.smo.copied", "smo");
    assert!(t.insert(40, 40).unwrap());
    let s = {
        let t = Arc::clone(&t);
        spawn_named("smo", move || t.insert(50, 50).unwrap())
    };
    copied.wait_parked(); // the copy is published
    stored.release();
    assert!(u1.join().unwrap(), "U1 syncs its value into the copy");
    copied.release();
    checked.release();
    assert!(u2.join().unwrap());
    assert!(s.join().unwrap());
    assert_eq!(t.get(10).unwrap(), Some(222), "U2's acknowledged update was lost");
    for k in [20, 30, 40, 50] {
        assert_eq!(t.get(k).unwrap(), Some(k));
    }
    t.check().unwrap();
}

/// Builds the schedule of issue 33's defects 1 and 2 on a tree of 4-slot leaves: a leaf X
/// (keys 10, 20, 30) held by `stale` threads parked in their descent; X split into X1
/// `[0, 30)` and L `[30, ..)`; X1 filled and its SMO (thread `smo-x1`, inserting 7) parked
/// with its copy made and sealed; L filled and its SMO (thread `smo-l`, inserting 70) parked
/// after its link into X1's `next`, the parent not yet updated. Returns the join handles of
/// the two SMO threads; the caller releases the points.
fn x1_and_l_in_smo(
    t: &Arc<NbTree>,
    sealed: &Pause,
    linked: &Pause,
) -> (JoinHandle<bool>, JoinHandle<bool>) {
    for k in [40, 50, 5, 6] {
        assert!(t.insert(k, k).unwrap()); // X → X1 {10, 20}, L {30, 40, 50}; X1 full
    }
    let x1 = {
        let t = Arc::clone(t);
        spawn_named("smo-x1", move || t.insert(7, 7).unwrap())
    };
    sealed.wait_parked(); // X1's copy (next = L) made, X1 sealed
    assert!(t.insert(60, 60).unwrap()); // L full
    let l = {
        let t = Arc::clone(t);
        spawn_named("smo-l", move || t.insert(70, 70).unwrap())
    };
    linked.wait_parked(); // X1.next = L's copy NL; the parent names L
    (x1, l)
}

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

/// Issue 33, defect 1: L's SMO has linked its copy NL into X1's `next` (PM, persisted: its
/// durability point) while X1's own SMO holds a copy whose `next` is L's old block. A stale
/// update settles through X1's `next` onto NL and is acknowledged; X1's SMO then links its
/// copy — pointing at L — and NL is unreachable in PM. Before the fix a crash there lost the
/// acknowledged update (both persistence modes).
#[test]
fn a_neighbours_smo_does_not_unlink_an_acknowledged_write() {
    let sc = Scenario::setup();
    for mode in [PersistMode::Eadr, PersistMode::Adr] {
        let d = tempfile::tempdir().unwrap();
        let t = shadow_tree(d.path(), mode);
        for k in [10, 20, 30] {
            assert!(t.insert(k, k).unwrap());
        }
        let stale = sc.pause_thread("nbtree.find_leaf.child", "stale");
        let u = {
            let t = Arc::clone(&t);
            spawn_named("stale", move || t.update(30, 333).unwrap())
        };
        stale.wait_parked(); // holds X, the only leaf
        let sealed = sc.pause_thread("nbtree.smo.sealed", "smo-x1");
        let linked = sc.pause_thread("nbtree.smo.linked_pred", "smo-l");
        let (x1, l) = x1_and_l_in_smo(&t, &sealed, &linked);
        stale.release();
        assert!(u.join().unwrap(), "{mode:?}: the stale update is acknowledged");
        sealed.release();
        assert!(x1.join().unwrap()); // X1's SMO completes
        t.pool().crash(CrashOptions::STRICT).unwrap();
        linked.release();
        let _ = l.join().unwrap();
        drop(t);
        let t = reopen(d.path());
        assert_eq!(t.get(30).unwrap(), Some(333), "{mode:?}: an acknowledged update was lost");
        for k in [5, 6, 7, 10, 20, 40, 50, 60] {
            assert_eq!(t.get(k).unwrap(), Some(k), "{mode:?}: key {k}");
        }
        t.check().unwrap();
        drop((stale, sealed, linked));
    }
}

/// Issue 33, defect 3 (eADR): a delete of a sealed slot removed the key in the copy and is
/// parked before mirroring it into the old leaf, the only durable one (the SMO is parked in its
/// sync phase). A read then completes with "absent". Before the fix a crash brought the key
/// back: the absence a completed read returned was not durable.
#[test]
fn an_absence_read_from_a_copy_is_durable() {
    let sc = Scenario::setup();
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
        sealed.wait_parked();
        let del = {
            let t = Arc::clone(&t);
            spawn_named("deleter", move || t.remove(20))
        };
        redirected.wait_parked(); // 20 gone from the copy, still in the old leaf
        assert_eq!(t.get(20).unwrap(), None, "the copy decides");
        t.pool().crash(CrashOptions::STRICT).unwrap();
        redirected.release();
        sealed.release();
        let _ = (del.join().unwrap(), s.join().unwrap());
        drop(t);
        let t = reopen(d.path());
        assert_eq!(t.get(20).unwrap(), None, "{mode:?}: a key a completed read saw absent is back");
        for k in [10, 30, 40] {
            assert_eq!(t.get(k).unwrap(), Some(k));
        }
        t.check().unwrap();
        drop((sealed, redirected));
    }
}

/// Issue 33, defect 2: stale inserts that reach L's copy NL through X1's `next` fill it and
/// run NL's own SMO while L's and X1's SMOs are unfinished. Before the fix NL's SMO linked
/// NL's copy into X1, helped X1's SMO — whose copy still pointed at L — and then looked for a
/// predecessor whose `next` was NL or its copy: none existed, and the inserter spun forever.
#[test]
fn stale_inserts_into_an_unlinked_copy_do_not_livelock() {
    let sc = Scenario::setup();
    let t = tree(4);
    for k in [10, 20, 30] {
        assert!(t.insert(k, k).unwrap());
    }
    let stale = sc.pause_thread("nbtree.find_leaf.child", "stale");
    let (tx, rx) = mpsc::channel();
    let inserters: Vec<_> = [31, 32, 33]
        .into_iter()
        .map(|k| {
            let t = Arc::clone(&t);
            let tx = tx.clone();
            spawn_named("stale", move || {
                let r = t.insert(k, k).unwrap();
                let _ = tx.send(k);
                r
            })
        })
        .collect();
    stale.wait_parked_n(3); // all three hold X
    let sealed = sc.pause_thread("nbtree.smo.sealed", "smo-x1");
    let linked = sc.pause_thread("nbtree.smo.linked_pred", "smo-l");
    let (x1, l) = x1_and_l_in_smo(&t, &sealed, &linked);
    stale.release();
    for _ in 0..3 {
        if let Err(e) = rx.recv_timeout(PARK_TIMEOUT) {
            panic!("stale inserts still spinning {PARK_TIMEOUT:?} after their release ({e})");
        }
    }
    for i in inserters {
        assert!(i.join().unwrap());
    }
    sealed.release();
    assert!(x1.join().unwrap());
    linked.release();
    assert!(l.join().unwrap());
    for k in [5, 6, 7, 10, 20, 30, 31, 32, 33, 40, 50, 60, 70] {
        assert_eq!(t.get(k).unwrap(), Some(k), "key {k}");
    }
    t.check().unwrap();
}

/// Issue 33: the link phase of L meets its predecessor X1 full with its SMO unable to begin
/// (no PM for X1's new leaves). Before the fix L's link phase ran X1's copy phase, failed with
/// `OutOfSpace`, and left L linked into X1's `next` but not into the parent: L's insert failed
/// and so did every update of L's keys (a sealed slot sends an update through L's SMO). L's SMO
/// had its PM; it must complete, and the store stay usable but for inserts into X1.
#[test]
fn a_link_phase_does_not_need_its_predecessors_copy() {
    let sc = Scenario::setup();
    let t = tree(4);
    for k in [10, 20, 30, 40, 50, 5, 6, 60] {
        assert!(t.insert(k, k).unwrap()); // X1 {5, 6, 10, 20} and L {30, 40, 50, 60} full
    }
    let copied = sc.pause_thread("nbtree.smo.copied", "smo-l");
    let l = {
        let t = Arc::clone(&t);
        spawn_named("smo-l", move || t.insert(70, 70))
    };
    copied.wait_parked(); // L's new leaves are allocated
    let no_pm = sc.fail("nbtree.smo.alloc", None);
    let e = t.insert(7, 7).unwrap_err(); // X1's SMO cannot begin
    assert!(e.is_out_of_space(), "{e}");
    copied.release();
    let r = l.join().unwrap();
    assert!(matches!(r, Ok(true)), "L's SMO had its PM: {r:?}");
    for k in [30, 40, 50, 60, 70] {
        assert!(t.update(k, k + 1).unwrap(), "update of {k} with X1 out of PM");
        assert_eq!(t.get(k).unwrap(), Some(k + 1));
    }
    for k in [5, 6, 10, 20] {
        assert_eq!(t.get(k).unwrap(), Some(k));
    }
    no_pm.disarm();
    assert!(t.insert(7, 7).unwrap());
    t.check().unwrap();
}

/// R2: an update inside a redirected delete's window. The SMO has sealed the old leaf; a delete
/// finds the key in a sealed slot, removes it in the copy and — parked — has not yet mirrored
/// the removal into the old leaf. A reader then sees the key absent; an update that starts
/// after that reader must not succeed (before the fix it wrote the old leaf, found nothing in
/// the copy and returned true: not linearizable).
#[test]
fn r2_update_inside_a_redirected_delete() {
    // First: tests of this file arm points every thread meets, so they run one at a time.
    let sc = Scenario::setup();
    let t = tree(4);
    for k in [10, 20, 30, 40] {
        assert!(t.insert(k, k).unwrap());
    }
    let sealed = sc.pause_thread("nbtree.smo.sealed", "smo");
    let redirected = sc.pause_thread("nbtree.delete.redirected", "deleter");
    let s = {
        let t = Arc::clone(&t);
        spawn_named("smo", move || t.insert(50, 50).unwrap())
    };
    sealed.wait_parked(); // copy published, old leaf sealed, sync pass not run
    let d = {
        let t = Arc::clone(&t);
        spawn_named("deleter", move || t.remove(20).unwrap())
    };
    redirected.wait_parked(); // 20 removed in the copy, still present in the old leaf
    assert_eq!(t.get(20).unwrap(), None, "the copy decides once the old leaf is sealed");
    let updated = t.update(20, 99).unwrap();
    redirected.release();
    sealed.release();
    assert!(d.join().unwrap());
    assert!(s.join().unwrap());
    assert!(!updated, "update succeeded on a key a completed read saw removed");
    assert_eq!(t.get(20).unwrap(), None);
    for k in [10, 30, 40, 50] {
        assert_eq!(t.get(k).unwrap(), Some(k));
    }
    t.check().unwrap();
}

/// R3: a write that reached the copy along `next` before the parent names it. The SMO of leaf
/// L (keys 30..) has linked its copy into its predecessor and is parked before the parent
/// update. A stale descent (parked since before the predecessor itself was split off) settles
/// through the predecessor onto the copy and updates key 30 there; then an update through the
/// parent reaches L. Before the fix that update wrote L only — sync-on-write skips a copied
/// slot that a direct write made current — and was lost when the SMO finished.
#[test]
fn r3_direct_write_into_a_copy_before_the_parent_link() {
    // First: tests of this file arm points every thread meets, so they run one at a time.
    let sc = Scenario::setup();
    let t = tree(4);
    for k in [10, 20, 30] {
        assert!(t.insert(k, k).unwrap());
    }
    let stale = sc.pause_thread("nbtree.find_leaf.child", "stale");
    let b = {
        let t = Arc::clone(&t);
        spawn_named("stale", move || t.update(30, 333).unwrap())
    };
    stale.wait_parked(); // holds the only leaf, X
                         // X splits into X1 [.., 30) and L [30, ..); L fills up.
    for k in [40, 50, 60] {
        assert!(t.insert(k, k).unwrap());
    }
    let linked = sc.pause_thread("nbtree.smo.linked_pred", "smo");
    let s = {
        let t = Arc::clone(&t);
        spawn_named("smo", move || t.insert(70, 70).unwrap())
    };
    linked.wait_parked(); // X1.next = copy of L; the parent still points to L
    stale.release();
    assert!(b.join().unwrap(), "the stale update lands on the copy");
    assert!(t.update(30, 444).unwrap());
    linked.release();
    assert!(s.join().unwrap());
    assert_eq!(t.get(30).unwrap(), Some(444), "the later acknowledged update was lost");
    for k in [10, 20, 40, 50, 60, 70] {
        assert_eq!(t.get(k).unwrap(), Some(k));
    }
    t.check().unwrap();
}

/// The claim counter `num` of a full leaf whose SMO cannot start (no PM for the new leaves):
/// before the fix every failed insert added one, and after 2^32 of them the counter wrapped to
/// 0 and the next insert stored its value into slot 0 over a live entry. The 2^32 claims are
/// stood in for by setting the counter; the insert that wraps it is parked between its SMO
/// check and its claim, so it claims after the leaf went full.
#[test]
fn num_cannot_wrap_onto_a_live_slot() {
    // First: tests of this file arm points every thread meets, so they run one at a time.
    let sc = Scenario::setup();
    let t = tree(4);
    assert!(t.insert(10, 1).unwrap());
    let no_pm = sc.fail("nbtree.smo.alloc", None);
    let claim = sc.pause_thread("nbtree.insert.claim", "claimer");
    let c = {
        let t = Arc::clone(&t);
        spawn_named("claimer", move || t.insert(20, 99))
    };
    claim.wait_parked(); // past the SMO-bit check, before claiming a slot
    testing::set_leaf_claims(&t, 10, u32::MAX);
    let e = t.insert(30, 3).unwrap_err();
    assert!(e.is_out_of_space(), "{e}");
    claim.release();
    let r = c.join().unwrap();
    assert!(r.as_ref().is_err_and(|e| e.is_out_of_space()), "{r:?}");
    assert_eq!(t.get(10).unwrap(), Some(1), "a failed insert overwrote a live entry");
    assert!(testing::leaf_claims(&t, 10) >= 4, "the claim counter wrapped");
    // PM again: the SMO runs and both keys go in.
    no_pm.disarm();
    assert!(t.insert(20, 2).unwrap());
    assert!(t.insert(30, 3).unwrap());
    for (k, v) in [(10, 1), (20, 2), (30, 3)] {
        assert_eq!(t.get(k).unwrap(), Some(v));
    }
    t.check().unwrap();
}

/// Inner-node readers never wait for a writer: with an SMO's parent update parked in the middle
/// of an inner-node insert (entries shifted, the new one not yet written), every key is still
/// found, promptly. Before the fix readers spun on the node's version word until the writer
/// committed.
#[test]
fn inner_readers_pass_a_writer_parked_mid_shift() {
    // First: tests of this file arm points every thread meets, so they run one at a time.
    let sc = Scenario::setup();
    let t = tree(4);
    // Leaves over 10..=400 (step 10); the separators sit in one level-1 node.
    let keys: Vec<u64> = (1..=40).map(|k| k * 10).collect();
    for &k in keys.iter().rev() {
        assert!(t.insert(k, k + 1).unwrap());
    }
    let shifted = sc.pause_thread("nbtree.inner.shifted", "smo");
    let s = {
        let t = Arc::clone(&t);
        // Fills the leaf of 10..: its SMO inserts a separator near the node's left end, so
        // nearly every entry shifts.
        spawn_named("smo", move || (1..=9).all(|k| t.upsert(k, k + 1).is_ok()))
    };
    shifted.wait_parked();
    let (tx, rx) = mpsc::channel();
    let r = {
        let t = Arc::clone(&t);
        let keys = keys.clone();
        spawn_named("reader", move || {
            for &k in &keys {
                tx.send((k, t.get(k).unwrap())).unwrap();
            }
        })
    };
    let mut seen = Vec::new();
    while seen.len() < keys.len() {
        match rx.recv_timeout(Duration::from_secs(5)) {
            Ok(x) => seen.push(x),
            Err(_) => {
                shifted.release(); // let the reader finish before failing
                r.join().unwrap();
                panic!("a reader waited for a parked inner-node writer ({} keys read)", seen.len());
            }
        }
    }
    shifted.release();
    r.join().unwrap();
    assert!(s.join().unwrap());
    for (k, v) in seen {
        assert_eq!(v, Some(k + 1), "key {k}");
    }
    t.check().unwrap();
}
