//! The correct toy engine passes the whole kit, in both persistence modes: the kit does not flag
//! a correct engine.

numakv_index::conformance_tests!(
    engine = numakv_index::testkit::toy::Toy,
    kit = numakv_index::testkit::Kit::new(Default::default()),
    modes = [adr, eadr],
);
