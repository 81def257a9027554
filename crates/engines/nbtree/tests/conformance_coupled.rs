//! The conformance kit on the coupled-leaf variant (metadata line in PM), eADR and ADR.

numakv_index::conformance_tests!(
    engine = numakv_nbtree::NbTree,
    kit = numakv_index::testkit::Kit::new(numakv_nbtree::NbTreeOptions {
        coupled: true,
        ..Default::default()
    }),
    modes = [adr, eadr],
);
