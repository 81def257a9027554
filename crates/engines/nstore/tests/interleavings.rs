//! Forced schedules and injected failures of NStore's GC (the pause and fail points listed in
//! the crate docs): each test aims at one window and failed before its fix.

mod common;

use numakv_index::{Engine, Index};
use numakv_pmem::failpoint::Scenario;
use numakv_pmem::{CrashOptions, PersistMode, SimMode};

/// A reclaim interrupted after it rewrote a live entry (the next rewrite found no space): the
/// original counts as garbage, so `check()`'s accounting holds now, after a crash and rescan,
/// and after a clean close and a snapshot open; GC then finishes the file.
#[test]
fn an_interrupted_reclaim_leaves_exact_garbage_counts() {
    let o = common::opts();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    let s = common::create(&path, PersistMode::Adr, SimMode::Shadow, &o);
    let model = common::churn(&s, 3_000);
    {
        let sc = Scenario::setup();
        let fail = sc.fail("nstore.gc.rewritten", Some(1));
        let e = s.collect_garbage().expect_err("the injected failure stops the pass");
        assert!(e.is_out_of_space(), "{e}");
        assert_eq!(fail.hits(), 1);
    }
    common::verify(&s, &model, "after an interrupted reclaim");
    // Power failure: the rescan counts the rewritten original as garbage too.
    let pool = s.pool().clone();
    pool.crash(CrashOptions::STRICT).unwrap();
    drop(s);
    drop(pool);
    let (s, _, c) = common::open(&path, SimMode::Shadow, &o);
    assert_eq!(common::counter(&c, "from_snapshot"), 0);
    common::verify(&s, &model, "after a crash and rescan");
    s.close().unwrap();
    let (s, _, c) = common::open(&path, SimMode::Shadow, &o);
    assert_eq!(common::counter(&c, "from_snapshot"), 1, "{c:?}");
    common::verify(&s, &model, "after a snapshot open");
    assert!(s.collect_garbage().unwrap() > 0);
    common::verify(&s, &model, "after GC finished");
}
