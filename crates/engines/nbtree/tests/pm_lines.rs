//! Table I per operation, measured by the accounting layer on a leaf that is not splitting:
//! an insert writes exactly one PM line (the entry) and reads none of the leaf's metadata; an
//! update and a delete write one line; a search reads one. In ADR each write is one flush.
//! Coupled leaves (Fig. 13) pay the metadata line on top.

use numakv_index::{Engine, Index};
use numakv_nbtree::{NbTree, NbTreeOptions};
use numakv_pmem::{account, AccessStats, PersistMode, Pool, PoolConfig};

/// Accounting is switched per process: the tests of this file take turns.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn measure(t: &NbTree, op: impl FnOnce(&NbTree)) -> AccessStats {
    account::op_discard();
    let before = account::thread_stats();
    op(t);
    account::op_end();
    account::thread_stats().since(&before)
}

fn tree(mode: PersistMode, coupled: bool) -> NbTree {
    let mut cfg = PoolConfig::new(NbTree::engine_id(), 32 << 20);
    cfg.mode = mode;
    let pool = Pool::volatile(cfg).unwrap();
    NbTree::create(pool, &NbTreeOptions { coupled, ..Default::default() }).unwrap()
}

#[test]
fn one_line_per_operation() {
    if !account::COMPILED {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    account::set_enabled(true);
    for mode in [PersistMode::Eadr, PersistMode::Adr] {
        let t = tree(mode, false);
        // A few keys in the first leaf: room left, so no SMO below.
        for k in 1..=4u64 {
            t.insert(k * 10, k).unwrap();
        }
        let flushes = u64::from(mode == PersistMode::Adr);
        let s = measure(&t, |t| assert!(t.insert(25, 7).unwrap()));
        assert_eq!((s.writes(), s.flushes), (1, flushes), "insert {mode}: {s:?}");
        let s = measure(&t, |t| assert!(t.update(25, 8).unwrap()));
        assert_eq!((s.writes(), s.reads(), s.flushes), (1, 1, flushes), "update {mode}: {s:?}");
        let s = measure(&t, |t| assert!(t.remove(10).unwrap()));
        assert_eq!((s.writes(), s.reads(), s.flushes), (1, 1, flushes), "delete {mode}: {s:?}");
        let s = measure(&t, |t| assert_eq!(t.get(25).unwrap(), Some(8)));
        assert_eq!((s.writes(), s.reads()), (0, 1), "search {mode}: {s:?}");
    }
    // Coupled leaves: the metadata line is read by every search and written by every insert.
    let t = tree(PersistMode::Eadr, true);
    for k in 1..=4u64 {
        t.insert(k * 10, k).unwrap();
    }
    let s = measure(&t, |t| assert!(t.insert(25, 7).unwrap()));
    assert_eq!(s.writes(), 2, "coupled insert: {s:?}");
    let s = measure(&t, |t| assert_eq!(t.get(25).unwrap(), Some(7)));
    assert_eq!(s.reads(), 2, "coupled search: {s:?}");
    account::set_enabled(false);
}

/// The insert that fills a leaf past its capacity runs the SMO: its copies, Calloc's log and
/// bitmap, and the link are counted in the SMO share (`account::smo_scope`), and what is left —
/// the insert's own leaf access — is the one entry line of Table I.
#[test]
fn a_splitting_insert_is_one_line_plus_the_smo_share() {
    if !account::COMPILED {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    account::set_enabled(true);
    let t = tree(PersistMode::Eadr, false);
    let slots = t.leaf_slots() as u64;
    for k in 1..=slots {
        assert!(t.insert(k * 10, k).unwrap());
    }
    let s = measure(&t, |t| assert!(t.insert(5, 7).unwrap()));
    assert_eq!(t.stats().counters.iter().find(|c| c.0 == "smos").map(|c| c.1), Some(1));
    assert_eq!(s.writes() - s.smo_writes, 1, "split insert: {s:?}");
    // Two new 1 KB blocks (16 lines each) plus Calloc's log and bitmap and the link word.
    assert!(s.smo_writes >= 2 * 16, "split insert: {s:?}");
    let s = measure(&t, |t| assert!(t.insert(15, 7).unwrap()));
    assert_eq!((s.writes(), s.smo_writes), (1, 0), "plain insert: {s:?}");
    account::set_enabled(false);
}
