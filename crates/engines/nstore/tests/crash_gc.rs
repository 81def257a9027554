//! Power failures during garbage collection (ADR shadow mode): whatever fence GC is at when the
//! power goes, the recovered store holds exactly the acknowledged state — no lost live entry, no
//! resurrected delete — and GC can run again to completion afterwards.

mod common;

use numakv_index::{Engine, Index};
use numakv_pmem::{CrashOptions, PersistMode, SimMode};
use rand::{Rng, SeedableRng};

#[test]
fn crash_at_every_stage_of_gc() {
    let seed: u64 = std::env::var("NUMAKV_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
    let o = common::opts();
    // How many fences one full GC pass issues, to aim crashes inside it.
    let total = {
        let dir = tempfile::tempdir().unwrap();
        let s = common::create(dir.path(), PersistMode::Adr, SimMode::Shadow, &o);
        let model = common::churn(&s, 3_000);
        let pool = s.pool().clone();
        pool.crash_after_fences(u64::MAX / 2, CrashOptions::STRICT).unwrap();
        let reclaimed = s.collect_garbage().unwrap();
        assert!(reclaimed > 0, "the churn left nothing for GC to reclaim");
        common::verify(&s, &model, "after an uninterrupted GC");
        pool.cancel_crash();
        reclaimed
    };
    assert!(total > 0);
    let mut crashed_inside = 0;
    for round in 0..12 {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store");
        let s = common::create(&path, PersistMode::Adr, SimMode::Shadow, &o);
        let model = common::churn(&s, 3_000);
        let pool = s.pool().clone();
        let fences = rng.gen_range(1..4_000);
        let copts = if rng.gen_bool(0.5) {
            CrashOptions::random(rng.gen())
        } else {
            CrashOptions { seed: rng.gen(), ..CrashOptions::STRICT }
        };
        pool.crash_after_fences(fences, copts).unwrap();
        let _ = s.collect_garbage(); // errors once the power is gone
        if pool.has_crashed() {
            crashed_inside += 1;
        } else {
            pool.crash(copts).unwrap();
        }
        drop(s);
        drop(pool);
        let ctx = format!("seed {seed} round {round} (crash after {fences} fences)");
        let (s, _, _) = common::open(&path, SimMode::Shadow, &o);
        common::verify(&s, &model, &ctx);
        // GC finishes what the crash interrupted, and the result survives another failure.
        s.collect_garbage().unwrap();
        common::verify(&s, &model, &format!("{ctx}, GC again"));
        s.pool().crash(CrashOptions::random(rng.gen())).unwrap();
        let pool = s.pool().clone();
        drop(s);
        drop(pool);
        let (s, _, _) = common::open(&path, SimMode::Shadow, &o);
        common::verify(&s, &model, &format!("{ctx}, second crash"));
    }
    assert!(crashed_inside > 0, "no crash landed inside GC");
}

#[test]
fn deleted_keys_stay_deleted_when_their_delete_entries_are_reclaimed() {
    let o = common::opts();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    let s = common::create(&path, PersistMode::Adr, SimMode::Shadow, &o);
    // Inserts fill files on node 0, one doomed key per two that stay (a third garbage: below
    // the threshold); the deletes go to node 1's files, which are all garbage and reclaimed
    // while the inserts they supersede survive in node 0's files — so reclaiming a delete
    // entry must first mark its history invalid.
    numakv_numa::set_current_node(0);
    for k in 1..=4_000 {
        s.insert(k, k).unwrap();
        s.insert(200_000 + 2 * k, k).unwrap();
        s.insert(200_001 + 2 * k, k).unwrap();
    }
    numakv_numa::set_current_node(1);
    for k in 1..=4_000 {
        assert!(s.remove(k).unwrap());
    }
    for k in 1..=4_000 {
        s.insert(100_000 + k, k).unwrap(); // fill node 1's files past the deletes
    }
    numakv_numa::set_current_node(0);
    let before = s.stats();
    assert!(s.collect_garbage().unwrap() > 0);
    let after = s.stats();
    assert!(after.counter("gc_history_invalidated").unwrap_or(0) >= 3_000, "{after:?}");
    assert!(after.pm_bytes() < before.pm_bytes(), "GC freed nothing: {before:?} {after:?}");
    let pool = s.pool().clone();
    pool.crash(CrashOptions::STRICT).unwrap();
    drop(s);
    drop(pool);
    let (s, _, _) = common::open(&path, SimMode::Shadow, &o);
    for k in 1..=4_000 {
        assert_eq!(s.get(k).unwrap(), None, "deleted key {k} came back");
        assert_eq!(s.get(100_000 + k).unwrap(), Some(k));
        assert_eq!(s.get(200_000 + 2 * k).unwrap(), Some(k));
    }
    let r = s.check().unwrap();
    assert_eq!(r.entries, 3 * 4_000);
    assert_eq!(r.reachable_blocks, r.allocated_blocks);
}
