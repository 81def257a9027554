//! Options shared by the test files.
#![allow(dead_code)] // each test binary uses a part

use std::time::Duration;

use numakv_nap::NapOptions;

/// A Nap that switches all the time, as in Nap's own conformance tests: 64 hot keys, every
/// operation sampled, a 2 ms check, no uniform detection, no noise filter.
pub fn churning_options<O: Default>() -> NapOptions<O> {
    NapOptions {
        hot: 64,
        sample: 1,
        check_period: Duration::from_millis(2),
        sketch_width: 4096,
        record_buffer: 4096,
        detect_uniform: false,
        min_count: 1,
        ..NapOptions::default()
    }
}
