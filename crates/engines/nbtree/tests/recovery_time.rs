//! Recovery from the PM key-value layer after a crash (drop without close), single-threaded:
//! every key back, `check()` clean, and the time of each phase printed. Small by default; the
//! paper's figure (16 M keys, 0.32 s) is `NUMAKV_RECOVERY_KEYS=16000000 cargo test --release
//! -p numakv-nbtree --test recovery_time -- --nocapture`.

use numakv_index::{Engine, Index};
use numakv_nbtree::{NbTree, NbTreeOptions};
use numakv_pmem::{OpenConfig, PersistMode, Pool, PoolConfig};

#[test]
fn recovery_rebuilds_everything() {
    let n: u64 =
        std::env::var("NUMAKV_RECOVERY_KEYS").ok().and_then(|s| s.parse().ok()).unwrap_or(200_000);
    let shm = std::path::Path::new("/dev/shm");
    let dir = if shm.is_dir() { tempfile::tempdir_in(shm) } else { tempfile::tempdir() }.unwrap();
    let path = dir.path().join("store");
    let mut cfg = PoolConfig::new(NbTree::engine_id(), n * 96 + (64 << 20));
    cfg.nodes = 1;
    cfg.mode = PersistMode::Eadr;
    let key = |i: u64| i.wrapping_mul(0x9E37_79B9_7F4A_7C15) % (u64::MAX - 2) + 1;
    {
        let t =
            NbTree::create(Pool::create(&path, cfg).unwrap(), &NbTreeOptions::default()).unwrap();
        for i in 0..n {
            t.insert(key(i), i).unwrap();
        }
        // Dropped without close: a crash as far as the store is concerned.
    }
    let pool = Pool::open(&path, OpenConfig::new(NbTree::engine_id())).unwrap();
    let cpu0 = thread_cpu_ns();
    let (t, report) = NbTree::open(pool, &NbTreeOptions::default()).unwrap();
    let cpu = thread_cpu_ns() - cpu0;
    eprintln!(
        "recovered {n} keys in {:.3} s wall ({:.0} ns/key), {:.3} s CPU of the one thread: {:?}",
        report.elapsed.as_secs_f64(),
        report.elapsed.as_nanos() as f64 / n as f64,
        cpu as f64 / 1e9,
        report.counters
    );
    assert!(!report.was_clean);
    let c = t.check().unwrap();
    assert_eq!(c.entries, n);
    assert_eq!(c.reachable_blocks, c.allocated_blocks);
    for i in (0..n).step_by(97) {
        assert_eq!(t.get(key(i)).unwrap(), Some(i));
    }
}

/// CPU time of the calling thread (wall time on a shared machine overstates the work).
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid out-pointer to a timespec; CLOCK_THREAD_CPUTIME_ID is always available on
    // Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
