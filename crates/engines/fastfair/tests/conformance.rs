//! The shared conformance and crash kit (DESIGN.md §4) on FAST&FAIR with the default 512-byte
//! nodes, in ADR (shadow power failures) and eADR (process kills).
//! (One invocation per file: the eADR kill test re-executes this binary filtered by test name.)

numakv_index::conformance_tests!(
    engine = numakv_fastfair::FastFair,
    kit = numakv_index::testkit::Kit::new(numakv_fastfair::FastFairOptions::default()),
    modes = [adr, eadr],
);
