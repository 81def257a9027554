//! The conformance and crash test kit every engine runs (DESIGN.md §4).
//!
//! One [`Kit`] per engine, one call per oracle:
//!
//! | call | oracle |
//! |------|--------|
//! | [`Kit::differential`] | random single-threaded sequences against `BTreeMap` (proptest), with clean and unclean reopens |
//! | [`Kit::sequential`] | one long seeded sequence over a large key space (splits, merges, reuse) |
//! | [`Kit::scans`] | ascending, no duplicates, bounds, agreement with point gets |
//! | [`Kit::concurrent_disjoint`] | threads on disjoint keys: every result exact, scans consistent |
//! | [`Kit::concurrent_shared`] | threads on shared keys: every result explained by a per-key linearization |
//! | [`Kit::crash_shadow`] | ADR power failures at random fences, random eviction, crashes during recovery |
//! | [`Kit::crash_kill`] | eADR: a child process SIGKILLed at random moments, crashes during recovery |
//! | [`Kit::bad_input`] | reserved keys, another engine's store, pool exhaustion |
//! | [`Kit::step_crash`] | an engine's protocol scenario crashed at every fence (ADR) / PM store (eADR), checked for durable linearizability on shared keys ([`steps`]) |
//!
//! Chaos schedules ([`chaos_on`], `NUMAKV_CHAOS`) run any oracle with preemptions on the PM
//! steps; [`Kit::gates`] makes the randomized oracles fail when they never reached the
//! mechanism the engine's kit names.
//!
//! Every crash oracle also checks `check()` and the leak invariant (reachable PM blocks equal
//! allocated blocks right after recovery). Each call returns a [`Violation`] describing the first
//! broken rule; [`conformance_tests!`](crate::conformance_tests) turns the calls into `#[test]`s.
//!
//! [`scenario`] holds the building blocks of an engine's own hand-written scenario tests (a
//! random op, a model, a recovered store checked against it, a crash round's steps).
//!
//! Sizes scale with `NUMAKV_TEST_SCALE` ([`numakv_pmem::crash::test_scale`]): 1 (the default)
//! keeps each call to a few seconds on 2 cores.

mod bad_input;
mod concurrent;
mod crash;
mod differential;
pub mod linearize;
mod model;
mod scans;
pub mod scenario;
pub mod steps;
pub mod toy;

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use numakv_pmem::{OpenConfig, PersistMode, Pool, PoolConfig, SimMode};

use crate::api::Engine;

pub use numakv_pmem::crash::test_scale;

/// A broken rule: what was expected, what happened, and enough context (seed, round, key) to
/// replay it.
#[derive(Clone, PartialEq, Eq)]
pub struct Violation(pub String);

impl fmt::Debug for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Debug is what `unwrap()` prints: show the message as is, newlines included.
        f.write_str(&self.0)
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Violation {}

/// Result of a test-kit oracle.
pub type Verdict<T = ()> = Result<T, Violation>;

/// Returns a [`Violation`] from the enclosing function when `cond` is false.
macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err($crate::testkit::Violation(format!($($fmt)+)));
        }
    };
}
pub(crate) use ensure;

/// Converts an engine error into a violation with context.
pub(crate) fn fail<T>(what: impl fmt::Display, e: impl fmt::Display) -> Verdict<T> {
    Err(Violation(format!("{what}: unexpected error: {e}")))
}

/// How the kit drives one engine.
#[derive(Clone, Debug)]
pub struct Kit<E: Engine> {
    /// Engine options used for every store the kit creates.
    pub opts: E::Options,
    /// NUMA nodes of the kit's pools (emulated on a one-node machine); threads are spread over
    /// them so per-node placement is exercised.
    pub nodes: usize,
    /// Capacity per node of the kit's pools (sparse files).
    pub capacity_per_node: u64,
    /// Page size of the kit's pools ([`numakv_pmem::DEFAULT_PAGE_SIZE`] by default); small
    /// pages make engines that size their files or extents by pages (NStore's logs) seal and
    /// collect them within a small run.
    pub page_size: u64,
    /// Capacity per node of the deliberately small pool of the out-of-space check.
    pub small_capacity_per_node: u64,
    /// Size factor ([`test_scale`] by default).
    pub scale: usize,
    /// Whether, in ADR shadow crashes, a value returned by a read on another thread must
    /// survive even if the write that produced it had not returned (durable linearizability of
    /// reads). eADR kill tests always demand it: there a visible store is a durable store.
    pub durable_reads_adr: bool,
    /// Coverage gates: engine counters ([`crate::EngineStats::counters`]) that the randomized
    /// oracles ([`Kit::concurrent_shared`], [`Kit::crash_shadow`])
    /// must see raised — the mechanisms the engine's kit claims those oracles exercise. A run
    /// that raised none of one fails naming it. Empty by default.
    pub gates: Vec<&'static str>,
}

impl<E: Engine> Kit<E> {
    /// A kit with the defaults: 2 nodes of 256 MiB (sparse), 8 MiB for the out-of-space pool,
    /// scale from `NUMAKV_TEST_SCALE`.
    pub fn new(opts: E::Options) -> Kit<E> {
        Kit {
            opts,
            nodes: 2,
            capacity_per_node: 256 << 20,
            page_size: numakv_pmem::DEFAULT_PAGE_SIZE,
            small_capacity_per_node: 8 << 20,
            scale: test_scale(),
            durable_reads_adr: false,
            gates: Vec::new(),
        }
    }

    /// The coverage gate of `oracle`: prints each gate's count in `stats` and fails naming the
    /// gates that stayed at zero.
    pub fn check_gates(&self, oracle: &str, stats: &[crate::EngineStats]) -> Verdict {
        if self.gates.is_empty() {
            return Ok(());
        }
        let count = |g: &str| stats.iter().map(|s| s.counter(g).unwrap_or(0)).sum::<u64>();
        let seen: Vec<(&str, u64)> = self.gates.iter().map(|&g| (g, count(g))).collect();
        eprintln!("{oracle}: coverage {seen:?}{}", numakv_pmem::chaos::note());
        let missed: Vec<&str> = seen.iter().filter(|g| g.1 == 0).map(|g| g.0).collect();
        ensure!(
            missed.is_empty(),
            "{oracle}: coverage gate: the run reached none of {missed:?} (seen {seen:?})"
        );
        Ok(())
    }

    /// A pool configuration for this kit.
    pub(crate) fn pool_config(&self, mode: PersistMode, sim: SimMode) -> PoolConfig {
        let mut cfg = PoolConfig::new(E::engine_id(), self.capacity_per_node);
        cfg.nodes = self.nodes;
        cfg.page_size = self.page_size;
        cfg.mode = mode;
        cfg.sim = sim;
        cfg
    }

    /// Creates a store in `dir` and the engine on it.
    pub(crate) fn create_in(&self, dir: &Path, mode: PersistMode, sim: SimMode) -> Verdict<E> {
        let pool = match Pool::create(dir, self.pool_config(mode, sim)) {
            Ok(p) => p,
            Err(e) => return fail("creating the pool", e),
        };
        E::create(pool, &self.opts).or_else(|e| fail(format!("{}::create", E::NAME), e))
    }

    /// Opens the store in `dir` (recovering it).
    pub(crate) fn open_in(&self, dir: &Path, sim: SimMode) -> Verdict<E> {
        let pool = open_pool::<E>(dir, sim)?;
        match E::open(pool, &self.opts) {
            Ok((e, _)) => Ok(e),
            Err(e) => fail(format!("{}::open", E::NAME), e),
        }
    }
}

pub(crate) fn open_pool<E: Engine>(dir: &Path, sim: SimMode) -> Verdict<Arc<Pool>> {
    let mut oc = OpenConfig::new(E::engine_id());
    oc.sim = sim;
    Pool::open(dir, oc).or_else(|e| fail("opening the pool", e))
}

/// A scratch directory for stores, in `/dev/shm` when it exists (memory-backed, like PM).
pub(crate) fn scratch() -> Verdict<tempfile::TempDir> {
    let shm = Path::new("/dev/shm");
    let dir = if shm.is_dir() {
        tempfile::Builder::new().prefix("numakv-kit-").tempdir_in(shm)
    } else {
        tempfile::Builder::new().prefix("numakv-kit-").tempdir()
    };
    dir.or_else(|e| fail("creating a scratch directory", e))
}

/// A seed for randomised oracles: `NUMAKV_TEST_SEED` when set (to replay a failure), else
/// random; every violation message includes it.
pub fn seed() -> u64 {
    std::env::var("NUMAKV_TEST_SEED")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(rand::random)
}

/// Turns chaos schedules on for this test process ([`numakv_pmem::chaos`]): with the seed in
/// `NUMAKV_CHAOS` when set, else with `default_seed` (CI's fixed budget run). Returns the seed
/// (printed; a failing oracle's message carries it too).
pub fn chaos_on(default_seed: u64) -> u64 {
    numakv_pmem::chaos::init_from_env();
    match numakv_pmem::chaos::seed() {
        Some(s) => s,
        None => {
            eprintln!(
                "chaos: {}={default_seed} (the kit's default)",
                numakv_pmem::chaos::CHAOS_ENV
            );
            numakv_pmem::chaos::enable(default_seed);
            default_seed
        }
    }
}

/// Generates the conformance tests of an engine: one `#[test]` per oracle.
///
/// ```no_run
/// // tests/conformance.rs of an engine crate (here the test kit's own toy engine):
/// numakv_index::conformance_tests!(
///     engine = numakv_index::testkit::toy::Toy,
///     kit = numakv_index::testkit::Kit::new(Default::default()),
///     modes = [adr, eadr],
/// );
/// # fn main() {}
/// ```
///
/// Put it alone in a test file (e.g. `tests/conformance.rs`): the eADR kill test re-executes the
/// test binary and finds itself by name (`crash_kill_eadr`).
#[macro_export]
macro_rules! conformance_tests {
    (engine = $engine:ty, kit = $kit:expr, modes = [$($mode:ident),+ $(,)?] $(,)?) => {
        fn __kit() -> $crate::testkit::Kit<$engine> {
            $kit
        }

        #[test]
        fn differential() {
            $( __kit().differential($crate::conformance_tests!(@mode $mode)).unwrap(); )+
        }

        #[test]
        fn sequential() {
            $( __kit().sequential($crate::conformance_tests!(@mode $mode)).unwrap(); )+
        }

        #[test]
        fn scans() {
            __kit().scans().unwrap();
        }

        #[test]
        fn concurrent_disjoint() {
            __kit().concurrent_disjoint().unwrap();
        }

        #[test]
        fn concurrent_shared() {
            __kit().concurrent_shared().unwrap();
        }

        #[test]
        fn bad_input() {
            __kit().bad_input().unwrap();
        }

        $( $crate::conformance_tests!(@crash $mode); )+
    };
    (@mode adr) => { $crate::pmem::PersistMode::Adr };
    (@mode eadr) => { $crate::pmem::PersistMode::Eadr };
    (@crash adr) => {
        #[test]
        fn crash_shadow_adr() {
            __kit().crash_shadow().unwrap();
        }
    };
    (@crash eadr) => {
        #[test]
        fn crash_kill_eadr() {
            __kit().crash_kill("crash_kill_eadr").unwrap();
        }
    };
}
