//! The shared conformance and crash kit (DESIGN.md §4) on Nap over FAST&FAIR, in ADR (shadow power
//! failures) and eADR (process kills), with a tiny hot set and a 2 ms check period so that the
//! switch thread switches NALs all through the tests — and crashes land in every phase.
//! (One kit per file: the eADR kill test re-executes this binary filtered by test name.)
//!
//! The tests are spelled out instead of `conformance_tests!` for one reason: `bad_input` runs
//! without the switch thread. With it, NAL pages move the moment the small pool runs out, and
//! FAST&FAIR can then hit OutOfSpace inside an internal split, after which its strict `check()`
//! reports the leaf orphaned by the lost separator ("children: level 0 chain … differs from its
//! parents' children") — a FAST&FAIR out-of-space issue, reported, not Nap's.

mod common;

use numakv_fastfair::FastFair;
use numakv_index::pmem::PersistMode;
use numakv_index::testkit::Kit;
use numakv_nap::Nap;

fn kit() -> Kit<Nap<FastFair>> {
    Kit::new(common::churning_options())
}

#[test]
fn differential() {
    kit().differential(PersistMode::Adr).unwrap();
    kit().differential(PersistMode::Eadr).unwrap();
}

#[test]
fn sequential() {
    kit().sequential(PersistMode::Adr).unwrap();
    kit().sequential(PersistMode::Eadr).unwrap();
}

#[test]
fn scans() {
    kit().scans().unwrap();
}

#[test]
fn concurrent_disjoint() {
    kit().concurrent_disjoint().unwrap();
}

#[test]
fn concurrent_shared() {
    kit().concurrent_shared().unwrap();
}

#[test]
fn bad_input() {
    Kit::<Nap<FastFair>>::new(common::manual_options()).bad_input().unwrap();
}

#[test]
fn crash_shadow_adr() {
    kit().crash_shadow().unwrap();
}

#[test]
fn crash_kill_eadr() {
    kit().crash_kill("crash_kill_eadr").unwrap();
}
