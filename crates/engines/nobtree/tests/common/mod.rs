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

/// Small deterministic PRNG (xorshift).
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

/// One mutating operation.
#[derive(Clone, Copy, Debug)]
pub enum Op {
    Insert(u64, u64),
    Upsert(u64, u64),
    Update(u64, u64),
    Remove(u64),
}

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

pub fn tree_apply(t: &Nobtree, m: &BTreeMap<u64, u64>, op: Op) {
    match op {
        Op::Insert(k, v) => assert_eq!(t.insert(k, v).unwrap(), !m.contains_key(&k), "{op:?}"),
        Op::Upsert(k, v) => t.upsert(k, v).unwrap(),
        Op::Update(k, v) => assert_eq!(t.update(k, v).unwrap(), m.contains_key(&k), "{op:?}"),
        Op::Remove(k) => assert_eq!(t.remove(k).unwrap(), m.contains_key(&k), "{op:?}"),
    }
}

/// A random mutating op on keys `1..=space`.
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

/// Everything in the tree, by a full scan (strictly ascending).
pub fn contents(t: &Nobtree) -> BTreeMap<u64, u64> {
    let mut out = Vec::new();
    t.scan(0, usize::MAX, &mut out).unwrap();
    for w in out.windows(2) {
        assert!(w[0].0 < w[1].0, "scan not strictly ascending: {w:?}");
    }
    out.into_iter().collect()
}

/// `check()` (exact: no leak), contents = model with the pending op wholly absent or applied,
/// point gets agree.
pub fn verify(t: &Nobtree, model: &BTreeMap<u64, u64>, pending: Option<Op>, exact: bool) {
    let r = t.check().unwrap();
    if exact {
        assert_eq!(r.reachable_blocks, r.allocated_blocks, "leak or double allocation: {r:?}");
    } else {
        assert!(r.reachable_blocks <= r.allocated_blocks, "{r:?}");
    }
    let got = contents(t);
    assert_eq!(r.entries, got.len() as u64);
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
}

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
    for &op in pre {
        tree_apply(&t, &model, op);
        model_apply(&mut model, op);
    }
    let pool = Arc::clone(t.pool());
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
    let (t, rep) = reopen(d.path(), SimMode::Shadow, opts);
    assert!(!rep.was_clean);
    verify(&t, &model, pending, true);
    let mut model = contents(&t);
    let mut rng = Rng(fence * 7 + 1);
    for _ in 0..300 {
        let op = random_op(&mut rng, 3000, 6);
        tree_apply(&t, &model, op);
        model_apply(&mut model, op);
    }
    verify(&t, &model, None, false);
    Some(rep)
}

/// Sum of a recovery counter over reports.
pub fn counter_sum(reps: &[RecoveryReport], name: &str) -> u64 {
    reps.iter().flat_map(|r| r.counters.iter()).filter(|c| c.0 == name).map(|c| c.1).sum()
}

/// A value that names its key.
pub fn vk(k: u64) -> u64 {
    k.wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// Scaled count.
pub fn scaled(n: usize) -> usize {
    n * numakv_pmem::crash::test_scale()
}
