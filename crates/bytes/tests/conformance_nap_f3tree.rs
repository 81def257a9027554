//! The byte-key kit (numakv_bytes::testkit) on the byte layer over Nap over F3Tree, with a Nap that
//! switches NALs all the time (64 hot keys, a 2 ms check), in ADR and eADR. One kit per file.

mod common;

numakv_bytes::bytes_conformance_tests!(
    engine = numakv_nap::Nap<numakv_f3tree::F3Tree>,
    opts = common::churning_options(),
    modes = [adr, eadr],
);
