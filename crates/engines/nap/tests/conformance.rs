//! The shared conformance and crash kit (DESIGN.md §4) on Nap over FAST&FAIR, in ADR (shadow power
//! failures) and eADR (process kills), with a tiny hot set and a 2 ms check period so that the
//! switch thread switches NALs all through the tests — and crashes land in every phase.
//! (One kit per file: the eADR kill test re-executes this binary filtered by test name.)
//!
//! `bad_input` runs with the switch thread too: NAL pages move the moment the small pool runs
//! out, and FAST&FAIR refuses a split it cannot finish (it reserves the cascade's nodes first),
//! so running out of space leaves nothing for `check()` to report.

mod common;

use numakv_fastfair::FastFair;
use numakv_nap::Nap;

numakv_index::conformance_tests! {
    engine = Nap<FastFair>,
    kit = numakv_index::testkit::Kit::new(common::churning_options()),
    modes = [adr, eadr],
}
