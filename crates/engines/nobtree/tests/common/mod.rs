//! Helpers shared by the scenario files.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use numakv_index::{Engine, Index, RecoveryReport};
use numakv_nobtree::{Nobtree, NobtreeOptions};
use numakv_pmem::{CrashOptions, OpenConfig, PersistMode, Pool, PoolConfig, SimMode};

pub const CAP: u64 = 32 << 20;

/// Options without the background coordinator (deterministic crash tests).
pub fn quiet() -> NobtreeOptions {
    let mut o = NobtreeOptions::default();
    o.migration.enabled = false;
    o
}

pub fn pool_cfg(mode: PersistMode, sim: SimMode) -> PoolConfig {
    let mut c = PoolConfig::new(Nobtree::engine_id(), CAP);
    c.nodes = 2;
    c.mode = mode;
    c.sim = sim;
    c
}

/// A volatile ADR pool on 2 emulated nodes.
pub fn volatile(opts: &NobtreeOptions) -> Nobtree {
    let pool = Pool::volatile(pool_cfg(PersistMode::Adr, SimMode::Direct)).unwrap();
    Nobtree::create(pool, opts).unwrap()
}

/// A store in `dir`.
pub fn create(dir: &Path, mode: PersistMode, sim: SimMode, opts: &NobtreeOptions) -> Nobtree {
    let pool = Pool::create(dir, pool_cfg(mode, sim)).unwrap();
    Nobtree::create(pool, opts).unwrap()
}

/// Reopens the store in `dir` (recovery included).
pub fn reopen(dir: &Path, sim: SimMode, opts: &NobtreeOptions) -> (Nobtree, RecoveryReport) {
    let mut c = OpenConfig::new(Nobtree::engine_id());
    c.sim = sim;
    let pool: Arc<Pool> = Pool::open(dir, c).unwrap();
    Nobtree::open(pool, opts).unwrap()
}

// The engine-independent scenario helpers (op, model, checks of a recovered tree).
pub use numakv_index::testkit::scenario::*;

/// One crash round: a fresh shadow store, `pre` applied, a crash armed for the `fence`-th
/// fence while `ops` run. `None` when the ops finished first. On crash: reopen, verify, more
/// ops, verify again.
pub fn crash_round(
    mode: PersistMode,
    opts: &NobtreeOptions,
    pre: &[Op],
    ops: &[Op],
    fence: u64,
    copts: CrashOptions,
) -> Option<RecoveryReport> {
    let d = tempfile::tempdir().unwrap();
    let t = create(d.path(), mode, SimMode::Shadow, opts);
    let mut model = BTreeMap::new();
    apply_all(&t, &mut model, pre.iter().copied());
    let pool = Arc::clone(t.pool());
    let pending = Some(run_to_crash(&t, &pool, fence, copts, &mut model, ops.iter().copied())?);
    drop(t);
    drop(pool);
    let (t, rep) = reopen(d.path(), SimMode::Shadow, opts);
    assert!(!rep.was_clean);
    verify(&t, &model, pending, true);
    keep_working(&t, fence * 7 + 1, 300, 3000, 6);
    Some(rep)
}

/// `check()` passes and counts the entries of a full scan, and every value names its key
/// ([`vk`]). Returns the scan.
pub fn check_values_name_keys(t: &Nobtree) -> Vec<(u64, u64)> {
    let r = t.check().unwrap();
    let mut out = Vec::new();
    t.scan(0, usize::MAX, &mut out).unwrap();
    assert_eq!(r.entries, out.len() as u64);
    for &(k, v) in &out {
        assert_eq!(v, vk(k));
    }
    out
}
