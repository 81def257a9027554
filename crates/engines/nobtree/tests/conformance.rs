//! The shared conformance and crash kit (DESIGN.md §4) on NOBtree with the paper's defaults
//! (height threshold 2, round-robin placement over 2 emulated nodes, migration on), in ADR
//! (shadow power failures) and eADR (process kills).
//! (One invocation per file: the eADR kill test re-executes this binary filtered by test name.)

numakv_index::conformance_tests!(
    engine = numakv_nobtree::Nobtree,
    kit = numakv_index::testkit::Kit::new(numakv_nobtree::NobtreeOptions::default()),
    modes = [adr, eadr],
);
