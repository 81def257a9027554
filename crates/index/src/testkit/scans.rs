//! Scan oracle: ordered, duplicate-free, bounded output that agrees with the model and with
//! point gets, including at the edges (start 0, start past the last key, `max` 0 and huge).

use std::collections::BTreeMap;

use numakv_pmem::{PersistMode, SimMode};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::differential::{check_entries, check_scan, step, Op};
use super::{ensure, fail, scratch, seed, Kit, Verdict, Violation};
use crate::api::{Engine, MAX_KEY};

impl<E: Engine> Kit<E> {
    /// Loads random keys (sparse and dense regions, the extreme keys 1 and `u64::MAX-1`) and
    /// checks random scans against the model and against gets.
    pub fn scans(&self) -> Verdict {
        let seed = seed();
        self.scans_seeded(seed)
            .map_err(|v| Violation(format!("scans (NUMAKV_TEST_SEED={seed}): {v}")))
    }

    fn scans_seeded(&self, seed: u64) -> Verdict {
        let mut rng = SmallRng::seed_from_u64(seed);
        let dir = scratch()?;
        let e = self.create_in(&dir.path().join("store"), PersistMode::Adr, SimMode::Direct)?;
        let mut model = BTreeMap::new();
        // Empty index: every scan is empty.
        for start in [0, 1, 1000, MAX_KEY, u64::MAX] {
            check_scan(&e, &model, start, 10)?;
        }
        let n = 3_000 * self.scale as u64;
        for k in [1, MAX_KEY, MAX_KEY - 1, 2] {
            step(&e, &mut model, &Op::Insert(k, k.wrapping_mul(3)))?;
        }
        for i in 0..n {
            // A dense run and a sparse spread.
            let k = if i % 2 == 0 { 1_000 + i } else { rng.gen_range(1..=MAX_KEY) };
            step(&e, &mut model, &Op::Upsert(k, rng.gen()))?;
        }
        for (start, max) in [(0, 0), (0, 1), (0, usize::MAX), (u64::MAX, 5), (MAX_KEY, 5), (2, 3)] {
            check_scan(&e, &model, start, max)?;
        }
        for _ in 0..500 * self.scale {
            let start = match rng.gen_range(0..3) {
                0 => rng.gen_range(900..1_000 + n),
                1 => rng.gen(),
                _ => *model.keys().nth(rng.gen_range(0..model.len())).unwrap_or(&1),
            };
            check_scan(&e, &model, start, rng.gen_range(0..300))?;
        }
        // Every scanned pair agrees with a point get.
        let mut out = Vec::new();
        if let Err(err) = e.scan(0, usize::MAX, &mut out) {
            return fail("full scan", err);
        }
        for &(k, v) in &out {
            match e.get(k) {
                Ok(got) => {
                    ensure!(got == Some(v), "scan returned ({k}, {v:#x}) but get({k}) = {got:x?}")
                }
                Err(err) => return fail(format!("get({k})"), err),
            }
        }
        // Delete every other key of the dense run and scan again (holes, emptied nodes).
        for i in (0..n).step_by(4) {
            step(&e, &mut model, &Op::Remove(1_000 + i))?;
        }
        for _ in 0..200 * self.scale {
            check_scan(&e, &model, rng.gen_range(900..1_000 + n), rng.gen_range(1..100))?;
        }
        check_entries(&e, &model)?;
        e.close().or_else(|err| fail("close()", err))
    }
}

/// Checks the shape of a scan result taken while other threads mutate: strictly ascending keys,
/// all `≥ start`, at most `max`.
pub(crate) fn check_scan_shape(out: &[(u64, u64)], start: u64, max: usize) -> Verdict {
    ensure!(out.len() <= max, "scan({start}, {max}) returned {} pairs", out.len());
    if let Some(&(k, _)) = out.first() {
        ensure!(k >= start, "scan({start}, {max}) returned key {k} below the start");
    }
    for w in out.windows(2) {
        ensure!(
            w[0].0 < w[1].0,
            "scan({start}, {max}) returned keys out of order or duplicated: {} then {}",
            w[0].0,
            w[1].0
        );
    }
    Ok(())
}
