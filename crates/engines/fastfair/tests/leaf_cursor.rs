//! `LeafCursor` (node-based batched writes for F3-tree's F3-N): sorted runs reuse the previous
//! leaf instead of descending, any order stays correct, concurrent writers and merges are
//! tolerated, and a crash in the middle of a batch recovers like one of plain upserts.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use common::{check_contents, contents, reopen, verify, vk, Op};
use numakv_index::{Engine, Index};
use numakv_pmem::{CrashOptions, PersistMode, SimMode};

#[test]
fn sorted_batches_reuse_leaves_and_match_upserts() {
    let t = common::volatile(256);
    let mut model = BTreeMap::new();
    let mut rng = common::Rng(7);
    let (mut hits, mut descents) = (0, 0);
    for round in 0..40u64 {
        // A batch of 200 keys, sorted, some already present (overwrites).
        let mut keys: Vec<u64> = (0..200).map(|_| 1 + rng.below(20_000)).collect();
        keys.sort_unstable();
        let mut c = t.leaf_cursor();
        for &k in &keys {
            c.upsert(k, vk(k) ^ round).unwrap();
            model.insert(k, vk(k) ^ round);
        }
        hits += c.hits();
        descents += c.descents();
    }
    assert_eq!(contents(&t), model);
    verify(&t, &model, None, true);
    assert!(t.check().is_ok());
    assert!(hits > 0 && descents > 0, "hits {hits}, descents {descents}");
    // Dense sorted keys: most writes land in the previous leaf.
    let mut c = t.leaf_cursor();
    for k in 30_000..31_000u64 {
        c.upsert(k, k).unwrap();
    }
    assert!(c.hits() > 800, "only {} of 1000 dense keys reused a leaf", c.hits());
    drop(c);
    // Any order is still correct (a non-covering leaf means a descent).
    let mut c = t.leaf_cursor();
    for k in (40_000..40_500u64).rev().chain([5, 50_000, 7]) {
        c.upsert(k, k + 1).unwrap();
        model.insert(k, k + 1);
    }
    drop(c);
    for k in 30_000..31_000u64 {
        model.insert(k, k);
    }
    verify(&t, &model, None, true);
    assert!(t.check().is_ok());
}

#[test]
fn cursors_run_alongside_removes_that_merge_leaves() {
    let t = Arc::new(common::volatile(256));
    for k in 1..=8_000u64 {
        t.upsert(k * 4, 0).unwrap();
    }
    std::thread::scope(|s| {
        // Two cursor writers over disjoint residues, one remover of the preloaded keys.
        for w in 0..2u64 {
            let t = Arc::clone(&t);
            s.spawn(move || {
                for batch in 0..40u64 {
                    let mut c = t.leaf_cursor();
                    for i in 0..100u64 {
                        let k = (batch * 100 + i) * 4 + 1 + w;
                        c.upsert(k, vk(k)).unwrap();
                    }
                }
            });
        }
        let t = Arc::clone(&t);
        s.spawn(move || {
            for k in 1..=8_000u64 {
                assert!(t.remove(k * 4).unwrap());
            }
        });
    });
    let mut model = BTreeMap::new();
    for w in 0..2u64 {
        for n in 0..4_000u64 {
            let k = n * 4 + 1 + w;
            model.insert(k, vk(k));
        }
    }
    assert!(t.stats().counter("merges").unwrap_or(0) > 0, "the removes merged no leaf");
    // Merged-away leaves may still await their epoch grace period: not an exact block count.
    verify(&*t, &model, None, false);
    assert!(t.check().is_ok());
}

#[test]
fn a_crash_inside_a_cursor_batch_recovers() {
    let mut crashed = 0;
    for fence in (50..2_000).step_by(97) {
        let d = tempfile::tempdir().unwrap();
        let t = common::create(d.path(), PersistMode::Adr, SimMode::Shadow, 256);
        let mut model = BTreeMap::new();
        for k in 1..=500u64 {
            t.upsert(k * 10, vk(k)).unwrap();
            model.insert(k * 10, vk(k));
        }
        let pool = Arc::clone(t.pool());
        pool.crash_after_fences(fence, CrashOptions::STRICT).unwrap();
        let mut pending = None;
        {
            let mut c = t.leaf_cursor();
            for k in (5..5_000u64).step_by(3) {
                let _ = c.upsert(k, k);
                if pool.has_crashed() {
                    pending = Some(Op::Upsert(k, k));
                    break;
                }
                model.insert(k, k);
            }
        }
        if pending.is_none() {
            pool.cancel_crash();
            continue;
        }
        crashed += 1;
        drop(t);
        drop(pool);
        let (t, rep) = reopen(d.path(), SimMode::Shadow);
        assert!(!rep.was_clean);
        let got = check_contents(&t, &model, pending);
        verify(&t, &got, None, true);
    }
    assert!(crashed > 5, "only {crashed} crashes landed in a batch");
}
