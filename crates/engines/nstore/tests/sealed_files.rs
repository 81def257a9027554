//! A sealed log file is never written again (issue 34, defect 1): a byte-key write that does
//! not fit the active file seals it and then finds no space for a new one; the sealed file must
//! not take the next smaller put or delete, nor GC's rewrite of the file it reclaims, nor — once
//! GC freed it and its page holds a new file — any later write.

use std::path::Path;

use numakv_index::{Engine, Index};
use numakv_nstore::{NStore, NStoreOptions};
use numakv_pmem::{CrashOptions, OpenConfig, PersistMode, Pool, PoolConfig, SimMode};

/// One node, one cluster, one-page files (504 words of variable-length entries, 100 fixed
/// slots), no GC threads.
fn opts() -> NStoreOptions {
    NStoreOptions {
        clusters: 1,
        log_file_size: 4096,
        gc_threads_per_node: 0,
        recovery_threads: 1,
        ..Default::default()
    }
}

/// A 128 KiB single-node store in ADR shadow mode.
fn create(dir: &Path, mode: PersistMode) -> NStore {
    let mut cfg = PoolConfig::new(NStore::engine_id(), 128 << 10);
    cfg.page_size = 4096;
    cfg.mode = mode;
    cfg.sim = SimMode::Shadow;
    NStore::create(Pool::create(dir, cfg).unwrap(), &opts()).unwrap()
}

fn reopen(dir: &Path) -> NStore {
    let mut oc = OpenConfig::new(NStore::engine_id());
    oc.sim = SimMode::Shadow;
    NStore::open(Pool::open(dir, oc).unwrap(), &opts()).unwrap().0
}

/// `put_bytes("a", [9; 112])` (19 words) until the store is out of space: the last one sealed
/// the active file (494 of 504 words used) and found no room for a new file.
fn fill_until_out_of_space(s: &NStore) {
    for i in 0.. {
        assert!(i < 100_000, "a 128 KiB store never ran full");
        match s.put_bytes(b"a", &[9; 112]) {
            Ok(()) => {}
            Err(e) if e.is_out_of_space() => return,
            Err(e) => panic!("put {i}: {e}"),
        }
    }
}

/// The sealed file took a 5-word put and then GC's rewrite of that put while reclaiming the
/// same file: the index named a retired file (`check()`: "names no file"), a crash lost the
/// acknowledged put, and without a crash `get_bytes` spun forever.
#[test]
fn a_sealed_file_takes_no_put_and_no_rewrite_of_its_own_reclaim() {
    for mode in [PersistMode::Adr, PersistMode::Eadr] {
        let dir = tempfile::tempdir().unwrap();
        let s = create(dir.path(), mode);
        fill_until_out_of_space(&s);
        // May be refused for space (it needs a new file); if acknowledged it must stay.
        let acked = match s.put_bytes(b"a", b"") {
            Ok(()) => true,
            Err(e) if e.is_out_of_space() => false,
            Err(e) => panic!("{mode:?}: put: {e}"),
        };
        let want: Option<Vec<u8>> = Some(if acked { Vec::new() } else { vec![9; 112] });
        let _ = s.collect_garbage();
        s.check().unwrap_or_else(|e| panic!("{mode:?}: check after GC: {e}"));
        assert_eq!(s.get_bytes(b"a").unwrap(), want, "{mode:?}: before the crash");
        let pool = s.pool().clone();
        pool.crash(CrashOptions::STRICT).unwrap();
        drop(s);
        drop(pool);
        let s = reopen(dir.path());
        assert_eq!(s.get_bytes(b"a").unwrap(), want, "{mode:?}: after the crash");
        s.check().unwrap_or_else(|e| panic!("{mode:?}: check after the crash: {e}"));
    }
}

/// The sealed file took a delete, GC reclaimed and freed it, fixed-size files filled its page:
/// a later byte-key put still wrote into the freed file (the stale active file), over the last
/// slot of the fixed file there, and `get` of that slot's key returned the put's meta word.
#[test]
fn a_freed_sealed_file_is_not_written_over_the_file_that_reuses_its_page() {
    for mode in [PersistMode::Adr, PersistMode::Eadr] {
        let dir = tempfile::tempdir().unwrap();
        let s = create(dir.path(), mode);
        fill_until_out_of_space(&s);
        let deleted = match s.delete_bytes(b"a") {
            Ok(d) => d,
            Err(e) if e.is_out_of_space() => false,
            Err(e) => panic!("{mode:?}: delete: {e}"),
        };
        assert!(s.gc_quiesce(std::time::Duration::from_secs(20)).unwrap(), "GC did not settle");
        assert!(s.stats().counter("gc_files_reclaimed").unwrap_or(0) > 0);
        // Fixed-size files take every page GC freed.
        let mut keys = Vec::new();
        for k in 1000u64.. {
            assert!(k < 1_000_000, "never ran full again");
            match s.insert(k, k * 7) {
                Ok(true) => keys.push(k),
                Ok(false) => panic!("key {k} was present"),
                Err(e) if e.is_out_of_space() => break,
                Err(e) => panic!("{mode:?}: insert {k}: {e}"),
            }
        }
        let acked_b = match s.put_bytes(b"b", b"") {
            Ok(()) => true,
            Err(e) if e.is_out_of_space() => false,
            Err(e) => panic!("{mode:?}: put b: {e}"),
        };
        for &k in &keys {
            assert_eq!(s.get(k).unwrap(), Some(k * 7), "{mode:?}: key {k}");
        }
        if acked_b {
            assert_eq!(s.get_bytes(b"b").unwrap(), Some(Vec::new()), "{mode:?}");
        }
        let a = if deleted { None } else { Some(vec![9; 112]) };
        assert_eq!(s.get_bytes(b"a").unwrap(), a, "{mode:?}");
        s.check().unwrap_or_else(|e| panic!("{mode:?}: check: {e}"));
        let pool = s.pool().clone();
        pool.crash(CrashOptions::STRICT).unwrap();
        drop(s);
        drop(pool);
        let s = reopen(dir.path());
        for &k in &keys {
            assert_eq!(s.get(k).unwrap(), Some(k * 7), "{mode:?}: key {k} after the crash");
        }
        s.check().unwrap_or_else(|e| panic!("{mode:?}: check after the crash: {e}"));
    }
}

/// The window itself: GC read the tail of the sealed file it reclaims (pause point
/// `nstore.gc.tail_read`) and a put of the sealed file's cluster comes now. It must not land in
/// that file (GC would retire the file without it): it goes to a new file or is refused.
#[test]
fn a_put_between_gcs_tail_read_and_the_retire_is_not_lost() {
    use numakv_pmem::failpoint::Scenario;
    let dir = tempfile::tempdir().unwrap();
    let s = create(dir.path(), PersistMode::Adr);
    fill_until_out_of_space(&s);
    // Every file is eligible (all its entries but the newest "a" are superseded) and the pass
    // takes them in id order: pause at the last one, the sealed file that was active.
    let files = s.stats().counter("files_created").unwrap() as usize;
    let sc = Scenario::setup();
    let hits = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let h = std::sync::Arc::clone(&hits);
    let pause = sc.pause_when("nstore.gc.tail_read", move || {
        h.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1 == files
    });
    let acked = std::thread::scope(|t| {
        let gc = t.spawn(|| s.collect_garbage());
        pause.wait_parked();
        let acked = match s.put_bytes(b"a", b"") {
            Ok(()) => true,
            Err(e) if e.is_out_of_space() => false,
            Err(e) => panic!("put: {e}"),
        };
        pause.release();
        gc.join().unwrap().unwrap();
        acked
    });
    drop(sc);
    let want: Option<Vec<u8>> = Some(if acked { Vec::new() } else { vec![9; 112] });
    s.check().unwrap_or_else(|e| panic!("check: {e}"));
    assert_eq!(s.get_bytes(b"a").unwrap(), want);
    let pool = s.pool().clone();
    pool.crash(CrashOptions::STRICT).unwrap();
    drop(s);
    drop(pool);
    let s = reopen(dir.path());
    assert_eq!(s.get_bytes(b"a").unwrap(), want, "after the crash");
    s.check().unwrap();
}
