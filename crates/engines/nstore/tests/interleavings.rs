//! Forced schedules and injected failures of NStore's GC (the pause and fail points listed in
//! the crate docs): each test aims at one window and failed before its fix.

mod common;

use numakv_index::{Engine, Index};
use numakv_pmem::failpoint::Scenario;
use numakv_pmem::{CrashOptions, PersistMode, SimMode};

/// A reclaim interrupted after it rewrote a live entry (the next rewrite found no space): the
/// original counts as garbage, so `check()`'s accounting holds now, after a crash and rescan,
/// and after a clean close and a snapshot open; GC then finishes the file.
#[test]
fn an_interrupted_reclaim_leaves_exact_garbage_counts() {
    let o = common::opts();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    let s = common::create(&path, PersistMode::Adr, SimMode::Shadow, &o);
    let model = common::churn(&s, 3_000);
    {
        let sc = Scenario::setup();
        let fail = sc.fail("nstore.gc.rewritten", Some(1));
        let e = s.collect_garbage().expect_err("the injected failure stops the pass");
        assert!(e.is_out_of_space(), "{e}");
        assert_eq!(fail.hits(), 1);
    }
    common::verify(&s, &model, "after an interrupted reclaim");
    // Power failure: the rescan counts the rewritten original as garbage too.
    let pool = s.pool().clone();
    pool.crash(CrashOptions::STRICT).unwrap();
    drop(s);
    drop(pool);
    let (s, _, c) = common::open(&path, SimMode::Shadow, &o);
    assert_eq!(common::counter(&c, "from_snapshot"), 0);
    common::verify(&s, &model, "after a crash and rescan");
    s.close().unwrap();
    let (s, _, c) = common::open(&path, SimMode::Shadow, &o);
    assert_eq!(common::counter(&c, "from_snapshot"), 1, "{c:?}");
    common::verify(&s, &model, "after a snapshot open");
    assert!(s.collect_garbage().unwrap() > 0);
    common::verify(&s, &model, "after GC finished");
}

/// `get_bytes` read the index (entry `e1` of key K) and stands before reading `e1`; meanwhile K
/// is written again (`e2`, whose history is `e1`) and GC reclaims `e2`'s file, marking `e1`
/// `inv`. The reader must treat `e1` as moved and read the index again — not report corruption.
#[test]
fn get_bytes_finding_its_entry_marked_by_gc_reads_the_index_again() {
    let o = numakv_nstore::NStoreOptions {
        clusters: 1,
        log_file_size: 4096, // one page: 504 words of entries
        gc_threads_per_node: 0,
        ..common::opts()
    };
    let dir = tempfile::tempdir().unwrap();
    let s = common::create(dir.path(), PersistMode::Eadr, SimMode::Direct, &o);
    let k = b"the key".to_vec();
    let (v1, v2) = (vec![1u8; 100], vec![2u8; 100]);
    s.put_bytes(&k, &v1).unwrap();
    // Live fillers until the file of e1 is full: it stays (not eligible for GC).
    let mut i = 0u32;
    while s.stats().counter("files_created").unwrap_or(0) < 2 {
        i += 1;
        s.put_bytes(format!("filler {i}").as_bytes(), &[0; 100]).unwrap();
    }
    let sc = Scenario::setup();
    let pause = sc.pause("nstore.get_bytes.located");
    std::thread::scope(|t| {
        let reader = t.spawn(|| s.get_bytes(&k));
        pause.wait_parked();
        // e2 in the second file, then garbage until that file is sealed.
        s.put_bytes(&k, &v2).unwrap();
        let mut j = 0u32;
        while s.stats().counter("files_created").unwrap_or(0) < 3 {
            j += 1;
            let g = format!("garbage {j}");
            s.put_bytes(g.as_bytes(), &[0; 100]).unwrap();
            s.delete_bytes(g.as_bytes()).unwrap();
        }
        assert_eq!(s.collect_garbage().unwrap(), 1, "GC reclaims e2's file only");
        assert!(s.stats().counter("gc_history_invalidated").unwrap_or(0) >= 1, "e1 marked");
        pause.release();
        let got = reader.join().unwrap().expect("a read racing GC is not corruption");
        assert_eq!(got, Some(v2.clone()));
    });
    assert!(s.stats().counter("read_retries").unwrap_or(0) >= 1);
    assert_eq!(s.get_bytes(&k).unwrap(), Some(v2));
    s.check().unwrap();
}
