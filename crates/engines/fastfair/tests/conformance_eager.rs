//! The shared conformance and crash kit (DESIGN.md §4) on FAST&FAIR with eager recovery (the
//! whole tree walked, collected, repaired and its orphans linked before `open()` returns), in ADR
//! (shadow power failures) and eADR (process kills). The other conformance files use the default,
//! lazy recovery.
//! (One invocation per file: the eADR kill test re-executes this binary filtered by test name.)

numakv_index::conformance_tests!(
    engine = numakv_fastfair::FastFair,
    kit = numakv_index::testkit::Kit::new(numakv_fastfair::FastFairOptions {
        recovery: numakv_fastfair::RecoveryMode::Eager,
        ..Default::default()
    }),
    modes = [adr, eadr],
);
