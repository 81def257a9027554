//! The conformance and crash kit on the non-NUMA-aware variant (PTFOs interleaved over the
//! nodes, evaluate threads serving any node's lists, one per node) with key-based evaluation
//! and a count threshold high enough that crashes find many entries pending.

use std::time::Duration;

use numakv_f3tree::{Evaluators, F3TreeOptions};

fn opts() -> F3TreeOptions {
    F3TreeOptions {
        numa_aware: false,
        evaluators: Evaluators::Unbound(1),
        fo_entries: 16,
        count_threshold: 200,
        time_threshold: Duration::from_millis(20),
        ..F3TreeOptions::default()
    }
}

numakv_index::conformance_tests!(
    engine = numakv_f3tree::F3Tree,
    kit = numakv_index::testkit::Kit::new(opts()),
    modes = [adr, eadr],
);
