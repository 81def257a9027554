//! Writers under the byte layer over NBTree on two nodes, enough keys for many leaf SMOs: each
//! SMO needs a Calloc log slot, and a thread's slots return only after a grace period, which
//! NBTree waits for unpinned. The layer once held an epoch pin across the engine's write, so
//! that wait could never end and writes failed with OutOfSpace ("64 bytes requested").

use std::sync::Arc;

use numakv_bytes::{engine_id, ByteMap, Bytes};
use numakv_nbtree::NbTree;
use numakv_pmem::{numa, Pool, PoolConfig};

#[test]
fn writers_survive_nbtree_smos() {
    let mut cfg = PoolConfig::new(engine_id::<NbTree>(), 256 << 20);
    cfg.nodes = 2;
    let pool = Pool::volatile(cfg).unwrap();
    let b = Arc::new(Bytes::<NbTree>::create(pool, &Default::default()).unwrap());
    let keys = 20_000u64 * numakv_pmem::crash::test_scale() as u64;
    std::thread::scope(|s| {
        for t in 0..2u64 {
            let b = Arc::clone(&b);
            s.spawn(move || {
                numa::set_current_node(t as usize);
                let value = [t as u8; 100];
                for i in 0..keys {
                    // Scattered keys: splits all over the tree.
                    let k = (i * 2 + t).wrapping_mul(0x9E37_79B9_7F4A_7C15).to_be_bytes();
                    b.put(&[&k[..], b"-padding"].concat(), &value)
                        .unwrap_or_else(|e| panic!("thread {t}, put #{i}: {e}"));
                }
            });
        }
    });
    let r = b.check().unwrap();
    assert_eq!(r.entries, 2 * keys);
}
