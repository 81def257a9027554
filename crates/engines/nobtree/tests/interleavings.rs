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

use common::{check_values_name_keys, quiet, vk, volatile, Op};
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

/// Issue 19: the coordinator and the public `migrate_*_of` share one migration log block. A
/// migration `A` parks with its log armed and its parent already pointing at the copy; a second
/// migration `B` elsewhere in the tree then ran to its end — overwriting the log with its own
/// record and disarming it — and a crash at that moment left `A` half done with nothing to
/// redo: the parent named the copy, the previous sibling the original (`check()` failed after
/// recovery). Now migrations are serialised: `B` waits until `A` is done, the crash finds `A`'s
/// log armed and recovery redoes it.
#[test]
fn concurrent_migrations_do_not_share_the_log() {
    use numakv_pmem::{CrashOptions, PersistMode, SimMode};
    use std::collections::BTreeMap;
    let sc = Scenario::setup();
    let opts = NobtreeOptions { nsm_mode: NsmMode::Node(0), ..quiet() };
    let d = tempfile::tempdir().unwrap();
    let t = Arc::new(common::create(d.path(), PersistMode::Adr, SimMode::Shadow, &opts));
    let mut model = BTreeMap::new();
    for k in 1..=1500u64 {
        t.insert(k * 5, vk(k)).unwrap();
        model.insert(k * 5, vk(k));
    }
    let pool = Arc::clone(t.pool());
    let parked = sc.pause_thread("nobtree.migrate.parent_switched", "mig-a");
    // Leaves far apart: different parents (height 2: different subindex roots) and siblings.
    let a = {
        let t = Arc::clone(&t);
        thread::Builder::new()
            .name("mig-a".into())
            .spawn(move || t.migrate_leaf_of(1000, 1))
            .unwrap()
    };
    parked.wait_parked();
    let (tx, rx) = mpsc::channel();
    let b = {
        let t = Arc::clone(&t);
        thread::Builder::new()
            .name("mig-b".into())
            .spawn(move || {
                let r = t.migrate_leaf_of(6000, 1);
                let _ = tx.send(());
                r
            })
            .unwrap()
    };
    // Before the fix `B` finishes here; now it waits for `A`.
    let b_done_first = rx.recv_timeout(Duration::from_secs(2)).is_ok();
    pool.crash(CrashOptions::STRICT).unwrap();
    parked.release();
    let _ = a.join().unwrap();
    let _ = b.join().unwrap();
    drop(t);
    drop(pool);
    let (t, rep) = common::reopen(d.path(), SimMode::Shadow, &opts);
    assert!(!rep.was_clean);
    common::verify(&t, &model, None, true);
    assert!(!b_done_first, "a second migration ran while the first had the log armed");
    let redone = rep.counters.iter().find(|c| c.0 == "migration_redone").map(|c| c.1);
    assert_eq!(redone, Some(1), "{rep:?}");
}

/// Issue 19 (the paper: migration "does not block any reader"): a migration parked with its
/// node, the previous sibling and the parent frozen and its copy written. Readers of the
/// node's keys go on reading through them (they used to wait for the node and parent locks,
/// held through the copy, the allocation and every fence); a writer to the node waits until
/// the migration is done and then writes the copy.
#[test]
fn readers_do_not_wait_for_a_migration() {
    let sc = Scenario::setup();
    let opts = NobtreeOptions { nsm_mode: NsmMode::Node(0), ..quiet() };
    let t = Arc::new(volatile(&opts));
    for k in 1..=3000u64 {
        t.insert(k, vk(k)).unwrap();
    }
    let k = 1500;
    let parked = sc.pause_thread("nobtree.migrate.frozen", "mig");
    let m = {
        let t = Arc::clone(&t);
        thread::Builder::new().name("mig".into()).spawn(move || t.migrate_leaf_of(k, 1)).unwrap()
    };
    parked.wait_parked();
    let t2 = Arc::clone(&t);
    let got = finishes("reader", 10, move || t2.get(k).unwrap());
    assert_eq!(got, Some(vk(k)), "the reader of the frozen node");
    let (tx, rx) = mpsc::channel();
    let w = {
        let t = Arc::clone(&t);
        thread::spawn(move || {
            t.upsert(k, 7).unwrap();
            let _ = tx.send(());
        })
    };
    assert!(rx.recv_timeout(Duration::from_millis(300)).is_err(), "a write into a frozen node");
    parked.release();
    assert!(m.join().unwrap().unwrap(), "the migration committed");
    w.join().unwrap();
    assert_eq!(t.get(k).unwrap(), Some(7));
    assert_eq!(t.leaf_node_of(k).unwrap(), 1);
    t.check().unwrap();
}

/// Issue 19: the upper layer is rebuilt from a snapshot without holding the upper-layer mutex
/// through the build. A rebuild parked after its snapshot (`nobtree.rebuild.snapshot`: the log
/// of writes started, the entries read, nothing built); meanwhile inserts split subindex roots
/// (new roots inserted into the old replicas or its temporary list) and subindex roots
/// migrate (their entries rewritten) — all without waiting for the rebuild. Released, the
/// rebuild applies the logged writes to the layer it built before the swap: `check()` finds
/// every top-level node named by the new layer or its temporary list, and no entry naming a
/// migrated-away root. A rebuild that ignores the log loses them (`check()`: "upper entries").
#[test]
fn rebuild_from_a_snapshot_keeps_concurrent_upper_writes() {
    let sc = Scenario::setup();
    // Height 1: every leaf is a subindex root, so every split is an upper-layer insert. No
    // automatic rebuilds: the test's own is the only one.
    let opts = NobtreeOptions {
        height: 1,
        nsm_mode: NsmMode::Node(0),
        background_rebuild: false,
        rebuild_threshold: 1e9,
        ..quiet()
    };
    let t = Arc::new(volatile(&opts));
    let key = |i: u64| i * 7919 % 100_003 + 1; // spread over the key space
    for i in 0..3000u64 {
        assert!(t.insert(key(i), vk(key(i))).unwrap());
    }
    let before = t.stats();
    assert!(before.counter("upper_temp_list").unwrap() > 0, "{:?}", before.counters);
    let parked = sc.pause_thread("nobtree.rebuild.snapshot", "rebuild");
    let r = {
        let t = Arc::clone(&t);
        thread::Builder::new().name("rebuild".into()).spawn(move || t.rebuild_upper()).unwrap()
    };
    parked.wait_parked();
    // Upper-layer writes while the rebuild is parked: they must not wait for it.
    let t2 = Arc::clone(&t);
    let (splits, migrated) = finishes("upper writes during a rebuild", 20, move || {
        let s0 = t2.stats().counter("subindex_splits").unwrap();
        for i in 3000..6000u64 {
            assert!(t2.insert(key(i), vk(key(i))).unwrap());
        }
        // Root migrations: their upper entries are rewritten.
        let migrated = (0..6000u64)
            .step_by(151)
            .filter(|&i| t2.migrate_node_of(key(i), 0, 1).unwrap())
            .count();
        (t2.stats().counter("subindex_splits").unwrap() - s0, migrated)
    });
    assert!(splits > 100, "only {splits} subindex splits during the rebuild");
    assert!(migrated > 5, "only {migrated} root migrations during the rebuild");
    parked.release();
    r.join().unwrap().unwrap();
    assert_eq!(t.stats().counter("upper_rebuilds"), Some(1));
    let out = check_values_name_keys(&t);
    assert_eq!(out.len(), 6000);
    // The migrated roots are on node 1 and reached through the new layer.
    for i in (0..6000u64).step_by(151) {
        assert_eq!(t.get(key(i)).unwrap(), Some(vk(key(i))));
    }
}

/// Issue 19 (hysteresis; papers/nobtree.txt §III-B2: nodes migrate "to the socket that
/// accesses them most"): three NUMA nodes, one leaf on node 0, read 6 times from node 2 and
/// then once from node 1 — the sample that makes it hot comes from node 1, and the leaf goes
/// to node 2 (it went to the last sampler's node before). The coordinator is parked with the
/// leaf frozen (`nobtree.migrate.frozen`) while node 2 reads it 20 times more; the copy then
/// carries those statistics (node 1: 1, node 2: 26): a burst of 8 reads from node 1 — enough
/// to make a fresh id hot (threshold 7, all remote) — does not move it back; having moved, it
/// moves again only at a 75% remote majority.
#[test]
fn migration_goes_to_the_largest_accessor_and_the_copy_keeps_its_statistics() {
    use numakv_nobtree::{MigrationOptions, Nobtree};
    use numakv_pmem::numa::set_current_node;
    use numakv_pmem::{PersistMode, Pool, SimMode};
    let sc = Scenario::setup();
    let d = tempfile::tempdir().unwrap();
    // Loaded without the coordinator (the loader's samples would count for node 0), then
    // reopened with it: the loaded nodes are not fresh (no cool-down applies to them anyway).
    let mut cfg = common::pool_cfg(PersistMode::Adr, SimMode::Direct);
    cfg.nodes = 3;
    let load = NobtreeOptions { nsm_mode: NsmMode::Node(0), ..quiet() };
    let t = Nobtree::create(Pool::create(d.path(), cfg).unwrap(), &load).unwrap();
    for k in 1..=2000u64 {
        t.insert(k, vk(k)).unwrap();
    }
    t.close().unwrap();
    let opts = NobtreeOptions {
        nsm_mode: NsmMode::Node(0),
        migration: MigrationOptions {
            sample_every: 1,
            hot_threshold: 7,
            cooldown: 0,
            inner: false,
            ..Default::default()
        },
        ..Default::default()
    };
    let (t, _) = common::reopen(d.path(), SimMode::Direct, &opts);
    let k = 1000;
    assert_eq!(t.leaf_node_of(k).unwrap(), 0);
    let read = |node: usize, times: usize| {
        set_current_node(node);
        for _ in 0..times {
            assert_eq!(t.get(k).unwrap(), Some(vk(k)));
        }
        set_current_node(0);
    };
    let parked = sc.pause("nobtree.migrate.frozen");
    read(2, 6);
    read(1, 1);
    parked.wait_parked();
    read(2, 20);
    parked.release();
    t.drain_migrations();
    let st = t.stats();
    assert_eq!(t.leaf_node_of(k).unwrap(), 2, "not the largest accessor: {:?}", st.counters);
    read(1, 8);
    t.drain_migrations();
    let st = t.stats();
    assert_eq!(t.leaf_node_of(k).unwrap(), 2, "moved back by a burst: {:?}", st.counters);
    assert_eq!(st.counter("migrations"), Some(1), "{:?}", st.counters);
    assert_eq!(st.counter("migration_stats_carried"), Some(1), "{:?}", st.counters);
    // Having moved, it needs a 75% remote majority to move again: node 1 at 49 of 75 (65%)
    // is not enough, at 109 of 135 (81%) it is.
    read(1, 40);
    t.drain_migrations();
    assert_eq!(t.leaf_node_of(k).unwrap(), 2, "moved back at 65% remote: {:?}", t.stats().counters);
    read(1, 60);
    t.drain_migrations();
    let st = t.stats();
    assert_eq!(t.leaf_node_of(k).unwrap(), 1, "not moved at 81% remote: {:?}", st.counters);
    assert_eq!(st.counter("migrations_queued_again"), Some(1), "{:?}", st.counters);
    t.check().unwrap();
}

/// Issue 36 (the paper: migration "does not block any reader"): a merge locks the node `N`
/// and its right sibling `R`, then their parent `P`. With `P` frozen by a parked migration
/// (of one of `P`'s other children) it waited in `WriteGuard::lock(P)` holding `N` and `R`,
/// and every reader of `N`'s or `R`'s keys spun in `ReadSnapshot::begin` until the migration
/// ended. Now a merge gives up on a frozen parent as it does on a frozen sibling.
///
/// Height 3, keys 1..=3000, coordinator off. The leaf `O` of 1500 and its previous sibling
/// `L` are first moved to node 1 (so their keys can be told apart: writers rightly wait for
/// those two while they are frozen), then `O` is migrated back and parked at
/// `nobtree.migrate.frozen` (`O`, `L` and `P` frozen). A deleter removes 1600 down to 1400
/// (keeping `k % 5 == 0`, skipping `O`'s and `L`'s keys): its deletes leave leaves sparse and
/// merge them, some with `P` as parent. Readers of the kept keys must finish every pass.
#[test]
fn readers_do_not_wait_for_a_merge_blocked_on_a_frozen_parent() {
    let sc = Scenario::setup();
    let opts = NobtreeOptions { height: 3, nsm_mode: NsmMode::Node(0), ..quiet() };
    let t = Arc::new(volatile(&opts));
    for k in 1..=3000u64 {
        t.insert(k, vk(k)).unwrap();
    }
    assert!(t.migrate_leaf_of(1500, 1).unwrap());
    let o_low =
        (1..=1500u64).rev().take_while(|&k| t.leaf_node_of(k).unwrap() == 1).last().unwrap();
    assert!(t.migrate_leaf_of(o_low - 1, 1).unwrap());
    let frozen_keys: Vec<u64> =
        (1300..=1700u64).filter(|&k| t.leaf_node_of(k).unwrap() == 1).collect();
    assert!(frozen_keys.contains(&1500) && frozen_keys.contains(&(o_low - 1)));
    let merges_before = t.stats().counter("merges").unwrap();
    let parked = sc.pause_thread("nobtree.migrate.frozen", "mig");
    let m = {
        let t = Arc::clone(&t);
        thread::Builder::new().name("mig".into()).spawn(move || t.migrate_leaf_of(1500, 0)).unwrap()
    };
    parked.wait_parked();
    let (tx, rx) = mpsc::channel();
    let doomed: Vec<u64> =
        (1400..=1600u64).rev().filter(|k| k % 5 != 0 && !frozen_keys.contains(k)).collect();
    let d = {
        let t = Arc::clone(&t);
        let doomed = doomed.clone();
        thread::Builder::new()
            .name("deleter".into())
            .spawn(move || {
                for k in doomed {
                    assert!(t.remove(k).unwrap(), "remove {k}");
                }
                let _ = tx.send(());
            })
            .unwrap()
    };
    // Reader passes over the kept keys while the deleter runs (and, before the fix, after it
    // blocked holding two leaves): each pass must finish.
    let kept: Vec<u64> = (1380..=1620u64).filter(|k| !doomed.contains(k)).collect();
    let mut passes = 0;
    let mut longest = Duration::ZERO;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let done = rx.try_recv().is_ok();
        let t2 = Arc::clone(&t);
        let kept2 = kept.clone();
        let t0 = std::time::Instant::now();
        let got = finishes("reader", 10, move || {
            kept2.iter().map(|&k| t2.get(k).unwrap()).collect::<Vec<_>>()
        });
        longest = longest.max(t0.elapsed());
        passes += 1;
        for (k, v) in kept.iter().zip(got) {
            assert_eq!(v, Some(vk(*k)), "kept key {k}");
        }
        if done {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the deleter did not finish while the migration was parked ({passes} reader passes)"
        );
    }
    eprintln!("{passes} reader passes while the migration was parked, longest {longest:?}");
    let merged = t.stats().counter("merges").unwrap() - merges_before;
    assert!(merged > 0, "no merge during the parked migration: the test lost its teeth");
    parked.release();
    assert!(m.join().unwrap().unwrap(), "the migration committed");
    d.join().unwrap();
    assert_eq!(t.leaf_node_of(1500).unwrap(), 0);
    let out = check_values_name_keys(&t);
    let want: Vec<(u64, u64)> =
        (1..=3000u64).filter(|k| !doomed.contains(k)).map(|k| (k, vk(k))).collect();
    assert_eq!(out, want);
}

/// Issue 36: the window between a migration's unfreezing of its copy and the disarming of its
/// log (`nobtree.migrate.copy_open`): both references already name the copy `O'`, writers enter
/// it, and the log is still armed, so a crash here makes recovery redo a migration whose copy
/// has taken writes since. The redo must only re-point references that still name `O`
/// (none): every acknowledged write into `O'` survives. Updates and inserts into the copy are
/// acknowledged; a writer that then splits the copy waits in the split's parent insert for the
/// frozen parent (its new node is linked only by the copy's sibling pointer — an orphan
/// recovery links) and is the pending operation. Heights 2 and 3, ADR shadow, strict crash.
#[test]
fn crash_after_writes_into_the_copy_while_the_log_is_armed() {
    use numakv_pmem::{CrashOptions, PersistMode, SimMode};
    use std::collections::BTreeMap;
    let sc = Scenario::setup();
    for height in [2u32, 3] {
        let opts = NobtreeOptions { height, nsm_mode: NsmMode::Node(0), ..quiet() };
        let d = tempfile::tempdir().unwrap();
        let t = Arc::new(common::create(d.path(), PersistMode::Adr, SimMode::Shadow, &opts));
        let mut model = BTreeMap::new();
        for k in 1..=1500u64 {
            t.insert(k * 5, vk(k * 5)).unwrap();
            model.insert(k * 5, vk(k * 5));
        }
        let pool = Arc::clone(t.pool());
        let parked = sc.pause_thread("nobtree.migrate.copy_open", "mig");
        let m = {
            let t = Arc::clone(&t);
            thread::Builder::new()
                .name("mig".into())
                .spawn(move || t.migrate_leaf_of(5000, 1))
                .unwrap()
        };
        parked.wait_parked();
        // The copy's keys: the only leaf on node 1.
        let copy: Vec<u64> =
            (4900..=5100u64).step_by(5).filter(|&k| t.leaf_node_of(k).unwrap() == 1).collect();
        assert!(copy.contains(&5000), "{copy:?}");
        for &k in &copy {
            t.upsert(k, vk(k) + 1).unwrap();
            model.insert(k, vk(k) + 1);
        }
        let lo = copy[0];
        // Two inserts fit (a leaf of a sequential load is about half full).
        for k in [lo + 1, lo + 2] {
            assert!(t.insert(k, vk(k)).unwrap());
            model.insert(k, vk(k));
        }
        assert_eq!(t.leaf_node_of(lo + 1).unwrap(), 1, "the inserts went into the copy");
        // More inserts into the copy: one of them splits it and waits for the frozen parent.
        // (key, done): sent before and after each insert.
        let (tx, rx) = mpsc::channel::<(u64, bool)>();
        let w = {
            let t = Arc::clone(&t);
            let keys: Vec<u64> = [lo + 3, lo + 4]
                .into_iter()
                .chain(copy.iter().skip(1).flat_map(|&c| [c + 1, c + 2]))
                .collect();
            thread::spawn(move || {
                for k in keys {
                    let _ = tx.send((k, false));
                    let r = t.insert(k, vk(k));
                    if !matches!(r, Ok(true)) {
                        return; // the pool crashed under it: never acknowledged
                    }
                    let _ = tx.send((k, true));
                }
            })
        };
        // Acknowledged inserts go into the model until the writer stops making progress (it
        // waits for the frozen parent; or it finished, had nothing split).
        let mut pending = None;
        while let Ok((k, done)) = rx.recv_timeout(Duration::from_millis(500)) {
            if done {
                model.insert(k, vk(k));
                pending = None;
            } else {
                pending = Some(Op::Insert(k, vk(k)));
            }
        }
        pool.crash(CrashOptions::STRICT).unwrap();
        parked.release();
        let _ = m.join().unwrap();
        w.join().unwrap();
        drop(t);
        drop(pool);
        let (t, rep) = common::reopen(d.path(), SimMode::Shadow, &opts);
        assert!(!rep.was_clean);
        common::verify(&t, &model, pending, true);
        let counter = |n: &str| rep.counters.iter().find(|c| c.0 == n).map_or(0, |c| c.1);
        eprintln!(
            "height {height}: pending {pending:?}, recovery {:?}",
            rep.counters.iter().filter(|c| c.1 > 0).collect::<Vec<_>>()
        );
        assert_eq!(counter("migration_redone"), 1, "{rep:?}");
        assert_eq!(counter("orphans_linked"), 1, "the copy's split was not left to recovery");
        common::keep_working(&t, 77, 300, 8000, 6);
    }
}
