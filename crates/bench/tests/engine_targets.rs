//! The engines as benchmark targets: a store per instance in the given directory, contents kept
//! across a clean reopen and a crash, and runs through the runner in both persistence modes.

use std::sync::{Arc, Mutex};

use numakv_bench::engines;
use numakv_bench::{run, BenchConfig, PersistMode, Progress, Reopen, TargetEnv};
use numakv_numa::Topology;

/// The tests of this binary run one at a time: they share the process-wide epoch collector, so
/// the deferred frees of one test's ADR stores (which flush) can run on another test's worker
/// threads and show up in that run's per-thread flush count.
static SERIAL: Mutex<()> = Mutex::new(());

fn env(dir: &std::path::Path, persist: PersistMode) -> TargetEnv {
    TargetEnv {
        dir: dir.to_path_buf(),
        topology: Arc::new(Topology::with_nodes(2).unwrap()),
        persist,
        max_keys: 10_000,
        threads: 1,
    }
}

#[test]
fn an_engine_instance_keeps_its_contents_across_reopen_and_crash() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for target in engines::all() {
        let dir = tempfile::tempdir().unwrap();
        let mut inst = target.open(&env(dir.path(), PersistMode::Adr)).unwrap();
        let index = inst.index();
        for k in 1..=3_000 {
            assert!(index.insert(k, k * 3).unwrap());
        }
        assert!(index.remove(7).unwrap());
        drop(index);
        for how in [Reopen::Clean, Reopen::Crash] {
            let took = inst.reopen(how).unwrap();
            // Only measurement stores (NBTree over the naive allocator or the page heap) may
            // decline, and then nothing changed (checked below like a reopen).
            assert!(
                took.is_some() || target.description().contains("not recoverable"),
                "{}: {how:?} not timed",
                target.name()
            );
            let index = inst.index();
            assert_eq!(index.get(8).unwrap(), Some(24), "{} after {how:?}", target.name());
            assert_eq!(index.get(7).unwrap(), None, "{} after {how:?}", target.name());
            assert_eq!(index.check().unwrap().entries, 2_999, "{} after {how:?}", target.name());
        }
        // A reopen while a worker still holds the index is refused, not a deadlock or a panic.
        // (Measurement stores decline every reopen with `None`, leaving the store as it is.)
        let held = inst.index();
        let r = inst.reopen(Reopen::Clean);
        if target.description().contains("not recoverable") {
            assert!(matches!(r, Ok(None)), "{}: {r:?}", target.name());
        } else {
            assert!(r.is_err(), "{}", target.name());
        }
        drop(held);
    }
}

#[test]
fn engines_and_peers_run_side_by_side_in_both_modes() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for persist in [PersistMode::Adr, PersistMode::Eadr] {
        let scratch = tempfile::tempdir().unwrap();
        let config = BenchConfig {
            engines: vec!["all".into()],
            workload: "nap-write-intensive".into(),
            keys: Some(3_000),
            ops: Some(6_000),
            threads: vec![2],
            persist,
            crash: true,
            check: true,
            scratch: Some(scratch.path().to_path_buf()),
            ..BenchConfig::default()
        };
        let report = run(&config, &engines::available(), Progress::Hidden).unwrap();
        assert!(report.failures.is_empty(), "{:?}", report.failures);
        assert_eq!(report.runs.len(), engines::available().len());
        for r in &report.runs {
            assert_eq!(r.ops, 6_000, "{}", r.engine);
            let is_engine = engines::all().iter().any(|t| t.name() == r.engine);
            assert_eq!(r.pm_reads_per_op.unwrap() > 0.0, is_engine, "{}", r.engine);
            // Measurement stores (NBTree over naive/page-heap blocks) decline the crash reopen.
            let reopens =
                is_engine && !r.engine.ends_with("-naive") && !r.engine.ends_with("-pageheap");
            assert_eq!(r.recover_ms.is_some(), reopens, "{}", r.engine);
            // Inserts and updates flush in ADR and never in eADR.
            if is_engine {
                assert_eq!(
                    r.flushes_per_op.unwrap() > 0.0,
                    persist == PersistMode::Adr,
                    "{}",
                    r.engine
                );
            }
        }
        assert_eq!(std::fs::read_dir(scratch.path()).unwrap().count(), 0, "stores left behind");
    }
}

/// `repro f3tree-numa` counts each F3-tree row twice, as lines and through the modelled
/// per-node caches; both views are in the report and its JSON, and both show the NUMA-aware
/// variant with fewer remote accesses than the non-NUMA one.
#[test]
fn f3tree_numa_reports_lines_and_modelled_cache_misses() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let opts = numakv_bench::repro::ReproOptions {
        out_dir: dir.path().to_path_buf(),
        scale: 0.1,
        quiet: true,
        ..numakv_bench::repro::ReproOptions::default()
    };
    let targets = engines::select(&["f3tree".into()]).unwrap();
    let out = numakv_bench::repro::run("f3tree-numa", &targets, &opts, Progress::Hidden).unwrap();
    assert!(out.report.failures.is_empty(), "{:?}", out.report.failures);
    assert!(out.markdown.contains("### Through a modelled cache per node"), "{}", out.markdown);
    let row = |name: &str| {
        out.report
            .runs
            .iter()
            .find(|r| r.engine == name && r.workload.contains("upsert"))
            .unwrap_or_else(|| panic!("no {name} row"))
    };
    let remote = |name: &str, flush: &str| {
        let c = &row(name).counters;
        let get = |k: &str| {
            c.get(&format!("llc_{flush}_{k}"))
                .copied()
                .unwrap_or_else(|| panic!("{name}: no llc_{flush}_{k} in {c:?}"))
        };
        let misses = get("memory_reads_local") + get("memory_reads_remote");
        assert!(misses > 0 && get("hits") > 0, "{name} {flush}: {c:?}");
        get("memory_reads_remote") + get("transfers_remote") + get("writebacks_remote")
    };
    for flush in ["clflush", "clwb"] {
        let (numa, non) = (remote("f3tree", flush), remote("f3tree-nonuma", flush));
        assert!(numa < non, "{flush}: f3tree {numa} vs f3tree-nonuma {non} remote accesses");
        assert!(out.markdown.contains(&format!("(upsert, {flush})")), "{}", out.markdown);
    }
    // Sequential keys (Fig. 8a): each thread's range has its own leaves, which the NUMA-aware
    // evaluators split on the writer's node, so the tree phase is local too and the cut is
    // well past the paper's 50% (≈ 97% at scale 1); the non-NUMA variant's is not.
    let seq = |name: &str| {
        let r = out
            .report
            .runs
            .iter()
            .find(|r| r.engine == name && r.workload.contains("sequential"))
            .unwrap_or_else(|| panic!("no sequential {name} row"));
        r.remote_reads_per_op.unwrap() + r.remote_writes_per_op.unwrap()
    };
    let (numa, non) = (seq("f3tree"), seq("f3tree-nonuma"));
    // The remote lines per op of the non-NUMA variant swing 4–20 between runs at this scale
    // (which node its unpinned evaluators happen to serve from), so the claim is checked on the
    // evaluators' tree accesses: ≈ 11–18% remote for F3-tree(N) in every run seen (each range's
    // leaves split on its writer's node). The non-NUMA variant's share is whatever the scheduler
    // gives its unbound evaluators (≈ 50% in most runs, but 19% and 18% in two CI runs of
    // 2026-11-26, the second equal to F3-tree(N)'s), so only the absolute bound is checked —
    // under a quarter, where unbound evaluators on two nodes average a half; the comparison
    // with the non-NUMA variant is made on the random keys above (no failure seen there).
    let tree_share = |name: &str| {
        let r =
            out.report.runs.iter().find(|r| r.engine == name && r.workload.contains("sequential"));
        let c = &r.unwrap_or_else(|| panic!("no sequential {name} row")).counters;
        let get = |k: &str| *c.get(k).unwrap_or_else(|| panic!("{name}: no {k}")) as f64;
        get("pm_eval_tree_remote") / (get("pm_eval_tree_local") + get("pm_eval_tree_remote"))
    };
    let (numa_tree, non_tree) = (tree_share("f3tree"), tree_share("f3tree-nonuma"));
    assert!(
        numa_tree < 0.25,
        "sequential: evaluator tree accesses {:.0}% remote for f3tree ({:.0}% for f3tree-nonuma; \
         {numa} vs {non} remote lines/op)",
        numa_tree * 100.0,
        non_tree * 100.0
    );
    // Lines and misses are different counts of the same run: the caches absorb most lines.
    let n = row("f3tree");
    let lines = (n.pm_reads_per_op.unwrap() + n.pm_writes_per_op.unwrap()) * n.ops as f64;
    assert!((remote("f3tree", "clflush") as f64) < lines, "{n:?}");
    // The paper's baselines have rows, and the verdict is stated against NI with shares.
    for name in ["f3tree-ni", "f3tree-n2", "f3tree-batched", "fastfair"] {
        row(name);
    }
    assert!(out.markdown.contains("`f3tree` vs `f3tree-ni`: "), "{}", out.markdown);
    assert!(out.markdown.contains("remote share"), "{}", out.markdown);
    // NI's evaluators all run on the first node: its tree phase is (nearly) all local, where
    // F3-tree(N)'s is about half remote with random keys on two nodes.
    let tree_remote = |name: &str| {
        let c = &row(name).counters;
        let (l, r) = (c["pm_eval_tree_local"], c["pm_eval_tree_remote"]);
        r as f64 / (l + r).max(1) as f64
    };
    assert!(tree_remote("f3tree-ni") < 0.1, "NI tree phase {}", tree_remote("f3tree-ni"));
    assert!(tree_remote("f3tree") > 0.3, "N tree phase {}", tree_remote("f3tree"));
    // Fig. 9's sweep: one node in use means no remote line for any variant.
    let sweep = |name: &str, k: usize| {
        out.report
            .runs
            .iter()
            .find(|r| r.engine == name && r.workload.contains(&format!("sweep, {k} nodes")))
            .unwrap_or_else(|| panic!("no sweep row {name} on {k} nodes"))
    };
    for name in ["f3tree", "f3tree-n2", "f3tree-ni"] {
        assert_eq!(sweep(name, 1).remote_share, Some(0.0), "{name} on one node");
        assert!(sweep(name, 4).remote_share.unwrap() > 0.0, "{name} on four nodes");
    }
}
