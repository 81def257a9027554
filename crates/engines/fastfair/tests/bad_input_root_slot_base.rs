//! Bad root slot bases and misuse of a shared pool get typed errors, never a panic and never a
//! damaged tree: a base whose slots do not fit in the pool header, opening at the wrong base,
//! a second tree through `Engine::create` in a pool whose NSM already holds nodes, an NSM of
//! another pool, and reopening with an NSM recovered without the tree's nodes.

mod common;

use std::sync::Arc;

use numakv_fastfair::{FastFair, FastFairOptions};
use numakv_index::{Engine, Error, Index};
use numakv_pmem::alloc::nsm::{Nsm, NsmMode};
use numakv_pmem::{OpenConfig, PersistMode, Pool, SimMode, ROOT_SLOTS};

fn at(base: usize) -> FastFairOptions {
    FastFairOptions { root_slot_base: base, node_size: 256, ..Default::default() }
}

fn volatile_pool() -> Arc<Pool> {
    Pool::volatile(common::pool_cfg(PersistMode::Adr, SimMode::Direct)).unwrap()
}

#[test]
fn bases_outside_the_header_are_invalid_options() {
    for base in [ROOT_SLOTS - 1, ROOT_SLOTS, 1000, usize::MAX] {
        let pool = volatile_pool();
        let e = FastFair::create(Arc::clone(&pool), &at(base)).unwrap_err();
        assert!(matches!(e, Error::InvalidOptions(_)), "base {base}: {e}");
        assert!(e.to_string().contains("root_slot_base"), "{e}");
        let nsm = Nsm::new(Arc::clone(&pool), NsmMode::Local).unwrap();
        let e = FastFair::create_with(Arc::clone(&pool), nsm, &at(base)).unwrap_err();
        assert!(matches!(e, Error::InvalidOptions(_)), "base {base}: {e}");
        assert!(matches!(FastFair::reachable(&pool, &at(base)), Err(Error::InvalidOptions(_))));
        assert!(matches!(FastFair::open(pool, &at(base)), Err(Error::InvalidOptions(_))));
    }
    // The last base that fits works, and leaves the slots below it alone.
    let pool = volatile_pool();
    let t = FastFair::create(Arc::clone(&pool), &at(ROOT_SLOTS - 2)).unwrap();
    t.insert(5, 6).unwrap();
    assert_eq!(t.get(5).unwrap(), Some(6));
    for s in 0..ROOT_SLOTS - 2 {
        assert_eq!(pool.root(s).unwrap().load(std::sync::atomic::Ordering::Relaxed), 0);
    }
}

#[test]
fn opening_at_the_wrong_base_is_an_error() {
    let d = tempfile::tempdir().unwrap();
    let pool = Pool::create(d.path(), common::pool_cfg(PersistMode::Adr, SimMode::Direct)).unwrap();
    let t = FastFair::create(pool, &at(4)).unwrap();
    for k in 1..=500 {
        t.insert(k, k).unwrap();
    }
    t.close().unwrap();
    for base in [0, 3, 5] {
        let pool = Pool::open(d.path(), OpenConfig::new(FastFair::engine_id())).unwrap();
        let e = FastFair::open(pool, &at(base)).unwrap_err();
        assert!(matches!(e, Error::Corrupted { .. }), "base {base}: {e}");
        assert!(e.to_string().contains("root_slot_base"), "{e}");
    }
    // Nothing was modified: the right base opens the tree intact.
    let pool = Pool::open(d.path(), OpenConfig::new(FastFair::engine_id())).unwrap();
    let (t, _) = FastFair::open(pool, &at(4)).unwrap();
    assert_eq!(t.check().unwrap().entries, 500);
}

#[test]
fn shared_pool_misuse_is_refused() {
    let pool = volatile_pool();
    let first = FastFair::create(Arc::clone(&pool), &at(0)).unwrap();
    first.insert(1, 1).unwrap();
    // A second tree through Engine::create would get an NSM of its own over the same pages.
    assert!(FastFair::create(Arc::clone(&pool), &at(2)).is_err());
    // The same slots twice.
    let e = FastFair::create_with(Arc::clone(&pool), Arc::clone(first.nsm()), &at(0)).unwrap_err();
    assert!(matches!(e, Error::InvalidOptions(_)), "{e}");
    // An NSM of another pool.
    let other = volatile_pool();
    let foreign = Nsm::new(other, NsmMode::Local).unwrap();
    let e = FastFair::create_with(Arc::clone(&pool), foreign, &at(2)).unwrap_err();
    assert!(matches!(e, Error::InvalidOptions(_)), "{e}");
    assert_eq!(first.get(1).unwrap(), Some(1));

    // open_with with an NSM recovered without the tree's nodes is refused before any repair.
    let d = tempfile::tempdir().unwrap();
    let pool = Pool::create(d.path(), common::pool_cfg(PersistMode::Adr, SimMode::Direct)).unwrap();
    let t = FastFair::create(pool, &at(0)).unwrap();
    for k in 1..=300 {
        t.insert(k, k).unwrap();
    }
    t.close().unwrap();
    let pool = Pool::open(d.path(), OpenConfig::new(FastFair::engine_id())).unwrap();
    let reachable = FastFair::reachable(&pool, &at(0)).unwrap();
    let (nsm, _) =
        Nsm::recover(Arc::clone(&pool), NsmMode::Local, reachable[..1].to_vec()).unwrap();
    let e = FastFair::open_with(Arc::clone(&pool), nsm, &at(0)).unwrap_err();
    assert!(matches!(e, Error::Corrupted { .. }), "{e}");
}
