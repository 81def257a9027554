//! Lazy (instant) recovery against eager recovery on the same crashed image: `open()` returns
//! before any walk, readers and writers work at once, and once the background pass is done the
//! tree, the NSM collection and every recovery counter equal the eager result. Closing a store
//! while its background recovery runs lets it finish; dropping it cancels it, and the next open
//! starts over. Waiting for the pass from a pinned thread is refused instead of deadlocking.

mod common;

use common::{check_contents, crashed_store, full_report, reopen_with, verify_recovered};
use numakv_fastfair::RecoveryMode;
use numakv_index::{Engine, Index};
use numakv_pmem::SimMode;

#[test]
fn lazy_and_eager_recover_the_same_tree() {
    let mut reps = Vec::new();
    for seed in 1..=6u64 {
        let d = common::scratch();
        let (a, b) = (d.path().join("a"), d.path().join("b"));
        let (model, pending) = crashed_store(&a, 256, seed, 3_000);
        common::copy_store(&a, &b);

        let (lazy, lrep) = reopen_with(&a, SimMode::Shadow, RecoveryMode::Lazy);
        assert_eq!(lrep.counters, vec![("deferred", 1)], "lazy open did recovery work");
        // Readers work at once, while the background pass may still run.
        let got_lazy = check_contents(&lazy, &model, pending);

        let (eager, erep) = reopen_with(&b, SimMode::Shadow, RecoveryMode::Eager);
        assert!(erep.counters.iter().all(|c| c.0 != "deferred"));
        assert_eq!(check_contents(&eager, &model, pending), got_lazy, "seed {seed}");

        let lrep = full_report(&lazy, lrep);
        let without_deferred = |r: &numakv_index::RecoveryReport| -> Vec<(&'static str, u64)> {
            r.counters.iter().copied().filter(|c| c.0 != "deferred").collect()
        };
        assert_eq!(without_deferred(&lrep), erep.counters, "seed {seed}");
        let (lc, ec) = (lazy.check().unwrap(), eager.check().unwrap());
        assert_eq!(lc, ec, "seed {seed}");
        assert_eq!(lc.reachable_blocks, lc.allocated_blocks, "seed {seed}: leak");
        // Waiting again reports the same outcome.
        assert_eq!(lazy.wait_recovery().unwrap().unwrap().counters, without_deferred(&lrep));
        assert!(eager.wait_recovery().unwrap().is_none());
        reps.push(lrep);
    }
    let sum = |c| common::counter_sum(&reps, c);
    eprintln!(
        "lazy = eager over {} crashes: slots_repaired {}, ranges_fixed {}, orphans_linked {}, \
         nsm_free_blocks {}, pages_reclaimed {}",
        reps.len(),
        sum("slots_repaired"),
        sum("ranges_fixed"),
        sum("orphans_linked"),
        sum("nsm_free_blocks"),
        sum("pages_reclaimed")
    );
    assert!(sum("nsm_free_blocks") > 0, "no crash left garbage to collect");
}

#[test]
fn close_or_drop_during_the_background_recovery_leaves_a_recoverable_store() {
    for seed in 1..=8u64 {
        let d = common::scratch();
        let (mut model, pending) = crashed_store(d.path(), 256, 100 + seed, 4_000);
        let (t, _) = reopen_with(d.path(), SimMode::Shadow, RecoveryMode::Lazy);
        common::resolve(&t, &mut model, pending);
        // Stop the background pass at different moments: right away, or after some writes.
        for i in 0..seed * 40 {
            let k = common::scrambled(50_000 + i);
            assert!(t.insert(k, i).unwrap());
            model.insert(k, i);
        }
        if seed % 2 == 0 {
            t.close().unwrap(); // lets the pass finish, then closes
        } else {
            drop(t); // a power failure while the pass runs: it is cancelled
        }
        let (t, rep) = reopen_with(d.path(), SimMode::Shadow, RecoveryMode::Lazy);
        assert_eq!(rep.was_clean, seed % 2 == 0);
        check_contents(&t, &model, None);
        verify_recovered(&t, &model, None);
        t.close().unwrap();
    }
}

#[test]
fn waiting_from_a_pinned_thread_is_refused_and_close_then_cancels() {
    let d = common::scratch();
    let (model, pending) = crashed_store(d.path(), 256, 77, 4_000);
    let guard = numakv_pmem::alloc::epoch::pin(); // holds the collection back
    let (t, _) = reopen_with(d.path(), SimMode::Shadow, RecoveryMode::Lazy);
    assert!(t.recovery_pending());
    let err = t.check().unwrap_err();
    assert!(matches!(err, numakv_index::Error::Unsupported(_)), "{err}");
    check_contents(&t, &model, pending);
    t.close().unwrap(); // cancels: waiting would deadlock
    drop(guard);
    let (t, _) = reopen_with(d.path(), SimMode::Shadow, RecoveryMode::Lazy);
    let mut model = model;
    common::resolve(&t, &mut model, pending);
    verify_recovered(&t, &model, None);
}
