//! The numakv benchmark driver (DESIGN.md §5): workload generators, a NUMA-placing runner with
//! PM access accounting, DRAM reference peers, reports (table, JSON, CSV), SVG plots, the papers'
//! workloads as presets, and scaled-down reproductions of their tables and figures.
//!
//! The `numakv` binary wires this library to `numakv bench` and `numakv repro`; the engines come
//! in as [`Target`]s built through the `numakv` facade ([`engines`]), next to the DRAM
//! [`peers`]; [`engines::available`] lists both.
//!
//! ```
//! use numakv_bench::{peers, presets, run, target, BenchConfig, Progress};
//!
//! let config = BenchConfig {
//!     engines: vec!["rwlock-btreemap".into()],
//!     workload: "nstore-get50upd50".into(),
//!     keys: Some(1_000),
//!     ops: Some(1_000),
//!     threads: vec![1],
//!     ..BenchConfig::default()
//! };
//! let targets = target::resolve(&config.engines, &peers::all()).unwrap();
//! let report = run(&config, &targets, Progress::Hidden).unwrap();
//! println!("{}", report.to_table());
//! assert_eq!(report.runs[0].workload, "nstore-get50upd50");
//! assert!(presets::PRESETS.iter().any(|p| p.name == "ycsb-f"));
//! ```

#![warn(missing_docs)]

pub mod bytes;
pub mod dist;
pub mod engines;
mod error;
pub mod peers;
pub mod plot;
pub mod presets;
pub mod report;
pub mod repro;
mod repro_bytes;
mod repro_f3tree;
pub mod repro_fastfair;
mod repro_nap;
mod repro_nobtree;
pub mod repro_nstore;
pub mod repro_redis;
pub mod runner;
pub mod target;
pub mod workload;

pub use dist::Dist;
pub use error::{BenchError, Result};
pub use report::{Report, RunFailure, RunResult};
pub use runner::{default_scratch, run, run_workloads, write_outputs, BenchConfig, Progress};
pub use target::{Reopen, Target, TargetEnv, TargetInstance};
pub use workload::{KeyOrder, Mix, MixOrder, OpKind, ScanLen, Workload};

pub use numakv_numa::Placement;
pub use numakv_pmem::{LatencyModel, PersistMode};
