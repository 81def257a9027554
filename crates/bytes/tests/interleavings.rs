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

/// Leaf writers inside one prefix's tree hold the prefix's lock shared: with a writer parked
/// after building its new leaf (holding that leaf's slot lock), a write to another leaf of the
/// same prefix completes, and a write to the parked writer's leaf waits for it and builds on
/// its leaf — no update is lost (without the slot lock the second write would publish a leaf
/// without the first one's value, which the first then overwrites).
#[test]
fn leaf_writers_of_one_prefix_run_in_parallel_without_losing_updates() {
    let sc = Scenario::setup();
    let pool = Pool::volatile(PoolConfig::new(numakv_bytes::engine_id::<FastFair>(), 64 << 20))
        .expect("pool");
    let mut b = Bytes::<FastFair>::create(pool, &Default::default()).expect("create");
    b.set_tree_limits(numakv_bytes::TreeLimits {
        leaf_entries: 4,
        leaf_bytes: 1024,
        inner_children: 4,
        inner_bytes: 4096,
        cell_value: numakv_bytes::CELL_MAX_VALUE,
    })
    .expect("limits");
    let n = 64;
    for i in 0..n {
        b.put(&key(i), b"old").expect("put");
    }
    // Another write that sees the tree, so that the stripe's hint says "tree".
    b.put(&key(n / 2), b"old").expect("put");
    let leaf = |i: usize| b.leaf_of(&key(i)).expect("leaf_of").expect("present");
    let same = (1..n).find(|&i| leaf(i) == leaf(0)).expect("a neighbour of key 0 in its leaf");
    let other = (1..n).rev().find(|&i| leaf(i) != leaf(0)).expect("a key in another leaf");
    let pause = sc.pause_thread("bytes.write.leaf_built", "writer-a");
    let c_done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|t| {
        let b = &b;
        let a = std::thread::Builder::new()
            .name("writer-a".into())
            .spawn_scoped(t, move || b.update(&key(0), b"from a").expect("update a"))
            .expect("spawn");
        pause.wait_parked();
        // Another leaf of the same prefix: not held up by the parked writer.
        assert!(b.update(&key(other), b"from b").expect("update b"));
        let c_done = &c_done;
        let c = t.spawn(move || {
            let r = b.update(&key(same), b"from c").expect("update c");
            c_done.store(true, std::sync::atomic::Ordering::SeqCst);
            r
        });
        std::thread::sleep(std::time::Duration::from_millis(200));
        // Read before releasing: a failed assertion while the writer is parked would leave the
        // scope waiting for it.
        let c_finished_early = c_done.load(std::sync::atomic::Ordering::SeqCst);
        pause.release();
        assert!(a.join().expect("writer a"));
        assert!(
            !c_finished_early,
            "a write to the parked writer's leaf finished while it was parked"
        );
        assert!(c.join().expect("writer c"));
    });
    assert_eq!(b.get(&key(0)).expect("get").as_deref(), Some(&b"from a"[..]));
    assert_eq!(b.get(&key(same)).expect("get").as_deref(), Some(&b"from c"[..]));
    assert_eq!(b.get(&key(other)).expect("get").as_deref(), Some(&b"from b"[..]));
    b.check().expect("check");
}
