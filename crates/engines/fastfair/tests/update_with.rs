//! `Index::update_with` on FAST&FAIR: one descent under the leaf lock.

use numakv_fastfair::FastFair;
use numakv_index::testkit::scenario::check_update_with_semantics;
use numakv_index::{Engine, Index};
use numakv_pmem::{Pool, PoolConfig};

fn tree() -> FastFair {
    let pool = Pool::volatile(PoolConfig::new(FastFair::engine_id(), 64 << 20)).expect("pool");
    FastFair::create(pool, &Default::default()).expect("create")
}

#[test]
fn replaces_present_keys_only_and_keeps_the_value_on_error() {
    check_update_with_semantics(&tree());
}

/// Threads incrementing one key through `update_with` while others insert around it (splits
/// of its leaf): the leaf lock excludes the other writers, so no increment is lost.
#[test]
fn increments_under_the_leaf_lock_are_not_lost() {
    let t = tree();
    t.upsert(5_000, 0).expect("upsert");
    let per = 20_000u64;
    std::thread::scope(|s| {
        for w in 0..3u64 {
            let t = &t;
            s.spawn(move || {
                for i in 0..per {
                    t.update_with(5_000, &mut |v| Ok(Some(v + 1))).expect("update_with");
                    // Splits of the neighbourhood while the counter moves.
                    let k = 1 + (i * 3 + w) % 9_998;
                    if k != 5_000 {
                        t.upsert(k, i).expect("upsert");
                    }
                }
            });
        }
    });
    assert_eq!(t.get(5_000).expect("get"), Some(3 * per));
    t.check().expect("check");
}
