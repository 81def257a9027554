//! A crash at every persistence point of a leaf merge (append, range takeover, parent entry
//! removal, unlink): recovery either rolls the merge back (the left node's range is cut back to
//! its sibling's low key, the appended copies are dropped, the right node is re-linked in its
//! parent if it had lost its entry) or finds it complete.

mod common;

use common::{crash_round, Op};
use numakv_index::Index;
use numakv_pmem::PersistMode;

#[test]
fn crash_inside_a_merge() {
    // Find, by a dry run, a remove that triggers a merge.
    let t = common::volatile(256);
    let pre: Vec<Op> = (1..=60u64).map(|k| Op::Insert(k, k * 11)).collect();
    for op in &pre {
        if let Op::Insert(k, v) = *op {
            t.insert(k, v).unwrap();
        }
    }
    let mut removes = Vec::new();
    let mut trigger = None;
    for k in (1..=60u64).rev() {
        let before = t.stats().counter("merges").unwrap();
        t.remove(k).unwrap();
        if t.stats().counter("merges").unwrap() > before {
            trigger = Some(k);
            break;
        }
        removes.push(Op::Remove(k));
    }
    let k = trigger.expect("no remove merged");
    let mut all = pre.clone();
    all.extend(removes);
    let ops = [Op::Remove(k)];
    let (reps, fence) = common::sweep_fences(1, 0, |fence, copts| {
        crash_round(PersistMode::Adr, 256, &all, &ops, fence, copts)
    });
    assert!(fence >= 5, "the merge took only {fence} fences");
    assert!(common::counter_sum(&reps, "ranges_fixed") > 0, "no crash fell inside the merge");
}
