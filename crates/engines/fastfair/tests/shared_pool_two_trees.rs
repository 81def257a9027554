//! Two independent FAST&FAIR trees in one pool, at different root slot bases and with different
//! node sizes, sharing one NSM allocator (as an embedding engine such as F3-tree would): create,
//! fill, close, reopen both (NSM recovered with the union of their nodes), check; then a power
//! failure in shadow mode while both grow and shrink, and the same recovery. Neither tree's
//! recovery may reclaim the other's nodes.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use common::{vk, Rng};
use numakv_fastfair::{FastFair, FastFairOptions};
use numakv_index::{CheckReport, Engine, Index};
use numakv_pmem::alloc::nsm::{Nsm, NsmMode};
use numakv_pmem::{CrashOptions, OpenConfig, PersistMode, Pool, SimMode};

fn opts(base: usize, node_size: usize) -> FastFairOptions {
    FastFairOptions { node_size, root_slot_base: base, ..Default::default() }
}

const A: (usize, usize) = (0, 256);
const B: (usize, usize) = (10, 512);

/// Reopens both trees: NSM recovered with the nodes of both, then each tree's own repair.
fn reopen_both(dir: &Path, sim: SimMode) -> (Arc<Pool>, FastFair, FastFair) {
    let mut c = OpenConfig::new(FastFair::engine_id());
    c.sim = sim;
    let pool = Pool::open(dir, c).unwrap();
    let (oa, ob) = (opts(A.0, A.1), opts(B.0, B.1));
    let mut reachable = FastFair::reachable(&pool, &oa).unwrap();
    reachable.extend(FastFair::reachable(&pool, &ob).unwrap());
    let (nsm, _) = Nsm::recover(Arc::clone(&pool), NsmMode::Local, reachable).unwrap();
    // The options ask for lazy recovery (the default); `open_with` repairs eagerly all the same:
    // the embedder has collected the shared NSM already, no background pass is started.
    assert_eq!(oa.recovery, numakv_fastfair::RecoveryMode::Lazy);
    let (a, ra) = FastFair::open_with(Arc::clone(&pool), Arc::clone(&nsm), &oa).unwrap();
    // The stored node size wins: a different one in the options is ignored at open.
    let (b, rb) = FastFair::open_with(Arc::clone(&pool), nsm, &opts(B.0, 4096)).unwrap();
    assert_eq!((a.node_size(), b.node_size()), (A.1, B.1));
    for (t, r) in [(&a, &ra), (&b, &rb)] {
        assert!(r.counters.iter().all(|c| c.0 != "deferred"), "{r:?}");
        assert!(r.counters.iter().any(|c| c.0 == "nodes"), "{r:?}");
        assert!(!t.recovery_pending());
        assert!(t.wait_recovery().unwrap().is_none(), "open_with started a background pass");
    }
    (pool, a, b)
}

/// Both trees check, hold their models, and together hold every allocated block.
fn verify(a: &FastFair, b: &FastFair, ma: &BTreeMap<u64, u64>, mb: &BTreeMap<u64, u64>) {
    let (ra, rb): (CheckReport, CheckReport) = (a.check().unwrap(), b.check().unwrap());
    assert_eq!(common::contents(a), *ma);
    assert_eq!(common::contents(b), *mb);
    assert_eq!(ra.allocated_blocks, rb.allocated_blocks, "one NSM");
    assert_eq!(ra.reachable_blocks + rb.reachable_blocks, ra.allocated_blocks, "{ra:?} {rb:?}");
}

fn create_both(dir: &Path, sim: SimMode) -> (Arc<Pool>, FastFair, FastFair) {
    let pool = Pool::create(dir, common::pool_cfg(PersistMode::Adr, sim)).unwrap();
    let nsm = Nsm::new(Arc::clone(&pool), NsmMode::Local).unwrap();
    let a = FastFair::create_with(Arc::clone(&pool), Arc::clone(&nsm), &opts(A.0, A.1)).unwrap();
    let b = FastFair::create_with(Arc::clone(&pool), nsm, &opts(B.0, B.1)).unwrap();
    (pool, a, b)
}

#[test]
fn two_trees_create_fill_close_open_check() {
    let d = tempfile::tempdir().unwrap();
    let (pool, a, b) = create_both(d.path(), SimMode::Direct);
    let (mut ma, mut mb) = (BTreeMap::new(), BTreeMap::new());
    // The same keys in both, with different values; enough for several levels each.
    for k in 1..=6000u64 {
        a.insert(k, vk(k)).unwrap();
        ma.insert(k, vk(k));
        b.insert(k, !vk(k)).unwrap();
        mb.insert(k, !vk(k));
    }
    // Shrink one of them (merges retire blocks into the shared NSM).
    for k in (1..=6000u64).filter(|k| k % 5 != 0) {
        a.remove(k).unwrap();
        ma.remove(&k);
    }
    assert!(a.stats().counter("root_shrinks").unwrap() > 0);
    assert_eq!(common::contents(&a), ma);
    assert_eq!(common::contents(&b), mb);
    drop((a, b));
    pool.close().unwrap();
    drop(pool);

    let (pool, a, b) = reopen_both(d.path(), SimMode::Direct);
    assert!(pool.was_clean());
    verify(&a, &b, &ma, &mb);
    // Both keep working in the shared pool.
    for k in 6001..=7000u64 {
        a.insert(k, vk(k)).unwrap();
        ma.insert(k, vk(k));
        b.remove(k - 6000).unwrap();
        mb.remove(&(k - 6000));
    }
    assert_eq!(common::contents(&a), ma);
    assert_eq!(common::contents(&b), mb);
    drop((a, b));
    pool.close().unwrap();
    drop(pool);
    let (_pool, a, b) = reopen_both(d.path(), SimMode::Direct);
    verify(&a, &b, &ma, &mb);
}

#[test]
fn two_trees_survive_a_power_failure() {
    let d = tempfile::tempdir().unwrap();
    let (pool, a, b) = create_both(d.path(), SimMode::Shadow);
    let (mut ma, mut mb) = (BTreeMap::new(), BTreeMap::new());
    let mut rng = Rng(77);
    for _ in 0..4000 {
        let k = 1 + rng.below(3000);
        let (t, m) = if rng.below(2) == 0 { (&a, &mut ma) } else { (&b, &mut mb) };
        if rng.below(3) == 0 {
            t.remove(k).unwrap();
            m.remove(&k);
        } else {
            t.upsert(k, vk(k) ^ rng.below(2)).unwrap();
            m.insert(k, t.get(k).unwrap().unwrap());
        }
    }
    // Every operation returned, so every one is durable; the crash loses nothing but may
    // evict any dirty line (none should matter).
    pool.crash(CrashOptions::random(5)).unwrap();
    drop((a, b));
    drop(pool);
    let (pool, a, b) = reopen_both(d.path(), SimMode::Shadow);
    assert!(!pool.was_clean());
    verify(&a, &b, &ma, &mb);
}
