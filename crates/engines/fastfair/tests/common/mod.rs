//! Helpers shared by the scenario files.
#![allow(dead_code)]

use std::path::Path;
use std::sync::Arc;

use numakv_fastfair::{FastFair, FastFairOptions, RecoveryMode};
use numakv_index::Engine;
use numakv_pmem::{OpenConfig, PersistMode, Pool, PoolConfig, SimMode};

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

/// Small deterministic PRNG (xorshift) so tests need no seeds from outside.
pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

use std::collections::BTreeMap;

use numakv_index::Index;
use numakv_pmem::CrashOptions;

/// One mutating operation.
#[derive(Clone, Copy, Debug)]
pub enum Op {
    Insert(u64, u64),
    Upsert(u64, u64),
    Update(u64, u64),
    Remove(u64),
}

impl Op {
    pub fn key(self) -> u64 {
        match self {
            Op::Insert(k, _) | Op::Upsert(k, _) | Op::Update(k, _) | Op::Remove(k) => k,
        }
    }
}

/// Applies `op` to the model as the contract says.
pub fn model_apply(m: &mut BTreeMap<u64, u64>, op: Op) {
    match op {
        Op::Insert(k, v) => {
            m.entry(k).or_insert(v);
        }
        Op::Upsert(k, v) => {
            m.insert(k, v);
        }
        Op::Update(k, v) => {
            if let Some(x) = m.get_mut(&k) {
                *x = v;
            }
        }
        Op::Remove(k) => {
            m.remove(&k);
        }
    }
}

/// Applies `op` to the tree, checking its answer against the model (before the op).
pub fn tree_apply(t: &FastFair, m: &BTreeMap<u64, u64>, op: Op) {
    match op {
        Op::Insert(k, v) => assert_eq!(t.insert(k, v).unwrap(), !m.contains_key(&k), "{op:?}"),
        Op::Upsert(k, v) => t.upsert(k, v).unwrap(),
        Op::Update(k, v) => assert_eq!(t.update(k, v).unwrap(), m.contains_key(&k), "{op:?}"),
        Op::Remove(k) => assert_eq!(t.remove(k).unwrap(), m.contains_key(&k), "{op:?}"),
    }
}

/// A random mutating op on keys `1..=space`, values including 0 and u64::MAX.
pub fn random_op(rng: &mut Rng, space: u64, insert_bias: u64) -> Op {
    let k = 1 + rng.below(space);
    let v = match rng.below(3) {
        0 => 0,
        1 => u64::MAX,
        _ => rng.next(),
    };
    let d = rng.below(10);
    if d < insert_bias {
        Op::Insert(k, v)
    } else if d < insert_bias + 1 {
        Op::Upsert(k, v)
    } else if d < insert_bias + 2 {
        Op::Update(k, v)
    } else {
        Op::Remove(k)
    }
}

/// Everything in the tree, by a full scan.
pub fn contents(t: &FastFair) -> BTreeMap<u64, u64> {
    let mut out = Vec::new();
    t.scan(0, usize::MAX, &mut out).unwrap();
    for w in out.windows(2) {
        assert!(w[0].0 < w[1].0, "scan not strictly ascending: {w:?}");
    }
    out.into_iter().collect()
}

/// Verifies a recovered tree: `check()` passes with no leak, and its contents are the model
/// with the pending operation either wholly absent or wholly applied; point gets agree.
pub fn verify_recovered(t: &FastFair, model: &BTreeMap<u64, u64>, pending: Option<Op>) {
    verify(t, model, pending, true)
}

/// As [`verify_recovered`]; `exact` = no block may await its epoch grace period (right after
/// recovery), else merged-away nodes may still be allocated.
pub fn verify(t: &FastFair, model: &BTreeMap<u64, u64>, pending: Option<Op>, exact: bool) {
    let r = t.check().unwrap();
    if exact {
        assert_eq!(r.reachable_blocks, r.allocated_blocks, "leak or double allocation: {r:?}");
    } else {
        assert!(r.reachable_blocks <= r.allocated_blocks, "{r:?}");
    }
    let got = check_contents(t, model, pending);
    assert_eq!(r.entries, got.len() as u64);
}

/// A full scan is the model with `pending` wholly absent or wholly applied, and point gets
/// agree with it (no `check()`: usable while a lazy recovery runs). Returns the contents.
pub fn check_contents(
    t: &FastFair,
    model: &BTreeMap<u64, u64>,
    pending: Option<Op>,
) -> BTreeMap<u64, u64> {
    let got = contents(t);
    let mut after = model.clone();
    if let Some(op) = pending {
        model_apply(&mut after, op);
    }
    assert!(
        got == *model || got == after,
        "recovered contents are neither before nor after {pending:?}"
    );
    for (k, v) in &got {
        assert_eq!(t.get(*k).unwrap(), Some(*v));
    }
    got
}

/// One crash round in shadow mode: a fresh store with node size `ns`, `pre` applied, then a
/// crash armed to fire during the `fence`-th fence while `ops` run. Returns false when the ops finished before the crash
/// fired (no more crash points). On crash: reopen, verify, run a few more ops, verify again.
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
    for &op in pre {
        tree_apply(&t, &model, op);
        model_apply(&mut model, op);
    }
    let pool = Arc::clone(numakv_index::Engine::pool(&t));
    pool.crash_after_fences(fence, copts).unwrap();
    let mut pending = None;
    for &op in ops {
        tree_apply(&t, &model, op);
        if pool.has_crashed() {
            pending = Some(op);
            break;
        }
        model_apply(&mut model, op);
    }
    if pending.is_none() {
        pool.cancel_crash();
        return None;
    }
    drop(t);
    drop(pool);
    let (t, rep) = reopen_with(d.path(), SimMode::Shadow, recovery);
    assert!(!rep.was_clean);
    check_contents(&t, &model, pending);
    let rep = full_report(&t, rep);
    verify_recovered(&t, &model, pending);
    // The recovered tree keeps working.
    let mut model = contents(&t);
    let mut rng = Rng(fence * 7 + 1);
    for _ in 0..200 {
        let op = random_op(&mut rng, 2000, 5);
        tree_apply(&t, &model, op);
        model_apply(&mut model, op);
    }
    verify(&t, &model, None, false);
    Some(rep)
}

/// Sum of a recovery counter over reports.
pub fn counter_sum(reps: &[numakv_index::RecoveryReport], name: &str) -> u64 {
    reps.iter().flat_map(|r| r.counters.iter()).filter(|c| c.0 == name).map(|c| c.1).sum()
}

/// A value that names its key (to catch a key paired with another key's value).
pub fn vk(k: u64) -> u64 {
    k.wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// Scaled op count.
pub fn scaled(n: usize) -> usize {
    n * numakv_pmem::crash::test_scale()
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
    for i in 0..keys {
        let op = Op::Insert(scrambled(i), rng.next());
        tree_apply(&t, &model, op);
        model_apply(&mut model, op);
    }
    for i in 0..keys {
        if rng.below(3) > 0 {
            let op = Op::Remove(scrambled(i));
            tree_apply(&t, &model, op);
            model_apply(&mut model, op);
        }
    }
    let pool = Arc::clone(numakv_index::Engine::pool(&t));
    pool.crash_after_fences(1 + rng.below(3_000), CrashOptions::random(seed)).unwrap();
    let mut pending = None;
    while !pool.has_crashed() {
        let op = random_op(&mut rng, keys * 2, 5);
        let op = match op {
            Op::Insert(k, v) => Op::Insert(scrambled(k), v),
            Op::Upsert(k, v) => Op::Upsert(scrambled(k), v),
            Op::Update(k, v) => Op::Update(scrambled(k), v),
            Op::Remove(k) => Op::Remove(scrambled(k)),
        };
        tree_apply(&t, &model, op);
        if pool.has_crashed() {
            pending = Some(op);
            break;
        }
        model_apply(&mut model, op);
    }
    (model, pending)
}

/// Resolves the interrupted operation by looking at the recovered tree: the model it is in.
pub fn resolve(t: &FastFair, model: &mut BTreeMap<u64, u64>, pending: Option<Op>) {
    let Some(op) = pending else { return };
    let k = op.key();
    let got = t.get(k).unwrap();
    let mut after = model.clone();
    model_apply(&mut after, op);
    if got == after.get(&k).copied() {
        *model = after;
    } else {
        assert_eq!(got, model.get(&k).copied(), "{op:?} neither applied nor absent");
    }
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
