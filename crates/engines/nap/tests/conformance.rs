//! The shared conformance and crash kit (DESIGN.md §4) on Nap over FAST&FAIR, in ADR (shadow power
//! failures) and eADR (process kills), with a tiny hot set and a 2 ms check period so that the
//! switch thread switches NALs all through the tests — and crashes land in every phase.
//! (One invocation per file: the eADR kill test re-executes this binary filtered by test name.)

mod common;

numakv_index::conformance_tests!(
    engine = numakv_nap::Nap<numakv_fastfair::FastFair>,
    kit = numakv_index::testkit::Kit::new(common::churning_options()),
    modes = [adr, eadr],
);
