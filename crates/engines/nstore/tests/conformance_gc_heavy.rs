//! The conformance and crash kit on NStore with GC reclaiming constantly: the smallest files,
//! few clusters and a low garbage threshold, so that background reclaims overlap every phase of
//! the kit, `check()` included (which must exclude them: docs/design.md "NStore", GC), at the
//! default test scale. (One invocation per file, as in `conformance.rs`.)

numakv_index::conformance_tests!(
    engine = numakv_nstore::NStore,
    kit = numakv_index::testkit::Kit::new(numakv_nstore::NStoreOptions {
        clusters: 2,
        log_file_size: 64 << 10,
        gc_threshold: 0.1,
        gc_interval: std::time::Duration::from_millis(1),
        recovery_threads: 2,
        ..Default::default()
    }),
    modes = [adr, eadr],
);
