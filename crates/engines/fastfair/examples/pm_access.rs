//! PM lines read/written, flushes and fences per operation of FAST&FAIR, one thread, uniform
//! random keys over a preloaded tree (the nbtree Table I style of measurement).
//!
//! ```sh
//! cargo run --release -p numakv-fastfair --example pm_access -- [preload=1000000] [ops=100000] [node_size=512] [adr|eadr]
//! ```

use std::collections::HashSet;

use numakv_fastfair::{FastFair, FastFairOptions};
use numakv_index::{Engine, Index};
use numakv_pmem::{account, PersistMode, Pool, PoolConfig};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize, d: usize| args.get(i).and_then(|s| s.parse().ok()).unwrap_or(d);
    let preload = arg(0, 1_000_000);
    let ops = arg(1, 100_000);
    let node_size = arg(2, 512);
    let mode = match args.get(3).map(String::as_str) {
        Some("eadr") => PersistMode::Eadr,
        _ => PersistMode::Adr,
    };

    let mut cfg = PoolConfig::new(FastFair::engine_id(), 1 << 30);
    cfg.mode = mode;
    let pool = Pool::volatile(cfg)?;
    let tree = FastFair::create(pool, &FastFairOptions { node_size, ..Default::default() })?;

    let mut rng = SmallRng::seed_from_u64(42);
    let mut keys = Vec::with_capacity(preload);
    let mut present = HashSet::with_capacity(preload + ops);
    let t0 = std::time::Instant::now();
    while keys.len() < preload {
        let k = rng.gen_range(1..u64::MAX - 1);
        if tree.insert(k, k)? {
            keys.push(k);
            present.insert(k);
        }
    }
    eprintln!("preloaded {preload} keys in {:.2?}", t0.elapsed());

    account::set_enabled(true);
    println!("FAST&FAIR, {mode:?}, node {node_size} B, {preload} keys preloaded, {ops} ops each, 1 thread, uniform keys");
    println!(
        "{:<8} {:>12} {:>12} {:>10} {:>10}",
        "op", "lines read", "lines written", "flushes", "fences"
    );
    let mut measure =
        |name: &str, f: &mut dyn FnMut(&mut SmallRng) -> Result<(), numakv_index::Error>| {
            account::op_discard();
            let before = account::thread_stats();
            for _ in 0..ops {
                f(&mut rng)?;
                account::op_end();
            }
            let d = account::thread_stats().since(&before);
            let per = |x: u64| x as f64 / d.ops.max(1) as f64;
            println!(
                "{:<8} {:>12.2} {:>12.2} {:>10.2} {:>10.2}",
                name,
                per(d.reads()),
                per(d.writes()),
                per(d.flushes),
                per(d.fences)
            );
            Ok::<(), numakv_index::Error>(())
        };

    measure("search", &mut |r| {
        let k = keys[r.gen_range(0..keys.len())];
        assert_eq!(tree.get(k)?, Some(k));
        Ok(())
    })?;
    measure("update", &mut |r| {
        let k = keys[r.gen_range(0..keys.len())];
        assert!(tree.update(k, !k)?);
        Ok(())
    })?;
    let mut fresh = Vec::with_capacity(ops);
    measure("insert", &mut |r| loop {
        let k = r.gen_range(1..u64::MAX - 1);
        if !present.contains(&k) {
            assert!(tree.insert(k, k)?);
            present.insert(k);
            fresh.push(k);
            return Ok(());
        }
    })?;
    let mut victims = keys.clone();
    let mut i = 0;
    measure("delete", &mut |r| {
        let j = r.gen_range(i..victims.len());
        victims.swap(i, j);
        assert!(tree.remove(victims[i])?);
        i += 1;
        Ok(())
    })?;
    account::set_enabled(false);
    let st = tree.stats();
    eprintln!("stats: {:?}", st.counters);
    tree.check()?;
    Ok(())
}
