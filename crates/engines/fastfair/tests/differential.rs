//! Random single-threaded operation sequences against `BTreeMap`, small nodes so that splits,
//! root splits and merges happen often; `check()` along the way.

mod common;

use std::collections::BTreeMap;

use numakv_index::Index;

fn run(node_size: usize, key_space: u64, ops: usize, seed: u64) {
    let t = common::volatile(node_size);
    let mut model = BTreeMap::new();
    let mut rng = common::Rng(seed);
    for step in 0..ops {
        let k = 1 + rng.below(key_space);
        let v = match rng.below(4) {
            0 => 0,
            1 => u64::MAX,
            _ => rng.next(),
        };
        // Phases: grow, then shrink, then mixed, so that merges get their turn.
        let phase = step * 3 / ops;
        let dice = rng.below(10);
        let op = match (phase, dice) {
            (0, 0..=6) | (2, 0..=2) => 0, // insert
            (1, 0..=6) | (2, 3..=5) => 1, // remove
            (_, 7) => 2,                  // upsert
            (_, 8) => 3,                  // update
            _ => 4,                       // get + scan
        };
        match op {
            0 => {
                let fresh = !model.contains_key(&k);
                assert_eq!(t.insert(k, v).unwrap(), fresh, "insert {k}");
                if fresh {
                    model.insert(k, v);
                }
            }
            1 => assert_eq!(t.remove(k).unwrap(), model.remove(&k).is_some(), "remove {k}"),
            2 => {
                t.upsert(k, v).unwrap();
                model.insert(k, v);
            }
            3 => {
                let present = model.contains_key(&k);
                assert_eq!(t.update(k, v).unwrap(), present, "update {k}");
                if present {
                    model.insert(k, v);
                }
            }
            _ => {
                assert_eq!(t.get(k).unwrap(), model.get(&k).copied(), "get {k}");
                let mut out = Vec::new();
                let n = 1 + rng.below(40) as usize;
                t.scan(k, n, &mut out).unwrap();
                let want: Vec<(u64, u64)> =
                    model.range(k..).take(n).map(|(a, b)| (*a, *b)).collect();
                assert_eq!(out, want, "scan {k} {n}");
            }
        }
        if step % 5000 == 0 {
            t.check().unwrap();
        }
    }
    let r = t.check().unwrap();
    assert_eq!(r.entries, model.len() as u64);
    let mut out = Vec::new();
    t.scan(0, usize::MAX, &mut out).unwrap();
    let want: Vec<(u64, u64)> = model.iter().map(|(a, b)| (*a, *b)).collect();
    assert_eq!(out, want);
    let s = numakv_index::Index::stats(&t);
    assert!(s.counter("splits").unwrap() > 0 && s.counter("root_splits").unwrap() > 0, "{s:?}");
    assert!(s.counter("merges").unwrap() > 0, "{s:?}");
}

#[test]
fn small_nodes() {
    run(256, 3000, 60_000 * numakv_pmem::crash::test_scale(), 0x1234_5678);
}

#[test]
fn default_nodes() {
    run(512, 20_000, 60_000 * numakv_pmem::crash::test_scale(), 0x9abc_def1);
}
