//! Forced interleavings at FAST&FAIR's protocol windows: each test parks one thread at a named
//! pause point (docs/design.md §12, crate docs "Pause points") and moves another operation
//! through the window — a shift, a split, a merge with root shrink — before releasing it.
//!
//! The trees use 256-byte nodes: 12 slots, at most 11 entries, a leaf merges at ≤ 2 entries when
//! the pair fits in 8. Keys 10, 20, .., 110 fill the root leaf; 120 splits it at 70 into
//! A = [10..60] and B = [70..120] under a new root. Removing 10..40 then leaves A with 2 entries:
//! A absorbs B (B DEAD) and the empty root shrinks to A.
//!
//! Each test holds the failpoint registry (`Scenario`) from its first line (a point is global)
//! and parks only named threads (`pause_thread`), so the test's own operations pass every point.
//! Parked threads are released before any assertion: a failing test never hangs.

mod common;

use std::sync::{mpsc, Arc};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use numakv_fastfair::{FastFair, FastFairOptions, RecoveryMode};
use numakv_index::{Engine, Index};
use numakv_pmem::failpoint::{spawn_named, Scenario};
use numakv_pmem::{CrashOptions, PersistMode, Pool, PoolConfig, SimMode};

const NODE: usize = 256;

/// A tree of 256-byte nodes in a volatile pool.
fn tree() -> Arc<FastFair> {
    let pool = Pool::volatile(PoolConfig::new(FastFair::engine_id(), 16 << 20)).unwrap();
    let opts = FastFairOptions { node_size: NODE, ..Default::default() };
    Arc::new(FastFair::create(pool, &opts).unwrap())
}

/// Inserts `keys` with value `10 * key`.
fn fill(t: &FastFair, keys: impl IntoIterator<Item = u64>) {
    for k in keys {
        assert!(t.insert(k, k * 10).unwrap(), "insert {k}");
    }
}

/// The full root leaf [10..110].
fn full_leaf(t: &FastFair) {
    fill(t, (1..=11).map(|i| i * 10));
}

/// Two leaves A = [10..60], B = [70..120] under an internal root.
fn two_leaves(t: &FastFair) {
    fill(t, (1..=12).map(|i| i * 10));
    assert_eq!(counter(t, "splits"), 1);
    assert_eq!(counter(t, "height"), 2);
}

/// Removes 10..40 from A: A absorbs B and the root shrinks to A.
fn merge_and_shrink(t: &FastFair) {
    for k in [10, 20, 30, 40] {
        assert!(t.remove(k).unwrap(), "remove {k}");
    }
}

fn counter(t: &FastFair, name: &str) -> u64 {
    t.stats().counters.iter().find(|c| c.0 == name).unwrap().1
}

/// Runs `f` on a helper thread while a thread is parked holding a lock that `f` may (wrongly)
/// wait for: `None` if it did not finish within `WINDOW` (then the caller releases the parked
/// thread, joins the helper and fails, instead of hanging).
fn within_window<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> (Option<T>, JoinHandle<()>) {
    let (tx, rx) = mpsc::channel();
    let h = thread::spawn(move || {
        let _ = tx.send(f());
    });
    (rx.recv_timeout(WINDOW).ok(), h)
}

/// How long the operations inside a window may take (they take microseconds).
const WINDOW: Duration = Duration::from_secs(10);

/// A lock-free reader between reading a key and reading its value (`fastfair.leaf.key_read`)
/// while a writer shifts that slot: a delete (left shift, direction change) and an insert (right
/// shift, same direction). Slot 2 held 30 when the reader took it; after the shift it holds the
/// right neighbour (delete) or the left one (insert) with its value. The reader must reject the
/// pair (key re-read) and find 30 again — further right in the same pass (insert) or after a
/// retry in the new direction (delete: the switch counter changed).
#[test]
fn reader_between_key_and_value_while_the_slot_shifts() {
    // First: tests of this file arm points every thread meets, so they run one at a time.
    let sc = Scenario::setup();
    for delete in [true, false] {
        let t = tree();
        fill(&t, [10, 20, 30, 40, 50]);
        let p = sc.pause_thread("fastfair.leaf.key_read", "reader");
        let r = {
            let t = Arc::clone(&t);
            spawn_named("reader", move || t.get(30).unwrap())
        };
        p.wait_parked(); // 30 read at slot 2, value not yet
        let retries = counter(&t, "retries");
        if delete {
            assert!(t.remove(20).unwrap()); // slot 2 now holds (40, 400)
        } else {
            assert!(t.insert(15, 150).unwrap()); // slot 2 now holds (20, 200)
        }
        p.release();
        let got = r.join().unwrap();
        assert_eq!(
            got,
            Some(300),
            "delete={delete}: the reader returned another key's value or missed 30"
        );
        if delete {
            assert!(counter(&t, "retries") > retries, "the direction change forced no retry");
        }
        t.check().unwrap();
    }
}

/// A reader that chose the root leaf (`fastfair.lookup.leaf`) before the leaf splits: its key
/// moved to the new right node, cut from the leaf it holds. It must follow the sibling link.
#[test]
fn reader_follows_the_sibling_of_a_leaf_that_split() {
    // First: tests of this file arm points every thread meets, so they run one at a time.
    let sc = Scenario::setup();
    let t = tree();
    full_leaf(&t);
    let p = sc.pause_thread("fastfair.lookup.leaf", "reader");
    let r = {
        let t = Arc::clone(&t);
        spawn_named("reader", move || t.get(100).unwrap())
    };
    p.wait_parked(); // holds the root leaf [10..110]
    assert!(t.insert(120, 1200).unwrap()); // split at 70: 100 moves right
    p.release();
    let got = r.join().unwrap();
    assert_eq!(counter(&t, "splits"), 1);
    assert_eq!(got, Some(1000), "the reader missed a key that moved to the new right node");
    t.check().unwrap();
}

/// A writer that found leaf B (`fastfair.write.leaf_found`, not yet locked) while B is merged
/// into A (B DEAD) and the root shrinks to A: it must notice DEAD and restart from the new root;
/// an insert into B would be lost with it.
#[test]
fn writer_restarts_from_a_leaf_merged_away_under_a_shrunk_root() {
    // First: tests of this file arm points every thread meets, so they run one at a time.
    let sc = Scenario::setup();
    let t = tree();
    two_leaves(&t);
    let p = sc.pause_thread("fastfair.write.leaf_found", "writer");
    let w = {
        let t = Arc::clone(&t);
        spawn_named("writer", move || t.insert(75, 750).unwrap())
    };
    p.wait_parked(); // holds B = [70..120], unlocked
    merge_and_shrink(&t);
    p.release();
    let inserted = w.join().unwrap();
    assert_eq!((counter(&t, "merges"), counter(&t, "root_shrinks")), (1, 1));
    assert!(inserted);
    assert_eq!(t.get(75).unwrap(), Some(750), "an acknowledged insert went into a dead leaf");
    for k in (5..=12).map(|i| i * 10) {
        assert_eq!(t.get(k).unwrap(), Some(k * 10));
    }
    t.check().unwrap();
}

/// `update_with` (one descent, the leaf locked while `f` runs) that found the root leaf before
/// it splits (`fastfair.write.leaf_found`): its key moved right; locking must move right along
/// the sibling link, and `f` runs once, on the key's value.
#[test]
fn update_with_moves_right_after_its_leaf_split() {
    // First: tests of this file arm points every thread meets, so they run one at a time.
    let sc = Scenario::setup();
    let t = tree();
    full_leaf(&t);
    let p = sc.pause_thread("fastfair.write.leaf_found", "updater");
    let u = {
        let t = Arc::clone(&t);
        spawn_named("updater", move || {
            let mut calls = 0;
            let r = t
                .update_with(100, &mut |v| {
                    calls += 1;
                    Ok(Some(v + 1))
                })
                .unwrap();
            (r, calls)
        })
    };
    p.wait_parked(); // holds the root leaf [10..110], unlocked
    assert!(t.insert(120, 1200).unwrap()); // split at 70: 100 moves right
    p.release();
    let (old, calls) = u.join().unwrap();
    assert_eq!(counter(&t, "splits"), 1);
    assert_eq!((old, calls), (Some(1000), 1), "update_with lost its key to the split");
    assert_eq!(t.get(100).unwrap(), Some(1001));
    t.check().unwrap();
}

/// A scan parked between leaves (`fastfair.scan.next_leaf`: A emitted, B not yet read) while B
/// is merged into A and the root shrinks: the scan finds B DEAD, restarts at A, which now holds
/// keys it already returned. Output: strictly ascending, every key present throughout, once.
/// Then the same with B splitting instead (five inserts fill it, a sixth splits it).
#[test]
fn scan_between_leaves_while_the_next_leaf_merges_or_splits() {
    // First: tests of this file arm points every thread meets, so they run one at a time.
    let sc = Scenario::setup();
    for merge in [true, false] {
        let t = tree();
        two_leaves(&t);
        let p = sc.pause_thread("fastfair.scan.next_leaf", "scanner");
        let s = {
            let t = Arc::clone(&t);
            spawn_named("scanner", move || {
                let mut out = Vec::new();
                t.scan(1, 1000, &mut out).unwrap();
                out
            })
        };
        p.wait_parked(); // A's keys returned, about to read B
        let mut want: Vec<u64> = (1..=12).map(|i| i * 10).collect();
        if merge {
            merge_and_shrink(&t);
        } else {
            fill(&t, [71, 72, 73, 74, 75, 76]);
            want.extend([71, 72, 73, 74, 75, 76]);
            want.sort_unstable();
        }
        p.release();
        let out = s.join().unwrap();
        if merge {
            assert_eq!((counter(&t, "merges"), counter(&t, "root_shrinks")), (1, 1));
        } else {
            assert_eq!(counter(&t, "splits"), 2);
        }
        let keys: Vec<u64> = out.iter().map(|e| e.0).collect();
        assert!(keys.windows(2).all(|w| w[0] < w[1]), "merge={merge}: not ascending: {keys:?}");
        assert_eq!(keys, want, "merge={merge}");
        assert!(out.iter().all(|&(k, v)| v == k * 10));
        t.check().unwrap();
    }
}

/// FAIR's window (`fastfair.split.linked`): the root leaf has split, B is durable and linked
/// through A.sibling, and no parent names it yet (the new root is not installed). Meanwhile a
/// writer inserts into B's range (found through A's sibling link), and readers and a scan see
/// every key. After the split completes, everything is there.
#[test]
fn split_window_before_the_parent_update() {
    // First: tests of this file arm points every thread meets, so they run one at a time.
    let sc = Scenario::setup();
    let t = tree();
    full_leaf(&t);
    let p = sc.pause_thread("fastfair.split.linked", "splitter");
    let s = {
        let t = Arc::clone(&t);
        spawn_named("splitter", move || t.insert(120, 1200).unwrap())
    };
    p.wait_parked(); // A = [10..60] (locked) → B = [70..120]; root slot still A
    let height = counter(&t, "height");
    let (window, h) = within_window({
        let t = Arc::clone(&t);
        move || {
            let inserted = t.insert(95, 950);
            let got: Vec<_> = (1..=12).map(|i| t.get(i * 10)).collect();
            let mut out = Vec::new();
            let scanned = t.scan(1, 1000, &mut out);
            (inserted, got, scanned, out)
        }
    });
    p.release();
    h.join().unwrap();
    assert!(s.join().unwrap());
    let (inserted, got, scanned, out) =
        window.expect("the window's operations waited for the splitter");
    assert_eq!(height, 1, "the window is before the new root");
    assert!(inserted.unwrap(), "insert into the new node's range in the window");
    for (i, g) in (1..=12).zip(got) {
        assert_eq!(g.unwrap(), Some(i * 100), "key {} missed in the window", i * 10);
    }
    scanned.unwrap();
    let mut want: Vec<(u64, u64)> = (1..=12).map(|i| (i * 10, i * 100)).collect();
    want.push((95, 950));
    want.sort_unstable();
    assert_eq!(out, want, "scan in the window");
    for &(k, v) in &want {
        assert_eq!(t.get(k).unwrap(), Some(v));
    }
    assert_eq!(counter(&t, "height"), 2);
    t.check().unwrap();
}

/// A store in `dir` that crashed in FAIR's window of a root split (ADR, strict: only what was
/// persisted survives): the root leaf [10..110] split for 120, the splitter parked before the
/// new root is installed, and another writer acknowledged 95 into the new node B. The durable
/// tree: root slot = A = [10..60], A.sibling = B = [70..120] + 95, no parent names B.
fn crashed_in_the_split_window(sc: &Scenario, dir: &std::path::Path) {
    let t = Arc::new(common::create(dir, PersistMode::Adr, SimMode::Shadow, NODE));
    full_leaf(&t);
    let p = sc.pause_thread("fastfair.split.linked", "splitter");
    let s = {
        let t = Arc::clone(&t);
        spawn_named("splitter", move || t.insert(120, 1200))
    };
    p.wait_parked(); // B durable and linked through A only
    let (window, h) = within_window({
        let t = Arc::clone(&t);
        move || {
            let acked = t.insert(95, 950);
            (acked, t.pool().crash(CrashOptions::STRICT))
        }
    });
    p.release();
    h.join().unwrap();
    let _ = s.join().unwrap(); // in flight at the crash: either outcome is allowed
    let (acked, crashed) = window.expect("the insert in the window waited for the splitter");
    assert!(acked.unwrap());
    crashed.unwrap();
    drop(Arc::try_unwrap(t).unwrap());
}

/// Every key of [`crashed_in_the_split_window`], plus `extra`, with its value.
fn assert_split_window_keys(t: &FastFair, what: &str, extra: &[u64]) {
    let mut want: Vec<u64> = (1..=11).map(|i| i * 10).collect();
    want.push(95);
    want.extend(extra);
    for k in want {
        assert_eq!(t.get(k).unwrap(), Some(k * 10), "{what}: acknowledged key {k} lost");
    }
    // B held 120 durably before the window: the interrupted insert took effect.
    assert_eq!(t.get(120).unwrap(), Some(1200), "{what}");
}

/// A crash in FAIR's window ([`crashed_in_the_split_window`]): recovery (eager and lazy) finds
/// B through A's sibling link, installs the missing root and keeps every acknowledged key.
#[test]
fn crash_in_the_split_window_keeps_every_acknowledged_key() {
    // First: tests of this file arm points every thread meets, so they run one at a time.
    let sc = Scenario::setup();
    for recovery in [RecoveryMode::Eager, RecoveryMode::Lazy] {
        let d = common::scratch();
        crashed_in_the_split_window(&sc, d.path());
        let (t, rep) = common::reopen_with(d.path(), SimMode::Shadow, recovery);
        assert!(!rep.was_clean);
        assert_split_window_keys(&t, &recovery.to_string(), &[]);
        t.check().unwrap();
        assert_eq!(counter(&t, "height"), 2, "{recovery}: the missing root was installed");
    }
}

/// The lazy recovery pass against foreground writers repairing the same crash: the lost root
/// split of [`crashed_in_the_split_window`]. The pass is parked either before its walk
/// (`fastfair.recovery.background`) or after it decided that the root level has a second node
/// and before it locks the root to install the lost root (`fastfair.recovery.lost_root`).
/// Meanwhile foreground inserts fill B and split it; B's splitter needs the level above the
/// root, finds the old root unlocked and installs it itself. The pass, released, must find the
/// root changed (nothing to link: `orphans_linked` 0) and leave a tree that checks.
#[test]
fn lazy_recovery_against_writers_that_install_the_lost_root() {
    // First: tests of this file arm points every thread meets, so they run one at a time.
    let sc = Scenario::setup();
    for point in ["fastfair.recovery.background", "fastfair.recovery.lost_root"] {
        let d = common::scratch();
        crashed_in_the_split_window(&sc, d.path());
        let p = sc.pause_thread(point, "fastfair-recovery");
        let (t, rep) = common::reopen_with(d.path(), SimMode::Shadow, RecoveryMode::Lazy);
        assert!(!rep.was_clean);
        p.wait_parked();
        // B = [70..120] + 95 holds 7 entries: 4 more fill it, the 5th splits it.
        let extra = [121, 122, 123, 124, 125];
        let (window, h) = within_window({
            let t = Arc::new(t);
            move || {
                fill(&t, extra);
                t
            }
        });
        p.release();
        h.join().unwrap();
        let t = Arc::try_unwrap(window.expect("foreground writers waited for the recovery pass"))
            .unwrap();
        let report = t.wait_recovery().unwrap().expect("a lazy open's report");
        let linked = report.counters.iter().find(|c| c.0 == "orphans_linked").unwrap().1;
        assert_eq!(counter(&t, "root_splits"), 1, "{point}: the foreground installed the root");
        assert_eq!(linked, 0, "{point}: the pass linked again what the foreground had linked");
        assert_split_window_keys(&t, point, &extra);
        t.check().unwrap();
        assert_eq!(counter(&t, "height"), 2, "{point}");
    }
}
