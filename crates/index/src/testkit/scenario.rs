//! Building blocks for an engine's own hand-written scenario tests (crash rounds aimed at one
//! mechanism, regressions), where the [`Kit`](super::Kit) oracles are too coarse.
//!
//! Unlike the oracles, these helpers panic (`assert!`) on the first broken rule, like the tests
//! that call them: a random mutating [`Op`], a `BTreeMap` model ([`model_apply`]), the engine's
//! answer checked against it ([`tree_apply`]), the contents by a full scan ([`contents`]), and the
//! verification of a recovered store whose interrupted operation must be wholly absent or wholly
//! applied ([`check_contents`], [`verify`], [`resolve`]). Everything works on `&dyn Index`, so one
//! helper serves every engine.

use std::collections::BTreeMap;

use numakv_pmem::{CrashOptions, Pool};

use crate::api::{Index, RecoveryReport};
use crate::error::Error;

/// Small deterministic PRNG (xorshift) so scenarios need no seeds from outside. The seed must
/// not be 0 (xorshift stays at 0).
#[derive(Clone, Debug)]
pub struct Rng(pub u64);

impl Rng {
    /// The next 64 random bits.
    // Not an `Iterator`: it never ends and is always used one number at a time.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// A number in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// One mutating operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// `insert(key, value)`.
    Insert(u64, u64),
    /// `upsert(key, value)`.
    Upsert(u64, u64),
    /// `update(key, value)`.
    Update(u64, u64),
    /// `remove(key)`.
    Remove(u64),
}

impl Op {
    /// The key the operation acts on.
    pub fn key(self) -> u64 {
        match self {
            Op::Insert(k, _) | Op::Upsert(k, _) | Op::Update(k, _) | Op::Remove(k) => k,
        }
    }

    /// The same operation on key `f(key)` (same value).
    pub fn map_key(self, f: impl FnOnce(u64) -> u64) -> Op {
        match self {
            Op::Insert(k, v) => Op::Insert(f(k), v),
            Op::Upsert(k, v) => Op::Upsert(f(k), v),
            Op::Update(k, v) => Op::Update(f(k), v),
            Op::Remove(k) => Op::Remove(f(k)),
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

/// Applies `op` to the store, asserting that its answer is the one the model (before the op)
/// implies. The model is left as it is.
pub fn tree_apply(t: &dyn Index, m: &BTreeMap<u64, u64>, op: Op) {
    match op {
        Op::Insert(k, v) => assert_eq!(t.insert(k, v).unwrap(), !m.contains_key(&k), "{op:?}"),
        Op::Upsert(k, v) => t.upsert(k, v).unwrap(),
        Op::Update(k, v) => assert_eq!(t.update(k, v).unwrap(), m.contains_key(&k), "{op:?}"),
        Op::Remove(k) => assert_eq!(t.remove(k).unwrap(), m.contains_key(&k), "{op:?}"),
    }
}

/// [`tree_apply`] then [`model_apply`], for each op of `ops` in turn.
pub fn apply_all(t: &dyn Index, m: &mut BTreeMap<u64, u64>, ops: impl IntoIterator<Item = Op>) {
    for op in ops {
        tree_apply(t, m, op);
        model_apply(m, op);
    }
}

/// A random mutating op on keys `1..=space`, values including 0 and `u64::MAX`: an insert with
/// probability `insert_bias`/10, then an upsert and an update 1/10 each, else a remove.
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

/// Everything in the store, by a full scan, asserting it strictly ascending.
pub fn contents(t: &dyn Index) -> BTreeMap<u64, u64> {
    let mut out = Vec::new();
    t.scan(0, usize::MAX, &mut out).unwrap();
    for w in out.windows(2) {
        assert!(w[0].0 < w[1].0, "scan not strictly ascending: {w:?}");
    }
    out.into_iter().collect()
}

/// Asserts that a full scan is the model with `pending` wholly absent or wholly applied, and
/// that point gets agree with it (no `check()`: usable while a background recovery runs).
/// Returns the contents.
pub fn check_contents(
    t: &dyn Index,
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

/// Verifies a store: `check()` passes and counts the entries a scan returns, the contents are
/// as [`check_contents`] says, and its blocks: `exact`, every allocated block is reachable (no
/// leak, right after recovery), else none is reachable that is not allocated (blocks awaiting
/// their epoch grace period may still be allocated).
pub fn verify(t: &dyn Index, model: &BTreeMap<u64, u64>, pending: Option<Op>, exact: bool) {
    let r = t.check().unwrap();
    if exact {
        assert_eq!(r.reachable_blocks, r.allocated_blocks, "leak or double allocation: {r:?}");
    } else {
        assert!(r.reachable_blocks <= r.allocated_blocks, "{r:?}");
    }
    let got = check_contents(t, model, pending);
    assert_eq!(r.entries, got.len() as u64);
}

/// Verifies a recovered store: [`verify`], exact.
pub fn verify_recovered(t: &dyn Index, model: &BTreeMap<u64, u64>, pending: Option<Op>) {
    verify(t, model, pending, true)
}

/// Resolves the interrupted operation by looking at the recovered store: `model` becomes the
/// state it is in (asserting that the op is either wholly applied or absent for its key).
pub fn resolve(t: &dyn Index, model: &mut BTreeMap<u64, u64>, pending: Option<Op>) {
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

/// Arms `pool` (shadow mode) to crash during its `fence`-th fence, then runs `ops` on `t` as
/// [`apply_all`] does until the crash fires. Returns the operation the crash interrupted (not
/// applied to `model`), or `None`, the crash disarmed, when the ops finished first.
pub fn run_to_crash(
    t: &dyn Index,
    pool: &Pool,
    fence: u64,
    copts: CrashOptions,
    model: &mut BTreeMap<u64, u64>,
    ops: impl IntoIterator<Item = Op>,
) -> Option<Op> {
    pool.crash_after_fences(fence, copts).unwrap();
    for op in ops {
        tree_apply(t, model, op);
        if pool.has_crashed() {
            return Some(op);
        }
        model_apply(model, op);
    }
    pool.cancel_crash();
    None
}

/// The recovered store keeps working: from its current contents, `n` random ops
/// ([`random_op`] with `space` and `insert_bias`, seeded by `seed`), each answer checked, then
/// [`verify`] (not exact).
pub fn keep_working(t: &dyn Index, seed: u64, n: usize, space: u64, insert_bias: u64) {
    let mut model = contents(t);
    let mut rng = Rng(seed);
    apply_all(t, &mut model, (0..n).map(|_| random_op(&mut rng, space, insert_bias)));
    verify(t, &model, None, false);
}

/// A crash sweep: at fences `1, 1 + step, 1 + 2 * step, …`, `round(fence, CrashOptions::STRICT)`
/// then `round(fence, CrashOptions::random(fence ^ seed))`, until a strict round returns `None`
/// (its ops finished before the fence). Returns the reports of the rounds that crashed, and the
/// fence at which the sweep ended.
pub fn sweep_fences(
    step: u64,
    seed: u64,
    mut round: impl FnMut(u64, CrashOptions) -> Option<RecoveryReport>,
) -> (Vec<RecoveryReport>, u64) {
    let mut reps = Vec::new();
    let mut fence = 1;
    while let Some(r) = round(fence, CrashOptions::STRICT) {
        reps.push(r);
        reps.extend(round(fence, CrashOptions::random(fence ^ seed)));
        fence += step;
    }
    (reps, fence)
}

/// A sweep step that scales with `NUMAKV_TEST_SCALE`: 4 × `step` at scale 1, 2 × at scale 2,
/// `step` from scale 3 (a step of 0 counts as 1).
pub fn sweep_step(step: u64) -> u64 {
    step.max(1) * (4 / super::test_scale().min(4)) as u64
}

/// Sum of a recovery counter over reports.
pub fn counter_sum(reps: &[RecoveryReport], name: &str) -> u64 {
    reps.iter().flat_map(|r| r.counters.iter()).filter(|c| c.0 == name).map(|c| c.1).sum()
}

/// A value that names its key (to catch a key paired with another key's value).
pub fn vk(k: u64) -> u64 {
    k.wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// `n` scaled by `NUMAKV_TEST_SCALE` ([`test_scale`](super::test_scale)).
pub fn scaled(n: usize) -> usize {
    n * super::test_scale()
}

/// The contract of [`Index::update_with`] on `t`, an empty index: on 1,000 keys (2, 4, …,
/// 2,000) `f` sees a present key's value and its result is stored; `None` from `f` keeps the
/// value; an absent key returns `None` without calling `f`; an error from `f` is returned and
/// nothing is written. For engines with their own `update_with`.
pub fn check_update_with_semantics(t: &dyn Index) {
    for k in 1..=1000u64 {
        t.upsert(k * 2, k).expect("upsert");
    }
    // Present: f sees the value, its result is stored.
    assert_eq!(t.update_with(20, &mut |v| Ok(Some(v + 100))).expect("update_with"), Some(10));
    assert_eq!(t.get(20).expect("get"), Some(110));
    // `None` from f leaves the value.
    assert_eq!(t.update_with(20, &mut |_| Ok(None)).expect("update_with"), Some(110));
    assert_eq!(t.get(20).expect("get"), Some(110));
    // Absent: f is not called.
    let mut called = false;
    let r = t.update_with(21, &mut |_| {
        called = true;
        Ok(Some(1))
    });
    assert_eq!(r.expect("update_with"), None);
    assert!(!called);
    assert_eq!(t.get(21).expect("get"), None);
    // An error from f: returned, nothing written.
    let r = t.update_with(40, &mut |_| Err(Error::InvalidOptions("no".into())));
    assert!(matches!(r, Err(Error::InvalidOptions(_))), "{r:?}");
    assert_eq!(t.get(40).expect("get"), Some(20));
    assert_eq!(t.check().expect("check").entries, 1000);
}
