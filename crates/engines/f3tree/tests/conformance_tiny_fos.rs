//! The conformance and crash kit with tiny FOs (4 entries), an FO limit of 2 and evaluation
//! thresholds that let PTFOs fill up: producers link FOs and wait at the limit all the time,
//! so crashes land with full PTFOs, between an FO's allocation and its link, during unlinks
//! and while evaluate threads apply entries (node-batched evaluation).

use std::time::Duration;

use numakv_f3tree::{Evaluation, F3TreeOptions};

fn opts() -> F3TreeOptions {
    F3TreeOptions {
        fo_entries: 4,
        fo_limit: Some(2),
        count_threshold: 6,
        time_threshold: Duration::from_millis(3),
        evaluation: Evaluation::NodeBatched { batch: 5 },
        ..F3TreeOptions::default()
    }
}

numakv_index::conformance_tests!(
    engine = numakv_f3tree::F3Tree,
    kit = numakv_index::testkit::Kit::new(opts()),
    modes = [adr, eadr],
);
