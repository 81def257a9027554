//! Regression (original: missing flushes when a new node is initialised): after every
//! acknowledged insert that split a node or the root, a strict ADR power failure (only flushed
//! and fenced lines survive, nothing else) must lose nothing.

mod common;

use std::collections::BTreeMap;

use numakv_index::{Engine, Index};
use numakv_pmem::{CrashOptions, PersistMode, SimMode};

#[test]
fn strict_crash_after_each_split_loses_nothing() {
    let mut rng = common::Rng(0x1417);
    let keys: Vec<u64> = (0..300).map(|_| 1 + rng.below(1 << 40)).collect();
    // Crash after the insert number `n` for every n in `points` (fresh store each time).
    let points: Vec<usize> = (1..keys.len()).step_by(7).collect();
    let mut splits_seen = 0;
    for &n in &points {
        let d = tempfile::tempdir().unwrap();
        let t = common::create(d.path(), PersistMode::Adr, SimMode::Shadow, 256);
        let mut model = BTreeMap::new();
        for &k in &keys[..n] {
            t.upsert(k, k.wrapping_mul(3)).unwrap();
            model.insert(k, k.wrapping_mul(3));
        }
        splits_seen += t.stats().counter("splits").unwrap();
        let pool = std::sync::Arc::clone(t.pool());
        pool.crash(CrashOptions::STRICT).unwrap();
        drop(t);
        drop(pool);
        let (t, _) = common::reopen(d.path(), SimMode::Shadow);
        common::verify_recovered(&t, &model, None);
    }
    assert!(splits_seen > 50);
}
