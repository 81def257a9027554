//! The shared conformance and crash kit (DESIGN.md §4) on F3-tree with its defaults (NUMA-aware,
//! key-based evaluation), in ADR (shadow power failures) and eADR (process kills). Crashes land
//! while entries are pending in PTFOs and while evaluate threads apply them.
//! (One invocation per file: the eADR kill test re-executes this binary filtered by test name.)

numakv_index::conformance_tests!(
    engine = numakv_f3tree::F3Tree,
    kit = numakv_index::testkit::Kit::new(numakv_f3tree::F3TreeOptions::default()),
    modes = [adr, eadr],
);
