//! The conformance kit on 3-slot leaves: SMOs on almost every insert, so crashes (eADR kills,
//! ADR power failures) land inside SMOs and recovery must repair every intermediate state
//! without leaking a block.

numakv_index::conformance_tests!(
    engine = numakv_nbtree::NbTree,
    kit = numakv_index::testkit::Kit::new(numakv_nbtree::NbTreeOptions {
        leaf_slots: 3,
        ..Default::default()
    }),
    modes = [adr, eadr],
);
