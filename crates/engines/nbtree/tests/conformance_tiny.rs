//! The conformance kit on 3-slot leaves: SMOs on almost every insert, so ADR power failures
//! land inside SMOs and recovery must repair every intermediate state without leaking a block.
//!
//! eADR kills on 3-slot leaves are not in this suite yet: about one run in eight of
//! `crash_kill_eadr` with `leaf_slots = 3` fails (a key lost after a kill while an update of it
//! was pending, or a Calloc ring entry freed twice); open item in docs/design.md "NBTree". The
//! default-leaf and coupled suites run the kill oracle.

numakv_index::conformance_tests!(
    engine = numakv_nbtree::NbTree,
    kit = numakv_index::testkit::Kit::new(numakv_nbtree::NbTreeOptions {
        leaf_slots: 3,
        ..Default::default()
    }),
    modes = [adr],
);
