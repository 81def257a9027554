//! `open()` time after a crash versus key count, eager recovery against lazy (instant) recovery,
//! in one run. Each store is loaded with uniformly random keys, then dropped without `close()`
//! (an unclean shutdown: in direct mode a dropped store is a process kill); then, per mode and
//! repetition, the pool is opened (`Pool::open`, which scans the page descriptor table), the tree
//! is opened, one get runs, and — lazy — the background recovery is waited for. Every session
//! ends unclean again, so each open recovers a crashed store. Medians over the repetitions, after
//! one unmeasured round per mode.
//!
//! ```sh
//! cargo run --release -p numakv-fastfair --example open_time -- [keys=100000,1000000] [reps=3] [node_size=512]
//! ```

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use numakv_fastfair::{FastFair, FastFairOptions, RecoveryMode};
use numakv_index::{Engine, Index};
use numakv_pmem::{OpenConfig, PersistMode, Pool, PoolConfig};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// One recovery: pool open, tree open, first get, background pass (lazy).
struct Sample {
    pool_open: Duration,
    open: Duration,
    first_get: Duration,
    background: Duration,
}

fn recover(
    dir: &Path,
    recovery: RecoveryMode,
    probe: u64,
) -> Result<Sample, Box<dyn std::error::Error>> {
    let t0 = Instant::now();
    let pool: Arc<Pool> = Pool::open(dir, OpenConfig::new(FastFair::engine_id()))?;
    let pool_open = t0.elapsed();
    let t1 = Instant::now();
    let (tree, report) = FastFair::open(pool, &FastFairOptions { recovery, ..Default::default() })?;
    let open = t1.elapsed();
    assert!(!report.was_clean);
    let t2 = Instant::now();
    assert_eq!(tree.get(probe)?, Some(probe));
    let first_get = t2.elapsed();
    tree.wait_recovery()?;
    let background = t1.elapsed();
    drop(tree); // unclean again: the next open recovers a crashed store
    Ok(Sample { pool_open, open, first_get, background })
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64() * 1e3)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let sizes: Vec<usize> = args
        .first()
        .map(|s| s.split(',').filter_map(|x| x.parse().ok()).collect())
        .unwrap_or_else(|| vec![100_000, 1_000_000]);
    let reps: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(3);
    let node_size: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(512);
    let shm = Path::new("/dev/shm");
    let base = if shm.is_dir() { tempfile::tempdir_in(shm)? } else { tempfile::tempdir()? };

    println!(
        "| keys | nodes | eager: pool open + tree open (ms) | lazy: pool open (ms) | lazy: tree open (ms) \
         | lazy: first get (µs) | lazy: background pass done (ms) |"
    );
    println!("|---|---|---|---|---|---|---|");
    for &n in &sizes {
        let dir = base.path().join(format!("k{n}"));
        let mut cfg = PoolConfig::new(FastFair::engine_id(), 1 << 30);
        cfg.mode = PersistMode::Adr;
        let tree = FastFair::create(
            Pool::create(&dir, cfg)?,
            &FastFairOptions { node_size, ..Default::default() },
        )?;
        let mut rng = SmallRng::seed_from_u64(n as u64);
        let mut probe = 0;
        let mut loaded = 0;
        while loaded < n {
            let k = rng.gen_range(1..u64::MAX - 1);
            if tree.insert(k, k)? {
                loaded += 1;
                probe = k;
            }
        }
        let nodes = tree.check()?.reachable_blocks;
        drop(tree); // the crash

        // One unmeasured round per mode: the first opens of a process pay one-time costs (page
        // faults of fresh allocations, the first thread spawns) that are not recovery.
        recover(&dir, RecoveryMode::Eager, probe)?;
        recover(&dir, RecoveryMode::Lazy, probe)?;
        let (mut eager, mut lazy) = (Vec::new(), Vec::new());
        for _ in 0..reps {
            eager.push(recover(&dir, RecoveryMode::Eager, probe)?);
            lazy.push(recover(&dir, RecoveryMode::Lazy, probe)?);
        }
        let col = |v: &[Sample], f: fn(&Sample) -> Duration| median(v.iter().map(f).collect());
        println!(
            "| {n} | {nodes} | {} | {} | {} | {:.1} | {} |",
            ms(col(&eager, |s| s.pool_open + s.open)),
            ms(col(&lazy, |s| s.pool_open)),
            ms(col(&lazy, |s| s.open)),
            col(&lazy, |s| s.first_get).as_secs_f64() * 1e6,
            ms(col(&lazy, |s| s.background)),
        );
        std::fs::remove_dir_all(&dir)?;
    }
    Ok(())
}
