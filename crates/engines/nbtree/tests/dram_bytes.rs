//! `stats().dram_bytes` against a hand count: the leaf metadata records and inner nodes found by
//! walking the structure, at their `size_of` (`repro space` quotes this figure per key). It used
//! to multiply *allocated PM blocks* by `size_of::<LeafMeta>() + 5 × slots`, counting the
//! inline fingerprint and tag arrays twice and leaving the inner nodes out.

use std::mem::size_of;
use std::sync::Arc;
use std::thread;

use numakv_index::{Engine, Index};
use numakv_nbtree::inner::Inner;
use numakv_nbtree::leaf::LeafMeta;
use numakv_nbtree::{testing, NbTree, NbTreeOptions};
use numakv_pmem::{OpenConfig, PersistMode, Pool, PoolConfig};

fn hand_count(t: &NbTree) -> u64 {
    let (leaves, inners) = testing::count_nodes(t);
    leaves * size_of::<LeafMeta>() as u64 + inners * size_of::<Inner>() as u64
}

#[test]
fn dram_bytes_is_leaf_metadata_plus_inner_nodes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    let mut cfg = PoolConfig::new(NbTree::engine_id(), 256 << 20);
    cfg.nodes = 1;
    cfg.mode = PersistMode::Eadr;
    // 4-slot leaves: thousands of SMOs and a three-level inner tree from 20 k keys.
    let opts = NbTreeOptions { leaf_slots: 4, ..Default::default() };
    let t = Arc::new(NbTree::create(Pool::create(&path, cfg).unwrap(), &opts).unwrap());
    // A fresh tree: one leaf, one inner node (the root), known without walking.
    let fresh = (size_of::<LeafMeta>() + size_of::<Inner>()) as u64;
    assert_eq!(t.stats().dram_bytes, fresh);

    let workers: Vec<_> = (0..2u64)
        .map(|w| {
            let t = Arc::clone(&t);
            thread::spawn(move || {
                for i in 0..10_000u64 {
                    let k = (i * 2 + w).wrapping_mul(0x9E37_79B9_7F4A_7C15) % 1_000_000 + 1;
                    t.upsert(k, i).unwrap();
                    if i % 3 == 0 {
                        t.remove(k).unwrap();
                    }
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    let (leaves, inners) = testing::count_nodes(&t);
    assert!(leaves > 2_000 && inners > 40, "the run made SMOs and inner splits: {leaves} {inners}");
    assert_eq!(t.stats().dram_bytes, hand_count(&t), "{leaves} leaves, {inners} inner nodes");
    t.check().unwrap();
    let before = t.stats().dram_bytes;
    drop(t); // a crash: recovery rebuilds the DRAM layer from PM

    let pool = Pool::open(&path, OpenConfig::new(NbTree::engine_id())).unwrap();
    let (t, _) = NbTree::open(pool, &opts).unwrap();
    // Recovery packs the inner levels anew, so the figure may differ from before the crash;
    // the leaves are the same ones.
    assert_eq!(testing::count_nodes(&t).0, leaves);
    assert_eq!(t.stats().dram_bytes, hand_count(&t));
    eprintln!(
        "dram_bytes: {before} before the crash, {} after recovery ({leaves} leaves of {} B, \
         inner nodes of {} B)",
        t.stats().dram_bytes,
        size_of::<LeafMeta>(),
        size_of::<Inner>()
    );
}
