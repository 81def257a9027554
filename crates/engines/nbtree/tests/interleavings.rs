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
use std::time::Duration;

use numakv_index::{Engine, Index};
use numakv_nbtree::{testing, NbTree, NbTreeOptions};
use numakv_pmem::failpoint::{spawn_named, Scenario};
use numakv_pmem::{Pool, PoolConfig};

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

/// R1: an update's value store that is still in the store buffer when it reads the SMO state.
///
/// x86-TSO lets a load pass an earlier store to another location; no test can make the
/// hardware do it on demand, so the failure point `nbtree.update.store_buffered` makes the
/// update issue its value store as late as TSO may make it visible. Before the fix that was
/// after the update's check for an SMO copy (the store was a plain store followed by plain
/// loads): the update saw no copy, the SMO copied the old value, and the update's value died
/// with the retired leaf while it reported success. Now the store sits inside the slot's BUSY
/// section (an RMW the SMO's seal must wait out), so it is visible before the update looks for
/// a copy, and the copy carries it.
#[test]
fn r1_update_store_buffered_across_the_copy() {
    // First: tests of this file arm points every thread meets, so they run one at a time.
    let sc = Scenario::setup();
    // NBTree-W(R) updates hold the leaf's lock across the store and the check: no window.
    for coupled in [false, true] {
        let t = tree_shaped(4, coupled);
        assert!(t.insert(10, 1).unwrap());
        assert!(t.insert(20, 2).unwrap());
        let buffer = sc.fail("nbtree.update.store_buffered", Some(1));
        let checked = sc.pause_thread("nbtree.update.checked", "updater");
        let u = {
            let t = Arc::clone(&t);
            spawn_named("updater", move || t.update(10, 111).unwrap())
        };
        checked.wait_parked(); // the update saw no SMO; its store is (at the latest) pending
        for k in [30, 40, 50] {
            assert!(t.insert(k, k).unwrap()); // 50: the leaf is full, its SMO completes
        }
        checked.release();
        assert_eq!(buffer.hits(), 1, "the update passed the store-buffer point");
        assert!(u.join().unwrap(), "coupled={coupled}: the update reports success");
        assert_eq!(t.get(10).unwrap(), Some(111), "coupled={coupled}: an acknowledged update lost");
        t.check().unwrap();
    }
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
