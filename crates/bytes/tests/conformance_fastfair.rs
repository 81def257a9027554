//! The byte-key kit (numakv_bytes::testkit) on the byte layer over FastFair, in ADR (shadow
//! power failures) and eADR (process kills). One kit per file: the eADR kill test re-executes
//! this binary filtered by test name.

numakv_bytes::bytes_conformance_tests!(
    engine = numakv_fastfair::FastFair,
    opts = Default::default(),
    modes = [adr, eadr],
);
