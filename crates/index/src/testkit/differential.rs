//! Differential oracles: an engine driven by one thread must behave exactly like `BTreeMap`.

use std::collections::BTreeMap;

use numakv_pmem::{PersistMode, SimMode};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestError, TestRunner};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::{ensure, fail, scratch, seed, Kit, Verdict, Violation};
use crate::api::{Engine, Index, MAX_KEY, MIN_KEY};
use crate::error::Error;

/// One step of a differential run.
#[derive(Clone, Debug)]
pub(crate) enum Op {
    Insert(u64, u64),
    Upsert(u64, u64),
    Update(u64, u64),
    Get(u64),
    Remove(u64),
    Scan(u64, usize),
    /// Close (cleanly or by dropping: an unclean shutdown) and reopen.
    Reopen {
        clean: bool,
    },
    Check,
}

fn key() -> impl Strategy<Value = u64> {
    prop_oneof![
        20 => MIN_KEY..=48u64,
        1 => Just(0u64),
        1 => Just(u64::MAX),
        1 => Just(MAX_KEY),
        1 => Just(MAX_KEY - 1),
    ]
}

fn value() -> impl Strategy<Value = u64> {
    prop_oneof![4 => any::<u64>(), 1 => Just(0u64), 1 => Just(u64::MAX), 1 => 0u64..4]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (key(), value()).prop_map(|(k, v)| Op::Insert(k, v)),
        4 => (key(), value()).prop_map(|(k, v)| Op::Upsert(k, v)),
        3 => (key(), value()).prop_map(|(k, v)| Op::Update(k, v)),
        4 => key().prop_map(Op::Get),
        4 => key().prop_map(Op::Remove),
        2 => (prop_oneof![Just(0u64), key()], 0usize..20).prop_map(|(k, n)| Op::Scan(k, n)),
        1 => any::<bool>().prop_map(|clean| Op::Reopen { clean }),
        1 => Just(Op::Check),
    ]
}

fn valid(key: u64) -> bool {
    (MIN_KEY..=MAX_KEY).contains(&key)
}

/// Expects `r` to be `Err(InvalidKey(key))` when `key` is reserved, else returns the value.
fn checked<T>(what: &str, key: u64, r: crate::Result<T>) -> Verdict<Option<T>> {
    match r {
        Err(Error::InvalidKey(k)) if !valid(key) && k == key => Ok(None),
        Err(e) => fail(format!("{what}({key:#x})"), e),
        Ok(_) if !valid(key) => Err(Violation(format!(
            "{what}({key:#x}) accepted a reserved key instead of InvalidKey"
        ))),
        Ok(v) => Ok(Some(v)),
    }
}

/// Applies one point operation to the engine and the model and compares the results.
pub(crate) fn step(e: &dyn Index, model: &mut BTreeMap<u64, u64>, op: &Op) -> Verdict {
    match *op {
        Op::Insert(k, v) => {
            if let Some(got) = checked("insert", k, e.insert(k, v))? {
                let want = !model.contains_key(&k);
                ensure!(got == want, "insert({k}, {v:#x}) returned {got}, expected {want}");
                model.entry(k).or_insert(v);
            }
        }
        Op::Upsert(k, v) => {
            if checked("upsert", k, e.upsert(k, v))?.is_some() {
                model.insert(k, v);
            }
        }
        Op::Update(k, v) => {
            if let Some(got) = checked("update", k, e.update(k, v))? {
                let want = model.contains_key(&k);
                ensure!(got == want, "update({k}, {v:#x}) returned {got}, expected {want}");
                if let Some(slot) = model.get_mut(&k) {
                    *slot = v;
                }
            }
        }
        Op::Get(k) => {
            if let Some(got) = checked("get", k, e.get(k))? {
                let want = model.get(&k).copied();
                ensure!(got == want, "get({k}) returned {got:x?}, expected {want:x?}");
            }
        }
        Op::Remove(k) => {
            if let Some(got) = checked("remove", k, e.remove(k))? {
                let want = model.remove(&k).is_some();
                ensure!(got == want, "remove({k}) returned {got}, expected {want}");
            }
        }
        Op::Scan(start, max) => check_scan(e, model, start, max)?,
        Op::Check => check_entries(e, model)?,
        Op::Reopen { .. } => unreachable!("reopen is handled by the driver"),
    }
    Ok(())
}

/// `scan(start, max)` must return exactly the model's first `max` pairs from `start`.
pub(crate) fn check_scan(
    e: &dyn Index,
    model: &BTreeMap<u64, u64>,
    start: u64,
    max: usize,
) -> Verdict {
    let mut out = vec![(7, 7)]; // scan appends: a sentinel checks it does not clear
    let n = match e.scan(start, max, &mut out) {
        Ok(n) => n,
        Err(err) => return fail(format!("scan({start}, {max})"), err),
    };
    ensure!(out[0] == (7, 7), "scan({start}, {max}) clobbered the caller's buffer");
    ensure!(n == out.len() - 1, "scan({start}, {max}) returned {n} but appended {}", out.len() - 1);
    let want: Vec<(u64, u64)> = model.range(start..).take(max).map(|(&k, &v)| (k, v)).collect();
    if out[1..] != want[..] {
        let first_diff = out[1..].iter().zip(&want).position(|(a, b)| a != b);
        return Err(Violation(format!(
            "scan({start}, {max}) returned {} pairs, expected {}; first difference at position \
             {first_diff:?}: got {:x?}, expected {:x?}",
            n,
            want.len(),
            first_diff.and_then(|i| out.get(i + 1)),
            first_diff.and_then(|i| want.get(i)),
        )));
    }
    Ok(())
}

/// `check()` passes and counts the model's entries; a full scan equals the model.
pub(crate) fn check_entries(e: &dyn Index, model: &BTreeMap<u64, u64>) -> Verdict {
    let report = match e.check() {
        Ok(r) => r,
        Err(err) => return fail("check()", err),
    };
    ensure!(
        report.entries == model.len() as u64,
        "check() counted {} entries, the model has {}",
        report.entries,
        model.len()
    );
    check_scan(e, model, 0, usize::MAX)
}

impl<E: Engine> Kit<E> {
    /// Random operation sequences (reserved keys, values 0 and `u64::MAX`, scans, clean and
    /// unclean reopens, `check()`) against `BTreeMap`, shrunk to a minimal failing sequence.
    pub fn differential(&self, mode: PersistMode) -> Verdict {
        let seed = seed();
        let mut cfg = Config::with_cases(32 * self.scale as u32);
        cfg.failure_persistence = None;
        cfg.rng_algorithm = proptest::test_runner::RngAlgorithm::ChaCha;
        let mut runner = TestRunner::new_with_rng(
            cfg,
            proptest::test_runner::TestRng::from_seed(
                proptest::test_runner::RngAlgorithm::ChaCha,
                &seed_bytes(seed),
            ),
        );
        let result = runner.run(&proptest::collection::vec(op(), 1..120), |ops| {
            self.run_ops(mode, &ops).map_err(|v| TestCaseError::fail(v.0))
        });
        match result {
            Ok(()) => Ok(()),
            Err(TestError::Fail(why, ops)) => Err(Violation(format!(
                "differential ({mode:?}, NUMAKV_TEST_SEED={seed}): {why}\nminimal failing \
                 sequence: {ops:?}"
            ))),
            Err(TestError::Abort(why)) => {
                Err(Violation(format!("differential ({mode:?}) aborted: {why}")))
            }
        }
    }

    fn run_ops(&self, mode: PersistMode, ops: &[Op]) -> Verdict {
        let dir = scratch()?;
        let path = dir.path().join("store");
        let mut engine = Some(self.create_in(&path, mode, SimMode::Direct)?);
        let mut model = BTreeMap::new();
        for (i, op) in ops.iter().enumerate() {
            let e = engine.as_ref().expect("engine present between steps");
            match op {
                Op::Reopen { clean } => {
                    let e = engine.take().expect("engine present");
                    if *clean {
                        if let Err(err) = e.close() {
                            return fail(format!("step {i}: close()"), err);
                        }
                    } else {
                        drop(e);
                    }
                    let e = self.open_in(&path, SimMode::Direct)?;
                    check_entries(&e, &model)
                        .map_err(|v| Violation(format!("step {i}, after reopen: {v}")))?;
                    engine = Some(e);
                }
                op => step(e, &mut model, op).map_err(|v| Violation(format!("step {i}: {v}")))?,
            }
        }
        let e = engine.take().expect("engine present");
        check_entries(&e, &model)?;
        e.close().or_else(|err| fail("final close()", err))
    }

    /// One long seeded single-threaded run over a large key space: bulk loads in ascending,
    /// descending and random order, heavy deletes (merges, reuse), overwrites, scans, `check()`
    /// and a clean and an unclean reopen, all against `BTreeMap`.
    pub fn sequential(&self, mode: PersistMode) -> Verdict {
        let seed = seed();
        self.sequential_seeded(mode, seed)
            .map_err(|v| Violation(format!("sequential ({mode:?}, NUMAKV_TEST_SEED={seed}): {v}")))
    }

    fn sequential_seeded(&self, mode: PersistMode, seed: u64) -> Verdict {
        let mut rng = SmallRng::seed_from_u64(seed);
        let dir = scratch()?;
        let path = dir.path().join("store");
        let mut e = self.create_in(&path, mode, SimMode::Direct)?;
        let mut model = BTreeMap::new();
        let n = 4_000 * self.scale as u64;
        let space = 4 * n;
        // Ascending, then descending, then random loads.
        for k in (1..=n).map(|i| i * 4) {
            step(&e, &mut model, &Op::Insert(k, rng.gen()))?;
        }
        for k in (1..=n).rev().map(|i| i * 4 - 1) {
            step(&e, &mut model, &Op::Insert(k, rng.gen()))?;
        }
        for _ in 0..n {
            step(&e, &mut model, &Op::Upsert(rng.gen_range(1..=space), rng.gen()))?;
        }
        check_entries(&e, &model)?;
        // Reopen cleanly, then delete most keys (underflows, merges), in runs and at random.
        e.close().or_else(|err| fail("close()", err))?;
        e = self.open_in(&path, SimMode::Direct)?;
        check_entries(&e, &model)?;
        let keys: Vec<u64> = model.keys().copied().collect();
        for chunk in keys.chunks(64).step_by(2) {
            for &k in chunk {
                step(&e, &mut model, &Op::Remove(k))?;
            }
        }
        for _ in 0..n {
            step(&e, &mut model, &Op::Remove(rng.gen_range(1..=space)))?;
        }
        check_entries(&e, &model)?;
        // Mixed phase with scans, then an unclean reopen.
        for i in 0..2 * n {
            let k = rng.gen_range(1..=space);
            let op = match rng.gen_range(0..10) {
                0..=2 => Op::Insert(k, rng.gen()),
                3 => Op::Upsert(k, rng.gen()),
                4 => Op::Update(k, rng.gen()),
                5 | 6 => Op::Get(k),
                7 | 8 => Op::Remove(k),
                _ => Op::Scan(k, rng.gen_range(0..50)),
            };
            step(&e, &mut model, &op).map_err(|v| Violation(format!("mixed step {i}: {v}")))?;
        }
        drop(e);
        let e = self.open_in(&path, SimMode::Direct)?;
        check_entries(&e, &model)?;
        // Empty it completely, then refill a little: the emptied structure must still work.
        let keys: Vec<u64> = model.keys().copied().collect();
        for k in keys {
            step(&e, &mut model, &Op::Remove(k))?;
        }
        check_entries(&e, &model)?;
        for k in 1..=100 {
            step(&e, &mut model, &Op::Insert(k * 7, k))?;
        }
        check_entries(&e, &model)?;
        e.close().or_else(|err| fail("final close()", err))
    }
}

fn seed_bytes(seed: u64) -> [u8; 32] {
    let mut b = [0u8; 32];
    for (i, chunk) in b.chunks_mut(8).enumerate() {
        chunk.copy_from_slice(
            &(seed.wrapping_add(i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)).to_le_bytes(),
        );
    }
    b
}
