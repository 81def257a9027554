//! The shared conformance and crash kit (DESIGN.md §4) on NStore, in ADR (shadow power failures)
//! and eADR (process kills). Small files and few clusters, so that files fill, get sealed and
//! are reclaimed by GC (which runs every millisecond here) while the kit's operations run.
//! (One invocation per file: the eADR kill test re-executes this binary filtered by test name.)

numakv_index::conformance_tests!(
    engine = numakv_nstore::NStore,
    kit = numakv_index::testkit::Kit::new(numakv_nstore::NStoreOptions {
        clusters: 8,
        log_file_size: 256 << 10,
        gc_interval: std::time::Duration::from_millis(1),
        recovery_threads: 2,
        ..Default::default()
    }),
    modes = [adr, eadr],
);
