//! The byte-key kit (numakv_bytes::testkit) on the byte layer over NStore (the generic layer;
//! its native variable-length path is not used), with the small clusters, files and GC interval
//! of NStore's own conformance test, in ADR and eADR. One kit per file.

numakv_bytes::bytes_conformance_tests!(
    engine = numakv_nstore::NStore,
    opts = numakv_nstore::NStoreOptions {
        clusters: 8,
        log_file_size: 256 << 10,
        gc_interval: std::time::Duration::from_millis(1),
        recovery_threads: 2,
        ..Default::default()
    },
    modes = [adr, eadr],
);
