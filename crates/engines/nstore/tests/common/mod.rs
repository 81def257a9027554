//! Helpers of the NStore scenario tests: small stores (few clusters, one-page files) in ADR
//! shadow mode, a model to compare against, and reopening.

#![allow(dead_code)] // each test file uses a subset

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use numakv_index::{Engine, Index};
use numakv_nstore::{NStore, NStoreOptions};
use numakv_pmem::{OpenConfig, PersistMode, Pool, PoolConfig, SimMode};

/// Small files and clusters so that files fill and GC has work; no GC threads (tests drive GC
/// with `collect_garbage` so that a crash can be aimed at it).
pub fn opts() -> NStoreOptions {
    NStoreOptions {
        clusters: 4,
        log_file_size: 16 << 10,
        gc_threads_per_node: 0,
        recovery_threads: 2,
        ..Default::default()
    }
}

/// A new store in `dir` with 2 nodes of 64 MiB and 4 KiB pages.
pub fn create(dir: &Path, mode: PersistMode, sim: SimMode, o: &NStoreOptions) -> NStore {
    let mut cfg = PoolConfig::new(NStore::engine_id(), 64 << 20);
    cfg.nodes = 2;
    cfg.page_size = 4 << 10;
    cfg.mode = mode;
    cfg.sim = sim;
    let pool = Pool::create(dir, cfg).expect("create pool");
    NStore::create(pool, o).expect("create nstore")
}

/// Opens (recovers) the store in `dir`; returns it with its pool and report counters.
pub fn open(
    dir: &Path,
    sim: SimMode,
    o: &NStoreOptions,
) -> (NStore, Arc<Pool>, Vec<(&'static str, u64)>) {
    let mut oc = OpenConfig::new(NStore::engine_id());
    oc.sim = sim;
    let pool = Pool::open(dir, oc).expect("open pool");
    let (s, r) = NStore::open(pool.clone(), o).expect("open nstore");
    (s, pool, r.counters)
}

/// Counter `name` of a list.
pub fn counter(c: &[(&'static str, u64)], name: &str) -> u64 {
    c.iter().find(|(n, _)| *n == name).map_or(0, |x| x.1)
}

/// Asserts that `s` holds exactly `model` (gets, a full scan, `check()` with no leak).
pub fn verify(s: &NStore, model: &BTreeMap<u64, u64>, ctx: &str) {
    for (&k, &v) in model {
        assert_eq!(s.get(k).unwrap(), Some(v), "{ctx}: key {k}");
    }
    let mut out = Vec::new();
    s.scan(1, usize::MAX, &mut out).unwrap();
    let want: Vec<(u64, u64)> = model.iter().map(|(&k, &v)| (k, v)).collect();
    assert_eq!(out.len(), want.len(), "{ctx}: scan length");
    assert_eq!(out, want, "{ctx}: scan");
    let r = s.check().unwrap_or_else(|e| panic!("{ctx}: check: {e}"));
    assert_eq!(r.entries, model.len() as u64, "{ctx}: entries");
    assert_eq!(r.reachable_blocks, r.allocated_blocks, "{ctx}: leak");
}

/// Loads keys `1..=n` from both nodes, then updates 3/4 of them twice and deletes every
/// tenth key, so that most sealed files pass the GC threshold. Returns the model.
pub fn churn(s: &NStore, n: u64) -> BTreeMap<u64, u64> {
    let mut model = BTreeMap::new();
    for k in 1..=n {
        numakv_numa::set_current_node((k % 2) as usize);
        assert!(s.insert(k, k).unwrap());
        model.insert(k, k);
    }
    for round in 1..=2u64 {
        for k in 1..=n {
            numakv_numa::set_current_node(((k + round) % 2) as usize);
            if k % 4 != 0 {
                assert!(s.update(k, k * 10 + round).unwrap());
                model.insert(k, k * 10 + round);
            }
        }
    }
    for k in (10..=n).step_by(10) {
        assert!(s.remove(k).unwrap());
        model.remove(&k);
    }
    numakv_numa::set_current_node(0);
    model
}
