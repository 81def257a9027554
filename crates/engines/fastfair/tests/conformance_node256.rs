//! The shared conformance and crash kit with 256-byte nodes: splits, root splits and merges in
//! nearly every crash window.

numakv_index::conformance_tests!(
    engine = numakv_fastfair::FastFair,
    kit = numakv_index::testkit::Kit::new(numakv_fastfair::FastFairOptions {
        node_size: 256,
        ..Default::default()
    }),
    modes = [adr, eadr],
);
