//! The shared conformance and crash kit (DESIGN.md §4) on NBTree with the default 63-slot (1 KB) leaves,
//! in eADR (process kills, the paper's target) and ADR (shadow power failures, one flush per
//! write). (One invocation per file: the eADR kill test re-executes this binary by test name.)

numakv_index::conformance_tests!(
    engine = numakv_nbtree::NbTree,
    kit = numakv_index::testkit::Kit::new(numakv_nbtree::NbTreeOptions::default()),
    modes = [adr, eadr],
);
