//! The persistent-memory substrate of numakv.
//!
//! - [`Pool`]: a store's persistent memory, one file per NUMA node (or anonymous memory), with a
//!   validated, checksummed header, engine root slots and a clean-shutdown flag.
//! - [`PPtr`]: position-independent persistent pointers (node | offset).
//! - Persistence: [`PersistMode`] ADR / eADR, [`Pool::flush`] / [`Pool::fence`] /
//!   [`Pool::persist`] with the flush instruction chosen by CPUID.
//! - Crash simulation: ADR shadow mode ([`SimMode::Shadow`], [`Pool::crash`]) and an eADR
//!   process-kill harness ([`crash`]).
//! - [`account`]: PM lines read/written per operation, local vs remote, flushes and fences,
//!   and latency emulation ([`LatencyModel`]); a runtime switch, compiled out entirely without the
//!   `accounting` cargo feature (on by default; [`account::COMPILED`]).
//! - [`access`]: the accessor types PM structures are built from.
//! - `failpoint` (feature `failpoints`): named pause and failure points that tests use to force
//!   an interleaving ([`pause_point!`], [`fail_point!`]; no-ops without the feature).
//! - [`chaos`]: chaos schedules (`NUMAKV_CHAOS=<seed>`): every PM access, flush, fence and pause
//!   point a possible preemption, replayable by seed; [`steps`]: PM stores as crash points.
//! - [`heap`] and [`alloc`]: the page heap, NSM, Calloc, a naive bump allocator, and epoch-based
//!   reclamation.
//!
//! Formats and invariants are specified in `docs/design.md`.

pub mod access;
pub mod account;
pub mod alloc;
pub mod cachemodel;
pub mod chaos;
pub mod crash;
mod error;
#[cfg(feature = "failpoints")]
pub mod failpoint;

/// Without the `failpoints` feature a pause point is nothing (the module `failpoint`, which
/// defines the live version, is not compiled).
#[cfg(not(feature = "failpoints"))]
#[macro_export]
macro_rules! pause_point {
    ($name:literal) => {{}};
}

/// Without the `failpoints` feature a failure point never fires.
#[cfg(not(feature = "failpoints"))]
#[macro_export]
macro_rules! fail_point {
    ($name:literal) => {
        false
    };
}
pub mod heap;
pub mod layout;
mod map;
pub mod persist;
mod pool;
mod pptr;
pub mod shadow;
pub mod steps;

pub use access::{PmBytes, PmType, PmU16, PmU32, PmU64, PmU8};
pub use account::{AccessStats, LatencyModel};
pub use error::{PoolError, Result};
pub use layout::{EngineId, Header, ROOT_SLOTS};
pub use map::MapKind;
pub use numakv_numa as numa;
pub use persist::{PersistMode, LINE};
pub use pool::{node_path, OpenConfig, Pool, PoolConfig, SimMode, DEFAULT_PAGE_SIZE, LOCK_FILE};
pub use pptr::PPtr;
pub use shadow::{CrashOptions, CrashReport};

/// Over every pool open in this process: bytes of working memory backed by transparent huge
/// pages now, and resident bytes (`/proc/self/smaps`); `None` where that cannot be read. Pools
/// ask for huge pages (`MADV_HUGEPAGE`) when mapped; this says what the kernel granted, for the
/// benchmark's report.
pub fn huge_pages_in_pools() -> Option<(u64, u64)> {
    account::registered_regions().into_iter().try_fold((0, 0), |(h, r), (start, len)| {
        let (rh, rr) = map::huge_page_bytes(start, len)?;
        Some((h + rh, r + rr))
    })
}
