//! Forced schedules of the byte layer's trees (pause points listed in the crate docs).

use numakv_bytes::testkit::TINY;
use numakv_bytes::{ByteMap, Bytes};
use numakv_fastfair::FastFair;
use numakv_pmem::failpoint::Scenario;
use numakv_pmem::{Pool, PoolConfig};

fn key(i: usize) -> Vec<u8> {
    format!("key:{i:08}").into_bytes()
}

/// A scan parked between two leaves of one prefix's tree, holding the root, while writers
/// empty the root's left subtree (the root collapses onto its right child) and insert small
/// keys again, which land in the right subtree's leftmost leaf. The scan then follows the old
/// root to its right child. Had the collapse kept that child (mutating it in place under a range
/// that grew), the scan would meet the re-inserted small keys after larger ones it already
/// returned; because a removal copies the edge whose range grows, the old root's right child
/// keeps its range and the scan ascends.
#[test]
fn scan_across_a_root_collapse_stays_ascending() {
    let sc = Scenario::setup();
    let pool = Pool::volatile(PoolConfig::new(numakv_bytes::engine_id::<FastFair>(), 64 << 20))
        .expect("pool");
    let mut b = Bytes::<FastFair>::create(pool, &Default::default()).expect("create");
    b.set_tree_limits(TINY).expect("limits");
    let n = 32;
    for i in 0..n {
        b.put(&key(i), b"old").expect("put");
    }
    let h0 = b.prefix_height(&key(0)).expect("height").expect("a tree");
    assert!(h0 >= 3, "height {h0}");
    let pause = sc.pause("bytes.walk.leaf_done");
    std::thread::scope(|t| {
        let b = &b;
        let scan = t.spawn(move || {
            b.scan_prefix(b"key:", usize::MAX).map(|r| r.expect("scan").0).collect::<Vec<_>>()
        });
        pause.wait_parked();
        // Delete from the smallest key until the root loses its left child.
        let mut deleted = 0;
        while b.prefix_height(&key(0)).expect("height") == Some(h0) {
            assert!(b.delete(&key(deleted)).expect("delete"));
            deleted += 1;
            assert!(deleted < n, "the root never collapsed");
        }
        for i in 0..deleted {
            b.put(&key(i), b"new").expect("put");
        }
        pause.release();
        let got = scan.join().expect("scan thread");
        assert!(
            got.windows(2).all(|w| w[0] < w[1]),
            "scan not strictly ascending after {deleted} deletes and re-inserts: {:?}",
            got.iter().map(|k| String::from_utf8_lossy(k).into_owned()).collect::<Vec<_>>()
        );
        // Every key present throughout (the ones never deleted) was returned.
        for i in deleted..n {
            assert!(got.contains(&key(i)), "key {i}, present throughout, missing");
        }
    });
    b.check().expect("check");
}
