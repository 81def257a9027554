//! The shared conformance and crash kit (DESIGN.md §4) on Nap over NBTree, in ADR (shadow power
//! failures) and eADR (process kills, NBTree's target mode), with the moving options of
//! `common` (an 8-key hot set, a 1 ms check, decisions from 8 samples) so that NALs are replaced
//! all through the tests and crashes land in every phase. Unlike Nap<FastFair>, `bad_input` runs with the switch
//! thread too: NBTree has no out-of-space state that its `check()` reports.
//! (One kit per file: the eADR kill test re-executes this binary filtered by test name.)

mod common;

use numakv_nap::Nap;
use numakv_nbtree::NbTree;

numakv_index::conformance_tests! {
    engine = Nap<NbTree>,
    kit = numakv_index::testkit::Kit::new(common::moving_options()),
    modes = [adr, eadr],
}
