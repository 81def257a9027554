//! F3-tree specific behaviour the shared kit does not pin down: scans that merge keys held in
//! PTFOs (new keys, overriding values, tombstones) with the global tree, upserts that skip the
//! tree lookup, and the NUMA-aware evaluate threads' pinning.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use numakv_f3tree::{F3Tree, F3TreeOptions};
use numakv_index::{Engine, Index};
use numakv_pmem::{Pool, PoolConfig};

fn pool(nodes: usize) -> Arc<Pool> {
    let mut c = PoolConfig::new(F3Tree::engine_id(), 16 << 20);
    c.nodes = nodes;
    Pool::volatile(c).unwrap()
}

/// Evaluators that never trigger by themselves (only `wait_drained` makes them evaluate).
fn held() -> F3TreeOptions {
    F3TreeOptions {
        count_threshold: u64::MAX,
        time_threshold: Duration::from_secs(3600),
        ..F3TreeOptions::default()
    }
}

#[test]
fn scans_merge_pending_keys_with_the_tree() {
    let t = F3Tree::create(pool(2), &held()).unwrap();
    let mut model = BTreeMap::new();
    // Even keys into the tree.
    for k in (2..=600u64).step_by(2) {
        assert!(t.insert(k, k).unwrap());
        model.insert(k, k);
    }
    assert!(t.wait_drained(Duration::from_secs(60)));
    assert_eq!(t.pending_keys(), 0);
    // Now held in PTFOs: new odd keys, new values of tree keys, deletes of tree keys, and a key
    // written twice while pending.
    for k in (101..=401u64).step_by(6) {
        assert!(t.insert(k, k * 10).unwrap());
        model.insert(k, k * 10);
    }
    for k in (4..=600u64).step_by(8) {
        assert!(t.update(k, k + 1).unwrap());
        model.insert(k, k + 1);
    }
    for k in (6..=600u64).step_by(10) {
        assert!(t.remove(k).unwrap());
        model.remove(&k);
    }
    t.upsert(107, 7).unwrap();
    model.insert(107, 7);
    assert!(t.remove(113).unwrap());
    model.remove(&113);
    assert!(t.pending_keys() > 100, "the writes are still pending");
    assert_eq!(t.tree().get(101).unwrap(), None, "new keys are not in the tree yet");
    for (start, max) in [(0, usize::MAX), (1, 7), (100, 25), (101, 1), (399, 40), (598, 10)] {
        let mut out = Vec::new();
        t.scan(start, max, &mut out).unwrap();
        let want: Vec<(u64, u64)> = model.range(start..).take(max).map(|(&k, &v)| (k, v)).collect();
        assert_eq!(out, want, "scan({start}, {max})");
    }
    // The same after evaluation.
    assert!(t.wait_drained(Duration::from_secs(60)));
    let mut out = Vec::new();
    t.scan(0, usize::MAX, &mut out).unwrap();
    assert_eq!(out, model.iter().map(|(&k, &v)| (k, v)).collect::<Vec<_>>());
    t.check().unwrap();
    t.close().unwrap();
}

#[test]
fn upsert_is_blind_and_supersedes_pending_and_tree_values() {
    let t = F3Tree::create(pool(2), &held()).unwrap();
    t.upsert(5, 1).unwrap();
    t.upsert(5, 2).unwrap(); // supersedes a pending entry
    assert_eq!(t.get(5).unwrap(), Some(2));
    assert!(t.wait_drained(Duration::from_secs(60)));
    assert_eq!(t.tree().get(5).unwrap(), Some(2));
    t.upsert(5, 3).unwrap(); // supersedes the tree's value
    assert!(!t.insert(5, 9).unwrap(), "insert still sees the pending key");
    assert_eq!(t.get(5).unwrap(), Some(3));
    assert!(t.wait_drained(Duration::from_secs(60)));
    assert_eq!(t.tree().get(5).unwrap(), Some(3));
    t.check().unwrap();
    t.close().unwrap();
}

fn counter(t: &F3Tree, name: &str) -> u64 {
    t.stats().counter(name).unwrap_or(0)
}

#[test]
fn numa_aware_evaluators_are_pinned_and_non_numa_ones_are_not() {
    let t = F3Tree::create(pool(2), &F3TreeOptions::default()).unwrap();
    let t0 = Instant::now();
    let tried = |t: &F3Tree| counter(t, "evaluators_pinned") + counter(t, "evaluator_pin_failures");
    while tried(&t) < 4 && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(tried(&t), 4, "every evaluate thread (2 per node) asked to be pinned");
    // The machine's CPUs are in this process's affinity unless a cpuset says otherwise.
    let allowed = numakv_numa::current_affinity().unwrap();
    let topo = numakv_numa::Topology::with_nodes(2).unwrap();
    if topo.nodes().iter().all(|n| n.cpus.iter().all(|c| allowed.contains(c))) {
        assert_eq!(counter(&t, "evaluators_pinned"), 4);
    }
    t.close().unwrap();

    let t = F3Tree::create(pool(2), &F3TreeOptions::non_numa()).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(tried(&t), 0, "the non-NUMA variant's evaluate threads are not bound");
    t.close().unwrap();
}

/// Blocks NSM holds per node (FOs, tree nodes, the directory).
fn blocks_per_node(t: &F3Tree, nodes: usize) -> Vec<usize> {
    let mut out = vec![0; nodes];
    for p in t.nsm().allocated_blocks() {
        out[p.node()] += 1;
    }
    out
}

/// One producer thread per node writes `per` random keys; then everything is evaluated.
fn write_from_every_node(t: &Arc<F3Tree>, nodes: usize, per: u64) {
    std::thread::scope(|s| {
        for n in 0..nodes {
            let t = Arc::clone(t);
            s.spawn(move || {
                numakv_numa::set_current_node(n);
                for i in 0..per {
                    let k = (i * nodes as u64 + n as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)
                        >> 4
                        | 1;
                    t.upsert(k, i).unwrap();
                }
            });
        }
    });
    assert!(t.wait_drained(Duration::from_secs(60)));
}

/// F3-tree(NI) (Fig. 9's baseline): the two evaluate threads run on the first node and serve
/// every list, so the tree they grow lives there; only the producers' FOs are elsewhere. In
/// F3-tree(N) each node's evaluators grow the tree from their node.
#[test]
fn ni_evaluators_serve_every_list_from_the_first_node() {
    let ni = Arc::new(F3Tree::create(pool(2), &F3TreeOptions::ni()).unwrap());
    write_from_every_node(&ni, 2, 3000);
    let b = blocks_per_node(&ni, 2);
    assert_eq!(b[1], 1, "NI: node 1 holds only its producer's head FO, got {b:?}");
    assert!(b[0] > 10, "NI: the tree is on node 0, got {b:?}");
    let tried = counter(&ni, "evaluators_pinned") + counter(&ni, "evaluator_pin_failures");
    assert_eq!(tried, 2, "two evaluate threads in total");
    ni.check().unwrap();
    Arc::try_unwrap(ni).unwrap().close().unwrap();

    let n = Arc::new(F3Tree::create(pool(2), &F3TreeOptions::default()).unwrap());
    write_from_every_node(&n, 2, 3000);
    let b = blocks_per_node(&n, 2);
    assert!(b[1] > 10, "N: node 1's evaluators grow the tree there too, got {b:?}");
    n.check().unwrap();
    Arc::try_unwrap(n).unwrap().close().unwrap();
}

/// F3-tree(N2) on four nodes: two evaluate threads in total, on nodes 0 and 1; the lists of
/// nodes 2 and 3 are served by them (node 2 by evaluator 0, node 3 by evaluator 1), so no tree
/// node is allocated on nodes 2 and 3.
#[test]
fn n2_has_two_node_bound_evaluators_in_total() {
    let t = Arc::new(F3Tree::create(pool(4), &F3TreeOptions::n2()).unwrap());
    write_from_every_node(&t, 4, 1500);
    let b = blocks_per_node(&t, 4);
    assert_eq!((b[2], b[3]), (1, 1), "N2: nodes 2, 3 hold only head FOs, got {b:?}");
    assert!(b[0] > 5 && b[1] > 5, "N2: the tree grows on nodes 0 and 1, got {b:?}");
    let tried = counter(&t, "evaluators_pinned") + counter(&t, "evaluator_pin_failures");
    assert_eq!(tried, 2, "two evaluate threads in total");
    t.check().unwrap();
    Arc::try_unwrap(t).unwrap().close().unwrap();
}
