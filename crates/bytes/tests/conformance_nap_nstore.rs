//! The byte-key kit (numakv_bytes::testkit) on the byte layer over Nap over NStore, with a Nap
//! that switches NALs all the time (64 hot keys, a 2 ms check) and the small clusters and log
//! files of NStore's own conformance test (the default 8 MiB files fill the kit's pools), in ADR
//! and eADR. One kit per file.

mod common;

numakv_bytes::bytes_conformance_tests!(
    engine = numakv_nap::Nap<numakv_nstore::NStore>,
    opts = numakv_nap::NapOptions {
        inner: numakv_nstore::NStoreOptions {
            clusters: 8,
            log_file_size: 256 << 10,
            gc_interval: std::time::Duration::from_millis(1),
            recovery_threads: 2,
            ..Default::default()
        },
        ..common::churning_options()
    },
    modes = [adr, eadr],
);
