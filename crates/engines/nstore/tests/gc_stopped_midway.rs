//! A GC reclaim that stops after moving some live entries (OutOfSpace reserving the next copy;
//! forced here by the failure point `nstore.gc.rewritten`) leaves its file in place: the moved
//! entries must count as garbage there, or `check()` finds "garbage + live != reserved" (it did,
//! before the fix; found by the byte layer's out-of-space test under load). A later pass then
//! reclaims the file, and nothing is lost.

mod common;

use numakv_index::Index;
use numakv_pmem::failpoint::Scenario;
use numakv_pmem::{PersistMode, SimMode};

#[test]
fn a_reclaim_stopped_midway_keeps_the_accounting() {
    let o = common::opts();
    let dir = tempfile::tempdir().unwrap();
    let s = common::create(dir.path(), PersistMode::Adr, SimMode::Direct, &o);
    let model = common::churn(&s, 2_000);
    let sc = Scenario::setup();
    let point = sc.fail("nstore.gc.rewritten", Some(1));
    // The armed point stops the first reclaim; the pass goes on with the other files.
    s.collect_garbage().expect("the pass goes on after the stopped reclaim");
    assert!(point.hits() > 1, "the pass rewrote more after the failure");
    assert_eq!(s.stats().counter("gc_errors"), Some(1));
    drop(point);
    common::verify(&s, &model, "after a reclaim stopped midway");
    assert!(s.collect_garbage().unwrap() > 0, "a later pass reclaims the files");
    common::verify(&s, &model, "after the next pass");
}
