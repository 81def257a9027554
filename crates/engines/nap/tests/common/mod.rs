//! Options shared by the integration tests, for Nap over any raw engine.
#![allow(dead_code)] // each test binary uses a part

use std::time::Duration;

use numakv_nap::NapOptions;

/// A Nap that switches all the time: 64 hot keys, every operation sampled, a 2 ms check, no
/// uniform detection (the kit's keys are uniform), no noise filter.
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

/// A Nap whose switches happen only through `switch_to`.
pub fn manual_options<O: Default>() -> NapOptions<O> {
    NapOptions { background: false, sketch_width: 1024, record_buffer: 64, ..NapOptions::default() }
}
