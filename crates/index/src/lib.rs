//! The contract every numakv engine implements, and the test kit that holds them to it.
//!
//! - [`Index`]: the operations (insert, upsert, update, get, remove, scan, stats, check) on `u64`
//!   keys and values, per DESIGN.md §2: keys `1..=u64::MAX-1`, any value.
//! - [`Engine`]: create on a pool, open with recovery, clean close.
//! - [`Error`]: typed errors layered over the substrate's [`numakv_pmem::PoolError`].
//! - `testkit` (feature `testkit`): differential, concurrent, scan, crash (ADR shadow and eADR
//!   kill), leak and bad-input checks, one call per engine (DESIGN.md §4).

mod api;
mod error;
#[cfg(feature = "testkit")]
pub mod testkit;

pub use api::{
    check_fresh_pool, check_key, check_pool_engine, hosts_engine, wait_for_background, Backlog,
    CheckReport, Engine, EngineStats, Index, RecoveryReport, MAX_KEY, MIN_KEY,
};
pub use error::{Error, Result};
pub use numakv_pmem as pmem;
