//! Open time against key count (issue 21), a measurement run by hand:
//! `cargo test --release -p numakv-f3tree --test open_time -- --ignored --nocapture`.
//!
//! `open` reads the directory, the FOs still linked and NSM's extents; the tree's walk, NSM's
//! collection and the tree's repairs run in the background pass afterwards (what `open` did
//! before returning until issue 21). The test asserts that at the largest size `open` takes less
//! than a tenth of that pass.

use std::time::{Duration, Instant};

use numakv_f3tree::{F3Tree, F3TreeOptions};
use numakv_index::{Engine, Index};
use numakv_pmem::{OpenConfig, Pool, PoolConfig};

#[test]
#[ignore = "a measurement: run by hand with --ignored --nocapture"]
fn open_time_against_key_count() {
    let scratch = if std::path::Path::new("/dev/shm").is_dir() { "/dev/shm" } else { "/tmp" };
    let mut last = None;
    println!("| keys | open | background pass | open / pass |");
    println!("|---:|---:|---:|---:|");
    for keys in [10_000u64, 100_000, 400_000] {
        let dir = tempfile::tempdir_in(scratch).unwrap();
        let path = dir.path().join("store");
        let mut cfg = PoolConfig::new(F3Tree::engine_id(), 256 << 20);
        cfg.nodes = 2;
        let t =
            F3Tree::create(Pool::create(&path, cfg).unwrap(), &F3TreeOptions::default()).unwrap();
        for i in 0..keys {
            t.upsert(i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 2 | 1, i).unwrap();
        }
        assert!(t.wait_drained(Duration::from_secs(600)));
        t.close().unwrap();
        let pool = Pool::open(&path, OpenConfig::new(F3Tree::engine_id())).unwrap();
        let t0 = Instant::now();
        let (t, _) = F3Tree::open(pool, &F3TreeOptions::default()).unwrap();
        let open = t0.elapsed();
        let pass = t.wait_recovery().unwrap().expect("a background pass").elapsed;
        println!(
            "| {keys} | {open:.2?} | {pass:.2?} | {:.3} |",
            open.as_secs_f64() / pass.as_secs_f64().max(1e-9)
        );
        t.check().unwrap();
        t.close().unwrap();
        last = Some((open, pass));
    }
    let (open, pass) = last.unwrap();
    assert!(open * 10 < pass, "open {open:?} is not far below the pass {pass:?}");
}
