//! Upper-layer rebuilds and space per key after random inserts (issue 6: "upper-layer rebuilds
//! per 10M inserts"; papers/nobtree.txt §IV-C: "less than 20 reconstructions after inserting
//! 200 million keys").
//!
//! `cargo run --release -p numakv-nobtree --example rebuilds -- [KEYS] [THREADS]`
//! (defaults 2000000 and 2; 2 emulated NUMA nodes, volatile pool).

use std::sync::Arc;
use std::time::Instant;

use numakv_index::{Engine, Index};
use numakv_nobtree::{Nobtree, NobtreeOptions};
use numakv_pmem::{Pool, PoolConfig};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let keys: u64 = args.next().map(|s| s.parse()).transpose()?.unwrap_or(2_000_000);
    let threads: u64 = args.next().map(|s| s.parse()).transpose()?.unwrap_or(2);
    let mut cfg = PoolConfig::new(Nobtree::engine_id(), (keys * 64).max(64 << 20));
    cfg.nodes = 2;
    let pool = Pool::volatile(cfg)?;
    let mut opts = NobtreeOptions::default();
    opts.migration.enabled = false;
    let t = Arc::new(Nobtree::create(pool, &opts)?);
    let t0 = Instant::now();
    std::thread::scope(|s| {
        for th in 0..threads {
            let t = Arc::clone(&t);
            s.spawn(move || {
                numakv_pmem::numa::set_current_node((th % 2) as usize);
                let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ (th + 1);
                for _ in 0..keys / threads {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    t.insert(x % (u64::MAX - 2) + 1, x).expect("insert");
                }
            });
        }
    });
    let secs = t0.elapsed().as_secs_f64();
    // A rebuild requested by the last inserts may still run on the rebuild thread.
    t.drain_rebuilds();
    let st = t.stats();
    let c = |n: &str| st.counter(n).unwrap_or(0);
    let entries = t.check()?.entries;
    println!(
        "keys {entries} in {secs:.1} s; upper rebuilds {} ({:.1} per 10M inserts); subindexes \
         split {}; upper inserts failed {}; upper bytes/replica {}; PM {} B ({:.1} B/key); \
         node bytes {} ({:.1} B/key)",
        c("upper_rebuilds"),
        c("upper_rebuilds") as f64 * 1e7 / entries as f64,
        c("subindex_splits"),
        c("upper_insert_failed"),
        c("upper_bytes_per_replica"),
        st.pm_bytes(),
        st.pm_bytes() as f64 / entries as f64,
        c("node_bytes_allocated"),
        c("node_bytes_allocated") as f64 / entries as f64,
    );
    Ok(())
}
