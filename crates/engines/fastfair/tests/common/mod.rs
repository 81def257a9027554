//! Helpers shared by the scenario files.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use numakv_fastfair::{FastFair, FastFairOptions, RecoveryMode};
use numakv_index::Engine;
use numakv_pmem::{CrashOptions, OpenConfig, PersistMode, Pool, PoolConfig, SimMode};

pub const CAP: u64 = 16 << 20;

pub fn opts(node_size: usize) -> FastFairOptions {
    FastFairOptions { node_size, ..Default::default() }
}

pub fn pool_cfg(mode: PersistMode, sim: SimMode) -> PoolConfig {
    let mut c = PoolConfig::new(FastFair::engine_id(), CAP);
    c.mode = mode;
    c.sim = sim;
    c
}

/// A volatile ADR pool (no files).
pub fn volatile(node_size: usize) -> FastFair {
    let pool = Pool::volatile(pool_cfg(PersistMode::Adr, SimMode::Direct)).unwrap();
    FastFair::create(pool, &opts(node_size)).unwrap()
}

/// A store in `dir`.
pub fn create(dir: &Path, mode: PersistMode, sim: SimMode, node_size: usize) -> FastFair {
    let pool = Pool::create(dir, pool_cfg(mode, sim)).unwrap();
    FastFair::create(pool, &opts(node_size)).unwrap()
}

/// A store in `dir` of `capacity` bytes (small ones are cheap to copy and to close).
pub fn create_small(dir: &Path, sim: SimMode, node_size: usize, capacity: u64) -> FastFair {
    let mut cfg = pool_cfg(PersistMode::Adr, sim);
    cfg.capacity_per_node = capacity;
    let pool = Pool::create(dir, cfg).unwrap();
    FastFair::create(pool, &opts(node_size)).unwrap()
}

/// Reopens the store in `dir` (recovery included, lazy: the default).
pub fn reopen(dir: &Path, sim: SimMode) -> (FastFair, numakv_index::RecoveryReport) {
    reopen_with(dir, sim, RecoveryMode::default())
}

/// Reopens the store in `dir` with the given recovery mode.
pub fn reopen_with(
    dir: &Path,
    sim: SimMode,
    recovery: RecoveryMode,
) -> (FastFair, numakv_index::RecoveryReport) {
    let mut c = OpenConfig::new(FastFair::engine_id());
    c.sim = sim;
    let pool: Arc<Pool> = Pool::open(dir, c).unwrap();
    FastFair::open(pool, &FastFairOptions { recovery, ..Default::default() }).unwrap()
}

/// The recovery report of a reopen, with a lazy open's background counters (waited for).
pub fn full_report(
    t: &FastFair,
    open: numakv_index::RecoveryReport,
) -> numakv_index::RecoveryReport {
    match t.wait_recovery().unwrap() {
        Some(mut bg) => {
            bg.was_clean = open.was_clean;
            bg.counters.extend(open.counters); // ("deferred", 1)
            bg
        }
        None => open,
    }
}

// The engine-independent scenario helpers (op, model, checks of a recovered tree).
pub use numakv_index::testkit::scenario::*;

/// One crash round in shadow mode: a fresh store with node size `ns`, `pre` applied, then a
/// crash armed to fire during the `fence`-th fence while `ops` run. Returns `None` when the ops
/// finished before the crash fired (no more crash points). On crash: reopen, verify, run a few more ops, verify again.
pub fn crash_round(
    mode: PersistMode,
    ns: usize,
    pre: &[Op],
    ops: &[Op],
    fence: u64,
    copts: CrashOptions,
) -> Option<numakv_index::RecoveryReport> {
    crash_round_with(mode, ns, pre, ops, fence, copts, RecoveryMode::default())
}

/// [`crash_round`] with the given recovery mode. A lazy round reads the whole tree while the
/// background recovery runs, before `check()` waits for it.
pub fn crash_round_with(
    mode: PersistMode,
    ns: usize,
    pre: &[Op],
    ops: &[Op],
    fence: u64,
    copts: CrashOptions,
    recovery: RecoveryMode,
) -> Option<numakv_index::RecoveryReport> {
    let d = tempfile::tempdir().unwrap();
    let t = create(d.path(), mode, SimMode::Shadow, ns);
    let mut model = BTreeMap::new();
    apply_all(&t, &mut model, pre.iter().copied());
    let pool = Arc::clone(numakv_index::Engine::pool(&t));
    let pending = Some(run_to_crash(&t, &pool, fence, copts, &mut model, ops.iter().copied())?);
    drop(t);
    drop(pool);
    let (t, rep) = reopen_with(d.path(), SimMode::Shadow, recovery);
    assert!(!rep.was_clean);
    check_contents(&t, &model, pending);
    let rep = full_report(&t, rep);
    verify_recovered(&t, &model, pending);
    keep_working(&t, fence * 7 + 1, 200, 2000, 5);
    Some(rep)
}

/// Scrambled key number `i` in `1..=space`-ish (spreads splits over the whole tree).
pub fn scrambled(i: u64) -> u64 {
    1 + i.wrapping_mul(0x9e37_79b9_7f4a_7c15) % 1_000_000_007
}

/// A store in `dir` (ADR, shadow) that crashed in the middle of a mixed workload after
/// `keys` inserts and a wave of removes (merges: retired nodes), so that it holds garbage
/// blocks and, often, interrupted shifts, splits or merges. Returns the acknowledged contents
/// and the operation the crash interrupted (`None` if it fell between operations).
pub fn crashed_store(
    dir: &Path,
    ns: usize,
    seed: u64,
    keys: u64,
) -> (BTreeMap<u64, u64>, Option<Op>) {
    let t = create(dir, PersistMode::Adr, SimMode::Shadow, ns);
    let mut rng = Rng(seed | 1);
    let mut model = BTreeMap::new();
    apply_all(&t, &mut model, (0..keys).map(|i| Op::Insert(scrambled(i), rng.next())));
    let removes = (0..keys).filter(|_| rng.below(3) > 0).map(|i| Op::Remove(scrambled(i)));
    apply_all(&t, &mut model, removes);
    let pool = Arc::clone(numakv_index::Engine::pool(&t));
    let fence = 1 + rng.below(3_000);
    let ops = std::iter::from_fn(|| Some(random_op(&mut rng, keys * 2, 5).map_key(scrambled)));
    let pending = run_to_crash(&t, &pool, fence, CrashOptions::random(seed), &mut model, ops);
    (model, pending)
}

/// A scratch directory, in `/dev/shm` when it exists (memory-backed, like PM: copying and
/// syncing sparse node files costs no disk I/O).
pub fn scratch() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        tempfile::tempdir_in(shm).unwrap()
    } else {
        tempfile::tempdir().unwrap()
    }
}

/// Copies the closed (or crashed) store in `from` to `to`, node files and all: two opens of the
/// same image.
pub fn copy_store(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}
