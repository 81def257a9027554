//! The conformance kit on NBTree-W (leaf write locks, SMOs under the initiator's lock) with tiny
//! leaves, so that writers constantly wait for SMOs instead of helping them, eADR and ADR.
//! NBTree-WR shares W's write path and adds read locks; the SMO stress test covers it too.

numakv_index::conformance_tests!(
    engine = numakv_nbtree::NbTree,
    kit = numakv_index::testkit::Kit::new(numakv_nbtree::NbTreeOptions {
        variant: numakv_nbtree::Variant::W,
        leaf_slots: 3,
        ..Default::default()
    }),
    modes = [adr, eadr],
);
