//! Regression (original: non-atomic root split): the root pointer switches in one store, after
//! the new root is durable. A crash at every persistence point of the insert that splits the
//! root (leaf root, then an internal root) recovers a tree whose root covers everything; and
//! concurrent threads racing to grow a fresh tree never lose a key or build two roots.

mod common;

use std::sync::Arc;

use common::{crash_round, Op};
use numakv_fastfair::layout;
use numakv_index::Index;
use numakv_pmem::{CrashOptions, PersistMode};

#[test]
fn crash_during_leaf_root_split() {
    let cap = layout::slots(256) as u64 - 1;
    let pre: Vec<Op> = (1..=cap).map(|k| Op::Insert(k * 10, 0)).collect();
    let ops = [Op::Insert(55, 0), Op::Insert(5, 0)];
    let mut fence = 1;
    while crash_round(PersistMode::Adr, 256, &pre, &ops, fence, CrashOptions::STRICT).is_some() {
        assert!(crash_round(PersistMode::Adr, 256, &pre, &ops, fence, CrashOptions::random(fence))
            .is_some());
        fence += 1;
    }
    assert!(fence > 4, "the root split took only {fence} fences");
}

#[test]
fn crash_during_internal_root_split() {
    // Sequential inserts until the root is about to split at level 1; then crash inside it.
    let t = common::volatile(256);
    let mut n = 0u64;
    let mut pre = Vec::new();
    loop {
        n += 1;
        t.insert(n, n).unwrap();
        pre.push(Op::Insert(n, n));
        if t.stats().counter("root_splits").unwrap() == 1 {
            break;
        }
    }
    // Keep inserting until just before the second root split.
    let mut more = Vec::new();
    loop {
        n += 1;
        let before = t.stats().counter("root_splits").unwrap();
        t.insert(n, n).unwrap();
        if t.stats().counter("root_splits").unwrap() > before {
            break;
        }
        more.push(Op::Insert(n, n));
    }
    pre.extend(more);
    let ops = [Op::Insert(n, n), Op::Insert(n + 1, n)];
    let mut fence = 1;
    while crash_round(PersistMode::Adr, 256, &pre, &ops, fence, CrashOptions::STRICT).is_some() {
        fence += 1;
    }
    assert!(fence > 6, "the root split took only {fence} fences");
}

#[test]
fn concurrent_growth_of_a_fresh_tree() {
    for round in 0..(10 * numakv_pmem::crash::test_scale() as u64) {
        let t = Arc::new(common::volatile(256));
        let per = 400u64;
        std::thread::scope(|s| {
            for th in 0..4u64 {
                let t = Arc::clone(&t);
                s.spawn(move || {
                    for i in 0..per {
                        let k = 1 + i * 4 + th + round;
                        assert!(t.insert(k, k ^ 0x55).unwrap());
                    }
                });
            }
        });
        let r = t.check().unwrap();
        assert_eq!(r.entries, 4 * per);
        for i in 0..4 * per {
            let k = 1 + i + round;
            assert_eq!(t.get(k).unwrap(), Some(k ^ 0x55), "round {round} key {k}");
        }
        assert!(t.stats().counter("root_splits").unwrap() >= 2);
    }
}
