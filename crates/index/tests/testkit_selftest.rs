//! The test kit catches engines with planted bugs: each bug of the toy engine is reported by the
//! oracle meant for it (and the violation message names the rule).

use numakv_index::testkit::toy::{Bug, Toy, ToyOptions};
use numakv_index::testkit::Kit;
use numakv_pmem::PersistMode;

fn kit(bug: Bug) -> Kit<Toy> {
    Kit::new(ToyOptions { bug, ..ToyOptions::default() })
}

#[test]
fn missing_flush_is_caught_by_adr_crashes() {
    let v = kit(Bug::MissingFlush).crash_shadow().expect_err("a missing flush must be caught");
    assert!(v.0.contains("acknowledged"), "unexpected report: {v}");
}

#[test]
fn resurrected_delete_is_caught_by_reopen_and_crashes() {
    let v = kit(Bug::ResurrectedDelete)
        .differential(PersistMode::Adr)
        .expect_err("a resurrected delete must be caught by the differential reopen");
    assert!(v.0.contains("after reopen"), "unexpected report: {v}");
    kit(Bug::ResurrectedDelete).crash_shadow().expect_err("and by the crash oracle");
}

#[test]
fn duplicated_scan_key_is_caught() {
    kit(Bug::DuplicateScanKey).scans().expect_err("a duplicated scan key must be caught");
    let v = kit(Bug::DuplicateScanKey)
        .concurrent_disjoint()
        .expect_err("and by the concurrent scan shape check");
    assert!(v.0.contains("out of order or duplicated"), "unexpected report: {v}");
}

#[test]
fn lost_acknowledged_insert_is_caught() {
    kit(Bug::LostAckedInsert)
        .crash_shadow()
        .expect_err("a lost acknowledged insert must be caught");
    kit(Bug::LostAckedInsert)
        .differential(PersistMode::Eadr)
        .expect_err("and by the differential reopen");
}

#[test]
fn lost_acknowledged_insert_is_caught_by_eadr_kill() {
    let v = kit(Bug::LostAckedInsert)
        .crash_kill("lost_acknowledged_insert_is_caught_by_eadr_kill")
        .expect_err("an eADR kill must expose a DRAM-only insert");
    assert!(v.0.contains("recovered"), "unexpected report: {v}");
}
