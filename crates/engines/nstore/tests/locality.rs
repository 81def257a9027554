//! The paper's locality claims, measured by the accounting layer on two nodes: puts, updates
//! and deletes write only the writer's node's PM (its own log files), and a scan over keys
//! stored on both nodes reads no remote PM (the other node's entries are read by that node's
//! local read threads).

mod common;

use numakv_index::Index;
use numakv_nstore::NStoreOptions;
use numakv_pmem::{account, AccessStats, PersistMode, SimMode};

fn measure(op: impl FnOnce()) -> AccessStats {
    account::op_discard();
    let before = account::thread_stats();
    op();
    account::op_end();
    account::thread_stats().since(&before)
}

#[test]
fn writes_write_and_scans_read_no_remote_pm() {
    if !account::COMPILED {
        return;
    }
    let o = NStoreOptions { scan_threads_per_node: 1, ..common::opts() };
    let dir = tempfile::tempdir().unwrap();
    let s = common::create(dir.path(), PersistMode::Adr, SimMode::Direct, &o);
    account::set_enabled(true);
    let n = 2_000u64;
    let mut total = AccessStats::default();
    for k in 1..=n {
        // Alternate writer nodes: every key's history spans both nodes' files.
        numakv_numa::set_current_node((k % 2) as usize);
        total.add(&measure(|| assert!(s.insert(k, k).unwrap())));
        numakv_numa::set_current_node(((k + 1) % 2) as usize);
        total.add(&measure(|| assert!(s.update(k, k + 1).unwrap())));
        if k % 3 == 0 {
            numakv_numa::set_current_node((k % 2) as usize);
            total.add(&measure(|| assert!(s.remove(k).unwrap())));
        }
    }
    assert!(total.writes_local >= n * 2, "{total:?}");
    assert_eq!(total.writes_remote, 0, "a write wrote remote PM: {total:?}");
    // A scan from either node: the caller's and the read threads' lines together.
    for node in 0..2 {
        numakv_numa::set_current_node(node);
        let before = account::global_stats();
        let mut out = Vec::new();
        account::op_discard();
        s.scan(1, usize::MAX, &mut out).unwrap();
        account::op_end();
        let st = account::global_stats().since(&before);
        assert_eq!(out.len() as u64, n - n / 3);
        assert!(out.iter().all(|&(k, v)| v == k + 1));
        assert!(st.reads_local > 0, "{st:?}");
        assert_eq!(st.reads_remote, 0, "a scan from node {node} read remote PM: {st:?}");
    }
    numakv_numa::set_current_node(0);
    account::set_enabled(false);
}
