//! Forced interleavings and failures (docs/design.md §12, the NOBtree pause and failure points
//! listed in the crate docs). Each test failed (or hung) on the code before its fix.
//!
//! Each test holds the failpoint registry (`Scenario`) from its first line: an armed failure
//! point fires in every thread of the process.

mod common;

use std::sync::mpsc;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use common::{check_values_name_keys, quiet, vk, volatile};
use numakv_index::{Engine, Index};
use numakv_nobtree::NobtreeOptions;
use numakv_pmem::alloc::nsm::NsmMode;
use numakv_pmem::failpoint::Scenario;

/// Runs `f` on its own thread and fails the test when it has not finished within `secs`
/// (a self-deadlocked thread spins forever; it is left behind).
fn finishes<T: Send + 'static>(what: &str, secs: u64, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    thread::Builder::new()
        .name(what.to_string())
        .spawn(move || {
            let _ = tx.send(f());
        })
        .unwrap();
    rx.recv_timeout(Duration::from_secs(secs))
        .unwrap_or_else(|_| panic!("{what}: not finished after {secs} s (self-deadlock)"))
}

/// Issue 19: `grow_root` fails (out of space, swallowed by the split's `link`), so the head's
/// level keeps several nodes and no parent level. A delete that merges there and a migration
/// there used to descend to the missing parent level while holding two nodes of that level:
/// the descent ended on one of them and waited for the thread's own lock forever. Now both
/// check for a parent level before locking and give up; the next split at that level retries
/// the growth, which heals the shape.
#[test]
fn merge_and_migration_without_a_parent_level_finish() {
    let sc = Scenario::setup();
    for height in [2u32, 3] {
        let opts = NobtreeOptions { height, nsm_mode: NsmMode::Node(0), ..quiet() };
        let t = Arc::new(volatile(&opts));
        let grow = sc.fail("nobtree.grow_root", None);
        // ~25 leaves, all on the head's level (0): every split's growth fails.
        for k in 1..=150u64 {
            assert!(t.insert(k, vk(k)).unwrap());
        }
        let st = t.stats();
        assert_eq!(st.counter("root_grows"), Some(0), "{:?}", st.counters);
        assert!(st.counter("orphans_deferred").unwrap() > 10, "{:?}", st.counters);
        check_values_name_keys(&t);
        // Migrations and merging deletes near the head (and along the whole parentless level).
        let t2 = Arc::clone(&t);
        let migrated = finishes("migrate-near-head", 20, move || {
            (2..=150u64).step_by(7).filter(|&k| t2.migrate_leaf_of(k, 1).unwrap()).count()
        });
        assert_eq!(migrated, 0, "height {height}: a leaf without a parent level migrated");
        let t2 = Arc::clone(&t);
        finishes("delete-near-head", 20, move || {
            for k in (1..=150u64).filter(|k| k % 6 != 0) {
                assert!(t2.remove(k).unwrap());
            }
        });
        let out = check_values_name_keys(&t);
        assert_eq!(
            out,
            (1..=150u64).filter(|k| k % 6 == 0).map(|k| (k, vk(k))).collect::<Vec<_>>()
        );
        // Space is back: the next split at the head's level retries the growth.
        grow.disarm();
        for k in 151..=3000u64 {
            assert!(t.insert(k, vk(k)).unwrap());
        }
        let st = t.stats();
        assert!(
            st.counter("root_grows").unwrap() > 0,
            "no growth after space came back: {:?}",
            st.counters
        );
        // With a parent level, leaves near the head migrate and merge again.
        let t2 = Arc::clone(&t);
        let migrated = finishes("migrate-after-heal", 20, move || {
            (200..=3000u64).step_by(97).filter(|&k| t2.migrate_leaf_of(k, 1).unwrap()).count()
        });
        assert!(migrated > 0, "height {height}: no migration after the growth");
        for k in 200..=1000u64 {
            assert!(t.remove(k).unwrap());
        }
        assert!(t.stats().counter("merges").unwrap() > 0);
        let out = check_values_name_keys(&t);
        let want: Vec<(u64, u64)> = (1..=150u64)
            .filter(|k| k % 6 == 0)
            .chain((151..200).chain(1001..=3000))
            .map(|k| (k, vk(k)))
            .collect();
        assert_eq!(out, want, "height {height}");
        drop(t);
    }
}
