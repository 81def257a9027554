//! Single-threaded scenarios: many inserts, updates, deletes, scans, check() and reopen, on
//! tiny and default leaves.

use numakv_index::{Engine, Index};
use numakv_nbtree::{NbTree, NbTreeOptions};
use numakv_pmem::{Pool, PoolConfig};

fn tree(slots: usize) -> NbTree {
    let pool = Pool::volatile(PoolConfig::new(NbTree::engine_id(), 64 << 20)).unwrap();
    NbTree::create(pool, &NbTreeOptions { leaf_slots: slots, ..Default::default() }).unwrap()
}

#[test]
fn many_inserts_then_check() {
    for slots in [3, 31, 63] {
        let t = tree(slots);
        let n = 20_000u64;
        for i in 0..n {
            let k = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) % 1_000_000_007 + 1;
            t.insert(k, k ^ u64::MAX).unwrap();
        }
        let r = t.check().unwrap();
        assert_eq!(r.entries, n);
        for i in 0..n {
            let k = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) % 1_000_000_007 + 1;
            assert_eq!(t.get(k).unwrap(), Some(k ^ u64::MAX));
        }
        let mut out = Vec::new();
        t.scan(0, usize::MAX, &mut out).unwrap();
        assert_eq!(out.len() as u64, n);
        assert!(out.windows(2).all(|w| w[0].0 < w[1].0));
        drop(t);
    }
}
