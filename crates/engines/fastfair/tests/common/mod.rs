//! Helpers shared by the scenario files.
#![allow(dead_code)]

use std::path::Path;
use std::sync::Arc;

use numakv_fastfair::{FastFair, FastFairOptions};
use numakv_index::Engine;
use numakv_pmem::{OpenConfig, PersistMode, Pool, PoolConfig, SimMode};

pub const CAP: u64 = 64 << 20;

pub fn opts(node_size: usize) -> FastFairOptions {
    FastFairOptions { node_size, ..Default::default() }
}

pub fn pool_cfg(mode: PersistMode, sim: SimMode) -> PoolConfig {
    let mut c = PoolConfig::new(FastFair::engine_id(), CAP);
    c.mode = mode;
    c.sim = sim;
    c
}

/// A volatile ADR pool (no files).
pub fn volatile(node_size: usize) -> FastFair {
    let pool = Pool::volatile(pool_cfg(PersistMode::Adr, SimMode::Direct)).unwrap();
    FastFair::create(pool, &opts(node_size)).unwrap()
}

/// A store in `dir`.
pub fn create(dir: &Path, mode: PersistMode, sim: SimMode, node_size: usize) -> FastFair {
    let pool = Pool::create(dir, pool_cfg(mode, sim)).unwrap();
    FastFair::create(pool, &opts(node_size)).unwrap()
}

/// Reopens the store in `dir` (recovery included).
pub fn reopen(dir: &Path, sim: SimMode) -> (FastFair, numakv_index::RecoveryReport) {
    let mut c = OpenConfig::new(FastFair::engine_id());
    c.sim = sim;
    let pool: Arc<Pool> = Pool::open(dir, c).unwrap();
    FastFair::open(pool, &FastFairOptions::default()).unwrap()
}

/// Small deterministic PRNG (xorshift) so tests need no seeds from outside.
pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}
