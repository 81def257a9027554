//! The shared conformance and crash kit (DESIGN.md §4) on Nap over FAST&FAIR, in ADR (shadow power
//! failures) and eADR (process kills), with a hot set of 8 keys — a fraction of every oracle's
//! key space, so that it moves — a 1 ms check period and decisions from 8 samples, so that the
//! switch thread replaces NALs all through the tests — and crashes land in every phase. (With
//! 64 hot keys over the shared-key oracle's 48, one NAL over all of them was installed and
//! never replaced: issue 36.)
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
    kit = numakv_index::testkit::Kit::new(common::moving_options()),
    modes = [adr, eadr],
}
